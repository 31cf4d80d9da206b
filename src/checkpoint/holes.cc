// File holes (see holes.h).
#include "checkpoint/holes.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>
#include <vector>

namespace fp4moe::checkpoint {

bool is_file_hole(const std::filesystem::path& file, uint64_t begin, uint64_t size) {
  constexpr uint64_t kBlock = 4096;
  if (size < 2 * kBlock) return false;
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const uint64_t end = begin + size;
  const uint64_t inner_begin = (begin + kBlock - 1) / kBlock * kBlock;
  const uint64_t inner_end = end / kBlock * kBlock;
  bool hole = false;
  const off_t next_data = ::lseek(fd, static_cast<off_t>(inner_begin), SEEK_DATA);
  if ((next_data < 0 && errno == ENXIO) ||
      (next_data >= 0 && static_cast<uint64_t>(next_data) >= inner_end)) {
    std::vector<char> edge(kBlock);
    hole = true;
    for (const auto& [from, to] : {std::pair{begin, inner_begin}, std::pair{inner_end, end}}) {
      const auto n = static_cast<size_t>(to - from);
      if (n == 0) continue;
      hole = hole &&
             ::pread(fd, edge.data(), n, static_cast<off_t>(from)) == static_cast<ssize_t>(n) &&
             std::all_of(edge.begin(), edge.begin() + static_cast<std::ptrdiff_t>(n),
                         [](char c) { return c == 0; });
    }
  }
  ::close(fd);
  return hole;
}

}  // namespace fp4moe::checkpoint
