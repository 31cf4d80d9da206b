// One MoE layer on the CPU: route, group tokens by expert (each expert's weights are read once
// per batch), gate/up products, the gated activation, down products, weighted combine, plus the
// shared experts. Kernels are chosen once, when the layer is created.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "dispatch/linear.h"
#include "moe/router.h"
#include "pack/pack.h"

namespace fp4moe::moe {

enum class GatedActivation : uint8_t {
  // silu(min(g, L)) * clip(u, -L, L); L <= 0: plain silu(g) * u (DeepSeek-V3/V4, Qwen3, Mixtral).
  kSwiGlu,
  // gpt-oss: g' = min(g, L), u' = clip(u, -L, L), g' * sigmoid(alpha * g') * (u' + 1).
  kSwiGluOai,
};

struct ActivationConfig {
  GatedActivation kind = GatedActivation::kSwiGlu;
  float limit = 0.0f;    // DeepSeek-V4 swiglu_limit (10), gpt-oss limit (7); <= 0: no clamp
  float alpha = 1.702f;  // gpt-oss only
};

// One expert's weights in kernel layout: gate and up [I, H], down [H, I]; the biases (gpt-oss,
// F32, split from the interleaved gate_up bias by the loader) are empty when absent.
struct ExpertWeights {
  const pack::PackedWeights* gate = nullptr;
  const pack::PackedWeights* up = nullptr;
  const pack::PackedWeights* down = nullptr;
  std::span<const float> gate_bias, up_bias, down_bias;
};

struct MoeConfig {
  RouterConfig router;
  ActivationConfig routed_activation;
  ActivationConfig shared_activation;  // DeepSeek-V4 clamps the shared expert too (default)
  int64_t hidden = 0;
};

// The phases of one forward call, in order. The layer's own overheads are every phase but the
// two product phases; `fp4moe bench --moe` reports each against the whole call.
enum class MoePhase : uint8_t {
  kRouterLogits,  // router GEMV (reads the router weights), split over the pool
  kRouteSelect,   // top-k selection and routing weights, per token
  kGroup,         // counting sort of (token, choice) pairs by expert, inputs gathered
  kQuantize,      // W4A8 only: gathered inputs (and the tokens, for shared experts) to int8
  kGateUp,        // gate and up products of the active and shared experts (one pool job)
  kActivation,    // gated activation (and its int8 quantization for a W4A8 down product)
  kDown,          // down products (one pool job)
  kCombine,       // weighted sum of the choices plus the shared experts
};
inline constexpr int kMoePhases = 8;
std::string_view moe_phase_name(MoePhase phase);

// Wall seconds of each phase of the last forward call (steady_clock read at each boundary, about
// 20 ns a read), and how many thread-pool jobs the call handed off (a job of one task runs on the
// calling thread and is not one).
struct MoePhaseTimes {
  double seconds[kMoePhases] = {};
  int pool_jobs = 0;
  double total() const {
    double t = 0;
    for (double s : seconds) t += s;
    return t;
  }
};

class MoeLayer {
 public:
  // Checks shapes and parameters, plans every product (one kernel choice per matrix) and sizes
  // the workspace for up to `max_tokens` per forward call. With Precision::kW4A8 every FP4 matrix
  // runs the W4A8 kernel (its activations quantized to int8 once per forward and role: gate and
  // up share one quantization); FP8 matrices, which have no int8 kernel, take the activations
  // rounded to BF16 (8 significant bits, finer than the FP4 products' int8 per block) through the
  // BF16-activation kernels (exact products of the rounded activations; on a host without one the
  // exact kernel runs on them widened), the same rounding on every host. The routed experts' FP4
  // matrices must then share one format (one activation block), as must the shared experts'.
  static Result<MoeLayer> create(const MoeConfig& config, const RouterWeights& router,
                                 std::vector<ExpertWeights> experts,
                                 std::vector<ExpertWeights> shared_experts, int64_t max_tokens,
                                 std::optional<kernels::Isa> isa = std::nullopt,
                                 dispatch::Precision precision = dispatch::Precision::kExact);

  // y [tokens, hidden] = sum_k w_k * expert_k(x) + sum_s shared_s(x), for x [tokens, hidden].
  // Allocates nothing. Also returns each token's (expert, weight) choices via ids()/weights().
  Status forward(const float* x, int64_t tokens, float* y, ThreadPool& pool);

  std::span<const int32_t> ids() const { return ids_; }
  std::span<const float> route_weights() const { return route_weights_; }
  // Weight bytes the last forward streamed: the router weights, each active expert once, shared
  // experts once.
  size_t last_bytes_read() const { return last_bytes_; }
  const MoePhaseTimes& last_phase_times() const { return phase_times_; }
  std::string describe() const;

 private:
  struct Expert {
    ExpertWeights w;
    dispatch::LinearPlan gate, up, down;
    int64_t inter;
  };
  struct Task {  // one range of tiles of one product
    const dispatch::LinearPlan* plan;
    const float* x;                    // exact plans
    const uint16_t* xb;                // exact plans that take BF16 activations (stride ldx)
    kernels::QuantizedActivations xq;  // W4A8 plans
    int64_t ldx, m;
    float* y;
    int64_t ldy, tile_begin, tile_end;
  };
  MoeLayer() = default;
  // x feeds an exact plan, xq (the same rows, quantized) a W4A8 one, xb (the same rows as BF16)
  // an exact one that takes_bf16().
  void add_tasks(const dispatch::LinearPlan& plan, const float* x, const uint16_t* xb, int64_t ldx,
                 const kernels::QuantizedActivations& xq, int64_t m, float* y, int64_t ldy,
                 int threads);
  // Whether `plan` takes BF16-rounded activations: an exact plan (a format without W4A8 kernels,
  // i.e. FP8) in a W4A8 layer.
  bool takes_bf16(const dispatch::LinearPlan& plan) const {
    return precision_ == dispatch::Precision::kW4A8 &&
           plan.precision() == dispatch::Precision::kExact;
  }
  // Runs tasks_ [0, routed_end) (routed products) and [routed_end, end) (shared products),
  // the shared ones spread evenly among the routed ones (see the definition).
  void run_tasks(ThreadPool& pool, size_t routed_end);

  MoeConfig config_;
  RouterWeights router_;  // its weight (F32) or weight_bf16 points into router_storage_
  // The router weights, copied at create into memory allocated as packed weights are
  // (core/streamed_memory.h): every call streams them, and a caller's ordinary allocation is in
  // 4 KiB pages, which the hardware prefetchers do not run past (2-core Zen 4, DeepSeek-V4-Flash
  // layer, batch 1: router_logits 175-186 us in the caller's vector, 138-151 us in 2 MiB pages).
  // As BF16 where every weight is exact in BF16 (RouterWeights::weight_bf16).
  StreamedBuffer router_storage_;
  std::vector<Expert> experts_, shared_;
  int64_t max_tokens_ = 0, max_inter_ = 0, shared_inter_total_ = 0;
  // Workspace (sized at create).
  std::vector<float> router_scratch_;
  std::vector<float> logits_;  // [max_tokens, E]
  std::vector<int32_t> ids_;
  std::vector<float> route_weights_;
  // slot_of_[t * K + k]: that choice's row in the expert-grouped set; slot_expert_ and
  // slot_token_: the expert and the token of each row.
  std::vector<int32_t> counts_, offsets_, slot_of_, slot_expert_, slot_token_;
  std::vector<float> xg_;         // gathered inputs [T * K, H], grouped by expert
  std::vector<float> gate_, up_;  // [T * K, I_max]
  std::vector<float> out_;        // [T * K, H]
  std::vector<float> shared_gate_, shared_up_, shared_out_;  // [T, I_s], [T, I_s], [n_s, T, H]
  std::vector<Task> tasks_, order_;  // order_: tasks_ in the order run_tasks hands them out
  // W4A8 activations (empty when no plan of that role is W4A8): the grouped inputs, the tokens
  // for the shared experts, and the gated activations feeding the routed / shared down products.
  // routed_tok_q_: the tokens themselves in the routed inputs' block, which a call reads in place
  // of the grouped ones where every active expert's rows are consecutive tokens (always at one
  // token): each token quantized once instead of once per choice (forward()).
  dispatch::QuantizedActivationBuffer routed_in_q_, routed_tok_q_, shared_in_q_, routed_act_q_,
      shared_act_q_;
  bool routed_in_w4a8_ = false, shared_in_w4a8_ = false;
  bool routed_in_exact_ = false;  // some routed gate/up product is exact (reads xg_)
  // BF16 activations (takes_bf16), each empty when no plan of that role takes them; indexed as the
  // F32 buffer they round: xg_, the tokens (x), gate_ and shared_gate_.
  std::vector<uint16_t> routed_in_b_, shared_in_b_, routed_act_b_, shared_act_b_;
  dispatch::Precision precision_ = dispatch::Precision::kExact;
  // The activation quantizer of the W4A8 plans, resolved once at create (nullptr when none is
  // W4A8).
  kernels::QuantizeActivationsFn quantizer_ = nullptr;
  size_t last_bytes_ = 0;
  MoePhaseTimes phase_times_;
};

// Applies the gated activation in place: gate[i] <- act(gate[i] + gate_bias, up[i] + up_bias).
void apply_gated_activation(const ActivationConfig& act, float* gate, const float* up, int64_t n,
                            std::span<const float> gate_bias, std::span<const float> up_bias);

}  // namespace fp4moe::moe
