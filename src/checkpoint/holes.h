// File holes: byte ranges of a file that were never written (sparse files). They read as zeros;
// sparse test fixtures are made of them, and `check` reports tensors in them as never written.
#pragma once

#include <cstdint>
#include <filesystem>

namespace fp4moe::checkpoint {

// Whether bytes [begin, begin + size) of `file` lie in a hole. SEEK_DATA works in file-system
// blocks, so the range between the first and last 4 KiB boundary inside it must hold no data and
// the partial blocks at its two ends are read and must be zero. Ranges under 8 KiB are never
// called holes (reading them is cheaper than asking). A file system without SEEK_DATA reports
// everything as data, so the answer is then false.
bool is_file_hole(const std::filesystem::path& file, uint64_t begin, uint64_t size);

}  // namespace fp4moe::checkpoint
