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
  // The records are names from model.safetensors.index.json (dtype "" and no shape): the shards
  // are not downloaded. Names tell some schemes (weight_scale_2: NVFP4, _blocks/_scales: gpt-oss
  // MXFP4, weight_scale_inv: FP8 blocks); the configs tell the rest.
  bool tensor_names_only = false;
  std::optional<uint64_t> index_total_size;  // the index's metadata.total_size
  std::vector<Finding> notes;                // from reading the directory (not_downloaded)
};

// Errors only for input that cannot be read (a key of the wrong type, a bad regex, neither file);
// everything else, including unknown dialects and contradictions, is a Finding.
Result<Manifest> detect(const DetectInput& input);

}  // namespace fp4moe::detect
