// Loading a checkpoint's MoE layers for the CPU kernels, and the plain reference forward.
#include "model/moe_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>

#include "checkpoint/dtype.h"
#include "checkpoint/tensor_values.h"
#include "formats/block.h"
#include "formats/scalar.h"

namespace fp4moe::model {
namespace {

using checkpoint::CheckpointDir;
using checkpoint::CheckpointTensor;
using checkpoint::DType;

// Scores that differ by less than this (relative to the k-th best) are a tie between the FP32
// router of the kernel path and the FP64 reference: float32 logits over H <= 8192 products carry
// ~1e-6 relative error, so 1e-5 separates rounding from a real routing bug.
constexpr double kRoutingTieTolerance = 1e-5;

std::string expand(std::string pattern, int layer, int expert = -1) {
  for (const auto& [key, value] : {std::pair<std::string, int>{"{L}", layer}, {"{E}", expert}}) {
    for (size_t pos; (pos = pattern.find(key)) != std::string::npos;) {
      pattern.replace(pos, key.size(), std::to_string(value));
    }
  }
  return pattern;
}

const MoeNaming kNamings[] = {
    {"deepseek_v4", "layers.{L}.ffn.gate.weight", "layers.{L}.ffn.gate.bias",
     "layers.{L}.ffn.experts.{E}.", "layers.{L}.ffn.shared_experts.", "w1", "w3", "w2"},
    {"deepseek_v3", "model.layers.{L}.mlp.gate.weight",
     "model.layers.{L}.mlp.gate.e_score_correction_bias", "model.layers.{L}.mlp.experts.{E}.",
     "model.layers.{L}.mlp.shared_experts.", "gate_proj", "up_proj", "down_proj"},
};

template <class T>
T json_value(const nlohmann::json& config, const char* key, T fallback) {
  if (!config.is_object() || !config.contains(key) || config[key].is_null()) return fallback;
  try {
    return config[key].get<T>();
  } catch (const nlohmann::json::exception&) {
    return fallback;
  }
}

using checkpoint::read_f32;

using checkpoint::tensor_bytes;

Result<StoredMatrix> find_matrix(const CheckpointDir& dir, const std::string& module) {
  StoredMatrix m;
  m.module = module;
  m.weight = dir.find(module + ".weight");
  if (m.weight == nullptr)
    return Error{dir.path().string() + ": no tensor '" + module + ".weight'"};
  const auto& w = *m.weight->info;
  const auto* scale = dir.find(module + ".scale");
  const auto* weight_scale = dir.find(module + ".weight_scale");
  const auto* weight_scale_2 = dir.find(module + ".weight_scale_2");
  const auto* scale_inv = dir.find(module + ".weight_scale_inv");
  const bool two_d = w.shape.size() == 2;
  if (two_d && (w.dtype == DType::I8 || w.dtype == DType::U8) && scale != nullptr &&
      (scale->info->dtype == DType::F8_E8M0 || scale->info->dtype == DType::U8) &&
      scale->info->shape.size() == 2 && scale->info->shape[1] * 16 == w.shape[1]) {
    m.scheme = "mxfp4";
    m.scale = scale;
    m.n = w.shape[0];
    m.k = w.shape[1] * 2;
  } else if (two_d && w.dtype == DType::U8 && weight_scale != nullptr &&
             weight_scale_2 != nullptr && weight_scale->info->dtype == DType::F8_E4M3 &&
             weight_scale_2->info->dtype == DType::F32 &&
             weight_scale_2->info->element_count == 1) {
    m.scheme = "nvfp4";
    m.scale = weight_scale;
    m.tensor_scale = weight_scale_2;
    m.n = w.shape[0];
    m.k = w.shape[1] * 2;
  } else if (two_d && w.dtype == DType::F8_E4M3 &&
             ((scale != nullptr && scale->info->dtype == DType::F8_E8M0) ||
              (scale_inv != nullptr && scale_inv->info->dtype == DType::F32))) {
    m.scheme = "fp8_block";
    m.scale = scale != nullptr ? scale : scale_inv;
    m.n = w.shape[0];
    m.k = w.shape[1];
  } else {
    return Error{dir.path().string() + ": module '" + module + "': unsupported storage (weight " +
                 std::string(checkpoint::dtype_name(w.dtype)) +
                 "); the CPU path runs MXFP4, NVFP4 and FP8 block-128 matrices"};
  }
  return m;
}

Result<pack::PackedWeights> pack_matrix(const CheckpointDir& dir, const StoredMatrix& m) {
  auto weight = tensor_bytes(dir, *m.weight);
  if (!weight.ok()) return weight.error();
  auto scale = tensor_bytes(dir, *m.scale);
  if (!scale.ok()) return scale.error();
  const std::string& name = m.weight->info->name;
  if (m.scheme == "mxfp4") return pack::pack_mxfp4(name, *weight, *scale, m.n, m.k);
  if (m.scheme == "nvfp4") {
    auto ts = read_f32(dir, *m.tensor_scale);
    if (!ts.ok()) return ts.error();
    return pack::pack_nvfp4(name, *weight, *scale, (*ts)[0], m.n, m.k);
  }
  if (m.scale->info->dtype == DType::F8_E8M0) {
    return pack::pack_fp8_block128_ue8m0(name, *weight, *scale, m.n, m.k);
  }
  auto scales = read_f32(dir, *m.scale);
  if (!scales.ok()) return scales.error();
  return pack::pack_fp8_block128(name, *weight, *scales, m.n, m.k);
}

Result<std::vector<float>> dequantize_matrix(const CheckpointDir& dir, const StoredMatrix& m) {
  auto weight = tensor_bytes(dir, *m.weight);
  if (!weight.ok()) return weight.error();
  auto scale = tensor_bytes(dir, *m.scale);
  if (!scale.ok()) return scale.error();
  std::vector<float> out(static_cast<size_t>(m.n * m.k));
  const std::string& name = m.weight->info->name;
  Status s;
  if (m.scheme == "mxfp4") {
    s = formats::dequantize_mxfp4(name, *weight, *scale, m.n, m.k, out);
  } else if (m.scheme == "nvfp4") {
    auto ts = read_f32(dir, *m.tensor_scale);
    if (!ts.ok()) return ts.error();
    s = formats::dequantize_nvfp4(name, *weight, *scale, (*ts)[0], m.n, m.k, out);
  } else if (m.scale->info->dtype == DType::F8_E8M0) {
    s = formats::dequantize_fp8_block128_ue8m0(name, *weight, *scale, m.n, m.k, out);
  } else {
    auto scales = read_f32(dir, *m.scale);
    if (!scales.ok()) return scales.error();
    s = formats::dequantize_fp8_block128(name, *weight, *scales, m.n, m.k, out);
  }
  if (!s.ok()) return s.error();
  return out;
}

double activation(const moe::ActivationConfig& act, double g, double u) {
  const double limit = act.limit;
  switch (act.kind) {
    case moe::GatedActivation::kSwiGlu:
      if (limit > 0) g = std::min(g, limit), u = std::clamp(u, -limit, limit);
      return g / (1.0 + std::exp(-g)) * u;
    case moe::GatedActivation::kSwiGluOai: {
      if (limit > 0) g = std::min(g, limit), u = std::clamp(u, -limit, limit);
      const double alpha = act.alpha;
      return g / (1.0 + std::exp(-alpha * g)) * (u + 1.0);
    }
  }
  return 0.0;
}

// y += scale * down(act(gate x, up x)), all in double.
void expert_forward(const DenseExpert& e, const moe::ActivationConfig& act, const float* x,
                    int64_t hidden, double scale, double* y) {
  std::vector<double> h(static_cast<size_t>(e.inter));
  for (int64_t i = 0; i < e.inter; ++i) {
    double g = 0, u = 0;
    const float* gw = e.gate.data() + i * hidden;
    const float* uw = e.up.data() + i * hidden;
    for (int64_t j = 0; j < hidden; ++j)
      g += static_cast<double>(gw[j]) * x[j], u += static_cast<double>(uw[j]) * x[j];
    h[static_cast<size_t>(i)] = activation(act, g, u);
  }
  for (int64_t o = 0; o < hidden; ++o) {
    const float* dw = e.down.data() + o * e.inter;
    double acc = 0;
    for (int64_t i = 0; i < e.inter; ++i)
      acc += static_cast<double>(dw[i]) * h[static_cast<size_t>(i)];
    y[o] += scale * acc;
  }
}

}  // namespace

Result<MoeModelInfo> read_moe_model(const CheckpointDir& dir) {
  const nlohmann::json& config = dir.config();
  if (!config.is_object())
    return Error{dir.path().string() + ": no config.json: cannot tell the MoE semantics"};
  MoeModelInfo info;
  info.num_layers = json_value<int>(config, "num_hidden_layers", 0);
  const MoeNaming* naming = nullptr;
  for (const auto& n : kNamings) {
    for (int l = 0; l < info.num_layers && naming == nullptr; ++l) {
      if (dir.find(expand(n.expert_prefix, l, 0) + n.gate + ".weight") != nullptr) naming = &n;
    }
  }
  if (naming == nullptr) {
    return Error{dir.path().string() +
                 ": no routed-expert tensors in a naming this tool runs "
                 "(DeepSeek-V4 'layers.L.ffn.experts.E.w1', DeepSeek-V3 "
                 "'model.layers.L.mlp.experts.E.gate_proj')"};
  }
  info.naming = *naming;
  auto& c = info.config;
  c.hidden = json_value<int64_t>(config, "hidden_size", 0);
  auto& r = c.router;
  r.num_experts =
      json_value<int>(config, "n_routed_experts", json_value<int>(config, "num_experts", 0));
  r.top_k = json_value<int>(config, "num_experts_per_tok", 0);
  const std::string scoring = json_value<std::string>(config, "scoring_func", "softmax");
  if (scoring == "sqrtsoftplus") {
    r.scoring = moe::ScoringFunc::kSqrtSoftplus;
  } else if (scoring == "sigmoid") {
    r.scoring = moe::ScoringFunc::kSigmoid;
  } else if (scoring == "softmax") {
    r.scoring = moe::ScoringFunc::kSoftmax;
  } else {
    return Error{dir.path().string() + "/config.json: unknown scoring_func '" + scoring + "'"};
  }
  // DeepSeek-V4's official Gate renormalizes whenever the scores are not softmax
  // (MOE_SEMANTICS.md §1); the V3 family and Qwen key it on norm_topk_prob.
  r.renormalize = naming->family == "deepseek_v4"
                      ? r.scoring != moe::ScoringFunc::kSoftmax
                      : json_value<bool>(config, "norm_topk_prob", false);
  r.routed_scaling_factor = json_value<float>(config, "routed_scaling_factor", 1.0f);
  r.n_group = json_value<int>(config, "n_group", 1);
  r.topk_group = json_value<int>(config, "topk_group", 1);
  const float limit = json_value<float>(config, "swiglu_limit", 0.0f);
  c.routed_activation = {moe::GatedActivation::kSwiGlu, limit, 1.702f};
  c.shared_activation = {moe::GatedActivation::kSwiGlu, limit, 1.702f};
  if (naming->family == "deepseek_v4")
    info.num_hash_layers = json_value<int>(config, "num_hash_layers", 0);
  for (int l = info.num_hash_layers; l < info.num_layers; ++l) {
    if (dir.find(expand(naming->expert_prefix, l, 0) + naming->gate + ".weight") != nullptr &&
        dir.find(expand(naming->router_weight, l)) != nullptr) {
      info.moe_layers.push_back(l);
    }
  }
  if (c.hidden <= 0 || r.num_experts <= 0 || r.top_k <= 0 || r.top_k > r.num_experts) {
    return Error{dir.path().string() +
                 "/config.json: hidden_size, n_routed_experts and "
                 "num_experts_per_tok must be positive with top_k <= experts"};
  }
  return info;
}

Result<MoeCheckpointLayer> MoeCheckpointLayer::load(const CheckpointDir& dir,
                                                    const MoeModelInfo& info, int layer) {
  MoeCheckpointLayer out;
  out.dir_ = &dir;
  out.layer_ = layer;
  out.config_ = info.config;
  const MoeNaming& n = info.naming;
  const auto* router = dir.find(expand(n.router_weight, layer));
  if (router == nullptr)
    return Error{dir.path().string() + ": no router '" + expand(n.router_weight, layer) + "'"};
  auto weight = read_f32(dir, *router);
  if (!weight.ok()) return weight.error();
  out.router_weight_ = std::move(*weight);
  if (const auto* bias = dir.find(expand(n.router_bias, layer))) {
    auto b = read_f32(dir, *bias);
    if (!b.ok()) return b.error();
    out.router_bias_ = std::move(*b);
  }
  auto load_expert = [&](const std::string& prefix,
                         std::vector<std::array<StoredMatrix, 3>>& stored,
                         std::vector<moe::ExpertWeights>& weights) -> Status {
    std::array<StoredMatrix, 3> matrices;
    const std::string* names[3] = {&n.gate, &n.up, &n.down};
    moe::ExpertWeights w;
    const pack::PackedWeights** slots[3] = {&w.gate, &w.up, &w.down};
    for (int i = 0; i < 3; ++i) {
      auto m = find_matrix(dir, prefix + *names[i]);
      if (!m.ok()) return m.error();
      matrices[static_cast<size_t>(i)] = *m;
      auto packed = pack_matrix(dir, *m);
      if (!packed.ok()) return packed.error();
      out.packed_.push_back(std::move(*packed));
      *slots[i] = &out.packed_.back();
      out.packed_bytes_ += out.packed_.back().streamed_bytes();
      out.stored_bytes_ += m->weight->info->byte_size() + m->scale->info->byte_size();
    }
    stored.push_back(matrices);
    weights.push_back(w);
    return Status::Ok();
  };
  for (int e = 0; e < info.config.router.num_experts; ++e) {
    FP4MOE_RETURN_IF_ERROR(
        load_expert(expand(n.expert_prefix, layer, e), out.expert_matrices_, out.experts_));
  }
  if (dir.find(expand(n.shared_prefix, layer) + n.gate + ".weight") != nullptr) {
    FP4MOE_RETURN_IF_ERROR(
        load_expert(expand(n.shared_prefix, layer), out.shared_matrices_, out.shared_));
  }
  return out;
}

std::string MoeCheckpointLayer::expert_scheme() const {
  return expert_matrices_.empty() ? "none" : expert_matrices_[0][0].scheme;
}
std::string MoeCheckpointLayer::shared_scheme() const {
  return shared_matrices_.empty() ? "none" : shared_matrices_[0][0].scheme;
}

namespace {
Result<DenseExpert> dense_of(const CheckpointDir& dir, const std::array<StoredMatrix, 3>& m) {
  DenseExpert e;
  auto gate = dequantize_matrix(dir, m[0]);
  if (!gate.ok()) return gate.error();
  auto up = dequantize_matrix(dir, m[1]);
  if (!up.ok()) return up.error();
  auto down = dequantize_matrix(dir, m[2]);
  if (!down.ok()) return down.error();
  e.gate = std::move(*gate);
  e.up = std::move(*up);
  e.down = std::move(*down);
  e.inter = m[0].n;
  return e;
}
}  // namespace

Result<DenseExpert> MoeCheckpointLayer::dense_expert(int expert) const {
  return dense_of(*dir_, expert_matrices_.at(static_cast<size_t>(expert)));
}
Result<DenseExpert> MoeCheckpointLayer::dense_shared(int shared) const {
  return dense_of(*dir_, shared_matrices_.at(static_cast<size_t>(shared)));
}

Result<ReferenceOutput> reference_forward(const MoeCheckpointLayer& layer, const float* x,
                                          int64_t tokens, std::span<const int32_t> kernel_ids) {
  const auto& cfg = layer.config();
  const auto& r = cfg.router;
  const int64_t hidden = cfg.hidden;
  const int experts = r.num_experts, top_k = r.top_k;
  const auto router = layer.router();
  ReferenceOutput out;
  out.y.assign(static_cast<size_t>(tokens * hidden), 0.0);
  std::map<int, std::vector<std::pair<int64_t, double>>> by_expert;  // expert -> (token, weight)
  std::vector<double> logits(static_cast<size_t>(experts)), scores(logits.size()),
      select(logits.size());
  for (int64_t t = 0; t < tokens; ++t) {
    const float* xt = x + t * hidden;
    for (int e = 0; e < experts; ++e) {
      double acc = 0;
      for (int64_t h = 0; h < hidden; ++h)
        acc += static_cast<double>(router.weight[static_cast<size_t>(e * hidden + h)]) * xt[h];
      logits[static_cast<size_t>(e)] = acc;
    }
    const double max_logit = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (int e = 0; e < experts; ++e) {
      const double l = logits[static_cast<size_t>(e)];
      double s = 0;
      switch (r.scoring) {
        case moe::ScoringFunc::kSoftmax:
          s = std::exp(l - max_logit);
          sum += s;
          break;
        case moe::ScoringFunc::kSigmoid:
          s = 1.0 / (1.0 + std::exp(-l));
          break;
        case moe::ScoringFunc::kSqrtSoftplus:
          s = std::sqrt(l > 20 ? l : std::log1p(std::exp(l)));
          break;
      }
      scores[static_cast<size_t>(e)] = s;
    }
    if (r.scoring == moe::ScoringFunc::kSoftmax)
      for (double& s : scores) s /= sum;
    for (int e = 0; e < experts; ++e) {
      select[static_cast<size_t>(e)] =
          scores[static_cast<size_t>(e)] +
          (router.correction_bias.empty() ? 0.0 : router.correction_bias[static_cast<size_t>(e)]);
    }
    // Group-limited selection (DeepSeek-V3 n_group/topk_group): mask experts outside the best
    // groups.
    if (r.n_group > 1) {
      const int per_group = experts / r.n_group;
      std::vector<std::pair<double, int>> group_scores;
      for (int g = 0; g < r.n_group; ++g) {
        std::vector<double> s(select.begin() + g * per_group, select.begin() + (g + 1) * per_group);
        std::sort(s.rbegin(), s.rend());
        const double score =
            router.correction_bias.empty() ? s[0] : s[0] + (s.size() > 1 ? s[1] : 0.0);
        group_scores.push_back({score, g});
      }
      std::stable_sort(group_scores.begin(), group_scores.end(),
                       [](auto a, auto b) { return a.first > b.first; });
      std::vector<bool> keep(static_cast<size_t>(r.n_group), false);
      for (int i = 0; i < r.topk_group; ++i)
        keep[static_cast<size_t>(group_scores[static_cast<size_t>(i)].second)] = true;
      for (int e = 0; e < experts; ++e) {
        if (!keep[static_cast<size_t>(e / per_group)]) select[static_cast<size_t>(e)] = -INFINITY;
      }
    }
    std::vector<int> order(static_cast<size_t>(experts));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return select[static_cast<size_t>(a)] > select[static_cast<size_t>(b)];
    });
    std::vector<int> ids(order.begin(), order.begin() + top_k);
    if (!kernel_ids.empty()) {
      std::vector<int> theirs(kernel_ids.begin() + t * top_k, kernel_ids.begin() + (t + 1) * top_k);
      std::vector<int> a = ids, b = theirs;
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      if (a != b) {
        const double kth = select[static_cast<size_t>(ids.back())];
        bool tie = true;
        for (int e : theirs) {
          tie = tie && select[static_cast<size_t>(e)] >=
                           kth - kRoutingTieTolerance * std::max(1.0, std::fabs(kth));
        }
        if (tie) {
          ++out.routing_ties;
          ids = theirs;
        } else {
          ++out.routing_mismatches;
        }
      }
    }
    std::vector<double> w(static_cast<size_t>(top_k));
    double wsum = 0;
    for (int k = 0; k < top_k; ++k)
      wsum += w[static_cast<size_t>(k)] = scores[static_cast<size_t>(ids[static_cast<size_t>(k)])];
    for (int k = 0; k < top_k; ++k) {
      double wk = w[static_cast<size_t>(k)];
      if (r.renormalize) wk /= wsum;
      by_expert[ids[static_cast<size_t>(k)]].push_back({t, wk * r.routed_scaling_factor});
    }
  }
  // Each active expert dequantized once (the reference needs no more memory than one expert).
  for (const auto& [expert, uses] : by_expert) {
    auto dense = layer.dense_expert(expert);
    if (!dense.ok()) return dense.error();
    for (const auto& [t, weight] : uses) {
      expert_forward(*dense, cfg.routed_activation, x + t * hidden, hidden, weight,
                     out.y.data() + t * hidden);
    }
  }
  for (int s = 0; s < layer.shared_count(); ++s) {
    auto dense = layer.dense_shared(s);
    if (!dense.ok()) return dense.error();
    for (int64_t t = 0; t < tokens; ++t) {
      expert_forward(*dense, cfg.shared_activation, x + t * hidden, hidden, 1.0,
                     out.y.data() + t * hidden);
    }
  }
  return out;
}

}  // namespace fp4moe::model
