// Module sizes from the config's dimensions, for when the safetensors headers were not read
// (configs only, or an index whose shards are not downloaded): parameters per module from
// hidden_size, intermediate sizes, heads and ranks, times the bytes per parameter of the module's
// scheme. What the config does not give stays unknown (nullopt), never 0.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>

#include "detect/arch.h"
#include "detect/manifest.h"

namespace fp4moe::detect {

// The dimensions a module's shape is made of; 0 = the config does not say.
struct ModelDims {
  int64_t hidden = 0, intermediate = 0, moe_intermediate = 0, shared_intermediate = 0;
  int64_t n_shared = 0, heads = 0, kv_heads = 0, head_dim = 0, vocab = 0, experts = 0;
  int64_t q_lora = 0, kv_lora = 0, qk_nope = 0, qk_rope = 0, v_head = 0;
  int64_t o_groups = 0, o_lora = 0;             // DeepSeek-V4 grouped output projection
  int64_t index_heads = 0, index_head_dim = 0;  // sparse-attention indexer
  int64_t lin_k_heads = 0, lin_v_heads = 0, lin_k_dim = 0, lin_v_dim = 0;  // linear attention
  int64_t mamba_heads = 0, mamba_head_dim = 0, ssm_groups = 0, ssm_state = 0;
  bool output_gate = false;   // attn_output_gate: q_proj also produces the gate
  int unquantized_bytes = 2;  // torch_dtype: float32 -> 4, else 2
};

// Tolerant: a missing key or one of another type leaves that dimension 0 (unknown).
ModelDims read_dims(const nlohmann::json& config);

// Parameters of one module (for one fused expert tensor: all its experts), or nullopt when its
// shape is not known from these dimensions.
std::optional<int64_t> module_params(std::string_view name, Role role, const ArchInfo& arch,
                                     const ModelDims& dims);

// Bytes per parameter of a stored scheme, block scales included (tensor scales are negligible);
// nullopt for absent/unknown.
std::optional<double> bytes_per_param(const SchemeSpec& spec, const ModelDims& dims);

}  // namespace fp4moe::detect
