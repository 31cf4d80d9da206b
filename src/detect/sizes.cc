// Module shapes from config dimensions (sizes.h). Shapes are [out, in] of each family's modules
// as their checkpoints store them.
#include "detect/sizes.h"

#include <string>

#include "detect/pattern.h"

namespace fp4moe::detect {
namespace {

using nlohmann::json;

int64_t dim(const json& text, const json& top, std::initializer_list<const char*> keys) {
  for (const json* obj : {&text, &top}) {
    if (!obj->is_object()) continue;
    for (const char* key : keys) {
      const auto it = obj->find(key);
      if (it == obj->end()) continue;
      if (it->is_number_integer() || it->is_number_unsigned()) {
        const int64_t v = it->get<int64_t>();
        if (v > 0 && v < (int64_t{1} << 40)) return v;
      }
    }
  }
  return 0;
}

std::string_view last_component(std::string_view name) {
  const size_t dot = name.rfind('.');
  return dot == std::string_view::npos ? name : name.substr(dot + 1);
}

bool has(std::string_view name, std::string_view comp) { return component_run_match(comp, name); }

// Whether the name holds an expert index ("experts.7.w1"): one expert, not a fused tensor.
bool one_expert(std::string_view name) {
  const size_t pos = name.find("experts.");
  if (pos == std::string_view::npos) return false;
  const size_t idx = pos + 8;
  return idx < name.size() && name[idx] >= '0' && name[idx] <= '9';
}

std::optional<int64_t> product(std::initializer_list<int64_t> dims) {
  int64_t p = 1;
  for (int64_t d : dims) {
    if (d <= 0) return std::nullopt;
    p *= d;
  }
  return p;
}

}  // namespace

ModelDims read_dims(const json& config) {
  ModelDims d;
  if (!config.is_object()) return d;
  const auto tc = config.find("text_config");
  const json& text = tc != config.end() && tc->is_object() ? *tc : config;
  d.hidden = dim(text, config, {"hidden_size", "d_model", "n_embd"});
  d.intermediate = dim(text, config, {"intermediate_size", "ffn_hidden_size"});
  d.moe_intermediate = dim(text, config, {"moe_intermediate_size", "expert_intermediate_size"});
  d.shared_intermediate = dim(text, config,
                              {"shared_expert_intermediate_size",
                               "moe_shared_expert_intermediate_size", "shared_intermediate_size"});
  d.n_shared = dim(text, config, {"n_shared_experts", "num_shared_experts"});
  d.heads = dim(text, config, {"num_attention_heads", "n_head"});
  d.kv_heads = dim(text, config, {"num_key_value_heads"});
  if (d.kv_heads == 0) d.kv_heads = d.heads;
  d.head_dim = dim(text, config, {"head_dim"});
  if (d.head_dim == 0 && d.heads > 0 && d.hidden % d.heads == 0) d.head_dim = d.hidden / d.heads;
  d.vocab = dim(text, config, {"vocab_size"});
  d.experts = dim(text, config, {"n_routed_experts", "num_experts", "num_local_experts"});
  d.q_lora = dim(text, config, {"q_lora_rank"});
  d.kv_lora = dim(text, config, {"kv_lora_rank"});
  d.qk_nope = dim(text, config, {"qk_nope_head_dim"});
  d.qk_rope = dim(text, config, {"qk_rope_head_dim"});
  d.v_head = dim(text, config, {"v_head_dim"});
  d.o_groups = dim(text, config, {"o_groups"});
  d.o_lora = dim(text, config, {"o_lora_rank"});
  d.index_heads = dim(text, config, {"index_n_heads"});
  d.index_head_dim = dim(text, config, {"index_head_dim"});
  d.lin_k_heads = dim(text, config, {"linear_num_key_heads"});
  d.lin_v_heads = dim(text, config, {"linear_num_value_heads"});
  d.lin_k_dim = dim(text, config, {"linear_key_head_dim"});
  d.lin_v_dim = dim(text, config, {"linear_value_head_dim"});
  d.mamba_heads = dim(text, config, {"mamba_num_heads"});
  d.mamba_head_dim = dim(text, config, {"mamba_head_dim"});
  d.ssm_groups = dim(text, config, {"n_groups"});
  d.ssm_state = dim(text, config, {"ssm_state_size"});
  const auto gate = text.find("attn_output_gate");
  d.output_gate = gate != text.end() && gate->is_boolean() && gate->get<bool>();
  for (const char* key : {"torch_dtype", "dtype"}) {
    for (const json* obj : {&text, &config}) {
      const auto it = obj->find(key);
      if (it != obj->end() && it->is_string() && it->get<std::string>() == "float32") {
        d.unquantized_bytes = 4;
      }
    }
  }
  return d;
}

std::optional<int64_t> module_params(std::string_view name, Role role, const ArchInfo& arch,
                                     const ModelDims& d) {
  const std::string_view last = last_component(name);
  const int64_t h = d.hidden;
  if (role == Role::kMtpOther) {  // an MTP layer's shared experts and MLP have the usual widths
    if (has(name, "shared_experts") || has(name, "shared_expert")) {
      return module_params(name, Role::kSharedExperts, arch, d);
    }
    if (has(name, "mlp") || has(name, "ffn")) return module_params(name, Role::kDenseMlp, arch, d);
  }
  switch (role) {
    case Role::kLmHead:
    case Role::kEmbedding:
      return product({d.vocab, h});
    case Role::kRouter:
      if (last == "shared_expert_gate") return product({1, h});
      if (last == "gate" || last == "router" || last == "proj") return product({d.experts, h});
      return std::nullopt;
    case Role::kRoutedExperts:
    case Role::kMtpExperts:
    case Role::kSharedExperts:
    case Role::kDenseMlp: {
      // The width of one expert / MLP of this role.
      int64_t inter = d.intermediate;
      if (role == Role::kRoutedExperts || role == Role::kMtpExperts) {
        inter = arch.family == Family::kGptOss ? d.intermediate : d.moe_intermediate;
      } else if (role == Role::kSharedExperts) {
        inter = d.shared_intermediate > 0                  ? d.shared_intermediate
                : d.n_shared > 0 && d.moe_intermediate > 0 ? d.n_shared * d.moe_intermediate
                                                           : 0;
      }
      // A fused expert tensor (gpt-oss, Gemma 4) holds every expert; gate_up is two matrices.
      const bool fused = (role == Role::kRoutedExperts || role == Role::kMtpExperts) &&
                         !one_expert(name) && has(name, "experts");
      const int64_t experts = fused ? d.experts : 1;
      if (last == "gate_up_proj") return product({experts, 2 * inter, h});
      for (std::string_view m : {"gate_proj", "up_proj", "w1", "w3", "fc1"}) {
        if (last == m) return product({experts, inter, h});
      }
      for (std::string_view m : {"down_proj", "w2", "fc2"}) {
        if (last == m) return product({experts, h, inter});
      }
      return std::nullopt;
    }
    case Role::kAttention:
    case Role::kMtpOther: {
      const int64_t heads = d.heads, hd = d.head_dim;
      const bool mla = d.kv_lora > 0 || d.q_lora > 0;
      const int64_t qk = d.qk_nope + d.qk_rope;
      if (has(name, "indexer")) {
        if (last == "wq_b") return product({d.index_heads, d.index_head_dim, d.q_lora});
        if (last == "wk") return product({d.index_head_dim, h});
        if (last == "weights_proj") return product({d.index_heads, h});
        return std::nullopt;
      }
      if (last == "q_a_proj" || last == "wq_a") return product({d.q_lora, h});
      if (last == "q_b_proj") return product({heads, qk, d.q_lora});
      if (last == "kv_a_proj_with_mqa") return product({d.kv_lora + d.qk_rope, h});
      if (last == "kv_b_proj") return product({heads, d.qk_nope + d.v_head, d.kv_lora});
      // DeepSeek-V4: one shared KV head of head_dim, grouped low-rank output projection.
      if (last == "wq_b") return product({heads, hd, d.q_lora});
      if (last == "wkv") return product({hd, h});
      if (last == "wo_a") return product({d.o_lora, heads, hd});
      if (last == "wo_b") return product({h, d.o_groups, d.o_lora});
      if (last == "eh_proj") return product({h, 2 * h});
      if (last == "e_proj" || last == "h_proj") return product({h, h});
      if (has(name, "linear_attn")) {
        const int64_t key = d.lin_k_heads * d.lin_k_dim, value = d.lin_v_heads * d.lin_v_dim;
        if (last == "in_proj_qkv") return product({2 * key + value, h});
        if (last == "in_proj_z") return product({value, h});
        if (last == "out_proj") return product({h, value});
        return std::nullopt;
      }
      if (last == "q_proj") {
        if (mla) return product({heads, qk, h});
        return product({d.output_gate ? 2 : 1, heads, hd, h});
      }
      if (last == "k_proj" || last == "v_proj") return product({d.kv_heads, hd, h});
      if (last == "o_proj") return product({h, heads, mla ? d.v_head : hd});
      return std::nullopt;
    }
    case Role::kSsm: {
      // Mamba-2: in_proj makes z, x, B, C and dt; out_proj maps d_inner back.
      const int64_t inner = d.mamba_heads * d.mamba_head_dim;
      if (last == "in_proj") {
        return product({2 * inner + 2 * d.ssm_groups * d.ssm_state + d.mamba_heads, h});
      }
      if (last == "out_proj") return product({h, inner});
      return std::nullopt;
    }
    case Role::kVision:
    case Role::kOther:
      return std::nullopt;
  }
  return std::nullopt;
}

std::optional<double> bytes_per_param(const SchemeSpec& spec, const ModelDims& dims) {
  auto scale_bytes = [&]() -> double { return spec.scale == ScaleType::kF32 ? 4.0 : 1.0; };
  switch (spec.scheme) {
    case Scheme::kNvfp4:
      return 0.5 + 1.0 / 16;
    case Scheme::kMxfp4:
      return 0.5 + 1.0 / 32;
    case Scheme::kFp8Block: {
      const double g = spec.group_size > 0 ? spec.group_size : 128;
      return 1.0 + scale_bytes() / (g * g);
    }
    case Scheme::kFp8Tensor:
    case Scheme::kFp8Channel:
      return 1.0;
    case Scheme::kMxfp8:
      return 1.0 + 1.0 / 32;
    case Scheme::kInt4: {
      const double g = spec.group_size > 0 ? spec.group_size : 128;
      return 0.5 + 2.0 / g;
    }
    case Scheme::kBf16:
      return dims.unquantized_bytes;
    case Scheme::kAbsent:
    case Scheme::kUnknown:
      return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace fp4moe::detect
