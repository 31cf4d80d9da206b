// Reads a checkpoint directory's evidence (configs, safetensors headers only) and detects it.
#include "detect/directory.h"

#include <fstream>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/dtype.h"
#include "detect/detect.h"
#include "detect/json_util.h"

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

}  // namespace

Result<InspectedDirectory> detect_directory(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Error{dir.string() + ": not a directory"};
  DetectInput input;
  if (has_weights(dir)) {
    auto ckpt = checkpoint::CheckpointDir::open(dir);
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
    auto config = checkpoint::read_json_file(dir / "config.json");
    if (!config.ok()) return config.error();
    auto hfq = checkpoint::read_json_file(dir / "hf_quant_config.json");
    if (!hfq.ok()) return hfq.error();
    input.config = std::move(config).value();
    input.hf_quant_config = std::move(hfq).value();
  }
  auto manifest = detect(input);
  if (!manifest.ok()) return Error{dir.string() + ": " + manifest.error().message};
  return InspectedDirectory{std::move(manifest).value(), input.config, input.hf_quant_config};
}

}  // namespace fp4moe::detect
