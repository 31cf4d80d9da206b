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

// A JSON side file (absent = null), tolerating the NaN/Infinity literals Python writes in configs.
Result<nlohmann::json> read_config(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return nlohmann::json();
  const auto size = fs::file_size(path, ec);
  if (ec) return Error{path.string() + ": cannot stat: " + ec.message()};
  if (size > checkpoint::kMaxJsonFileBytes) return Error{path.string() + ": file too large"};
  std::ifstream in(path, std::ios::binary);
  std::string text(static_cast<size_t>(size), '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(size))) {
    return Error{path.string() + ": cannot read"};
  }
  return jsonu::parse_config_json(text, path.string());
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
    auto config = read_config(dir / "config.json");
    if (!config.ok()) return config.error();
    auto hfq = read_config(dir / "hf_quant_config.json");
    if (!hfq.ok()) return hfq.error();
    input.config = std::move(config).value();
    input.hf_quant_config = std::move(hfq).value();
  }
  auto manifest = detect(input);
  if (!manifest.ok()) return Error{dir.string() + ": " + manifest.error().message};
  return InspectedDirectory{std::move(manifest).value(), input.config, input.hf_quant_config};
}

}  // namespace fp4moe::detect
