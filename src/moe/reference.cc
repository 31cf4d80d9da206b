// The FP64 MoE reference (see reference.h). Formulas, from /work/shared/MOE_SEMANTICS.md:
//  - scores: softmax over all experts (Qwen3-MoE), sigmoid (DeepSeek-V3, MiniMax-M2),
//    sqrt(softplus(z)) with torch's threshold 20 (DeepSeek-V4);
//  - selection: top-k of score + e_score_correction_bias, the bias only selects; DeepSeek-V3
//    groups: the group score is the sum of its top-2 biased scores (its max without a bias), the
//    best topk_group groups kept, the rest -inf;
//  - weights: the unbiased scores at the selected experts, / their sum when renormalizing (no
//    eps), x routed_scaling_factor;
//  - gpt-oss: logits = W x + b, top-k of the logits, softmax over those k;
//  - experts: SwiGLU with the DeepSeek-V4 clamp (gate from above, up both sides), or gpt-oss's
//    g * sigmoid(alpha g) * (u + 1) with the same clamps; biases on gate, up and down.
#include "moe/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace fp4moe::moe::reference {
namespace {

// Indices of the k largest of v, best first; ties to the lower index.
std::vector<int> top_k(const std::vector<double>& v, int k) {
  std::vector<int> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&v](int a, int b) { return v[a] > v[b]; });
  idx.resize(static_cast<size_t>(k));
  return idx;
}

}  // namespace

std::vector<double> weights_for(const RouterConfig& c, const Routing& r, std::span<const int> ids) {
  std::vector<double> w;
  if (c.weight_rule == WeightRule::kSoftmaxOfTopK) {
    double mx = -std::numeric_limits<double>::infinity();
    for (int id : ids) mx = std::max(mx, r.values[static_cast<size_t>(id)]);
    double sum = 0;
    for (int id : ids) sum += std::exp(r.values[static_cast<size_t>(id)] - mx);
    for (int id : ids) {
      w.push_back(std::exp(r.values[static_cast<size_t>(id)] - mx) / sum * c.routed_scaling_factor);
    }
    return w;
  }
  double sum = 0;
  for (int id : ids) sum += r.values[static_cast<size_t>(id)];
  for (int id : ids) {
    const double s = r.values[static_cast<size_t>(id)];
    w.push_back((c.renormalize ? s / sum : s) * c.routed_scaling_factor);
  }
  return w;
}

Routing route(const RouterConfig& c, const RouterWeights& router, const float* x, int64_t hidden) {
  const int e_count = c.num_experts;
  std::vector<double> logits(static_cast<size_t>(e_count));
  for (int e = 0; e < e_count; ++e) {
    double s = router.logit_bias.empty() ? 0.0 : router.logit_bias[static_cast<size_t>(e)];
    const float* w = router.weight.data() + int64_t{e} * hidden;
    for (int64_t j = 0; j < hidden; ++j) s += static_cast<double>(w[j]) * x[j];
    logits[static_cast<size_t>(e)] = s;
  }
  Routing r;
  if (c.weight_rule == WeightRule::kSoftmaxOfTopK) {
    r.keys = logits;
    r.values = logits;
  } else {
    r.values.resize(logits.size());
    const double mx = *std::max_element(logits.begin(), logits.end());
    double total = 0;
    for (double l : logits) total += std::exp(l - mx);
    for (size_t e = 0; e < logits.size(); ++e) {
      const double l = logits[e];
      switch (c.scoring) {
        case ScoringFunc::kSoftmax:
          r.values[e] = std::exp(l - mx) / total;
          break;
        case ScoringFunc::kSigmoid:
          r.values[e] = 1.0 / (1.0 + std::exp(-l));
          break;
        case ScoringFunc::kSqrtSoftplus:
          r.values[e] = std::sqrt(l > 20 ? l : std::log1p(std::exp(l)));
          break;
      }
    }
    r.keys = r.values;
    if (!router.correction_bias.empty()) {
      for (size_t e = 0; e < r.keys.size(); ++e) r.keys[e] += router.correction_bias[e];
    }
    if (c.n_group > 1) {
      const int per = e_count / c.n_group;
      std::vector<double> group_scores(static_cast<size_t>(c.n_group));
      for (int g = 0; g < c.n_group; ++g) {
        std::vector<double> s(r.keys.begin() + g * per, r.keys.begin() + (g + 1) * per);
        std::sort(s.rbegin(), s.rend());
        group_scores[static_cast<size_t>(g)] =
            router.correction_bias.empty() ? s[0] : s[0] + (s.size() > 1 ? s[1] : 0.0);
      }
      const std::vector<int> kept = top_k(group_scores, c.topk_group);
      for (int g = 0; g < c.n_group; ++g) {
        if (std::find(kept.begin(), kept.end(), g) != kept.end()) continue;
        std::fill(r.keys.begin() + g * per, r.keys.begin() + (g + 1) * per,
                  -std::numeric_limits<double>::infinity());
      }
    }
  }
  r.ids = top_k(r.keys, c.top_k);
  r.weights = weights_for(c, r, r.ids);
  return r;
}

double activation(const ActivationConfig& a, double g, double u) {
  const double limit = a.limit;
  if (limit > 0) {
    g = std::min(g, limit);
    u = std::clamp(u, -limit, limit);
  }
  switch (a.kind) {
    case GatedActivation::kSwiGlu:
      return g / (1.0 + std::exp(-g)) * u;
    case GatedActivation::kSwiGluOai:
      return g / (1.0 + std::exp(-static_cast<double>(a.alpha) * g)) * (u + 1.0);
  }
  return 0.0;
}

void expert_forward(const DenseExpertView& e, const ActivationConfig& act, const double* x,
                    int64_t hidden, double w, double* y, double* abs_sum) {
  std::vector<double> h(static_cast<size_t>(e.inter));
  for (int64_t i = 0; i < e.inter; ++i) {
    double g = e.gate_bias.empty() ? 0.0 : e.gate_bias[static_cast<size_t>(i)];
    double u = e.up_bias.empty() ? 0.0 : e.up_bias[static_cast<size_t>(i)];
    const float* gw = e.gate.data() + i * hidden;
    const float* uw = e.up.data() + i * hidden;
    for (int64_t j = 0; j < hidden; ++j) {
      g += static_cast<double>(gw[j]) * x[j];
      u += static_cast<double>(uw[j]) * x[j];
    }
    h[static_cast<size_t>(i)] = activation(act, g, u);
  }
  for (int64_t o = 0; o < hidden; ++o) {
    double acc = e.down_bias.empty() ? 0.0 : e.down_bias[static_cast<size_t>(o)];
    double mag = std::fabs(acc);
    const float* dw = e.down.data() + o * e.inter;
    for (int64_t i = 0; i < e.inter; ++i) {
      const double term = static_cast<double>(dw[i]) * h[static_cast<size_t>(i)];
      acc += term;
      mag += std::fabs(term);
    }
    y[o] += w * acc;
    if (abs_sum != nullptr) abs_sum[o] += std::fabs(w) * mag;
  }
}

}  // namespace fp4moe::moe::reference
