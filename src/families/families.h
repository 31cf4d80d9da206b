// The model-family table: one row per way a family names its tensors (model types, layer prefix,
// MoE block names, fused-expert layout, MTP placement, routing semantics, which commands run it).
// Read by detect/ (family from model_type, configs-only names, prefixes), model/ (the namings
// verify and bench look for) and, through model/, convert/. Depends on nothing but core/.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace fp4moe::families {

// Families as detect/ tells them apart (attention and layer layout differ even where the MoE
// names agree: Qwen3-MoE routes with DeepSeek-V3's names).
enum class Family {
  kDeepseekV3,  // deepseek_v3/v32, kimi_k2, glm_moe_dsa: model.layers.L.{self_attn,mlp}.*
  kDeepseekV4,  // deepseek_v4 reference checkpoint: layers.L.{attn,ffn}.*, mtp.N.*, head, embed
  kQwen3,       // qwen3, qwen3_moe, llama-like: model.layers.L.{self_attn,mlp}.*
  kQwen35,      // qwen3_5(_moe): linear_attn + self_attn, mlp.shared_expert, mtp.layers.N.*
  kMiniMax,     // minimax_m2: block_sparse_moe.experts.E.w{1,2,3}
  kGptOss,      // gpt_oss: fused mlp.experts.{gate_up,down}_proj (_blocks/_scales)
  kGemma4,      // gemma4: dense mlp + router + fused experts per layer
  kNemotronH,   // nemotron_h: backbone.layers.L.mixer.* per hybrid pattern
  kStep,        // step3p7: DeepSeek-like layout, names not confirmed
  kGeneric,     // anything else: generic HF names, flagged by a finding
};

// Where a family keeps its MTP (next-n) layers.
enum class MtpPlacement {
  kUnknown,    // names not known
  kAppended,   // <layer_prefix>{num_hidden_layers + i}. (DeepSeek-V3)
  kOwnPrefix,  // mtp.{i}. (DeepSeek-V4 reference names)
  kMtpLayers,  // mtp.layers.{i}. (Qwen3.5)
};

// How the routed experts of a layer are stored.
enum class ExpertLayout {
  kPerExpert,    // <experts>{E}.<gate|up|down> matrices
  kFusedGateUp,  // <experts><gate> [E, 2I, H] (gate and up rows interleaved), <experts><down>
};

// How the router weights the selected experts (MOE_SEMANTICS.md); model/ reads config keys for
// the rest (scoring_func, routed_scaling_factor, n_group).
enum class Routing {
  kNone,           // model/ does not run this family
  kNormTopkProb,   // DeepSeek-V3, Kimi, GLM, Qwen3-MoE: renormalize iff norm_topk_prob
  kV4,             // DeepSeek-V4: renormalize iff scoring is not softmax; hash layers first
  kAlwaysRenorm,   // MiniMax-M2 (HF MiniMaxM2SparseMoeBlock, vLLM renormalize=True)
  kSoftmaxOfTopK,  // gpt-oss: softmax over the top-k logits, swiglu limit 7, alpha 1.702
};

// Commands that run a row's checkpoints (detect-only rows are inspected and planned).
enum Runs : unsigned { kDetect = 1, kVerify = 2, kConvert = 4 };

// One naming of one family. Names inside a layer are relative to "<layer_prefix>{L}."; "{E}" is
// the expert index. Empty: the family has no such module.
struct FamilyNaming {
  Family family{};
  std::string_view key{};         // model/'s family name: "deepseek_v4", "gpt_oss", ...
  std::string_view display{};     // detect/'s: "deepseek-v4", "qwen3.5", ...
  std::string_view convention{};  // this row's naming convention, where a family has several
  std::span<const std::string_view> model_types{};  // config.json (text) model_type
  std::string_view layer_prefix{};                  // "model.layers."
  std::string_view lm_head{};                       // "lm_head"
  std::string_view embed{};                         // "model.embed_tokens"
  std::string_view router{};                        // router module: "mlp.gate"
  std::string_view router_logit_bias{};             // tensor added to the logits (gpt-oss)
  std::string_view router_correction_bias{};  // e_score_correction_bias tensor (selection only)
  std::string_view experts{};      // routed experts: "mlp.experts.{E}." (fused: "mlp.experts.")
  std::string_view shared{};       // shared experts: "mlp.shared_experts."
  std::string_view shared_gate{};  // the shared expert's own gate (Qwen3.5 shared_expert_gate)
  std::string_view dense_mlp{};    // dense MLP of non-MoE layers: "mlp."
  std::string_view gate{}, up{}, down{};  // members: "gate_proj", "up_proj", "down_proj"
  std::string_view dense_gate = "gate_proj", dense_up = "up_proj", dense_down = "down_proj";
  ExpertLayout layout = ExpertLayout::kPerExpert;
  MtpPlacement mtp = MtpPlacement::kUnknown;
  std::span<const std::string_view> mtp_extra{};  // MTP-only modules: "eh_proj"
  bool names_confirmed = true;    // false: the names are assumed (detect/ says so in a finding)
  bool experts_confirmed = true;  // false: the routed-expert names are (where there are experts)
  Routing routing = Routing::kNone;
  unsigned runs = kDetect;
};

// A VLM wrapper that keeps the language model under a prefix: by its top-level model_type, or
// (`any`) tried on every checkpoint by model/'s tensor lookup.
struct VlmPrefix {
  std::string_view top_model_type;  // "kimi_k25"; empty: tried on every checkpoint
  std::string_view prefix;          // "language_model."
};

// Every row, in lookup order (the first row of a family is its own checkpoint naming).
std::span<const FamilyNaming> table();
// Every VLM prefix.
std::span<const VlmPrefix> vlm_prefixes();

// The first row of `family` (every family has one).
const FamilyNaming& first_row(Family family);
// The rows of `family`, in table order (its naming conventions).
int convention_count(Family family);
const FamilyNaming& convention(Family family, int index);
// The family whose row lists `model_type`; kGeneric when none does.
Family family_of(std::string_view model_type);
// The VLM prefix of a top-level model_type, "" when none.
std::string_view vlm_prefix_of(std::string_view top_model_type);

// A name of the row's layer `layer` ("{L}") and expert `expert` ("{E}"): the full name of
// `relative` (one of the row's fields) under its layer prefix.
std::string layer_name(const FamilyNaming& row, std::string_view relative, int layer,
                       int expert = 0);
// The prefix of MTP layer `index` of a family whose MTP names are known (row.mtp), ending in '.':
// "model.layers.{num_layers + index}.", "mtp.{index}." or "mtp.layers.{index}.".
// `layer_prefix` is the checkpoint's (with any VLM prefix).
std::string mtp_layer_prefix(const FamilyNaming& row, std::string_view layer_prefix, int index,
                             int num_layers);
// The same with "{L}" (and "{E}") kept as templates.
std::string layer_template(const FamilyNaming& row, std::string_view relative);

}  // namespace fp4moe::families
