// A Hugging Face checkpoint directory: its JSON configs, its shards, and every tensor across them.
//
// Opening reads config.json, hf_quant_config.json and the shard headers only; tensor data is mapped
// on first request. Shards come from model.safetensors.index.json ("weight_map": tensor -> shard
// file) when it exists, otherwise from model.safetensors, otherwise from every *.safetensors file
// in the directory. A shard name that leaves the directory (absolute, "..", or a symlink resolving
// outside) is an error, as is an index entry whose tensor is not in its shard. The one exception:
// in a snapshot of the Hugging Face cache, symlinks into that same repo's blobs/ are followed
// (hf_cache.h), because that is how huggingface_hub stores every file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/safetensors.h"
#include "core/status.h"

namespace fp4moe::checkpoint {

// Largest JSON side file (config, index) we parse, and its deepest nesting: real configs are a
// few KB and nest 3-4 levels; the caps turn hostile files into errors instead of memory or stack
// exhaustion.
inline constexpr uint64_t kMaxJsonFileBytes = 64ull << 20;
inline constexpr int kMaxJsonDepth = 64;

// Parses a JSON side file; absent = null, unreadable/invalid/too deep = error naming the file.
// The one JSON reader of every command: Python's NaN/Infinity/-Infinity literals (real configs
// hold them) read as null; nesting is capped before parsing.
Result<nlohmann::json> read_json_file(const std::filesystem::path& path);
// The same rules on JSON text already in memory; `label` names the source in errors.
Result<nlohmann::json> parse_json_text(std::string_view text, std::string_view label);

// Checks that `file`, a path below the canonical checkpoint directory `dir`, resolves inside `dir`
// or (for a Hugging Face cache snapshot) inside its repo's blobs/; `what` starts the error
// ("<dir>/config.json", "index maps tensor 'x' to shard 'y'"), whose reason names where it went.
Status check_contained(const std::filesystem::path& dir, const std::filesystem::path& file,
                       std::string_view what);

// read_json_file of `dir`/`name` after check_contained; absent = null, a dangling symlink (a cache
// blob never downloaded) = error.
Result<nlohmann::json> read_checkpoint_json(const std::filesystem::path& dir,
                                            std::string_view name);

// model.safetensors.index.json, validated without opening a shard: "weight_map" an object of
// strings, every shard name relative and inside the directory (errors name the file and the
// entry), "metadata.total_size" a non-negative integer when present.
struct SafetensorsIndex {
  std::filesystem::path file;
  std::vector<std::pair<std::string, std::string>> weight_map;  // tensor -> shard, tensor order
  std::vector<std::string> shards;                              // sorted, unique
  std::optional<uint64_t> total_size;                           // metadata.total_size
};
inline constexpr std::string_view kIndexFileName = "model.safetensors.index.json";
// nullopt when `dir` has no index.
Result<std::optional<SafetensorsIndex>> read_safetensors_index(const std::filesystem::path& dir);

// Top-level regular files of `dir` that are not weights (tokenizer, generation config, chat
// template, config.json, ...): what a converter copies unchanged. Skips hidden files and weight
// files (*.safetensors, *.bin, *.pt, *.pth, *.ckpt, *.gguf, *.h5, *.msgpack, *.index.json).
// Sorted by name.
std::vector<std::filesystem::path> list_side_files(const std::filesystem::path& dir);

// Whether `child` is `parent` or lies below it, compared component by component (so /a/bc is not
// inside /a/b). Both should be canonical (fs::canonical / fs::weakly_canonical).
bool path_is_inside(const std::filesystem::path& child, const std::filesystem::path& parent);

struct CheckpointTensor {
  const TensorInfo* info = nullptr;  // owned by the CheckpointDir
  uint32_t shard = 0;                // index into shard_paths()
};

class CheckpointDir {
 public:
  static Result<CheckpointDir> open(const std::filesystem::path& dir);

  CheckpointDir(CheckpointDir&&) noexcept;
  CheckpointDir& operator=(CheckpointDir&&) noexcept;
  ~CheckpointDir();

  const std::filesystem::path& path() const;
  const nlohmann::json& config() const;           // config.json, null if absent
  const nlohmann::json& hf_quant_config() const;  // hf_quant_config.json, null if absent
  bool has_index() const;                         // model.safetensors.index.json was used

  size_t shard_count() const;
  const std::filesystem::path& shard_path(size_t shard) const;
  const SafetensorsHeader& shard_header(size_t shard) const;

  // Every tensor: shards in file-name order, and
  // within a shard in data order.
  const std::vector<CheckpointTensor>& tensors() const;
  // The tensor named `name`, or nullptr. O(log n).
  const CheckpointTensor* find(std::string_view name) const;
  // Sum of all tensor byte sizes.
  uint64_t total_tensor_bytes() const;

  // Zero-copy view of a tensor's bytes; maps its shard on first use (thread-safe). Errors name the
  // shard and tensor (a shard changed on disk since open, mmap failure).
  Result<std::span<const std::byte>> data(const CheckpointTensor& tensor) const;
  Result<std::span<const std::byte>> data(std::string_view name) const;

  // list_side_files(path()).
  std::vector<std::filesystem::path> non_weight_files() const;

 private:
  struct Impl;
  explicit CheckpointDir(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp4moe::checkpoint
