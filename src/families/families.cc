// The model-family table (families.h): one row per naming.
#include "families/families.h"

#include <algorithm>

#include "core/check.h"

namespace fp4moe::families {
namespace {

using sv = std::string_view;

constexpr sv kV3Types[] = {"deepseek_v3", "deepseek_v32", "deepseek_v2", "kimi_k2", "glm_moe_dsa"};
constexpr sv kV4Types[] = {"deepseek_v4", "deepseek_ref"};
constexpr sv kQwen3Types[] = {"qwen3", "qwen3_moe", "qwen2", "qwen2_moe", "llama", "mistral"};
constexpr sv kQwen35Types[] = {"qwen3_5_moe_text", "qwen3_5_text", "qwen3_5_moe", "qwen3_5"};
constexpr sv kMiniMaxTypes[] = {"minimax_m2"};
constexpr sv kGptOssTypes[] = {"gpt_oss"};
constexpr sv kGemma4Types[] = {"gemma4_text", "gemma4"};
constexpr sv kNemotronTypes[] = {"nemotron_h"};
constexpr sv kStepTypes[] = {"step3p7", "step3p5"};

constexpr sv kV3Mtp[] = {"eh_proj"};
constexpr sv kV4Mtp[] = {"e_proj", "h_proj"};

constexpr unsigned kAll = kDetect | kVerify | kConvert;

// The routing semantics of each family are in MOE_SEMANTICS.md. The first five rows are the
// namings verify, bench and convert look for, in this order; Kimi-K2 and GLM-5 use the DeepSeek-V3
// names, Qwen3-MoE the same without bias or shared expert (so model/ finds it by the V3 row).
const FamilyNaming kTable[] = {
    {.family = Family::kDeepseekV4,
     .key = "deepseek_v4",
     .display = "deepseek-v4",
     .convention = "DeepSeek-V4 reference names (layers.L.ffn.experts.E.w1)",
     .model_types = kV4Types,
     .layer_prefix = "layers.",
     .lm_head = "head",
     .embed = "embed",
     .router = "ffn.gate",
     .router_correction_bias = "ffn.gate.bias",
     .experts = "ffn.experts.{E}.",
     .shared = "ffn.shared_experts.",
     .dense_mlp = "ffn.",
     .gate = "w1",
     .up = "w3",
     .down = "w2",
     .mtp = MtpPlacement::kOwnPrefix,
     .mtp_extra = kV4Mtp,
     .routing = Routing::kV4,
     .runs = kAll},
    // Hugging Face names of DeepSeek-V4 (RedHat's compressed-tensors export).
    {.family = Family::kDeepseekV4,
     .key = "deepseek_v4",
     .display = "deepseek-v4",
     .convention = "HF-style names (model.layers.L.ffn.experts.E.gate_proj)",
     .layer_prefix = "model.layers.",
     .lm_head = "lm_head",
     .embed = "model.embed_tokens",
     .router = "ffn.gate",
     .router_correction_bias = "ffn.gate.e_score_correction_bias",
     .experts = "ffn.experts.{E}.",
     .shared = "ffn.shared_experts.",
     .dense_mlp = "ffn.",
     .gate = "gate_proj",
     .up = "up_proj",
     .down = "down_proj",
     .routing = Routing::kV4,
     .runs = kAll},
    {.family = Family::kDeepseekV3,
     .key = "deepseek_v3",
     .display = "deepseek-v3",
     .model_types = kV3Types,
     .layer_prefix = "model.layers.",
     .lm_head = "lm_head",
     .embed = "model.embed_tokens",
     .router = "mlp.gate",
     .router_correction_bias = "mlp.gate.e_score_correction_bias",
     .experts = "mlp.experts.{E}.",
     .shared = "mlp.shared_experts.",
     .dense_mlp = "mlp.",
     .gate = "gate_proj",
     .up = "up_proj",
     .down = "down_proj",
     .mtp = MtpPlacement::kAppended,
     .mtp_extra = kV3Mtp,
     .routing = Routing::kNormTopkProb,
     .runs = kAll},
    {.family = Family::kMiniMax,
     .key = "minimax_m2",
     .display = "minimax-m2",
     .model_types = kMiniMaxTypes,
     .layer_prefix = "model.layers.",
     .lm_head = "lm_head",
     .embed = "model.embed_tokens",
     .router = "block_sparse_moe.gate",
     .router_correction_bias = "block_sparse_moe.e_score_correction_bias",
     .experts = "block_sparse_moe.experts.{E}.",
     .dense_mlp = "mlp.",
     .gate = "w1",
     .up = "w3",
     .down = "w2",
     .routing = Routing::kAlwaysRenorm,
     .runs = kAll},
    {.family = Family::kGptOss,
     .key = "gpt_oss",
     .display = "gpt-oss",
     .model_types = kGptOssTypes,
     .layer_prefix = "model.layers.",
     .lm_head = "lm_head",
     .embed = "model.embed_tokens",
     .router = "mlp.router",
     .router_logit_bias = "mlp.router.bias",
     .experts = "mlp.experts.",
     .dense_mlp = "mlp.",
     .gate = "gate_up_proj",
     .down = "down_proj",
     .layout = ExpertLayout::kFusedGateUp,
     .routing = Routing::kSoftmaxOfTopK,
     .runs = kAll},
    {.family = Family::kQwen3,
     .key = "qwen3",
     .display = "qwen3",
     .model_types = kQwen3Types,
     .layer_prefix = "model.layers.",
     .lm_head = "lm_head",
     .embed = "model.embed_tokens",
     .router = "mlp.gate",
     .experts = "mlp.experts.{E}.",
     .shared = "mlp.shared_experts.",
     .dense_mlp = "mlp.",
     .gate = "gate_proj",
     .up = "up_proj",
     .down = "down_proj",
     .routing = Routing::kNormTopkProb,
     .runs = kAll},
    // Detected only: inspect, check and plan read them; verify, bench and convert name them.
    {.family = Family::kQwen35,
     .key = "qwen3_5",
     .display = "qwen3.5",
     .model_types = kQwen35Types,
     .layer_prefix = "model.language_model.layers.",
     .lm_head = "lm_head",
     .embed = "model.language_model.embed_tokens",
     .router = "mlp.gate",
     .experts = "mlp.experts.{E}.",
     .shared = "mlp.shared_expert.",
     .shared_gate = "mlp.shared_expert_gate",
     .dense_mlp = "mlp.",
     .gate = "gate_proj",
     .up = "up_proj",
     .down = "down_proj",
     .mtp = MtpPlacement::kMtpLayers},
    {.family = Family::kGemma4,
     .key = "gemma4",
     .display = "gemma4",
     .model_types = kGemma4Types,
     .layer_prefix = "model.language_model.layers.",
     .lm_head = "lm_head",
     .embed = "model.language_model.embed_tokens",
     .router = "router.proj",
     .experts = "experts.",
     .dense_mlp = "mlp.",
     .gate = "gate_up_proj",
     .down = "down_proj",
     .layout = ExpertLayout::kFusedGateUp,
     .experts_confirmed = false},
    {.family = Family::kNemotronH,
     .key = "nemotron_h",
     .display = "nemotron-h",
     .model_types = kNemotronTypes,
     .layer_prefix = "backbone.layers.",
     .lm_head = "lm_head",
     .embed = "backbone.embeddings",
     .router = "mixer.gate",
     .experts = "mixer.experts.{E}.",
     .shared = "mixer.shared_experts.",
     .dense_mlp = "mixer.",
     .up = "up_proj",
     .down = "down_proj",
     .dense_gate = ""},
    {.family = Family::kStep,
     .key = "step",
     .display = "step",
     .model_types = kStepTypes,
     .layer_prefix = "model.layers.",
     .lm_head = "lm_head",
     .embed = "model.embed_tokens",
     .router = "mlp.gate",
     .experts = "mlp.experts.{E}.",
     .shared = "mlp.shared_experts.",
     .dense_mlp = "mlp.",
     .gate = "gate_proj",
     .up = "up_proj",
     .down = "down_proj",
     .mtp = MtpPlacement::kAppended,
     .names_confirmed = false},
    {.family = Family::kGeneric,
     .key = "generic",
     .display = "generic",
     .layer_prefix = "model.layers.",
     .lm_head = "lm_head",
     .embed = "model.embed_tokens",
     .router = "mlp.gate",
     .experts = "mlp.experts.{E}.",
     .shared = "mlp.shared_experts.",
     .dense_mlp = "mlp.",
     .gate = "gate_proj",
     .up = "up_proj",
     .down = "down_proj",
     .names_confirmed = false},
};

// Kimi-K2.5 keeps the DeepSeek-V3 language model under "language_model.".
const VlmPrefix kVlmPrefixes[] = {{"kimi_k25", "language_model."}};

std::string replace_all(std::string s, sv key, sv value) {
  for (size_t pos = 0; (pos = s.find(key, pos)) != std::string::npos; pos += value.size()) {
    s.replace(pos, key.size(), value);
  }
  return s;
}

}  // namespace

std::span<const FamilyNaming> table() { return kTable; }
std::span<const VlmPrefix> vlm_prefixes() { return kVlmPrefixes; }

int convention_count(Family family) {
  return static_cast<int>(std::count_if(std::begin(kTable), std::end(kTable),
                                        [&](const FamilyNaming& r) { return r.family == family; }));
}

const FamilyNaming& convention(Family family, int index) {
  for (const auto& r : kTable) {
    if (r.family == family && index-- == 0) return r;
  }
  FP4MOE_CHECK(false && "family without that convention");
  return kTable[0];
}

const FamilyNaming& first_row(Family family) { return convention(family, 0); }

Family family_of(std::string_view model_type) {
  for (const auto& r : kTable) {
    if (std::find(r.model_types.begin(), r.model_types.end(), model_type) != r.model_types.end()) {
      return r.family;
    }
  }
  return Family::kGeneric;
}

std::string_view vlm_prefix_of(std::string_view top_model_type) {
  for (const auto& p : kVlmPrefixes) {
    if (p.top_model_type == top_model_type) return p.prefix;
  }
  return {};
}

std::string mtp_layer_prefix(const FamilyNaming& row, std::string_view layer_prefix, int index,
                             int num_layers) {
  switch (row.mtp) {
    case MtpPlacement::kAppended:
      return std::string(layer_prefix) + std::to_string(num_layers + index) + ".";
    case MtpPlacement::kOwnPrefix:
      return "mtp." + std::to_string(index) + ".";
    case MtpPlacement::kMtpLayers:
      return "mtp.layers." + std::to_string(index) + ".";
    case MtpPlacement::kUnknown:
      break;
  }
  return {};
}

std::string layer_template(const FamilyNaming& row, std::string_view relative) {
  return std::string(row.layer_prefix) + "{L}." + std::string(relative);
}

std::string layer_name(const FamilyNaming& row, std::string_view relative, int layer, int expert) {
  return replace_all(replace_all(layer_template(row, relative), "{L}", std::to_string(layer)),
                     "{E}", std::to_string(expert));
}

}  // namespace fp4moe::families
