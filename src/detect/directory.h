// Detection of a checkpoint directory: reads its configs and (when present) its safetensors
// headers through checkpoint/, and runs detect(). Shared by inspect, plan, convert and demo.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/status.h"
#include "detect/manifest.h"

namespace fp4moe::detect {

struct InspectedDirectory {
  Manifest manifest;
  nlohmann::json config;           // config.json (null if absent)
  nlohmann::json hf_quant_config;  // hf_quant_config.json (null if absent)
};

// A directory with configs only is inspected from its configs (the manifest says the tensors were
// not checked). Errors name the file and the reason.
Result<InspectedDirectory> detect_directory(const std::filesystem::path& dir);

}  // namespace fp4moe::detect
