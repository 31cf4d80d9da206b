// A streaming writer for sharded Hugging Face safetensors checkpoints.
//
// The caller declares every output tensor (name, dtype, shape) up front, then supplies the data
// tensor by tensor in that order. Knowing the plan lets each shard's exact header be written before
// its data, so tensors stream straight to disk: nothing is buffered beyond one chunk and nothing is
// copied twice. Everything is written into a temporary directory next to the destination
// (`.<name>.partial-XXXXXX`, same file system, locked with flock while its writer lives) and
// renamed into place by finish(); a writer destroyed before finish() removes it. A destination
// that exists is replaced only when asked (WriterOptions::replace_existing), by an atomic swap
// after everything succeeded, so an existing destination is never lost. Output modes follow the
// umask like mkdir and creat: directories 0777, files 0666, less the umask. One shard is written as
// model.safetensors; more as model-0000i-of-0000n.safetensors plus model.safetensors.index.json.
#pragma once

#include <atomic>
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

// Progress of removing a directory tree: bytes removed so far, bytes in all (allocated on disk).
using RemoveProgressFn = std::function<void(uint64_t removed, uint64_t total)>;

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
  // The destination may exist: finish() swaps the new checkpoint in with one atomic
  // renameat2(RENAME_EXCHANGE) (two renames where the file system lacks it) and only then removes
  // the old one, so at every moment the destination holds the old or the new checkpoint, whole.
  bool replace_existing = false;
  // Called by finish() on the complete temporary directory, after every file is written and
  // synced and before anything is renamed; an error leaves the destination as it was.
  std::function<Status(const std::filesystem::path& staged)> check_before_publish;
  // Progress of removing the temporary directory (a failed or abandoned write) or a replaced
  // destination; called after each file and every 1 GiB of a large one.
  RemoveProgressFn on_remove_progress;
  // Tested by finish() right before the rename that publishes: set, nothing is published and the
  // error is ErrorKind::kInterrupted.
  const std::atomic<bool>* cancel = nullptr;
};

// The path a writer writes to for `destination`: absolute, without a trailing slash, its parent
// resolved through symlinks as the kernel will (so "link/../out" is the "out" beside the link's
// target), its last component not followed. Checks about a destination must be made on this path.
std::filesystem::path resolve_destination(const std::filesystem::path& destination);

// Destinations moved aside (`.<name>.old-XXXXXX`) by a replacement that was killed between its two
// renames on a file system without renameat2 flags: never removed by this tool; reported.
std::vector<std::filesystem::path> find_moved_aside(const std::filesystem::path& parent);

// A writer's temporary directory left by an earlier run that was killed (no live writer holds its
// lock): its path and the bytes it takes on disk.
struct PartialDir {
  std::filesystem::path path;
  uint64_t bytes = 0;
};

// The stale temporary directories (`.<name>.partial-XXXXXX`, unlocked) directly in `parent`.
std::vector<PartialDir> find_stale_partials(const std::filesystem::path& parent);

// Removes a directory tree without following symlinks, file by file (files over 1 GiB are
// truncated in 1 GiB steps first, so progress keeps moving on slow file systems).
Status remove_tree(const std::filesystem::path& path, const RemoveProgressFn& progress = {});

// The process umask, read without changing it (/proc/self/status; umask(2) as a fallback).
unsigned process_umask();

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

  // Removes the temporary directory now (reporting progress through on_remove_progress); the
  // writer is unusable afterwards. The destination is untouched.
  Status discard();

  // Writes the next tensor of the plan; `name` must be that tensor, `bytes` its exact size.
  Status write(std::string_view name, std::span<const std::byte> bytes);
  // Same, the bytes produced chunk by chunk by `fill`.
  Status write(std::string_view name, const FillFn& fill);
  // Same, leaving the bytes a file hole that reads as zeros (sparse test fixtures).
  Status write_hole(std::string_view name);

  // Requires every planned tensor written. Closes and syncs shards, writes the index, copies and
  // writes the side files, runs check_before_publish, then renames the temporary directory to the
  // destination (or swaps it with the existing one and removes that, with replace_existing).
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
