// Quantization detection: configs + (optionally) safetensors headers -> Manifest (manifest.h).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "core/status.h"
#include "detect/manifest.h"
#include "detect/tensors.h"

namespace fp4moe::detect {

struct DetectInput {
  nlohmann::json config;           // config.json, or null when the directory has none
  nlohmann::json hf_quant_config;  // hf_quant_config.json, or null
  std::optional<std::vector<TensorRecord>> tensors;  // nullopt: no weights, configs only
};

// Errors only for input that cannot be read (a key of the wrong type, a bad regex, neither file);
// everything else, including unknown dialects and contradictions, is a Finding.
Result<Manifest> detect(const DetectInput& input);

}  // namespace fp4moe::detect
