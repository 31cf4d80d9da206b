// Reads a checkpoint directory's evidence (configs, safetensors headers only) and detects it.
#include "detect/directory.h"

#include <set>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/dtype.h"
#include "detect/detect.h"

namespace fp4moe::detect {
namespace {

namespace fs = std::filesystem;

bool has_weights(const fs::path& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".safetensors") return true;
  }
  return false;
}

std::string first_names(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < 3; ++i) out += (i ? ", " : "") + names[i];
  return out + (names.size() > 3 ? ", ..." : "");
}

}  // namespace

Result<InspectedDirectory> detect_directory(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Error{dir.string() + ": not a directory"};
  const fs::path root = fs::canonical(dir, ec);
  if (ec) return Error{dir.string() + ": cannot resolve: " + ec.message()};
  DetectInput input;
  // The index is read (and its shard names checked) whether or not the shards are here: with
  // configs only its names and total_size are the tensor evidence.
  auto index = checkpoint::read_safetensors_index(root);
  if (!index.ok()) return index.error();
  std::vector<std::string> absent;
  if (index->has_value()) {
    for (const std::string& shard : (*index)->shards) {
      const fs::path file = root / shard;
      if (!fs::exists(fs::symlink_status(file, ec))) absent.push_back(shard);
    }
    input.index_total_size = (*index)->total_size;
  }
  const bool all_shards = index->has_value() ? absent.empty() : has_weights(root);
  if (all_shards) {
    auto ckpt = checkpoint::CheckpointDir::open(root);
    if (!ckpt.ok()) return ckpt.error();
    input.config = ckpt->config();
    input.hf_quant_config = ckpt->hf_quant_config();
    std::vector<TensorRecord> records;
    records.reserve(ckpt->tensors().size());
    for (const auto& t : ckpt->tensors()) {
      records.push_back(
          {t.info->name, std::string(checkpoint::dtype_name(t.info->dtype)), t.info->shape});
    }
    input.tensors = std::move(records);
  } else {
    auto config = checkpoint::read_checkpoint_json(root, "config.json");
    if (!config.ok()) return config.error();
    auto hfq = checkpoint::read_checkpoint_json(root, "hf_quant_config.json");
    if (!hfq.ok()) return hfq.error();
    input.config = std::move(config).value();
    input.hf_quant_config = std::move(hfq).value();
    if (index->has_value()) {
      const checkpoint::SafetensorsIndex& idx = **index;
      std::vector<TensorRecord> records;
      records.reserve(idx.weight_map.size());
      for (const auto& [tensor, shard] : idx.weight_map) records.push_back({tensor, "", {}});
      input.tensors = std::move(records);
      input.tensor_names_only = true;
      input.notes.push_back(
          {Severity::kInfo, "not_downloaded",
           std::to_string(absent.size()) + " of " + std::to_string(idx.shards.size()) +
               " shard(s) named by " + std::string(checkpoint::kIndexFileName) +
               " are not downloaded (" + first_names(absent) +
               "): tensor names come from the index, their dtypes, shapes and values are not "
               "checked"});
    }
  }
  auto manifest = detect(input);
  if (!manifest.ok()) return Error{dir.string() + ": " + manifest.error().message};
  return InspectedDirectory{std::move(manifest).value(), input.config, input.hf_quant_config};
}

}  // namespace fp4moe::detect
