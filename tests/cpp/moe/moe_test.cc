// The MoE layer against the FP64 reference of moe/reference.h (dequantize every expert, loop over
// tokens), for the DeepSeek-V3/V4, gpt-oss and Qwen3-MoE semantics, on every ISA this host has;
// the W4A8 layer against that reference's arithmetic with the activations quantized as the layer
// does; plus the router's selection rules on hand-made logits, and bad configurations.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "dispatch/cpu_features.h"
#include "formats/scalar.h"
#include "kernels/registry.h"
#include "moe/moe_layer.h"
#include "moe/reference.h"
#include "test_weights.h"

namespace fp4moe::moe {
namespace {

using kernels::WeightFormat;

// Two chained FP32 products (depth <= ~40 terms each, see the kernel tests' bound) give a
// relative error of a few 1e-6 of the token's abs-sum scale; a wrong expert, weight or clamp is
// O(1). 1e-4 keeps a 20x margin over rounding and no slack for a semantic error.
constexpr double kMoeTolOfScale = 1e-4;

struct TestExpert {
  testing::QuantizedMatrix gate, up, down;
  std::vector<float> gate_bias, up_bias, down_bias;
  // The bytes a layer call streams for this expert: its three packed matrices.
  size_t streamed_bytes() const {
    return gate.packed.streamed_bytes() + up.packed.streamed_bytes() + down.packed.streamed_bytes();
  }
};

struct Fixture {
  MoeConfig config;
  std::vector<float> router_w, logit_bias, correction_bias;
  std::vector<std::unique_ptr<TestExpert>> experts, shared;
  WeightFormat routed_format = WeightFormat::kNvfp4, shared_format = WeightFormat::kNvfp4;
  bool biases = false;
};

std::unique_ptr<TestExpert> make_expert(WeightFormat f, int64_t h, int64_t inter, bool biases,
                                        std::mt19937& rng) {
  auto e = std::make_unique<TestExpert>();
  e->gate = testing::quantize_random(f, inter, h, rng);
  e->up = testing::quantize_random(f, inter, h, rng);
  e->down = testing::quantize_random(f, h, inter, rng);
  if (biases) {
    std::normal_distribution<float> normal(0.0f, 2.0f);
    for (auto [v, n] : {std::pair{&e->gate_bias, inter}, std::pair{&e->up_bias, inter},
                        std::pair{&e->down_bias, h}}) {
      v->resize(n);
      for (float& b : *v) b = normal(rng);
    }
  }
  return e;
}

void build(Fixture& fx, int n_shared, int64_t inter, std::mt19937& rng) {
  const int64_t h = fx.config.hidden;
  const int e_count = fx.config.router.num_experts;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  fx.router_w.resize(e_count * h);
  for (float& v : fx.router_w) v = normal(rng) * 0.3f;
  for (int e = 0; e < e_count; ++e) {
    fx.experts.push_back(make_expert(fx.routed_format, h, inter, fx.biases, rng));
  }
  for (int s = 0; s < n_shared; ++s) {
    fx.shared.push_back(make_expert(fx.shared_format, h, inter * 2, false, rng));
  }
}

ExpertWeights view(const TestExpert& e) {
  return ExpertWeights{&e.gate.packed, &e.up.packed, &e.down.packed,
                       e.gate_bias,    e.up_bias,    e.down_bias};
}

Result<MoeLayer> make_layer(const Fixture& fx, int64_t max_tokens, kernels::Isa isa,
                            dispatch::Precision precision = dispatch::Precision::kExact) {
  std::vector<ExpertWeights> experts, shared;
  for (const auto& e : fx.experts) experts.push_back(view(*e));
  for (const auto& e : fx.shared) shared.push_back(view(*e));
  return MoeLayer::create(fx.config, RouterWeights{fx.router_w, fx.logit_bias, fx.correction_bias},
                          experts, shared, max_tokens, isa, precision);
}

// ---- The FP64 reference (moe/reference.h), and the W4A8 error bounds around it ---------------

double ref_act(const ActivationConfig& a, double g, double u) {
  return reference::activation(a, g, u);
}

reference::DenseExpertView dense_view(const TestExpert& e) {
  return {e.gate.dequantized, e.up.dequantized, e.down.dequantized, e.gate_bias, e.up_bias,
          e.down_bias,        e.gate.n};
}

// ref_expert's `block` for a product whose activations are rounded to BF16 (not quantized).
constexpr int kBf16Activations = -1;

// The W4A8 activation block of a product with these weights: the family covers the FP4 formats
// (block = the weight's K block, kernels/types.h); FP8 takes BF16-rounded activations in a W4A8
// layer (MoeLayer::create).
int w4a8_block(WeightFormat f) {
  switch (f) {
    case WeightFormat::kNvfp4:
    case WeightFormat::kMxfp4:
      return kernels::weight_format_k_block(f);
    case WeightFormat::kFp8Block128:
      return kBf16Activations;
  }
  return 0;
}

// v rounded to the nearest BF16 value (ties to even), in FP64: monotone, as the layer's rounding.
double round_bf16(double v) {
  if (v == 0 || !std::isfinite(v)) return v;
  const double ulp = std::ldexp(1.0, std::ilogb(v) - 7);  // 8 significant bits
  return std::nearbyint(v / ulp) * ulp;
}

constexpr double kF32Rounding = 0x1p-24;

// A bound on |act_F32(g', u') - act(g, u)| for |g' - g| <= dg, |u' - u| <= du: the change over
// that rectangle (act is linear in u and, in g, monotone or at a smooth minimum, so its corners
// bound the change to first order; the clamps make it flat), plus the F32 evaluation's own
// roundings: a few of the result's size, the u + 1 of gpt-oss, and |alpha g| through exp's
// argument.
double activation_error(const ActivationConfig& a, double g, double u, double dg, double du) {
  const double mid = ref_act(a, g, u);
  double change = 0;
  for (double sg : {-1.0, 1.0}) {
    for (double su : {-1.0, 1.0}) {
      change = std::max(change, std::fabs(ref_act(a, g + sg * dg, u + su * du) - mid));
    }
  }
  const double gc = a.limit > 0 ? std::min(g, double(a.limit)) : g;
  const double uc = a.limit > 0 ? std::clamp(u, -double(a.limit), double(a.limit)) : u;
  const double alpha = a.kind == GatedActivation::kSwiGlu ? 1.0 : a.alpha;
  const double gate_part = std::fabs(gc / (1.0 + std::exp(-alpha * gc)));
  return change + (8 + 2 * std::fabs(alpha * gc)) * kF32Rounding * gate_part * (std::fabs(uc) + 1);
}

// Expert output, its abs-sum scale and `slack` per output row. `block` 0: the exact products.
// `block` kBf16Activations: the inputs rounded to BF16, exact products of them (FP8 in a W4A8
// layer). `block` > 0: the W4A8 products, whose inputs are what the layer quantizes them to per
// block: the input x by the library's scalar quantizer (every ISA's gives the same bits, and the
// kernel tests check it against its definition), the gated activations by that definition in FP64
// (q = nearest-even(v * 127 / amax), scale amax / 127). `slack` bounds, per output row, how far
// the layer's F32 pipeline may legitimately be from this FP64 one: the F32 error of each product
// (the kernel tests' (K, or K / block for W4A8, + 4) * 2^-24 of its abs-sum), the gate/up part
// carried through the activation (activation_error) and from there either into the down product
// directly (exact) or, for W4A8, into the block's scale and into the code of any activation whose
// v * 127 / amax lies that close to a rounding boundary (it may then round the other way).
void ref_expert(const TestExpert& e, const ActivationConfig& act, const float* x, int64_t h,
                int block, std::vector<double>& out, std::vector<double>& scale,
                std::vector<double>& slack) {
  const int64_t inter = e.gate.n;
  std::vector<double> xin(x, x + h);
  if (block == kBf16Activations) {
    for (int64_t j = 0; j < h; ++j) xin[j] = formats::decode_bf16(formats::encode_bf16(x[j]));
  }
  if (block > 0) {
    const auto* quantizer = kernels::find_activation_quantizer(kernels::Isa::kScalar);
    std::vector<int8_t> q(h);
    std::vector<float> scales(h / block);
    std::vector<int32_t> offsets(h / block);
    quantizer->fn(x, h, 1, h, block, q.data(), scales.data(), offsets.data());
    for (int64_t j = 0; j < h; ++j) xin[j] = double(q[j]) * scales[j / block];
  }
  auto product_tol = [block](int64_t k) {  // relative to the abs-sum, as in the kernel tests
    return double(block > 0 ? k / block + 4 : k + 4) * kF32Rounding;
  };
  std::vector<double> hid(inter), dhid(inter);
  for (int64_t i = 0; i < inter; ++i) {
    double g = e.gate_bias.empty() ? 0.0 : e.gate_bias[i];
    double u = e.up_bias.empty() ? 0.0 : e.up_bias[i];
    double ag = 0, au = 0;
    for (int64_t j = 0; j < h; ++j) {
      g += double(e.gate.dequantized[i * h + j]) * xin[j];
      u += double(e.up.dequantized[i * h + j]) * xin[j];
      ag += std::fabs(double(e.gate.dequantized[i * h + j]) * xin[j]);
      au += std::fabs(double(e.up.dequantized[i * h + j]) * xin[j]);
    }
    hid[i] = ref_act(act, g, u);
    dhid[i] = activation_error(act, g, u, product_tol(h) * ag + 2 * kF32Rounding * std::fabs(g),
                               product_tol(h) * au + 2 * kF32Rounding * std::fabs(u));
  }
  std::vector<double> xd(inter), dxd(inter);
  if (block == 0) {
    xd = hid;
    dxd = dhid;
  } else if (block == kBf16Activations) {
    // The layer rounds its F32 activation, within dhid of hid, to BF16: rounding is monotone, so
    // the result lies between the roundings of hid - dhid and hid + dhid.
    for (int64_t i = 0; i < inter; ++i) {
      xd[i] = round_bf16(hid[i]);
      dxd[i] = std::max(std::fabs(round_bf16(hid[i] - dhid[i]) - xd[i]),
                        std::fabs(round_bf16(hid[i] + dhid[i]) - xd[i]));
    }
  } else {
    for (int64_t b = 0; b < inter / block; ++b) {
      double amax = 0, damax = 0;
      for (int64_t i = b * block; i < (b + 1) * block; ++i) {
        amax = std::max(amax, std::fabs(hid[i]));
        damax = std::max(damax, dhid[i]);
      }
      for (int64_t i = b * block; i < (b + 1) * block; ++i) {
        if (amax == 0) {  // the layer's block may be nonzero: its values are within damax
          xd[i] = 0;
          dxd[i] = 2 * damax;
          continue;
        }
        const double step = amax / 127, t = hid[i] * 127 / amax, q = std::nearbyint(t);
        // The layer's v * 127 / amax: off by the activation's and amax's errors, and by the
        // quantizer's own F32 rounding (within 1e-5 of a step, the kernel tests).
        const double dt = (127 * dhid[i] + std::fabs(t) * damax) / amax + 256 * kF32Rounding;
        const double code_slack =
            std::max(std::fabs(std::nearbyint(t + dt) - q), std::fabs(std::nearbyint(t - dt) - q));
        xd[i] = q * step;
        dxd[i] = code_slack * step + std::fabs(q) * (damax / 127 + kF32Rounding * step);
      }
    }
  }
  out.assign(h, 0.0);
  scale.assign(h, 0.0);
  slack.assign(h, 0.0);
  for (int64_t j = 0; j < h; ++j) {
    double s = e.down_bias.empty() ? 0.0 : e.down_bias[j];
    double a = std::fabs(s), d = 0;
    for (int64_t i = 0; i < inter; ++i) {
      const double w = e.down.dequantized[j * inter + i];
      s += w * xd[i];
      a += std::fabs(w * xd[i]);
      d += std::fabs(w) * dxd[i];
    }
    out[j] = s;
    scale[j] = a;
    slack[j] = d + product_tol(inter) * a;
  }
}

struct RefToken {
  std::vector<int> ids;
  std::vector<double> weights, y, scale, slack;
};

// `w4a8`: every product the W4A8 family covers runs W4A8 (ref_expert's block > 0); otherwise
// the reference's own expert forward (slack 0: the exact tests bound the error by the scale).
RefToken ref_token(const Fixture& fx, const float* x, bool w4a8 = false) {
  const int64_t h = fx.config.hidden;
  const reference::Routing routing = reference::route(
      fx.config.router, RouterWeights{fx.router_w, fx.logit_bias, fx.correction_bias}, x, h);
  RefToken r;
  r.ids = routing.ids;
  r.weights = routing.weights;
  r.y.assign(h, 0.0);
  r.scale.assign(h, 0.0);
  r.slack.assign(h, 0.0);
  const std::vector<double> xd(x, x + h);
  std::vector<double> out, scale, slack;
  auto add = [&](const TestExpert& e, const ActivationConfig& act, double w) {
    if (!w4a8) {
      reference::expert_forward(dense_view(e), act, xd.data(), h, w, r.y.data(), r.scale.data());
      return;
    }
    ref_expert(e, act, x, h, w4a8_block(e.gate.format), out, scale, slack);
    for (int64_t j = 0; j < h; ++j) {
      r.y[j] += w * out[j];
      r.scale[j] += std::fabs(w) * scale[j];
      r.slack[j] += std::fabs(w) * slack[j];
    }
  };
  for (size_t i = 0; i < r.ids.size(); ++i) {
    add(*fx.experts[r.ids[i]], fx.config.routed_activation, r.weights[i]);
  }
  for (const auto& s : fx.shared) add(*s, fx.config.shared_activation, 1.0);
  return r;
}

void check_against_reference(const Fixture& fx, int64_t tokens, uint32_t seed,
                             const std::string& what) {
  for (kernels::Isa isa : dispatch::host_isas()) {
    SCOPED_TRACE(what + " isa " + std::string(kernels::isa_name(isa)) + " tokens " +
                 std::to_string(tokens) + " seed " + std::to_string(seed));
    std::mt19937 rng(seed + 7);
    const int64_t h = fx.config.hidden;
    const std::vector<float> x = testing::random_activations(tokens, h, rng);
    auto layer = make_layer(fx, tokens + 2, isa);
    ASSERT_TRUE(layer.ok()) << layer.error().message;
    std::vector<float> y(tokens * h, NAN);
    const Status st = layer->forward(x.data(), tokens, y.data(), ThreadPool::global());
    ASSERT_TRUE(st.ok()) << st.error().message;
    const int k = fx.config.router.top_k;
    for (int64_t t = 0; t < tokens; ++t) {
      const RefToken r = ref_token(fx, x.data() + t * h);
      for (int i = 0; i < k; ++i) {
        ASSERT_EQ(r.ids[i], layer->ids()[t * k + i]) << "token " << t << " choice " << i;
        EXPECT_NEAR(r.weights[i], layer->route_weights()[t * k + i], 1e-5 * std::fabs(r.weights[i]))
            << "token " << t << " choice " << i;
      }
      const double scale = *std::max_element(r.scale.begin(), r.scale.end());
      for (int64_t j = 0; j < h; ++j) {
        ASSERT_NEAR(y[t * h + j], r.y[j], kMoeTolOfScale * scale) << "token " << t << " row " << j;
      }
    }
  }
}

constexpr int64_t kHidden = 64;
constexpr int64_t kInter = 32;

// DeepSeek-V4-Flash in miniature: sqrtsoftplus top-3 of 8, renormalized and scaled by 1.5,
// SwiGLU clamped at 10, NVFP4 routed experts and one FP8 block-128 shared expert.
Fixture deepseek_v4_fixture(std::mt19937& rng) {
  Fixture fx;
  fx.config.hidden = kHidden;
  fx.config.router = {8, 3, ScoringFunc::kSqrtSoftplus, WeightRule::kScoresAtSelected, true, 1.5f,
                      1, 1};
  fx.config.routed_activation = {GatedActivation::kSwiGlu, 10.0f, 1.702f};
  fx.config.shared_activation = fx.config.routed_activation;
  fx.routed_format = WeightFormat::kNvfp4;
  fx.shared_format = WeightFormat::kFp8Block128;
  build(fx, 1, kInter, rng);
  return fx;
}

TEST(MoeLayer, DeepSeekV4SqrtSoftplusBiasClampSharedFp8) {
  const uint32_t seed = 401;
  std::mt19937 rng(seed);
  Fixture fx = deepseek_v4_fixture(rng);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  fx.correction_bias.resize(8);
  for (float& b : fx.correction_bias) b = normal(rng);
  for (int64_t t : {1, 3, 17}) check_against_reference(fx, t, seed, "deepseek-v4");
}

TEST(MoeLayer, DeepSeekV3SigmoidGroupLimitedMxfp4) {
  const uint32_t seed = 302;
  std::mt19937 rng(seed);
  Fixture fx;
  fx.config.hidden = kHidden;
  fx.config.router = {16, 4, ScoringFunc::kSigmoid, WeightRule::kScoresAtSelected, true, 2.5f,
                      4,  2};
  fx.routed_format = WeightFormat::kMxfp4;
  fx.shared_format = WeightFormat::kMxfp4;
  build(fx, 1, kInter, rng);
  std::normal_distribution<float> normal(0.0f, 0.2f);
  fx.correction_bias.resize(16);
  for (float& b : fx.correction_bias) b = normal(rng);
  for (int64_t t : {1, 3, 17}) check_against_reference(fx, t, seed, "deepseek-v3");
}

TEST(MoeLayer, DeepSeekV2SoftmaxGroupMaxWithoutBias) {
  const uint32_t seed = 202;
  std::mt19937 rng(seed);
  Fixture fx;
  fx.config.hidden = kHidden;
  fx.config.router = {8, 2, ScoringFunc::kSoftmax, WeightRule::kScoresAtSelected, false, 1.0f,
                      4, 2};
  build(fx, 0, kInter, rng);
  for (int64_t t : {1, 5}) check_against_reference(fx, t, seed, "deepseek-v2 groups");
}

TEST(MoeLayer, GptOssSoftmaxOverTopKClampedSwigluWithBiases) {
  const uint32_t seed = 120;
  std::mt19937 rng(seed);
  Fixture fx;
  fx.config.hidden = kHidden;
  fx.config.router = {8, 4, ScoringFunc::kSoftmax, WeightRule::kSoftmaxOfTopK, false, 1.0f, 1, 1};
  fx.config.routed_activation = {GatedActivation::kSwiGluOai, 7.0f, 1.702f};
  fx.routed_format = WeightFormat::kMxfp4;
  fx.biases = true;
  build(fx, 0, kInter, rng);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  fx.logit_bias.resize(8);
  for (float& b : fx.logit_bias) b = normal(rng);
  for (int64_t t : {1, 3, 17}) check_against_reference(fx, t, seed, "gpt-oss");
}

TEST(MoeLayer, Qwen3SoftmaxNormTopkProb) {
  const uint32_t seed = 3;
  std::mt19937 rng(seed);
  Fixture fx;
  fx.config.hidden = kHidden;
  fx.config.router = {8, 2, ScoringFunc::kSoftmax, WeightRule::kScoresAtSelected, true, 1.0f, 1, 1};
  build(fx, 0, kInter, rng);
  for (int64_t t : {1, 3, 17}) check_against_reference(fx, t, seed, "qwen3");
}

TEST(MoeLayer, ExpertsWithoutTokensAndAllTokensOnOneExpert) {
  const uint32_t seed = 77;
  std::mt19937 rng(seed);
  Fixture fx;
  fx.config.hidden = kHidden;
  fx.config.router = {8, 1, ScoringFunc::kSigmoid, WeightRule::kScoresAtSelected, false, 1.0f,
                      1, 1};
  build(fx, 1, kInter, rng);
  // A selection-only bias of +100 on expert 5 sends every token there; 7 experts get none.
  fx.correction_bias.assign(8, 0.0f);
  fx.correction_bias[5] = 100.0f;
  check_against_reference(fx, 9, seed, "all on expert 5");
  auto layer = make_layer(fx, 9, dispatch::best_host_isa());
  ASSERT_TRUE(layer.ok());
  std::vector<float> x = testing::random_activations(9, kHidden, rng), y(9 * kHidden);
  ASSERT_TRUE(layer->forward(x.data(), 9, y.data(), ThreadPool::global()).ok());
  for (int32_t id : layer->ids()) EXPECT_EQ(id, 5);
  // Bytes read: the router weights, expert 5 once for all 9 tokens, plus the shared expert.
  EXPECT_EQ(layer->last_bytes_read(), sizeof(float) * fx.router_w.size() +
                                          fx.experts[5]->streamed_bytes() +
                                          fx.shared[0]->streamed_bytes());
}

// A checkpoint's BF16 router: the layer keeps it as BF16 (RouterWeights::weight_bf16), reads half
// the bytes, and routes and computes as the reference says.
TEST(MoeLayer, Bf16RouterWeightsAreKeptAsBf16) {
  const uint32_t seed = 78;
  std::mt19937 rng(seed);
  Fixture fx;
  fx.config.hidden = kHidden;
  fx.config.router = {8, 2, ScoringFunc::kSoftmax, WeightRule::kScoresAtSelected, true, 1.0f, 1, 1};
  build(fx, 1, kInter, rng);
  for (float& v : fx.router_w) v = formats::decode_bf16(formats::encode_bf16(v));
  check_against_reference(fx, 9, seed, "BF16 router");
  auto layer = make_layer(fx, 9, dispatch::best_host_isa());
  ASSERT_TRUE(layer.ok());
  std::vector<float> x = testing::random_activations(1, kHidden, rng), y(kHidden);
  ASSERT_TRUE(layer->forward(x.data(), 1, y.data(), ThreadPool::global()).ok());
  size_t experts = 0;  // the token's 2 experts (distinct: top-k)
  for (int32_t id : layer->ids().first(2)) experts += fx.experts[id]->streamed_bytes();
  EXPECT_EQ(layer->last_bytes_read(),
            sizeof(uint16_t) * fx.router_w.size() + experts + fx.shared[0]->streamed_bytes());
}

// router_logits is the sum its comment specifies, bit for bit, on every path: eight partial sums
// over h in steps of 8 (each product rounded, then added in h order), folded
// ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)), the tail after, the bias (-0.0f without)
// last. Checked for 1-3 tokens (expert rows four at a time, then one by one), for 19 tokens
// (groups of 4 and lone tokens in 16-token tiles) and for expert sub-ranges, from F32 weights and
// from the same weights' BF16 bits (so BF16 storage gives the F32 logits bit for bit), against
// that specification written here in scalar code; and nothing outside the expert range is written.
TEST(Router, LogitsAreTheSpecifiedSumOnEveryPath) {
  const uint32_t seed = 83;
  std::mt19937 rng(seed);
  const int experts = 11;
  const int64_t hidden = 8 * 37 + 5;
  RouterConfig config{experts, 2, ScoringFunc::kSoftmax, WeightRule::kScoresAtSelected, true, 1.0f,
                      1,       1};
  std::vector<float> w = testing::random_activations(experts, hidden, rng);
  // Exact in BF16, so the same sums come from the BF16 weight bits (the layer keeps such a router
  // as BF16, and that is the path decode runs).
  std::vector<uint16_t> w16(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    w16[i] = formats::encode_bf16(w[i]);
    w[i] = formats::decode_bf16(w16[i]);
  }
  std::vector<float> bias(experts);
  for (float& b : bias) b = testing::random_activations(1, 1, rng)[0];
  const auto spec = [&](const float* x, int e, bool with_bias) {
    float p[8] = {};
    const int64_t body = hidden / 8 * 8;
    for (int64_t h = 0; h < body; ++h) {
      volatile float prod = x[h] * w[e * hidden + h];  // rounded on its own: no fused multiply-add
      p[h % 8] = p[h % 8] + prod;
    }
    float sum = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
    for (int64_t h = body; h < hidden; ++h) {
      volatile float prod = x[h] * w[e * hidden + h];
      sum = sum + prod;
    }
    return sum + (with_bias ? bias[e] : -0.0f);
  };
  for (const bool bf16 : {false, true}) {
    for (const bool with_bias : {false, true}) {
      const std::span<const float> b =
          with_bias ? std::span<const float>(bias) : std::span<const float>();
      const RouterWeights weights = bf16 ? RouterWeights{{}, b, {}, w16} : RouterWeights{w, b, {}};
      for (const int64_t tokens : {1, 2, 3, 19}) {
        const std::vector<float> x = testing::random_activations(tokens, hidden, rng);
        for (const auto& [e0, e1] : {std::pair{0, experts}, std::pair{3, 10}, std::pair{5, 6}}) {
          std::vector<float> logits(tokens * experts, 1.0f);
          router_logits(config, weights, x.data(), tokens, hidden, e0, e1, logits.data());
          for (int64_t t = 0; t < tokens; ++t) {
            for (int e = 0; e < experts; ++e) {
              // Outside [e0, e1) nothing is written (another task owns those logits).
              const float want =
                  e >= e0 && e < e1 ? spec(x.data() + t * hidden, e, with_bias) : 1.0f;
              const float got = logits[t * experts + e];
              ASSERT_EQ(std::bit_cast<uint32_t>(want), std::bit_cast<uint32_t>(got))
                  << "seed " << seed << ", " << tokens << " tokens, experts [" << e0 << ", " << e1
                  << "), token " << t << ", expert " << e << (with_bias ? ", with bias" : "")
                  << (bf16 ? ", BF16 weights" : "");
            }
          }
        }
      }
    }
  }
}

// The gated activation against FP64 over g in [-100, 100] (every 1/64, and 4096 random points of
// [-30, 30]), with and without the clamp, biases and gpt-oss's alpha: within 4 x 2^-24 of the FP64
// value relative (2 to 4 F32 ulp), plus 1e-35 absolute where exp(-g) overflows F32 (g < -87: the
// value is below 1e-36). Rows of 1..9 starting at offsets 0..3 put each element in every lane and
// in the 4-lane tail: its result is the same bits. NaN in, NaN out.
TEST(MoeLayer, GatedActivationWithinFourUlpOfFp64) {
  const uint32_t seed = 486;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-30.0f, 30.0f);
  std::vector<float> gs, us;
  for (int i = -6400; i <= 6400; ++i) gs.push_back(static_cast<float>(i) / 64.0f);
  for (int i = 0; i < 4096; ++i) gs.push_back(uni(rng));
  for (size_t i = 0; i < gs.size(); ++i) us.push_back(uni(rng) / 8.0f);
  for (const ActivationConfig act : {ActivationConfig{GatedActivation::kSwiGlu, 0.0f, 1.702f},
                                     ActivationConfig{GatedActivation::kSwiGlu, 7.0f, 1.702f},
                                     ActivationConfig{GatedActivation::kSwiGluOai, 7.0f, 1.702f}}) {
    for (bool bias : {false, true}) {
      SCOPED_TRACE("kind " + std::to_string(static_cast<int>(act.kind)) + " limit " +
                   std::to_string(act.limit) + " bias " + std::to_string(bias) + " seed " +
                   std::to_string(seed));
      const int64_t n = static_cast<int64_t>(gs.size());
      std::vector<float> gb(bias ? n : 0), ub(bias ? n : 0);
      for (int64_t i = 0; i < static_cast<int64_t>(gb.size()); ++i) {
        gb[i] = 0.25f * static_cast<float>(i % 7) - 0.75f;
        ub[i] = 0.125f * static_cast<float>(i % 5) - 0.25f;
      }
      std::vector<float> g = gs;
      apply_gated_activation(act, g.data(), us.data(), n, gb, ub);
      for (int64_t i = 0; i < n; ++i) {
        // The layer's F32 inputs (bias sums, the clamp, alpha * g), then FP64.
        float gi = gs[i] + (bias ? gb[i] : 0.0f), ui = us[i] + (bias ? ub[i] : 0.0f);
        if (act.limit > 0) {
          gi = std::min(gi, act.limit);
          ui = std::clamp(ui, -act.limit, act.limit);
        }
        const double ref = act.kind == GatedActivation::kSwiGluOai
                               ? gi / (1.0 + std::exp(-double{act.alpha * gi})) * (ui + 1.0)
                               : gi / (1.0 + std::exp(-double{gi})) * ui;
        ASSERT_NEAR(g[i], ref, 4 * 0x1p-24 * std::fabs(ref) + 1e-35)
            << "g " << gs[i] << " u " << us[i];
      }
      for (int64_t off = 0; off < 4; ++off) {
        for (int64_t len = 1; len <= 9; ++len) {
          std::vector<float> row(gs.begin() + off, gs.begin() + off + len);
          apply_gated_activation(
              act, row.data(), us.data() + off, len,
              bias ? std::span<const float>(gb).subspan(off, len) : std::span<const float>(),
              bias ? std::span<const float>(ub).subspan(off, len) : std::span<const float>());
          for (int64_t i = 0; i < len; ++i) {
            ASSERT_EQ(row[i], g[off + i]) << "offset " << off << " length " << len << " at " << i;
          }
        }
      }
    }
  }
  float nan_g[3] = {1.0f, NAN, -2.0f};
  const float u3[3] = {1.0f, 1.0f, 1.0f};
  apply_gated_activation({GatedActivation::kSwiGlu, 7.0f, 1.702f}, nan_g, u3, 3, {}, {});
  EXPECT_TRUE(std::isnan(nan_g[1]));
  EXPECT_FALSE(std::isnan(nan_g[0]) || std::isnan(nan_g[2]));
}

TEST(MoeLayer, TopKEqualsNumberOfExperts) {
  const uint32_t seed = 44;
  std::mt19937 rng(seed);
  Fixture fx;
  fx.config.hidden = kHidden;
  fx.config.router = {4, 4, ScoringFunc::kSoftmax, WeightRule::kScoresAtSelected, true, 1.0f, 1, 1};
  build(fx, 0, kInter, rng);
  for (int64_t t : {1, 6}) check_against_reference(fx, t, seed, "top_k = E");
}

// ---- W4A8 (int8 activations per block, kernels/types.h) -------------------------------------

// The W4A8 layer quantizes the expert inputs and the gated activations to int8 per 16/32-element
// block: each product is off by at most (amax / 254) * sum |w| per block (the kernel tests check
// that bound). Through two chained products and the gated activation, on these fixtures (rows
// scaled over 2^-6..2^6, so outputs cancel), a token's output is within 0.2-2.0% relative L2 of
// the exact FP64 reference (measured over the 72 token x ISA cases below on scalar and AVX2; every
// ISA's W4A8 kernels give the same bits); 5% leaves a margin.
// Stale or missing quantized activations, a wrong block or a wrong scale give errors of order 1.
constexpr double kW4a8MoeRelL2 = 5e-2;

// Against the FP64 reference of the W4A8 arithmetic (ref_token with w4a8, which quantizes every
// FP4 product's inputs per block as the layer does): within 2x its slack (first-order bounds:
// corner evaluation, the amax error in the denominator) plus 1e-5 of the row's abs-sum for the
// F32 routing weights (within a few 1e-7 of FP64; the exact tests hold them to 1e-5) and the
// combine's roundings. Measured: at most 2.5% of this allowance over 41 seeds x both fixtures
// and every ISA, while the exact products (a layer that quietly runs W4A16) land outside it on
// 87-99% of the outputs; the rel-L2 bound above alone cannot tell the two apart.
constexpr double kW4a8SlackSafety = 2.0;
constexpr double kW4a8RoutingTolOfScale = 1e-5;

void check_w4a8_against_reference(const Fixture& fx, int64_t tokens, uint32_t seed,
                                  const std::string& what) {
  for (kernels::Isa isa : dispatch::host_isas()) {
    // Every ISA level runs: one without its own W4A8 kernel uses the one below (dispatch/).
    SCOPED_TRACE(what + " W4A8 isa " + std::string(kernels::isa_name(isa)) + " tokens " +
                 std::to_string(tokens) + " seed " + std::to_string(seed));
    std::mt19937 rng(seed + 11);
    const int64_t h = fx.config.hidden;
    const std::vector<float> x = testing::random_activations(tokens, h, rng);
    auto layer = make_layer(fx, tokens + 1, isa, dispatch::Precision::kW4A8);
    ASSERT_TRUE(layer.ok()) << layer.error().message;
    std::vector<float> y(tokens * h, NAN);
    ASSERT_TRUE(layer->forward(x.data(), tokens, y.data(), ThreadPool::global()).ok());
    const int k = fx.config.router.top_k;
    for (int64_t t = 0; t < tokens; ++t) {
      const RefToken r = ref_token(fx, x.data() + t * h);
      for (int i = 0; i < k; ++i) {  // routing reads the F32 input: the same choices
        ASSERT_EQ(r.ids[i], layer->ids()[t * k + i]) << "token " << t << " choice " << i;
      }
      double err = 0, norm = 0;
      for (int64_t j = 0; j < h; ++j) {
        const double d = y[t * h + j] - r.y[j];
        err += d * d;
        norm += r.y[j] * r.y[j];
      }
      EXPECT_LE(std::sqrt(err / norm), kW4a8MoeRelL2) << "token " << t;
      const RefToken rq = ref_token(fx, x.data() + t * h, /*w4a8=*/true);
      for (int64_t j = 0; j < h; ++j) {
        ASSERT_NEAR(y[t * h + j], rq.y[j],
                    kW4a8SlackSafety * rq.slack[j] + kW4a8RoutingTolOfScale * rq.scale[j])
            << "token " << t << " row " << j << ": not the W4A8 arithmetic (the exact FP64 "
            << "reference gives " << r.y[j] << ")";
      }
    }
  }
}

TEST(MoeLayerW4A8, DeepSeekV4Nvfp4RoutedWithBf16ActivationFp8Shared) {
  const uint32_t seed = 481;
  std::mt19937 rng(seed);
  const Fixture fx = deepseek_v4_fixture(rng);
  for (int64_t t : {1, 4, 17}) check_w4a8_against_reference(fx, t, seed, "deepseek-v4");
  // FP4 products run the W4A8 kernels; the FP8 shared expert takes BF16 activations, through
  // the BF16-activation kernel where the host has one.
  auto layer = make_layer(fx, 4, dispatch::best_host_isa(), dispatch::Precision::kW4A8);
  ASSERT_TRUE(layer.ok());
  const std::string d = layer->describe();
  EXPECT_NE(d.find("nvfp4_gemm_w4a8"), std::string::npos) << d;
  EXPECT_NE(d.find("fp8b128_gemm_"), std::string::npos) << d;
}

// A DeepSeek-V3-style layer, FP8 block-128 throughout: in a W4A8 layer every product takes
// BF16-rounded activations (routed inputs grouped by expert, routed gated activations, the
// shared ones), on every host (without a BF16-activation kernel the exact kernel runs on them).
TEST(MoeLayerW4A8, Fp8RoutedAndSharedTakeBf16Activations) {
  const uint32_t seed = 484;
  std::mt19937 rng(seed);
  Fixture fx;
  fx.config.hidden = kHidden;
  fx.config.router = {8, 3, ScoringFunc::kSigmoid, WeightRule::kScoresAtSelected, true, 2.5f, 1, 1};
  fx.config.routed_activation = {GatedActivation::kSwiGlu, 0.0f, 1.702f};
  fx.config.shared_activation = fx.config.routed_activation;
  fx.routed_format = WeightFormat::kFp8Block128;
  fx.shared_format = WeightFormat::kFp8Block128;
  build(fx, 2, kInter, rng);  // two shared experts: their BF16 rows side by side
  for (int64_t t : {1, 2, 5, 13}) check_w4a8_against_reference(fx, t, seed, "fp8 throughout");
}

// The per-phase times of a forward call (what `fp4moe bench --moe` reports as the layer's own
// overheads): every phase that ran is timed, the phases lie inside the call's wall time, a phase
// that does not run (quantize, exact) stays 0, and the pool jobs are the ones each precision
// starts.
TEST(MoeLayer, PhaseTimesCoverTheCallAndCountItsPoolJobs) {
  const uint32_t seed = 483;
  std::mt19937 rng(seed);
  const Fixture fx = deepseek_v4_fixture(rng);
  const int64_t h = fx.config.hidden, tokens = 3;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(tokens * h), y(tokens * h);
  for (float& v : x) v = normal(rng);
  for (auto precision : {dispatch::Precision::kExact, dispatch::Precision::kW4A8}) {
    SCOPED_TRACE(std::string(dispatch::precision_name(precision)));
    auto layer = make_layer(fx, tokens, dispatch::best_host_isa(), precision);
    ASSERT_TRUE(layer.ok()) << layer.error().message;
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(layer->forward(x.data(), tokens, y.data(), ThreadPool::global()).ok());
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const MoePhaseTimes& times = layer->last_phase_times();
    const bool w4a8 = precision == dispatch::Precision::kW4A8;
    for (int i = 0; i < kMoePhases; ++i) {
      const auto phase = static_cast<MoePhase>(i);
      SCOPED_TRACE(std::string(moe_phase_name(phase)));
      EXPECT_GE(times.seconds[i], 0.0);
      if (phase == MoePhase::kQuantize && !w4a8) {
        EXPECT_EQ(times.seconds[i], 0.0);
      } else if (phase == MoePhase::kGateUp || phase == MoePhase::kDown) {
        EXPECT_GT(times.seconds[i], 0.0);
      }
    }
    EXPECT_LE(times.total(), wall);
    // router logits, gate/up, activation, down, combine; W4A8 adds the routed inputs'
    // quantization (the shared expert is FP8 here, so it has no quantized input).
    EXPECT_EQ(times.pool_jobs, w4a8 ? 6 : 5);
    // One token: its combine is one task, and W4A8 quantizes the token once, on the calling
    // thread, for every expert (each expert's row is that token), so neither is a pool job.
    ASSERT_TRUE(layer->forward(x.data(), 1, y.data(), ThreadPool::global()).ok());
    EXPECT_EQ(layer->last_phase_times().pool_jobs, 4);
  }
}

// W4A8 experts read the quantized tokens in place where every active expert's rows are
// consecutive tokens (always with 2 tokens; top-k = E: every expert has every token), else the
// inputs grouped by expert and quantized per row (top-2 of 4 over 7 tokens: some expert's tokens
// are not consecutive). Either way each output row is the one the token gets alone, bit for bit:
// the W4A8 kernels' sums do not depend on the other tokens, so a view of the wrong rows (an
// expert whose first token is not token 0 reading token 0) shows here.
TEST(MoeLayerW4A8, TokenRowsReadInPlaceOrGroupedGiveEachTokenItsOwnOutput) {
  const uint32_t seed = 485;
  struct Case {
    int64_t tokens;
    int top_k;
    bool grouped;
  };
  for (const Case c : {Case{2, 2, false}, Case{7, 4, false}, Case{7, 2, true}}) {
    SCOPED_TRACE("tokens " + std::to_string(c.tokens) + " top_k " + std::to_string(c.top_k) +
                 " seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    Fixture fx;
    fx.config.hidden = kHidden;
    fx.config.router = {
        4, c.top_k, ScoringFunc::kSoftmax, WeightRule::kScoresAtSelected, true, 1.0f, 1, 1};
    fx.config.routed_activation = {GatedActivation::kSwiGlu, 0.0f, 1.702f};
    fx.config.shared_activation = fx.config.routed_activation;
    fx.routed_format = WeightFormat::kNvfp4;
    build(fx, 0, kInter, rng);
    const int64_t h = fx.config.hidden;
    const std::vector<float> x = testing::random_activations(c.tokens, h, rng);
    auto layer = make_layer(fx, c.tokens, dispatch::best_host_isa(), dispatch::Precision::kW4A8);
    ASSERT_TRUE(layer.ok()) << layer.error().message;
    std::vector<float> y(c.tokens * h), one(h);
    ASSERT_TRUE(layer->forward(x.data(), c.tokens, y.data(), ThreadPool::global()).ok());
    // Per expert: whether its tokens have a gap, and whether its first token is not token 0.
    bool gap = false, later_first = false;
    for (int e = 0; e < 4; ++e) {
      int64_t first = -1, last = -1;
      for (int64_t s = 0; s < c.tokens * c.top_k; ++s) {
        if (layer->ids()[s] != e) continue;
        const int64_t t = s / c.top_k;
        gap = gap || (last >= 0 && t != last + 1);
        if (first < 0) first = t;
        last = t;
      }
      later_first = later_first || first > 0;
    }
    ASSERT_EQ(gap, c.grouped) << "the routing of seed " << seed << " changed: pick another";
    if (c.tokens == 2) {
      ASSERT_TRUE(later_first) << "every expert's first token is token 0";
    }
    for (int64_t t = 0; t < c.tokens; ++t) {
      ASSERT_TRUE(layer->forward(x.data() + t * h, 1, one.data(), ThreadPool::global()).ok());
      for (int64_t j = 0; j < h; ++j) {
        ASSERT_EQ(y[t * h + j], one[j]) << "token " << t << " row " << j;
      }
    }
  }
}

TEST(MoeLayerW4A8, GptOssMxfp4WithBiasesAndSharedExperts) {
  const uint32_t seed = 482;
  std::mt19937 rng(seed);
  Fixture fx;
  fx.config.hidden = kHidden;
  fx.config.router = {8, 4, ScoringFunc::kSoftmax, WeightRule::kSoftmaxOfTopK, false, 1.0f, 1, 1};
  fx.config.routed_activation = {GatedActivation::kSwiGluOai, 7.0f, 1.702f};
  fx.config.shared_activation = fx.config.routed_activation;
  fx.routed_format = WeightFormat::kMxfp4;
  fx.shared_format = WeightFormat::kMxfp4;
  fx.biases = true;
  build(fx, 2, kInter, rng);
  for (int64_t t : {1, 3, 9}) check_w4a8_against_reference(fx, t, seed, "gpt-oss + shared");
}

TEST(MoeLayerW4A8, MixedFp4FormatsInOneRoleAreAnError) {
  std::mt19937 rng(483);
  Fixture fx;
  fx.config.hidden = kHidden;
  fx.config.router = {4, 2, ScoringFunc::kSoftmax, WeightRule::kScoresAtSelected, true, 1.0f, 1, 1};
  build(fx, 0, kInter, rng);
  fx.experts[2] = make_expert(WeightFormat::kMxfp4, kHidden, kInter, false, rng);
  auto layer = make_layer(fx, 2, dispatch::best_host_isa(), dispatch::Precision::kW4A8);
  ASSERT_FALSE(layer.ok());
  EXPECT_NE(layer.error().message.find("one FP4 format"), std::string::npos)
      << layer.error().message;
  // The exact layer takes the mix.
  EXPECT_TRUE(make_layer(fx, 2, dispatch::best_host_isa()).ok());
}

// ---- Router selection rules on hand-made logits ----------------------------------------------

TEST(Router, GroupLimitExcludesTheBestExpertOfAWeakGroup) {
  RouterConfig c{8, 2, ScoringFunc::kSigmoid, WeightRule::kScoresAtSelected, true, 1.0f, 4, 2};
  std::vector<float> w(8, 0.0f), bias(8, 0.0f);
  // Groups {0,1} {2,3} {4,5} {6,7}. Expert 0 has the best score but its partner is poor, so
  // group 0's top-2 sum loses to groups 2 and 3.
  const float logits[8] = {5.0f, -5.0f, 0.0f, 0.0f, 2.0f, 2.0f, 1.5f, 1.5f};
  int32_t ids[2];
  float weights[2];
  std::vector<float> scratch(router_scratch_floats(c));
  route_logits(c, RouterWeights{w, {}, bias}, logits, ids, weights, scratch);
  EXPECT_EQ(ids[0], 4);
  EXPECT_EQ(ids[1], 5);
  EXPECT_NEAR(weights[0] + weights[1], 1.0f, 1e-6f);
  // Without the bias the group score is the max: group 0 (expert 0) now wins a place.
  route_logits(c, RouterWeights{w, {}, {}}, logits, ids, weights, scratch);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 4);
}

TEST(Router, TiesGoToTheLowerIndexAndBiasOnlySelects) {
  RouterConfig c{4, 2, ScoringFunc::kSqrtSoftplus, WeightRule::kScoresAtSelected, false, 2.0f,
                 1, 1};
  std::vector<float> w(4, 0.0f), bias = {0.0f, 0.0f, 0.0f, 1.5f};
  const float logits[4] = {1.0f, 1.0f, 1.0f, -30.0f};
  int32_t ids[2];
  float weights[2];
  std::vector<float> scratch(router_scratch_floats(c));
  route_logits(c, RouterWeights{w, {}, bias}, logits, ids, weights, scratch);
  EXPECT_EQ(ids[0], 3);  // sqrt(softplus(-30)) + 1.5 beats sqrt(softplus(1)) = 1.146
  EXPECT_EQ(ids[1], 0);  // three-way tie: lowest index
  EXPECT_NEAR(weights[0], 2.0 * std::sqrt(std::log1p(std::exp(-30.0))), 1e-9);
  EXPECT_NEAR(weights[1], 2.0 * std::sqrt(std::log1p(std::exp(1.0))), 1e-5);
}

// ---- Bad configurations are errors, not crashes ----------------------------------------------

TEST(MoeLayer, RejectsBadConfigurations) {
  std::mt19937 rng(9);
  Fixture fx;
  fx.config.hidden = kHidden;
  fx.config.router = {4, 2, ScoringFunc::kSoftmax, WeightRule::kScoresAtSelected, false, 1.0f,
                      1, 1};
  build(fx, 0, kInter, rng);
  const kernels::Isa isa = dispatch::best_host_isa();
  {
    Fixture bad = std::move(fx);
    bad.config.router.top_k = 5;
    EXPECT_FALSE(make_layer(bad, 4, isa).ok());
    bad.config.router.top_k = 2;
    bad.config.router.n_group = 3;
    EXPECT_FALSE(make_layer(bad, 4, isa).ok());
    bad.config.router.n_group = 2;
    bad.config.router.topk_group = 3;
    EXPECT_FALSE(make_layer(bad, 4, isa).ok());
    bad.config.router.n_group = 1;
    bad.config.router.topk_group = 1;
    bad.router_w.pop_back();
    auto r = make_layer(bad, 4, isa);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("router weight"), std::string::npos) << r.error().message;
    bad.router_w.push_back(0.0f);
    bad.config.hidden = kHidden * 2;  // expert shapes no longer fit
    bad.router_w.resize(4 * kHidden * 2);
    EXPECT_FALSE(make_layer(bad, 4, isa).ok());
    bad.config.hidden = kHidden;
    bad.router_w.resize(4 * kHidden);
    auto good = make_layer(bad, 4, isa);
    ASSERT_TRUE(good.ok()) << good.error().message;
    std::vector<float> x(5 * kHidden), y(5 * kHidden);
    EXPECT_FALSE(good->forward(x.data(), 5, y.data(), ThreadPool::global()).ok());
    EXPECT_FALSE(good->forward(x.data(), 0, y.data(), ThreadPool::global()).ok());
  }
}

}  // namespace
}  // namespace fp4moe::moe
