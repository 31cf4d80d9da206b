// The one FP64 MoE reference (moe/reference.h) against an independent FP64 transcription of
// gpt-oss's MLPBlock (openai/gpt-oss gpt_oss/torch/model.py, MOE_SEMANTICS.md §3), written the
// way the official code is: one fused gate_up matrix [2I, H] with the gate and up halves
// interleaved (x[..., ::2], x[..., 1::2]), the router Linear with a bias, topk(sorted) then a
// softmax over the k values, swiglu(alpha 1.702, limit 7) with the +1, the down bias added before
// the routing weights. The seed prints with every result (FP4MOE_TEST_SEED replays one).
#include "moe/reference.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace fp4moe::moe {
namespace {

uint32_t test_seed() {
  if (const char* s = std::getenv("FP4MOE_TEST_SEED")) return static_cast<uint32_t>(std::stoul(s));
  return 20261202;
}

struct GptOssLayer {
  int64_t h = 0, inter = 0;
  int experts = 0, top_k = 0;
  std::vector<float> router_w, router_b;                           // [E, H], [E]
  std::vector<std::vector<float>> mlp1_w, mlp1_b, mlp2_w, mlp2_b;  // [2I, H], [2I], [H, I], [H]
};

// The official MLPBlock on one token, in double: returns sum_k w_k * (mlp2(swiglu(mlp1 x))).
std::vector<double> official_mlp_block(const GptOssLayer& m, const std::vector<float>& x) {
  std::vector<double> g(static_cast<size_t>(m.experts));
  for (int e = 0; e < m.experts; ++e) {
    double s = m.router_b[e];
    for (int64_t j = 0; j < m.h; ++j) s += double(m.router_w[e * m.h + j]) * x[j];
    g[e] = s;
  }
  // torch.topk(g, k, sorted=True): the k largest, descending (distinct with random data).
  std::vector<int> order(static_cast<size_t>(m.experts));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&g](int a, int b) { return g[a] > g[b]; });
  order.resize(static_cast<size_t>(m.top_k));
  double denom = 0;
  for (int e : order) denom += std::exp(g[e]);
  std::vector<double> out(static_cast<size_t>(m.h), 0.0);
  for (int e : order) {
    const double weight = std::exp(g[e]) / denom;
    std::vector<double> t(static_cast<size_t>(2 * m.inter));
    for (int64_t r = 0; r < 2 * m.inter; ++r) {
      double s = m.mlp1_b[e][r];
      for (int64_t j = 0; j < m.h; ++j) s += double(m.mlp1_w[e][r * m.h + j]) * x[j];
      t[r] = s;
    }
    std::vector<double> act(static_cast<size_t>(m.inter));
    for (int64_t i = 0; i < m.inter; ++i) {
      const double x_glu = std::min(t[2 * i], 7.0);
      const double x_linear = std::clamp(t[2 * i + 1], -7.0, 7.0);
      act[i] = x_glu * (1.0 / (1.0 + std::exp(-1.702 * x_glu))) * (x_linear + 1.0);
    }
    for (int64_t o = 0; o < m.h; ++o) {
      double s = 0;
      for (int64_t i = 0; i < m.inter; ++i) s += double(m.mlp2_w[e][o * m.inter + i]) * act[i];
      out[o] += weight * (s + m.mlp2_b[e][o]);  // t += mlp2_bias, then the expert weights
    }
  }
  return out;
}

TEST(MoeReference, MatchesAnIndependentGptOssMlpBlock) {
  const uint32_t seed = test_seed();
  std::cout << "[seed " << seed << "] replay with FP4MOE_TEST_SEED=" << seed << "\n";
  SCOPED_TRACE("seed " + std::to_string(seed) + " (set FP4MOE_TEST_SEED to replay)");
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  GptOssLayer m;
  m.h = 48;
  m.inter = 24;
  m.experts = 8;
  m.top_k = 4;
  auto fill = [&](std::vector<float>& v, size_t n, float std) {
    v.resize(n);
    for (float& f : v) f = normal(rng) * std;
  };
  fill(m.router_w, static_cast<size_t>(m.experts * m.h), 0.3f);
  fill(m.router_b, static_cast<size_t>(m.experts), 0.5f);
  for (auto* v : {&m.mlp1_w, &m.mlp1_b, &m.mlp2_w, &m.mlp2_b}) v->resize(m.experts);
  for (int e = 0; e < m.experts; ++e) {
    // Large enough that the clamp at 7 and the up half's +1 both matter on some rows.
    fill(m.mlp1_w[e], static_cast<size_t>(2 * m.inter * m.h), 0.6f);
    fill(m.mlp1_b[e], static_cast<size_t>(2 * m.inter), 2.0f);
    fill(m.mlp2_w[e], static_cast<size_t>(m.h * m.inter), 0.2f);
    fill(m.mlp2_b[e], static_cast<size_t>(m.h), 1.0f);
  }
  // The reference's inputs: the fused rows split into gate (even) and up (odd), as model/ does.
  std::vector<std::vector<float>> gate(m.experts), up(m.experts), gate_b(m.experts),
      up_b(m.experts);
  for (int e = 0; e < m.experts; ++e) {
    for (int64_t i = 0; i < m.inter; ++i) {
      gate[e].insert(gate[e].end(), m.mlp1_w[e].begin() + (2 * i) * m.h,
                     m.mlp1_w[e].begin() + (2 * i + 1) * m.h);
      up[e].insert(up[e].end(), m.mlp1_w[e].begin() + (2 * i + 1) * m.h,
                   m.mlp1_w[e].begin() + (2 * i + 2) * m.h);
      gate_b[e].push_back(m.mlp1_b[e][2 * i]);
      up_b[e].push_back(m.mlp1_b[e][2 * i + 1]);
    }
  }
  RouterConfig router{
      m.experts, m.top_k, ScoringFunc::kSoftmax, WeightRule::kSoftmaxOfTopK, false, 1.0f, 1, 1};
  const ActivationConfig act{GatedActivation::kSwiGluOai, 7.0f, 1.702f};
  int clamped = 0;
  for (int token = 0; token < 16; ++token) {
    std::vector<float> x(static_cast<size_t>(m.h));
    for (float& v : x) v = normal(rng);
    const std::vector<double> want = official_mlp_block(m, x);
    const reference::Routing routing =
        reference::route(router, RouterWeights{m.router_w, m.router_b, {}}, x.data(), m.h);
    ASSERT_EQ(routing.ids.size(), size_t(m.top_k));
    std::vector<double> got(static_cast<size_t>(m.h), 0.0);
    const std::vector<double> xd(x.begin(), x.end());
    for (int k = 0; k < m.top_k; ++k) {
      const int e = routing.ids[k];
      reference::expert_forward(
          {gate[e], up[e], m.mlp2_w[e], gate_b[e], up_b[e], m.mlp2_b[e], m.inter}, act, xd.data(),
          m.h, routing.weights[k], got.data(), nullptr);
      for (int64_t i = 0; i < m.inter; ++i) {
        double g = gate_b[e][i];
        for (int64_t j = 0; j < m.h; ++j) g += double(gate[e][i * m.h + j]) * x[j];
        clamped += g > 7.0;
      }
    }
    double wsum = 0;
    for (double w : routing.weights) wsum += w;
    EXPECT_NEAR(wsum, 1.0, 1e-12) << "token " << token;
    double norm = 0;
    for (double v : want) norm = std::max(norm, std::fabs(v));
    for (int64_t o = 0; o < m.h; ++o) {
      // Both are FP64 sums of the same terms in other orders (~1e-15 relative), but the
      // reference's alpha is ActivationConfig's float 1.702f = 1.702 + 2.2e-8, the official one
      // 1.702: sigmoid(alpha g) moves by < 2.2e-8 |g| / 4, well under 1e-7 of the output scale.
      // A semantic slip (split, clamp, +1, bias, weights) is O(1).
      ASSERT_NEAR(got[o], want[o], 1e-7 * std::max(norm, 1.0)) << "token " << token << " row " << o;
    }
  }
  EXPECT_GT(clamped, 0) << "the fixture should reach the clamp at 7 on some rows";
}

// weights_for follows a substituted selection by the same rule as route().
TEST(MoeReference, WeightsForAnotherSelection) {
  RouterConfig c{4, 2, ScoringFunc::kSigmoid, WeightRule::kScoresAtSelected, true, 2.5f, 1, 1};
  reference::Routing r;
  r.values = {0.9, 0.8, 0.7, 0.1};
  const int ids[2] = {1, 2};
  const std::vector<double> w = reference::weights_for(c, r, ids);
  EXPECT_NEAR(w[0], 0.8 / 1.5 * 2.5, 1e-15);
  EXPECT_NEAR(w[1], 0.7 / 1.5 * 2.5, 1e-15);
}

}  // namespace
}  // namespace fp4moe::moe
