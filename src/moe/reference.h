// The FP64 reference of one MoE layer: routing, gated activations, expert biases and the combine
// written out in double, one token at a time, from dense (already dequantized) weights. The one
// statement of the MoE semantics (router.h, moe_layer.h; sources in /work/shared/MOE_SEMANTICS.md)
// that the kernel path is checked against: `fp4moe verify` (model/) and the MoE tests use it.
// It shares no code with router.cc or moe_layer.cc.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "moe/moe_layer.h"
#include "moe/router.h"

namespace fp4moe::moe::reference {

// One token's routing.
struct Routing {
  std::vector<int> ids;         // the selected experts, best first (ties: lower index)
  std::vector<double> weights;  // their routing weights, routed_scaling_factor included
  std::vector<double> keys;     // [E] what selection ranks: the biased scores (-inf outside the
                                // kept groups), or the logits for kSoftmaxOfTopK
  std::vector<double> values;   // [E] what weights are made of: the unbiased scores, or the
                                // logits for kSoftmaxOfTopK
};

// logits = W x + logit_bias in double; scores, group-limited selection and weights per `config`.
Routing route(const RouterConfig& config, const RouterWeights& router, const float* x,
              int64_t hidden);

// The routing weights `route` gives when `ids` are the selected experts (a caller that follows
// another path's choice on a tie gets that choice's weights by the same rule).
std::vector<double> weights_for(const RouterConfig& config, const Routing& routing,
                                std::span<const int> ids);

// act(g, u) of `config`, in double (clamps included).
double activation(const ActivationConfig& config, double g, double u);

// One expert's dense weights: gate and up [inter, hidden], down [hidden, inter], row-major;
// biases empty or [inter], [inter], [hidden].
struct DenseExpertView {
  std::span<const float> gate, up, down;
  std::span<const float> gate_bias, up_bias, down_bias;
  int64_t inter = 0;
};

// y += w * (down · act(gate · x + b_gate, up · x + b_up) + b_down): the down bias is weighted
// with the rest (gpt-oss MLPBlock). `abs_sum` (may be null) += |w| * the sum of the magnitudes of
// the terms of each output: the scale rounding errors of an F32 evaluation are relative to.
void expert_forward(const DenseExpertView& expert, const ActivationConfig& act, const double* x,
                    int64_t hidden, double w, double* y, double* abs_sum);

}  // namespace fp4moe::moe::reference
