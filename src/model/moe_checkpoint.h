// A checkpoint's MoE layers as runnable layers: reads the model family's routing semantics from
// config.json, finds each layer's router, routed and shared experts by the family's tensor names,
// packs them for the CPU kernels (pack/) and dequantizes them for the reference (formats/).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/checkpoint_dir.h"
#include "core/status.h"
#include "families/families.h"
#include "formats/storage.h"
#include "moe/moe_layer.h"
#include "moe/reference.h"
#include "pack/pack.h"

namespace fp4moe::model {

// Tensor names of one model family's MoE block ("{L}" = layer, "{E}" = expert): a row of the
// family table (families/families.h) that verify runs, with full name templates; a VLM wrapper's
// prefix (families::vlm_prefixes) is prepended when that is where the checkpoint keeps them.
struct MoeNaming {
  std::string family;             // "deepseek_v4", "deepseek_v3", "gpt_oss", "minimax_m2", ...
  std::string example;            // one routed-expert tensor name, for messages
  std::string router_weight;      // "layers.{L}.ffn.gate.weight"
  std::string router_logit_bias;  // gpt-oss router Linear bias (added to the logits)
  std::string router_bias;        // e_score_correction_bias (selection only)
  std::string expert_prefix;      // "layers.{L}.ffn.experts.{E}." ("{E}"-less when fused)
  std::string shared_prefix;      // "layers.{L}.ffn.shared_experts." or empty
  std::string gate, up, down;     // "w1", "w3", "w2"; fused: "gate_up_proj", "", "down_proj"
  // gpt-oss: all experts of a layer in `<prefix><gate>_blocks` [E, 2I, K/32, 16] (gate and up
  // rows interleaved), `<prefix><down>_blocks` [E, H, I/32, 16], `_scales` and `_bias` beside.
  bool fused = false;
  families::Routing routing = families::Routing::kNone;  // the row's routing semantics
};

struct MoeModelInfo {
  MoeNaming naming;
  std::string model_type;  // config.json (or its text_config) model_type
  moe::MoeConfig config;   // router, activations, hidden
  int num_layers = 0;
  int num_hash_layers = 0;      // DeepSeek-V4 layers routed by token id (not verifiable here)
  std::vector<int> moe_layers;  // layers with routed experts and a score router
};

// Reads config.json and the tensor names; an error when the checkpoint has no MoE layer this tool
// can run, in one sentence naming the family, layout or storage it cannot handle.
Result<MoeModelInfo> read_moe_model(const checkpoint::CheckpointDir& dir);

// The family table, read by convert/ too: the naming of `dir`'s routed experts, i.e. the first row
// of the table that verify runs (with a VLM prefix where the checkpoint keeps one) whose expert 0
// of some layer L < num_hidden_layers exists in any storage this project reads (`.weight`,
// `.weight_packed`; fused: `<gate>_blocks` MXFP4 or `<gate>` NVFP4). Otherwise an error in one
// sentence naming the model_type and every known naming; `who` says which command cannot go on
// ("verify and bench run").
Result<MoeNaming> find_moe_naming(const checkpoint::CheckpointDir& dir, std::string_view who);

// Every row of the family table, without prefixes (convert/ pairs gate and up by these names).
std::span<const MoeNaming> moe_namings();

// The fnmatch glob over module names that covers exactly the routed experts of `naming` in every
// layer: "model.layers.*.mlp.experts.*" (per-expert modules "...experts.7.gate_proj"; fused
// tensor families "...experts.gate_up_proj"). `*` crosses dots (fnmatch without FNM_PATHNAME).
std::string routed_expert_glob(const MoeNaming& naming);

// One matrix as stored: its row of the stored-form table (formats/storage.h), and its tensors.
struct StoredMatrix {
  std::string module;                             // "layers.3.ffn.experts.7.w1"
  const formats::StoredFormInfo* form = nullptr;  // a row with a codec
  std::string scheme;                             // the row's: "mxfp4", "nvfp4", "fp8_block"
  int64_t n = 0, k = 0;
  const checkpoint::CheckpointTensor* weight = nullptr;
  const checkpoint::CheckpointTensor* scale = nullptr;         // block scales
  const checkpoint::CheckpointTensor* tensor_scale = nullptr;  // NVFP4 weight_scale_2
  // compressed-tensors stores weight_global_scale, the reciprocal of ModelOpt's weight_scale_2.
  bool reciprocal_tensor_scale = false;
  // Rows of a stacked tensor (gpt-oss): the weight has source_rows rows, the matrix takes these.
  pack::RowSelection rows;
  int64_t source_rows = 0;
};

// An expert's weights dequantized by formats/ (independent of pack/ and the kernels), for the
// reference; the biases point into the layer.
struct DenseExpert {
  std::vector<float> gate, up, down;  // [I, H], [I, H], [H, I]
  std::span<const float> gate_bias, up_bias, down_bias;
  int64_t inter = 0;
  moe::reference::DenseExpertView view() const {
    return {gate, up, down, gate_bias, up_bias, down_bias, inter};
  }
};

class MoeCheckpointLayer {
 public:
  static Result<MoeCheckpointLayer> load(const checkpoint::CheckpointDir& dir,
                                         const MoeModelInfo& info, int layer);

  int layer() const { return layer_; }
  const moe::MoeConfig& config() const { return config_; }
  moe::RouterWeights router() const { return {router_weight_, router_logit_bias_, router_bias_}; }
  const std::vector<moe::ExpertWeights>& experts() const { return experts_; }
  const std::vector<moe::ExpertWeights>& shared() const { return shared_; }
  std::string expert_scheme() const;  // of the routed experts' gate matrices
  std::string shared_scheme() const;
  size_t packed_bytes() const { return packed_bytes_; }
  size_t stored_bytes() const { return stored_bytes_; }  // checkpoint bytes of all matrices

  // Dequantized through formats/ (independent of pack/ and the kernels): the reference's weights.
  Result<DenseExpert> dense_expert(int expert) const;
  Result<DenseExpert> dense_shared(int shared) const;
  int shared_count() const { return static_cast<int>(shared_matrices_.size()); }

 private:
  MoeCheckpointLayer() = default;
  const checkpoint::CheckpointDir* dir_ = nullptr;
  int layer_ = 0;
  moe::MoeConfig config_;
  std::vector<float> router_weight_, router_logit_bias_, router_bias_;
  std::deque<std::vector<float>> biases_;   // per-expert biases (gpt-oss), split from the layer's
  std::deque<pack::PackedWeights> packed_;  // stable addresses for ExpertWeights
  std::vector<moe::ExpertWeights> experts_, shared_;
  std::vector<std::array<StoredMatrix, 3>> expert_matrices_, shared_matrices_;
  size_t packed_bytes_ = 0, stored_bytes_ = 0;
};

// The reference forward (moe/reference.h) of a checkpoint layer: routing in double from the same
// router weights, every active expert dequantized once, products and activations in double. Where
// the kernel path selected a different expert set for a token and the reference's scores show a tie
// (the two sets' scores within `kRoutingTieTolerance`), the kernel path's set is used for that
// token and counted.
struct ReferenceOutput {
  std::vector<double> y;       // [tokens, hidden]
  int routing_ties = 0;        // tokens whose selection differed within the tie tolerance
  int routing_mismatches = 0;  // tokens whose selection differed beyond it (an error)
};
Result<ReferenceOutput> reference_forward(const MoeCheckpointLayer& layer, const float* x,
                                          int64_t tokens, std::span<const int32_t> kernel_ids);

}  // namespace fp4moe::model
