// MoE routing (see router.h). Formula sources, read for /work/shared/MOE_SEMANTICS.md:
//  - DeepSeek-V4 `inference/model.py` Gate.forward: fp32 logits; sqrtsoftplus = sqrt(softplus(z))
//    with torch's softplus (beta 1, threshold 20: z for z > 20); selection topk(s + bias), weights
//    from the unbiased s, w /= sum(w) when score_func != "softmax" (no eps), w *= route_scale.
//  - DeepSeek-V3 `inference/model.py` Gate.forward: sigmoid scores; with n_groups > 1 the group
//    score is topk(2).sum() of the biased scores (amax without bias), the best topk_groups groups
//    are kept and the rest masked to -inf (commit 1398800 "fix scores mask"); then as above.
//  - gpt-oss `gpt_oss/torch/model.py` MLPBlock: g = gate(t) (Linear with bias); topk(g, k,
//    sorted=True); expert_weights = softmax(values).
//  - Qwen3-MoE HF `Qwen3MoeSparseMoeBlock`: softmax over all experts in fp32, topk, divide by
//    the sum when norm_topk_prob (no eps). Mixtral: softmax of the top-k logits (same weights).
#include "moe/router.h"

#include <emmintrin.h>
#include <xmmintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "formats/scalar.h"

namespace fp4moe::moe {
namespace {

// Indices of the k largest values, best first; ties to the lower index (torch leaves ties open).
void top_k_indices(const float* v, int n, int k, int32_t* out, int32_t* work) {
  std::iota(work, work + n, 0);
  std::partial_sort(work, work + k, work + n,
                    [v](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
  std::copy(work, work + k, out);
}

float softplus_torch(float z) { return z > 20.0f ? z : std::log1p(std::exp(z)); }

}  // namespace

std::string RouterConfig::describe() const {
  const char* s = scoring == ScoringFunc::kSoftmax   ? "softmax"
                  : scoring == ScoringFunc::kSigmoid ? "sigmoid"
                                                     : "sqrtsoftplus";
  std::string out =
      std::string(s) + " top-" + std::to_string(top_k) + " of " + std::to_string(num_experts);
  if (weight_rule == WeightRule::kSoftmaxOfTopK) out += ", softmax over the top-k logits";
  if (renormalize) out += ", renormalized";
  if (n_group > 1) {
    out += ", groups " + std::to_string(topk_group) + "/" + std::to_string(n_group);
  }
  if (routed_scaling_factor != 1.0f) out += ", x" + std::to_string(routed_scaling_factor);
  return out;
}

Status validate_router(const RouterConfig& c, const RouterWeights& w, int64_t hidden) {
  auto fail = [](const std::string& why) { return Status(Error{"moe router: " + why}); };
  if (c.num_experts < 1) return fail("num_experts must be >= 1");
  if (c.top_k < 1 || c.top_k > c.num_experts) {
    return fail("top_k = " + std::to_string(c.top_k) +
                " must be in [1, num_experts = " + std::to_string(c.num_experts) + "]");
  }
  if (c.n_group < 1 || c.num_experts % c.n_group != 0) {
    return fail("n_group = " + std::to_string(c.n_group) + " must divide num_experts");
  }
  if (c.topk_group < 1 || c.topk_group > c.n_group) {
    return fail("topk_group = " + std::to_string(c.topk_group) + " must be in [1, n_group]");
  }
  if (c.n_group > 1 && c.topk_group * (c.num_experts / c.n_group) < c.top_k) {
    return fail("the kept groups hold fewer than top_k experts");
  }
  if (c.n_group > 1 && !w.correction_bias.empty() && c.num_experts / c.n_group < 2) {
    return fail("top-2 group scores need >= 2 experts per group");
  }
  if (!std::isfinite(c.routed_scaling_factor)) return fail("routed_scaling_factor not finite");
  if (static_cast<int64_t>(w.weight.size()) != c.num_experts * hidden) {
    return fail("router weight has " + std::to_string(w.weight.size()) + " elements, expected " +
                std::to_string(c.num_experts * hidden));
  }
  for (auto [span, name] :
       {std::pair{w.logit_bias, "logit bias"}, std::pair{w.correction_bias, "correction bias"}}) {
    if (!span.empty() && static_cast<int64_t>(span.size()) != c.num_experts) {
      return fail(std::string(name) + " has " + std::to_string(span.size()) +
                  " elements, expected " + std::to_string(c.num_experts));
    }
  }
  return Status::Ok();
}

int64_t router_scratch_floats(const RouterConfig& c) {
  // logits, scores, choice scores, group scores and two int32 index arrays (stored as floats).
  return 6 * int64_t{c.num_experts} + 2 * c.n_group;
}

void route_logits(const RouterConfig& c, const RouterWeights& w, const float* logits, int32_t* ids,
                  float* route_weights, std::span<float> scratch) {
  const int e_count = c.num_experts;
  float* scores = scratch.data();
  float* choice = scores + e_count;
  float* group_scores = choice + e_count;
  int32_t* work = reinterpret_cast<int32_t*>(group_scores + c.n_group);
  int32_t* kept = work + e_count;
  static_assert(sizeof(int32_t) == sizeof(float));

  if (c.weight_rule == WeightRule::kSoftmaxOfTopK) {
    // gpt-oss: topk on the raw logits, softmax over the k selected (max-subtracted).
    top_k_indices(logits, e_count, c.top_k, ids, work);
    const float mx = logits[ids[0]];
    float sum = 0.0f;
    for (int i = 0; i < c.top_k; ++i) sum += route_weights[i] = std::exp(logits[ids[i]] - mx);
    for (int i = 0; i < c.top_k; ++i) {
      route_weights[i] = route_weights[i] / sum * c.routed_scaling_factor;
    }
    return;
  }
  switch (c.scoring) {
    case ScoringFunc::kSoftmax: {
      const float mx = *std::max_element(logits, logits + e_count);
      float sum = 0.0f;
      for (int e = 0; e < e_count; ++e) sum += scores[e] = std::exp(logits[e] - mx);
      for (int e = 0; e < e_count; ++e) scores[e] /= sum;
      break;
    }
    case ScoringFunc::kSigmoid:
      for (int e = 0; e < e_count; ++e) scores[e] = 1.0f / (1.0f + std::exp(-logits[e]));
      break;
    case ScoringFunc::kSqrtSoftplus:
      for (int e = 0; e < e_count; ++e) scores[e] = std::sqrt(softplus_torch(logits[e]));
      break;
  }
  // Selection uses the biased scores; the weights use the unbiased ones (noaux_tc).
  for (int e = 0; e < e_count; ++e) {
    choice[e] = w.correction_bias.empty() ? scores[e] : scores[e] + w.correction_bias[e];
  }
  if (c.n_group > 1) {
    const int per_group = e_count / c.n_group;
    for (int g = 0; g < c.n_group; ++g) {
      const float* s = choice + g * per_group;
      if (w.correction_bias.empty()) {
        group_scores[g] = *std::max_element(s, s + per_group);
      } else {
        int32_t best[2];
        top_k_indices(s, per_group, 2, best, work);
        group_scores[g] = s[best[0]] + s[best[1]];
      }
    }
    top_k_indices(group_scores, c.n_group, c.topk_group, kept, work);
    for (int g = 0; g < c.n_group; ++g) {
      if (std::find(kept, kept + c.topk_group, g) != kept + c.topk_group) continue;
      std::fill(choice + g * per_group, choice + (g + 1) * per_group,
                -std::numeric_limits<float>::infinity());
    }
  }
  top_k_indices(choice, e_count, c.top_k, ids, work);
  float sum = 0.0f;
  for (int i = 0; i < c.top_k; ++i) sum += route_weights[i] = scores[ids[i]];
  for (int i = 0; i < c.top_k; ++i) {
    const float wi = c.renormalize ? route_weights[i] / sum : route_weights[i];
    route_weights[i] = wi * c.routed_scaling_factor;
  }
}

namespace {

#define FP4MOE_ROUTER_UNROLL _Pragma("GCC unroll 4")

// Eight router weights from `we`, F32 or BF16 (widened exactly: BF16 is an F32's top half).
[[gnu::always_inline]] inline void load8(const float* we, __m128& w0, __m128& w1) {
  w0 = _mm_loadu_ps(we);
  w1 = _mm_loadu_ps(we + 4);
}
[[gnu::always_inline]] inline void load8(const uint16_t* we, __m128& w0, __m128& w1) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(we));
  w0 = _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), v));
  w1 = _mm_castsi128_ps(_mm_unpackhi_epi16(_mm_setzero_si128(), v));
}
inline float widen(float w) { return w; }
inline float widen(uint16_t w) { return formats::decode_bf16(w); }

// The eight partial sums (lo: lanes 0-3, hi: 4-7) folded in the one fixed tree.
[[gnu::always_inline]] inline float fold8(__m128 lo, __m128 hi) {
  alignas(16) float p[8];
  _mm_store_ps(p, lo);
  _mm_store_ps(p + 4, hi);
  return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

// Logits of NT tokens (rows of x, stride hidden) against NE expert rows (rows of we, stride hidden)
// into logits[t * ld + e + r]: each sum exactly as a lone token's against a lone row (eight
// partial sums over h in steps of 8, folded by fold8, the tail after), so grouping changes no bit.
// A group reads each weight once for NT tokens and each activation once for NE rows, and runs
// 2 * NT * NE independent add chains: one token against one row alone waits ~3 cycles per 8 h on
// its two chains' adds, well below the machine's read bandwidth. SSE (baseline x86-64): the
// partial sums stay in registers (as a float array GCC kept them on the stack), multiplied and
// added apart (no FMA: the same roundings on every host).
template <int NT, int NE, class W>
[[gnu::always_inline]] inline void logits_block(const W* we, const float* x, int64_t hidden,
                                                const float* bias, int e, int ld, float* logits) {
  __m128 lo[NT][NE], hi[NT][NE];
  FP4MOE_ROUTER_UNROLL
  for (int t = 0; t < NT; ++t) {
    FP4MOE_ROUTER_UNROLL
    for (int r = 0; r < NE; ++r) lo[t][r] = hi[t][r] = _mm_setzero_ps();
  }
  int64_t h = 0;
  for (; h + 8 <= hidden; h += 8) {
    FP4MOE_ROUTER_UNROLL
    for (int r = 0; r < NE; ++r) {
      __m128 w0, w1;
      load8(we + r * hidden + h, w0, w1);
      FP4MOE_ROUTER_UNROLL
      for (int t = 0; t < NT; ++t) {
        const float* xt = x + t * hidden + h;
        lo[t][r] = _mm_add_ps(lo[t][r], _mm_mul_ps(_mm_loadu_ps(xt), w0));
        hi[t][r] = _mm_add_ps(hi[t][r], _mm_mul_ps(_mm_loadu_ps(xt + 4), w1));
      }
    }
  }
  FP4MOE_ROUTER_UNROLL
  for (int t = 0; t < NT; ++t) {
    FP4MOE_ROUTER_UNROLL
    for (int r = 0; r < NE; ++r) {
      float sum = fold8(lo[t][r], hi[t][r]);
      for (int64_t k = h; k < hidden; ++k) sum += x[t * hidden + k] * widen(we[r * hidden + k]);
      logits[t * ld + e + r] = sum + bias[r];
    }
  }
}

}  // namespace

namespace {

template <class W>
void router_logits_of(const RouterConfig& c, const RouterWeights& w, const W* weight,
                      const float* x, int64_t tokens, int64_t hidden, int e_begin, int e_end,
                      float* logits) {
  // From 4 tokens on, expert-major within a tile of tokens: the tile's activations (kTokenTile x
  // hidden F32, 256 KiB at hidden 4096) stay in L2 while every expert row of the range passes over
  // them. Without the tile, 512 tokens (8 MiB) were re-read from L3 once per expert: 84 ms for a
  // 4096 x 256 router. Within the tile, groups of 4 tokens share each load of a weight row (FP32
  // logits: DeepSeek official computes the gate in fp32; eight partial sums let the compiler
  // vectorize without reassociating a single chain).
  constexpr int64_t kTokenTile = 16;
  const auto bias_of = [&](int e) {
    // -0.0f + sum = sum for every sum (+0.0f would turn a -0.0f sum into +0.0f).
    return w.logit_bias.empty() ? -0.0f : w.logit_bias[e];
  };
  // Fewer than 4 tokens (decode): 4 expert rows at a time, then the rest one by one; each group
  // of rows runs every token while it is in cache (read from memory once).
  if (tokens < 4) {
    constexpr int kRows = 4;
    int e = e_begin;
    for (; e + kRows <= e_end; e += kRows) {
      const float bias[kRows] = {bias_of(e), bias_of(e + 1), bias_of(e + 2), bias_of(e + 3)};
      for (int64_t t = 0; t < tokens; ++t) {
        logits_block<1, kRows>(weight + e * hidden, x + t * hidden, hidden, bias, e, c.num_experts,
                               logits + t * c.num_experts);
      }
    }
    for (; e < e_end; ++e) {
      const float bias[1] = {bias_of(e)};
      for (int64_t t = 0; t < tokens; ++t) {
        logits_block<1, 1>(weight + e * hidden, x + t * hidden, hidden, bias, e, c.num_experts,
                           logits + t * c.num_experts);
      }
    }
    return;
  }
  for (int64_t t0 = 0; t0 < tokens; t0 += kTokenTile) {
    const int64_t t1 = std::min(tokens, t0 + kTokenTile);
    for (int e = e_begin; e < e_end; ++e) {
      const W* we = weight + e * hidden;
      const float bias[1] = {bias_of(e)};
      int64_t t = t0;
      for (; t + 4 <= t1; t += 4) {
        logits_block<4, 1>(we, x + t * hidden, hidden, bias, e, c.num_experts,
                           logits + t * c.num_experts);
      }
      for (; t < t1; ++t) {
        logits_block<1, 1>(we, x + t * hidden, hidden, bias, e, c.num_experts,
                           logits + t * c.num_experts);
      }
    }
  }
}

}  // namespace

void router_logits(const RouterConfig& c, const RouterWeights& w, const float* x, int64_t tokens,
                   int64_t hidden, int e_begin, int e_end, float* logits) {
  if (!w.weight_bf16.empty()) {
    router_logits_of(c, w, w.weight_bf16.data(), x, tokens, hidden, e_begin, e_end, logits);
  } else {
    router_logits_of(c, w, w.weight.data(), x, tokens, hidden, e_begin, e_end, logits);
  }
}

void route(const RouterConfig& c, const RouterWeights& w, const float* x, int64_t tokens,
           int64_t hidden, int32_t* ids, float* route_weights, std::span<float> scratch) {
  float* logits = scratch.data();
  std::span<float> rest = scratch.subspan(c.num_experts);
  for (int64_t t = 0; t < tokens; ++t) {
    router_logits(c, w, x + t * hidden, 1, hidden, 0, c.num_experts, logits);
    route_logits(c, w, logits, ids + t * c.top_k, route_weights + t * c.top_k, rest);
  }
}

}  // namespace fp4moe::moe
