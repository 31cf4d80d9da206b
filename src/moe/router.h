// MoE routers: scores from the router logits, expert selection and routing weights, covering the
// DeepSeek-V3/V4, gpt-oss, Qwen3-MoE and Mixtral semantics (sources in router.cc and
// /work/shared/MOE_SEMANTICS.md). Ties in top-k go to the lower expert index.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/status.h"

namespace fp4moe::moe {

enum class ScoringFunc : uint8_t {
  kSoftmax,       // softmax over all experts (Qwen3-MoE, Mixtral, DeepSeek-V2)
  kSigmoid,       // sigmoid (DeepSeek-V3 `scoring_func: sigmoid`)
  kSqrtSoftplus,  // sqrt(softplus(logit)) (DeepSeek-V4 `scoring_func: sqrtsoftplus`)
};

enum class WeightRule : uint8_t {
  kScoresAtSelected,  // w = score[e] of the selected experts (DeepSeek, Qwen3-MoE)
  kSoftmaxOfTopK,     // select top-k logits, w = softmax over those k logits (gpt-oss, Mixtral)
};

struct RouterConfig {
  int num_experts = 0;
  int top_k = 0;
  ScoringFunc scoring = ScoringFunc::kSoftmax;
  WeightRule weight_rule = WeightRule::kScoresAtSelected;
  // w /= sum(w) over the selected experts, without eps. DeepSeek official: score_func != softmax;
  // Qwen3-MoE / HF: norm_topk_prob.
  bool renormalize = false;
  float routed_scaling_factor = 1.0f;  // DeepSeek route_scale / routed_scaling_factor
  // Group-limited selection (DeepSeek-V3 n_group / topk_group): only experts of the topk_group
  // best groups compete. Group score: sum of the top-2 biased scores when a correction bias is
  // used (noaux_tc), else the group's max score.
  int n_group = 1;
  int topk_group = 1;
  std::string describe() const;
};

// Router parameters, F32. `weight` [E, H]; `logit_bias` [E] (gpt-oss router Linear bias) or
// empty; `correction_bias` [E] (DeepSeek e_score_correction_bias, selection only) or empty.
// `weight_bf16`, when not empty, replaces `weight` in router_logits: the same [E, H] values as BF16
// bits, for weights that are all exact in BF16 (checkpoints store routers in BF16): they widen to
// the same F32 values, so the logits have the same bits, from half the bytes. validate_router and
// the FP64 reference read `weight`.
struct RouterWeights {
  std::span<const float> weight;
  std::span<const float> logit_bias;
  std::span<const float> correction_bias;
  std::span<const uint16_t> weight_bf16 = {};
};

Status validate_router(const RouterConfig& config, const RouterWeights& weights, int64_t hidden);

// For each of `tokens` rows of x [tokens, hidden]: ids [tokens, top_k] and weights [tokens,
// top_k], in selection order (best first). `scratch` holds >= router_scratch_floats(config).
void route(const RouterConfig& config, const RouterWeights& weights, const float* x, int64_t tokens,
           int64_t hidden, int32_t* ids, float* route_weights, std::span<float> scratch);
// The F32 logits [tokens, E] (row stride E) of experts [e_begin, e_end) for every token: the part
// of route() that reads the router weights, split by expert range so threads can share it.
void router_logits(const RouterConfig& config, const RouterWeights& weights, const float* x,
                   int64_t tokens, int64_t hidden, int e_begin, int e_end, float* logits);
// Routing of one token from its logits [E] (exposed for tests of the selection rules).
void route_logits(const RouterConfig& config, const RouterWeights& weights, const float* logits,
                  int32_t* ids, float* route_weights, std::span<float> scratch);
int64_t router_scratch_floats(const RouterConfig& config);

}  // namespace fp4moe::moe
