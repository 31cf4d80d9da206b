// The CPU MoE layer (see moe_layer.h). Expert semantics and their sources:
//  - SwiGLU with DeepSeek-V4 clamp, `inference/model.py` Expert.forward: gate = w1(x), up = w3(x);
//    if swiglu_limit > 0: up = clamp(up, -L, L), gate = clamp(gate, max=L); silu(gate) * up; the
//    shared expert is built with the same swiglu_limit in the current official file, HF, vLLM
//    and SGLang (MOE_SEMANTICS.md, ambiguity 1), hence a separate shared ActivationConfig.
//  - gpt-oss `gpt_oss/torch/model.py` swiglu(x, alpha=1.702, limit=7.0): x_glu.clamp(max=limit),
//    x_linear.clamp(-limit, limit), x_glu * sigmoid(alpha * x_glu) * (x_linear + 1); biases on
//    both projections, and the down bias is weighted by the routing weight with the rest.
//  - Combine (DeepSeek MoE.forward, Qwen3 HF): y = sum_k w_k * expert_k(x) + shared(x), the
//    shared expert unscaled. DeepSeek-V4 multiplies w_k into the intermediate before w2 and HF
//    after down_proj; equal in exact arithmetic; here it is applied after down.
#include "moe/moe_layer.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "formats/scalar.h"

namespace fp4moe::moe {
namespace {

Error moe_error(const std::string& why) { return Error{"moe layer: " + why}; }

Status check_expert(const ExpertWeights& e, const std::string& name, int64_t hidden,
                    int64_t* inter) {
  if (e.gate == nullptr || e.up == nullptr || e.down == nullptr) {
    return moe_error(name + ": gate, up and down are all required");
  }
  const int64_t i = e.gate->n();
  if (e.gate->k() != hidden || e.up->k() != hidden || e.up->n() != i || e.down->n() != hidden ||
      e.down->k() != i) {
    return moe_error(name + ": shapes gate [" + std::to_string(e.gate->n()) + ", " +
                     std::to_string(e.gate->k()) + "], up [" + std::to_string(e.up->n()) + ", " +
                     std::to_string(e.up->k()) + "], down [" + std::to_string(e.down->n()) + ", " +
                     std::to_string(e.down->k()) + "] do not fit hidden " + std::to_string(hidden));
  }
  auto bias_ok = [](std::span<const float> b, int64_t n) {
    return b.empty() || static_cast<int64_t>(b.size()) == n;
  };
  if (!bias_ok(e.gate_bias, i) || !bias_ok(e.up_bias, i) || !bias_ok(e.down_bias, hidden)) {
    return moe_error(name + ": a bias does not match its projection's output size");
  }
  *inter = i;
  return Status::Ok();
}

// Marks phase boundaries of one forward call into MoePhaseTimes.
class PhaseClock {
 public:
  explicit PhaseClock(MoePhaseTimes& out) : out_(out), last_(Clock::now()) { out_ = {}; }
  void end(MoePhase phase) {
    const auto now = Clock::now();
    out_.seconds[static_cast<int>(phase)] += std::chrono::duration<double>(now - last_).count();
    last_ = now;
  }
  // A pool job of `tasks` tasks: one of a single task runs on the calling thread
  // (ThreadPool::run), so it is not counted.
  void job(int64_t tasks) { out_.pool_jobs += tasks > 1 ? 1 : 0; }

 private:
  using Clock = std::chrono::steady_clock;
  MoePhaseTimes& out_;
  Clock::time_point last_;
};

}  // namespace

std::string_view moe_phase_name(MoePhase phase) {
  switch (phase) {
    case MoePhase::kRouterLogits:
      return "router_logits";
    case MoePhase::kRouteSelect:
      return "route_select";
    case MoePhase::kGroup:
      return "group";
    case MoePhase::kQuantize:
      return "quantize";
    case MoePhase::kGateUp:
      return "gate_up";
    case MoePhase::kActivation:
      return "activation";
    case MoePhase::kDown:
      return "down";
    case MoePhase::kCombine:
      return "combine";
  }
  return "?";
}

namespace {

// Four floats in GCC's vector extension, the baseline build's SSE2 width: no ISA-specific file or
// dispatch is needed for the gated activation.
using F4 = float __attribute__((vector_size(16)));
using I4 = int32_t __attribute__((vector_size(16)));

// exp(x) lane by lane, within 2 ulp for x in [-87, 88] (Cephes' expf: x = n ln2 + r, |r| <= ln2/2,
// a degree-7 polynomial for exp(r), then 2^n made in the exponent field). x is clamped to that
// range first, so 2^n stays a normal float: exp(-87) = 1.6e-38 and exp(88) = 1.7e38 stand in for
// 0 and infinity, which changes silu(g) = g / (1 + exp(-g)) by under 1e-36 absolute. NaN stays NaN
// (each clamp keeps x when the comparison is false).
inline F4 exp4(F4 x) {
  x = x > 88.0f ? F4{} + 88.0f : x;
  x = x < -87.0f ? F4{} - 87.0f : x;
  // n = round(x / ln2): adding 1.5 * 2^23 rounds to an integer in the low mantissa bits.
  const F4 big = F4{} + 12582912.0f;
  const F4 n = (x * 1.44269504088896341f + big) - big;
  const F4 r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  F4 p = F4{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const I4 bits = (__builtin_convertvector(n, I4) + 127) << 23;
  F4 scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

inline F4 load4(const float* p) {
  F4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// act on four lanes: g, u (their biases added) in, the activation out.
inline F4 gated4(const ActivationConfig& act, F4 g, F4 u) {
  const float lim = act.limit;
  if (lim > 0.0f) {  // std::min(g, L) and std::clamp(u, -L, L), NaN kept
    g = lim < g ? F4{} + lim : g;
    u = u < -lim ? F4{} - lim : u;
    u = lim < u ? F4{} + lim : u;
  }
  if (act.kind == GatedActivation::kSwiGluOai)
    return g / (1.0f + exp4(-act.alpha * g)) * (u + 1.0f);
  return g / (1.0f + exp4(-g)) * u;
}

}  // namespace

// Four lanes at a time; a tail of fewer runs through the same lanes zero-padded, so each
// element's result does not depend on its position (a row's and a lone element's agree).
void apply_gated_activation(const ActivationConfig& act, float* gate, const float* up, int64_t n,
                            std::span<const float> gate_bias, std::span<const float> up_bias) {
  const bool gbias = !gate_bias.empty(), ubias = !up_bias.empty();
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    F4 g = load4(gate + i), u = load4(up + i);
    if (gbias) g += load4(gate_bias.data() + i);
    if (ubias) u += load4(up_bias.data() + i);
    const F4 out = gated4(act, g, u);
    std::memcpy(gate + i, &out, sizeof out);
  }
  if (i == n) return;
  const size_t bytes = sizeof(float) * static_cast<size_t>(n - i);
  alignas(16) float t[4][4] = {};  // g, u and their biases
  std::memcpy(t[0], gate + i, bytes);
  std::memcpy(t[1], up + i, bytes);
  if (gbias) std::memcpy(t[2], gate_bias.data() + i, bytes);
  if (ubias) std::memcpy(t[3], up_bias.data() + i, bytes);
  F4 g = load4(t[0]), u = load4(t[1]);
  if (gbias) g += load4(t[2]);
  if (ubias) u += load4(t[3]);
  const F4 out = gated4(act, g, u);
  std::memcpy(gate + i, &out, bytes);
}

namespace {

// rows x k of x (row stride ldx) rounded to BF16 (nearest-even) into out (row stride k).
void round_rows_bf16(const float* x, int64_t ldx, int64_t rows, int64_t k, uint16_t* out) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < k; ++j) out[r * k + j] = formats::encode_bf16(x[r * ldx + j]);
  }
}

}  // namespace

Result<MoeLayer> MoeLayer::create(const MoeConfig& config, const RouterWeights& router,
                                  std::vector<ExpertWeights> experts,
                                  std::vector<ExpertWeights> shared_experts, int64_t max_tokens,
                                  std::optional<kernels::Isa> isa, dispatch::Precision precision) {
  if (config.hidden < 1) return moe_error("hidden size must be >= 1");
  if (max_tokens < 1) return moe_error("max_tokens must be >= 1");
  FP4MOE_RETURN_IF_ERROR(validate_router(config.router, router, config.hidden));
  if (static_cast<int>(experts.size()) != config.router.num_experts) {
    return moe_error(std::to_string(experts.size()) + " experts given, the router has " +
                     std::to_string(config.router.num_experts));
  }
  MoeLayer layer;
  layer.config_ = config;
  layer.router_ = router;
  layer.precision_ = precision;
  // Router weights that are all exact in BF16 (a checkpoint's BF16 router) are kept as BF16: the
  // same logits from half the bytes (RouterWeights::weight_bf16).
  const bool bf16 = std::all_of(router.weight.begin(), router.weight.end(), [](float v) {
    return (std::bit_cast<uint32_t>(v) & 0xFFFFu) == 0;
  });
  const size_t count = router.weight.size();
  layer.router_storage_ = allocate_streamed(count * (bf16 ? sizeof(uint16_t) : sizeof(float)));
  if (layer.router_storage_ == nullptr) return moe_error("out of memory for the router weights");
  if (bf16) {
    auto* out = reinterpret_cast<uint16_t*>(layer.router_storage_.get());
    for (size_t i = 0; i < count; ++i) {
      out[i] = static_cast<uint16_t>(std::bit_cast<uint32_t>(router.weight[i]) >> 16);
    }
    layer.router_.weight = {};
    layer.router_.weight_bf16 = std::span<const uint16_t>(out, count);
  } else {
    std::memcpy(layer.router_storage_.get(), router.weight.data(), router.weight.size_bytes());
    layer.router_.weight =
        std::span<const float>(reinterpret_cast<const float*>(layer.router_storage_.get()), count);
    layer.router_.weight_bf16 = {};
  }
  layer.max_tokens_ = max_tokens;
  auto plan_all = [&](std::vector<ExpertWeights>& in, std::vector<Expert>& out,
                      const char* kind) -> Status {
    for (size_t e = 0; e < in.size(); ++e) {
      const std::string name = std::string(kind) + " " + std::to_string(e);
      int64_t inter = 0;
      FP4MOE_RETURN_IF_ERROR(check_expert(in[e], name, config.hidden, &inter));
      // W4A8 where asked for and the W4A8 family covers the format (it always has a scalar
      // kernel for the formats it covers: today the FP4 ones); exact otherwise.
      auto plan = [&](const pack::PackedWeights* w) {
        const bool covered =
            kernels::find_w4a8_kernel(w->format(), kernels::Isa::kScalar) != nullptr;
        return dispatch::LinearPlan::create(w->view(), isa,
                                            precision == dispatch::Precision::kW4A8 && covered
                                                ? precision
                                                : dispatch::Precision::kExact);
      };
      auto gate = plan(in[e].gate);
      auto up = plan(in[e].up);
      auto down = plan(in[e].down);
      for (auto* p : {&gate, &up, &down}) {
        if (!p->ok()) return moe_error(name + ": " + p->error().message);
      }
      out.push_back(Expert{in[e], *gate, *up, *down, inter});
    }
    return Status::Ok();
  };
  FP4MOE_RETURN_IF_ERROR(plan_all(experts, layer.experts_, "expert"));
  FP4MOE_RETURN_IF_ERROR(plan_all(shared_experts, layer.shared_, "shared expert"));
  int64_t max_shared_inter = 0;
  for (const Expert& e : layer.experts_) layer.max_inter_ = std::max(layer.max_inter_, e.inter);
  for (const Expert& e : layer.shared_) {
    layer.shared_inter_total_ += e.inter;
    max_shared_inter = std::max(max_shared_inter, e.inter);
  }
  // The activation block of each W4A8 role; two different blocks in one role is an Error.
  struct Role {
    int block = 0;
    bool any = false;
  };
  Role routed_in, routed_act, shared_in, shared_act;
  auto note = [&layer](Role& role, const dispatch::LinearPlan& p, const char* what) -> Status {
    if (p.precision() != dispatch::Precision::kW4A8) return Status::Ok();
    // Any W4A8 plan's quantizer serves every role: all give the same bits.
    if (layer.quantizer_ == nullptr) layer.quantizer_ = p.activation_quantizer();
    if (role.any && role.block != p.activation_block()) {
      return moe_error(std::string("W4A8 needs one FP4 format across the ") + what +
                       " (activation blocks " + std::to_string(role.block) + " and " +
                       std::to_string(p.activation_block()) + ")");
    }
    role.any = true;
    role.block = p.activation_block();
    return Status::Ok();
  };
  for (const Expert& e : layer.experts_) {
    layer.routed_in_exact_ = layer.routed_in_exact_ ||
                             e.gate.precision() == dispatch::Precision::kExact ||
                             e.up.precision() == dispatch::Precision::kExact;
    FP4MOE_RETURN_IF_ERROR(note(routed_in, e.gate, "routed gate/up products"));
    FP4MOE_RETURN_IF_ERROR(note(routed_in, e.up, "routed gate/up products"));
    FP4MOE_RETURN_IF_ERROR(note(routed_act, e.down, "routed down products"));
  }
  for (const Expert& e : layer.shared_) {
    FP4MOE_RETURN_IF_ERROR(note(shared_in, e.gate, "shared gate/up products"));
    FP4MOE_RETURN_IF_ERROR(note(shared_in, e.up, "shared gate/up products"));
    FP4MOE_RETURN_IF_ERROR(note(shared_act, e.down, "shared down products"));
  }

  const int64_t k = config.router.top_k;
  const int64_t slots = max_tokens * k;
  const int64_t h = config.hidden;
  layer.router_scratch_.resize(router_scratch_floats(config.router));
  layer.logits_.resize(max_tokens * config.router.num_experts);
  layer.ids_.resize(slots);
  layer.route_weights_.resize(slots);
  layer.counts_.resize(config.router.num_experts);
  layer.offsets_.resize(config.router.num_experts);
  layer.slot_of_.resize(slots);
  layer.slot_expert_.resize(slots);
  layer.slot_token_.resize(slots);
  layer.xg_.resize(slots * h);
  layer.gate_.resize(slots * layer.max_inter_);
  layer.up_.resize(slots * layer.max_inter_);
  layer.out_.resize(slots * h);
  layer.shared_gate_.resize(max_tokens * layer.shared_inter_total_);
  layer.shared_up_.resize(max_tokens * layer.shared_inter_total_);
  layer.shared_out_.resize(layer.shared_.size() * max_tokens * h);
  if (routed_in.any) {
    layer.routed_in_q_ = dispatch::QuantizedActivationBuffer(slots, h, routed_in.block);
    layer.routed_tok_q_ = dispatch::QuantizedActivationBuffer(max_tokens, h, routed_in.block);
    layer.routed_in_w4a8_ = true;
  }
  if (routed_act.any) {
    layer.routed_act_q_ =
        dispatch::QuantizedActivationBuffer(slots, layer.max_inter_, routed_act.block);
  }
  if (shared_in.any) {
    layer.shared_in_q_ = dispatch::QuantizedActivationBuffer(max_tokens, h, shared_in.block);
    layer.shared_in_w4a8_ = true;
  }
  if (shared_act.any) {
    layer.shared_act_q_ =
        dispatch::QuantizedActivationBuffer(static_cast<int64_t>(layer.shared_.size()) * max_tokens,
                                            max_shared_inter, shared_act.block);
  }
  auto any_bf16 = [&layer](const std::vector<Expert>& experts, auto member) {
    return std::any_of(experts.begin(), experts.end(),
                       [&](const Expert& e) { return layer.takes_bf16(e.*member); });
  };
  if (any_bf16(layer.experts_, &Expert::gate) || any_bf16(layer.experts_, &Expert::up)) {
    layer.routed_in_b_.resize(layer.xg_.size());
  }
  if (any_bf16(layer.shared_, &Expert::gate) || any_bf16(layer.shared_, &Expert::up)) {
    layer.shared_in_b_.resize(max_tokens * h);
  }
  if (any_bf16(layer.experts_, &Expert::down)) layer.routed_act_b_.resize(layer.gate_.size());
  if (any_bf16(layer.shared_, &Expert::down)) {
    layer.shared_act_b_.resize(layer.shared_gate_.size());
  }
  // Upper bound on tasks per phase: every matrix cut into at most 64 tasks.
  layer.tasks_.reserve((layer.experts_.size() + layer.shared_.size()) * 2 * 64);
  layer.order_.reserve(layer.tasks_.capacity());
  return layer;
}

void MoeLayer::add_tasks(const dispatch::LinearPlan& plan, const float* x, const uint16_t* xb,
                         int64_t ldx, const kernels::QuantizedActivations& xq, int64_t m, float* y,
                         int64_t ldy, int threads) {
  FP4MOE_CHECK(!takes_bf16(plan) || xb != nullptr);
  // Long contiguous tile ranges keep each task one prefetchable stream; a few per thread balance
  // the load when experts differ in size. At least 16 tiles (128 rows) per task. Unlike a lone
  // product (dispatch::tile_tasks), the layer's many tasks from several matrices already keep
  // both threads streaming: DeepSeek-V4-Flash at batch 1 on the 2-core Zen 4 measured alike with
  // at least 128 tiles per task or one task per thread per matrix.
  const int64_t tiles = plan.n_tiles();
  const int64_t per_task =
      std::max<int64_t>(16, (tiles + 2 * threads - 1) / (2 * int64_t{threads}));
  for (int64_t b = 0; b < tiles; b += per_task) {
    tasks_.push_back(Task{&plan, x, takes_bf16(plan) ? xb : nullptr, xq, ldx, m, y, ldy, b,
                          std::min(tiles, b + per_task)});
  }
}

void MoeLayer::run_tasks(ThreadPool& pool, size_t routed_end) {
  // The shared experts' tasks spread evenly among the routed ones (a Bresenham merge), not queued
  // after them: a shared expert in another format (DeepSeek-V4's FP8 one beside FP4 routed
  // experts) may be bound by its decode while the routed products are bound by DRAM; interleaved,
  // one thread decodes while the other streams, instead of both waiting on the same limit.
  const size_t routed = routed_end, shared = tasks_.size() - routed_end;
  order_.clear();
  for (size_t r = 0, s = 0; r < routed || s < shared;) {
    // Take a shared task while the shared fraction taken is behind the routed fraction taken.
    if (s < shared && (r == routed || (s + 1) * routed <= (r + 1) * shared)) {
      order_.push_back(tasks_[routed + s++]);
    } else {
      order_.push_back(tasks_[r++]);
    }
  }
  pool.run(static_cast<int64_t>(order_.size()), [this](int64_t i, int) {
    const Task& t = order_[i];
    if (t.plan->precision() == dispatch::Precision::kW4A8) {
      t.plan->run_tiles_w4a8(t.xq, t.m, t.y, t.ldy, t.tile_begin, t.tile_end);
    } else if (t.xb != nullptr) {
      t.plan->run_tiles_bf16(t.xb, t.ldx, t.m, t.y, t.ldy, t.tile_begin, t.tile_end);
    } else {
      t.plan->run_tiles(t.x, t.ldx, t.m, t.y, t.ldy, t.tile_begin, t.tile_end);
    }
  });
  tasks_.clear();
}

Status MoeLayer::forward(const float* x, int64_t tokens, float* y, ThreadPool& pool) {
  if (tokens < 1 || tokens > max_tokens_) {
    return moe_error("forward with " + std::to_string(tokens) +
                     " tokens; the layer was sized for 1.." + std::to_string(max_tokens_));
  }
  const int64_t h = config_.hidden;
  const int k = config_.router.top_k;
  const int64_t slots = tokens * k;
  const int threads = pool.size();
  PhaseClock clock(phase_times_);
  // Router logits split by expert range over the pool (the router weights are a few MB: one
  // thread alone would read them at well under the machine's bandwidth), then the selection.
  const int n_experts = config_.router.num_experts;
  const int64_t logit_tasks = std::min<int64_t>(n_experts, int64_t{threads} * 4);
  pool.run(logit_tasks, [&](int64_t task, int) {
    router_logits(config_.router, router_, x, tokens, h,
                  static_cast<int>(n_experts * task / logit_tasks),
                  static_cast<int>(n_experts * (task + 1) / logit_tasks), logits_.data());
  });
  clock.job(logit_tasks);
  clock.end(MoePhase::kRouterLogits);
  for (int64_t t = 0; t < tokens; ++t) {
    route_logits(config_.router, router_, logits_.data() + t * n_experts, ids_.data() + t * k,
                 route_weights_.data() + t * k,
                 std::span<float>(router_scratch_).subspan(n_experts));
  }
  clock.end(MoePhase::kRouteSelect);

  // Group the (token, choice) pairs by expert: counting sort, so each expert's rows are
  // contiguous and its weights are streamed once for all its tokens.
  std::fill(counts_.begin(), counts_.end(), 0);
  for (int64_t s = 0; s < slots; ++s) ++counts_[ids_[s]];
  int32_t running = 0;
  for (size_t e = 0; e < counts_.size(); ++e) {
    offsets_[e] = running;
    running += counts_[e];
    counts_[e] = 0;  // reused as the fill cursor below
  }
  for (int64_t s = 0; s < slots; ++s) {
    const int32_t e = ids_[s];
    const int32_t slot = offsets_[e] + counts_[e]++;
    slot_of_[s] = slot;
    slot_expert_[slot] = e;
    slot_token_[slot] = static_cast<int32_t>(s / k);
  }
  // W4A8 routed inputs are read in place where every active expert's rows are consecutive tokens
  // (always at one token; see below).
  bool routed_by_token = routed_in_w4a8_;
  for (size_t e = 0; e < experts_.size() && routed_by_token; ++e) {
    const int32_t c = counts_[e];
    routed_by_token =
        c == 0 || slot_token_[offsets_[e] + c - 1] - slot_token_[offsets_[e]] == c - 1;
  }
  // The gathered F32 inputs, where an exact product or the grouped quantization reads them: a
  // W4A8 layer at one token copies nothing (each copy is a cold 16 KiB at DeepSeek-V4's 4096, the
  // weights streamed since the last call having evicted it).
  if (routed_in_exact_ || (routed_in_w4a8_ && !routed_by_token)) {
    for (int64_t slot = 0; slot < slots; ++slot) {
      std::memcpy(xg_.data() + slot * h, x + int64_t{slot_token_[slot]} * h, sizeof(float) * h);
    }
  }
  clock.end(MoePhase::kGroup);

  // W4A8: the routed inputs (and the tokens, for the shared experts) quantized once, for gate
  // and up alike. Where every active expert's rows are consecutive tokens (always at one token),
  // the experts read the quantized tokens in place: each token is quantized once, not once per
  // choice, and one token is quantized on this thread, with no pool job (DeepSeek-V4-Flash at
  // batch 1: one row of 4096 instead of six, the six spread over the pool).
  if (routed_in_w4a8_) {
    if (routed_by_token) {
      routed_tok_q_.quantize(x, h, tokens, h, quantizer_, pool);
      clock.job(tokens);
    } else {
      routed_in_q_.quantize(xg_.data(), h, slots, h, quantizer_, pool);
      clock.job(slots);
    }
  }
  if (shared_in_w4a8_) {
    shared_in_q_.quantize(x, h, tokens, h, quantizer_, pool);
    clock.job(tokens);
  }
  // BF16 (takes_bf16): the tokens on this thread (one row per token), the grouped inputs of
  // routed experts that take them by rows over the pool.
  if (!shared_in_b_.empty()) round_rows_bf16(x, h, tokens, h, shared_in_b_.data());
  if (!routed_in_b_.empty()) {
    pool.run(slots, [&](int64_t r, int) {
      round_rows_bf16(xg_.data() + r * h, h, 1, h, routed_in_b_.data() + r * h);
    });
    clock.job(slots);
  }
  if (routed_in_w4a8_ || shared_in_w4a8_ || !shared_in_b_.empty() || !routed_in_b_.empty()) {
    clock.end(MoePhase::kQuantize);
  }

  // Phase 1: gate and up products of every active expert and every shared expert.
  // Read by the logits phase above (one of the two is empty).
  last_bytes_ = router_.weight.size_bytes() + router_.weight_bf16.size_bytes();
  for (size_t e = 0; e < experts_.size(); ++e) {
    if (counts_[e] == 0) continue;
    const Expert& ex = experts_[e];
    const int64_t off = offsets_[e];
    const kernels::QuantizedActivations xq = !routed_in_w4a8_ ? kernels::QuantizedActivations{}
                                             : routed_by_token
                                                 ? routed_tok_q_.view(slot_token_[off])
                                                 : routed_in_q_.view(off);
    const uint16_t* xb = routed_in_b_.empty() ? nullptr : routed_in_b_.data() + off * h;
    add_tasks(ex.gate, xg_.data() + off * h, xb, h, xq, counts_[e], gate_.data() + off * max_inter_,
              max_inter_, threads);
    add_tasks(ex.up, xg_.data() + off * h, xb, h, xq, counts_[e], up_.data() + off * max_inter_,
              max_inter_, threads);
    last_bytes_ +=
        ex.w.gate->streamed_bytes() + ex.w.up->streamed_bytes() + ex.w.down->streamed_bytes();
  }
  size_t routed_end = tasks_.size();
  int64_t shared_off = 0;
  const kernels::QuantizedActivations shared_xq =
      shared_in_w4a8_ ? shared_in_q_.view(0) : kernels::QuantizedActivations{};
  for (const Expert& ex : shared_) {
    const uint16_t* xb = shared_in_b_.empty() ? nullptr : shared_in_b_.data();
    add_tasks(ex.gate, x, xb, h, shared_xq, tokens, shared_gate_.data() + shared_off * tokens,
              ex.inter, threads);
    add_tasks(ex.up, x, xb, h, shared_xq, tokens, shared_up_.data() + shared_off * tokens, ex.inter,
              threads);
    shared_off += ex.inter;
    last_bytes_ +=
        ex.w.gate->streamed_bytes() + ex.w.up->streamed_bytes() + ex.w.down->streamed_bytes();
  }
  run_tasks(pool, routed_end);
  clock.job(static_cast<int64_t>(order_.size()));
  clock.end(MoePhase::kGateUp);

  // Phase 2: the gated activation, one row per task (quantized there for a W4A8 down product).
  const int64_t shared_rows = tokens * static_cast<int64_t>(shared_.size());
  pool.run(slots + shared_rows, [&](int64_t r, int) {
    if (r < slots) {
      const Expert& ex = experts_[slot_expert_[r]];
      float* g = gate_.data() + r * max_inter_;
      apply_gated_activation(config_.routed_activation, g, up_.data() + r * max_inter_, ex.inter,
                             ex.w.gate_bias, ex.w.up_bias);
      if (ex.down.precision() == dispatch::Precision::kW4A8) {
        routed_act_q_.quantize_rows(g, max_inter_, r, 1, ex.inter, quantizer_);
      } else if (takes_bf16(ex.down)) {
        round_rows_bf16(g, max_inter_, 1, ex.inter, routed_act_b_.data() + r * max_inter_);
      }
      return;
    }
    const int64_t s = (r - slots) / tokens, t = (r - slots) % tokens;
    int64_t off = 0;
    for (int64_t i = 0; i < s; ++i) off += shared_[i].inter;
    const Expert& ex = shared_[s];
    float* g = shared_gate_.data() + off * tokens + t * ex.inter;
    const float* u = shared_up_.data() + off * tokens + t * ex.inter;
    apply_gated_activation(config_.shared_activation, g, u, ex.inter, ex.w.gate_bias, ex.w.up_bias);
    if (ex.down.precision() == dispatch::Precision::kW4A8) {
      shared_act_q_.quantize_rows(g, ex.inter, s * max_tokens_ + t, 1, ex.inter, quantizer_);
    } else if (takes_bf16(ex.down)) {
      round_rows_bf16(g, ex.inter, 1, ex.inter, shared_act_b_.data() + (g - shared_gate_.data()));
    }
  });
  clock.job(slots + shared_rows);
  clock.end(MoePhase::kActivation);

  // Phase 3: down products.
  for (size_t e = 0; e < experts_.size(); ++e) {
    if (counts_[e] == 0) continue;
    const int64_t off = offsets_[e];
    const kernels::QuantizedActivations aq =
        experts_[e].down.precision() == dispatch::Precision::kW4A8
            ? routed_act_q_.view(off)
            : kernels::QuantizedActivations{};
    add_tasks(experts_[e].down, gate_.data() + off * max_inter_,
              routed_act_b_.empty() ? nullptr : routed_act_b_.data() + off * max_inter_, max_inter_,
              aq, counts_[e], out_.data() + off * h, h, threads);
  }
  routed_end = tasks_.size();
  shared_off = 0;
  for (size_t s = 0; s < shared_.size(); ++s) {
    const kernels::QuantizedActivations aq =
        shared_[s].down.precision() == dispatch::Precision::kW4A8
            ? shared_act_q_.view(static_cast<int64_t>(s) * max_tokens_)
            : kernels::QuantizedActivations{};
    add_tasks(shared_[s].down, shared_gate_.data() + shared_off * tokens,
              shared_act_b_.empty() ? nullptr : shared_act_b_.data() + shared_off * tokens,
              shared_[s].inter, aq, tokens, shared_out_.data() + s * tokens * h, h, threads);
    shared_off += shared_[s].inter;
  }
  run_tasks(pool, routed_end);
  clock.job(static_cast<int64_t>(order_.size()));
  clock.end(MoePhase::kDown);

  // Combine, one token per task, choices in selection order (deterministic).
  pool.run(tokens, [&](int64_t t, int) {
    float* yt = y + t * h;
    std::fill(yt, yt + h, 0.0f);
    for (int c = 0; c < k; ++c) {
      const int64_t s = t * k + c;
      const float w = route_weights_[s];
      const float* o = out_.data() + int64_t{slot_of_[s]} * h;
      const std::span<const float> b = experts_[ids_[s]].w.down_bias;
      if (b.empty()) {
        for (int64_t j = 0; j < h; ++j) yt[j] += w * o[j];
      } else {
        for (int64_t j = 0; j < h; ++j) yt[j] += w * (o[j] + b[j]);
      }
    }
    for (size_t s = 0; s < shared_.size(); ++s) {
      const float* o = shared_out_.data() + (s * tokens + t) * h;
      const std::span<const float> b = shared_[s].w.down_bias;
      for (int64_t j = 0; j < h; ++j) yt[j] += b.empty() ? o[j] : o[j] + b[j];
    }
  });
  clock.job(tokens);
  clock.end(MoePhase::kCombine);
  return Status::Ok();
}

std::string MoeLayer::describe() const {
  std::string out = "MoE layer: router " + config_.router.describe() + "; " +
                    std::to_string(experts_.size()) + " routed experts";
  if (!experts_.empty()) {
    out +=
        " (gate: " + experts_[0].gate.describe() + "; down: " + experts_[0].down.describe() + ")";
  }
  out += "; " + std::to_string(shared_.size()) + " shared expert(s)";
  if (!shared_.empty()) out += " (gate: " + shared_[0].gate.describe() + ")";
  auto act = [](const ActivationConfig& a) {
    std::string s = a.kind == GatedActivation::kSwiGlu
                        ? "swiglu"
                        : "swiglu-oai(alpha " + std::to_string(a.alpha) + ")";
    if (a.limit > 0) s += " clamp " + std::to_string(a.limit);
    return s;
  };
  out += "; routed activation " + act(config_.routed_activation) + ", shared " +
         act(config_.shared_activation);
  return out;
}

}  // namespace fp4moe::moe
