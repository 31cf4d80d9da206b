// Sparse checkpoint fixtures: real headers through CheckpointWriter, data left as file holes.
#include "checkpoint/sparse_fixture.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

namespace fp4moe::checkpoint {

Status write_sparse_checkpoint(const std::filesystem::path& dest,
                               const std::vector<FixtureTensor>& tensors,
                               const SparseFixtureOptions& options) {
  std::vector<TensorSpec> plan;
  plan.reserve(tensors.size());
  for (const FixtureTensor& t : tensors) plan.push_back(t.spec);
  WriterOptions writer_options;
  writer_options.max_shard_bytes = options.max_shard_bytes;
  if (!options.config.is_null()) writer_options.files["config.json"] = options.config.dump(2);
  if (!options.hf_quant_config.is_null()) {
    writer_options.files["hf_quant_config.json"] = options.hf_quant_config.dump(2);
  }
  auto writer = CheckpointWriter::create(dest, std::move(plan), std::move(writer_options));
  if (!writer.ok()) return writer.error();
  for (const FixtureTensor& t : tensors) {
    if (t.bytes.empty()) {
      FP4MOE_RETURN_IF_ERROR(writer->write_hole(t.spec.name));
    } else {
      FP4MOE_RETURN_IF_ERROR(writer->write(t.spec.name, t.bytes));
    }
  }
  return writer->finish();
}

Result<uint64_t> allocated_bytes(const std::filesystem::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return Error{path.string() + ": cannot stat: " + std::strerror(errno)};
  }
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

}  // namespace fp4moe::checkpoint
