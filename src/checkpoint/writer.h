// A streaming writer for sharded Hugging Face safetensors checkpoints.
//
// The caller declares every output tensor (name, dtype, shape) up front, then supplies the data
// tensor by tensor in that order. Knowing the plan lets each shard's exact header be written before
// its data, so tensors stream straight to disk: nothing is buffered beyond one chunk and nothing is
// copied twice. Everything is written into a temporary directory next to the destination
// (`.<name>.partial-XXXXXX`, same file system) and renamed into place by finish(); a writer
// destroyed before finish() removes it. One shard is written as model.safetensors; more as
// model-0000i-of-0000n.safetensors plus model.safetensors.index.json.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/dtype.h"
#include "core/status.h"

namespace fp4moe::checkpoint {

struct TensorSpec {
  std::string name;
  DType dtype = DType::U8;
  std::vector<int64_t> shape;
};

struct WriterOptions {
  // A shard is closed before a tensor that would take its data past this size; a tensor larger
  // than the limit gets a shard of its own. Hugging Face's default is 5 GB.
  uint64_t max_shard_bytes = 5'000'000'000;
  // "__metadata__" of every shard.
  std::map<std::string, std::string> metadata = {{"format", "pt"}};
  // Source checkpoint: its non-weight top-level files (tokenizer, generation config, chat template,
  // config.json, ...) are copied unchanged, and the destination may not lie inside it.
  std::optional<std::filesystem::path> source_dir;
  // Top-level files to write with this exact content, replacing any copied from source_dir
  // (a converter's new config.json / hf_quant_config.json). Names must be plain file names.
  std::map<std::string, std::string> files;
  // Bytes handed to a fill callback per call.
  size_t chunk_bytes = 8u << 20;
};

class CheckpointWriter {
 public:
  // Fills `chunk` with the tensor bytes starting at byte `offset` of the tensor. Called with
  // consecutive chunks until the tensor is complete.
  using FillFn = std::function<Status(uint64_t offset, std::span<std::byte> chunk)>;

  // Validates the plan (names unique, non-empty, valid UTF-8, not "__metadata__"; sizes checked)
  // and the destination (must not exist, must not be inside source_dir), then creates the
  // temporary directory.
  static Result<CheckpointWriter> create(const std::filesystem::path& dest,
                                         std::vector<TensorSpec> plan, WriterOptions options);

  CheckpointWriter(CheckpointWriter&&) noexcept;
  CheckpointWriter& operator=(CheckpointWriter&&) noexcept;
  ~CheckpointWriter();  // removes the temporary directory unless finish() succeeded

  // Writes the next tensor of the plan; `name` must be that tensor, `bytes` its exact size.
  Status write(std::string_view name, std::span<const std::byte> bytes);
  // Same, the bytes produced chunk by chunk by `fill`.
  Status write(std::string_view name, const FillFn& fill);
  // Same, leaving the bytes a file hole that reads as zeros (sparse test fixtures).
  Status write_hole(std::string_view name);

  // Requires every planned tensor written. Closes and syncs shards, writes the index, copies and
  // writes the side files, renames the temporary directory to the destination.
  Status finish();

  // Shard file names in order, and which shard each planned tensor goes to.
  const std::vector<std::string>& shard_names() const;
  size_t shard_of(size_t plan_index) const;

 private:
  struct Impl;
  explicit CheckpointWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp4moe::checkpoint
