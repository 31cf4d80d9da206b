// Tensor evidence: groups safetensors header records into modules (a weight and its scales) and
// classifies each module's storage scheme from names, dtypes and shapes alone.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "detect/manifest.h"

namespace fp4moe::detect {

// One tensor as the safetensors header describes it. `dtype` is the safetensors dtype name
// ("U8", "I8", "F8_E4M3", "F8_E8M0", "BF16", "F32", ...).
struct TensorRecord {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
};

struct TensorModule {
  std::string name;                                  // module name: tensor name minus its suffix
  std::map<std::string, const TensorRecord*> parts;  // suffix ("weight", "weight_scale", ...)
  SchemeSpec spec;                                   // classified scheme
  std::string evidence;                              // "U8 [2048,2048] + F8_E4M3 scale [2048,256]"
  int64_t bytes = 0;
  bool has_input_scale = false;
  bool names_only = false;  // index names without dtypes/shapes: spec is from the names alone
};

struct TensorEvidence {
  std::vector<TensorModule> modules;          // in name order
  std::vector<std::string> kv_scale_tensors;  // k_scale / v_scale tensors (FP8 KV cache)
  std::vector<std::string> unknown_dtypes;
};

// Splits a tensor name into (module, suffix). Exposed for tests.
std::pair<std::string, std::string> split_tensor_name(const std::string& name);

// Bytes of one element of a safetensors dtype; 0 for a name this tool does not know.
int dtype_size(const std::string& dtype);

TensorEvidence classify_tensors(const std::vector<TensorRecord>& tensors);

}  // namespace fp4moe::detect
