// Loading a checkpoint's MoE layers for the CPU kernels, and their reference forward
// (moe/reference.h on weights dequantized by formats/).
#include "model/moe_checkpoint.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "checkpoint/dtype.h"
#include "checkpoint/tensor_values.h"
#include "families/families.h"
#include "formats/block.h"
#include "formats/scalar.h"
#include "formats/storage.h"

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

// "{L}" and "{E}" as fnmatch wildcards: the pattern over every layer and expert.
std::string expand_glob(std::string pattern) {
  for (const char* key : {"{L}", "{E}"}) {
    for (size_t pos; (pos = pattern.find(key)) != std::string::npos;) pattern.replace(pos, 3, "*");
  }
  return pattern;
}

// model/'s view of the family table (families/families.h): the rows verify runs, with full name
// templates, one per distinct routed-expert naming (Qwen3-MoE is found by DeepSeek-V3's names).
std::vector<MoeNaming> build_namings() {
  std::vector<MoeNaming> out;
  for (const auto& row : families::table()) {
    if ((row.runs & families::kVerify) == 0) continue;
    auto t = [&row](std::string_view relative) {
      return relative.empty() ? std::string() : families::layer_template(row, relative);
    };
    MoeNaming n;
    n.family = std::string(row.key);
    n.routing = row.routing;
    n.fused = row.layout == families::ExpertLayout::kFusedGateUp;
    n.example = std::string(row.layer_prefix) + "L." + std::string(row.experts) +
                std::string(row.gate) + (n.fused ? "_blocks" : "");
    if (const size_t e = n.example.find("{E}"); e != std::string::npos)
      n.example.replace(e, 3, "E");
    n.router_weight = t(row.router) + ".weight";
    n.router_logit_bias = t(row.router_logit_bias);
    n.router_bias = t(row.router_correction_bias);
    n.expert_prefix = t(row.experts);
    n.shared_prefix = t(row.shared);
    n.gate = std::string(row.gate);
    n.up = std::string(row.up);
    n.down = std::string(row.down);
    const bool seen = std::any_of(out.begin(), out.end(), [&n](const MoeNaming& o) {
      return o.expert_prefix == n.expert_prefix && o.gate == n.gate;
    });
    if (!seen) out.push_back(std::move(n));
  }
  return out;
}

const std::vector<MoeNaming>& namings() {
  static const std::vector<MoeNaming> kNamings = build_namings();
  return kNamings;
}

// The prefixes tried on every checkpoint: none, then each VLM wrapper's (Kimi-K2.5).
std::vector<std::string> prefixes() {
  std::vector<std::string> out = {""};
  for (const auto& p : families::vlm_prefixes()) {
    if (std::find(out.begin(), out.end(), p.prefix) == out.end()) out.emplace_back(p.prefix);
  }
  return out;
}

MoeNaming with_prefix(MoeNaming n, const std::string& prefix) {
  for (std::string* f : {&n.router_weight, &n.router_logit_bias, &n.router_bias, &n.expert_prefix,
                         &n.shared_prefix}) {
    if (!f->empty()) *f = prefix + *f;
  }
  if (!prefix.empty()) n.example = prefix + n.example;
  return n;
}

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

// The classifier's view of the checkpoint (formats/storage.h): a tensor's dtype and shape by name.
formats::TensorLookup lookup(const CheckpointDir& dir) {
  return [&dir](const std::string& name) -> std::optional<formats::TensorDesc> {
    const auto* t = dir.find(name);
    if (t == nullptr) return std::nullopt;
    return formats::TensorDesc{checkpoint::dtype_name(t->info->dtype), t->info->shape};
  };
}

// The stored matrix of a classified module, with its tensors; an error for a form the CPU path
// does not run (one without a codec of formats/).
Result<StoredMatrix> stored_matrix(const CheckpointDir& dir, const formats::StoredMatrix& c,
                                   const std::string& module) {
  const formats::StoredFormInfo& row = *c.row;
  if (!row.codec) {
    const DType dtype = dir.find(c.weight)->info->dtype;
    if (row.form == formats::StoredForm::kDense) {
      return Error{dir.path().string() + ": '" + module + "' is " +
                       std::string(checkpoint::dtype_name(dtype)) +
                       " (not quantized) and the CPU kernels run only MXFP4, NVFP4 and FP8 "
                       "block-128 weights, so its MoE layers cannot run here (convert them first: "
                       "fp4moe convert --to nvfp4)",
                   ErrorKind::kFailed};
    }
    return Error{dir.path().string() + ": '" + module + "' is stored as " + std::string(row.name) +
                 ", a storage the CPU path does not run (MXFP4, NVFP4 ModelOpt or "
                 "compressed-tensors, FP8 block-128)"};
  }
  StoredMatrix m;
  m.module = module;
  m.form = &row;
  m.scheme = std::string(row.scheme);
  m.weight = dir.find(c.weight);
  m.scale = dir.find(c.scale);
  m.tensor_scale = c.tensor_scale.empty() ? nullptr : dir.find(c.tensor_scale);
  m.reciprocal_tensor_scale = row.reciprocal_tensor_scale;
  m.n = c.n;
  m.k = c.k;
  m.source_rows = c.experts > 0 ? c.experts * c.n : c.n;
  return m;
}

Result<StoredMatrix> find_matrix(const CheckpointDir& dir, const std::string& module) {
  auto c = formats::classify_stored(module, lookup(dir));
  if (!c.ok()) {
    if (dir.find(module + ".weight") == nullptr && dir.find(module + ".weight_packed") == nullptr) {
      return Error{dir.path().string() + ": no tensor '" + module +
                   ".weight' (nor '.weight_packed')"};
    }
    return Error{dir.path().string() + ": '" + module +
                 "' is in no storage the CPU path runs (MXFP4, NVFP4 ModelOpt or "
                 "compressed-tensors, FP8 block-128): " +
                 c.error().message};
  }
  if (c->experts > 0) {
    return Error{dir.path().string() + ": '" + module + "' is stored as " +
                 std::string(c->row->name) +
                 ", all experts in one tensor, where one matrix was "
                 "expected"};
  }
  return stored_matrix(dir, *c, module);
}

// gpt-oss: `<prefix><name>_blocks` U8 [E, N, K/32, 16] and `_scales` U8 [E, N, K/32] (MXFP4, as
// released), or ModelOpt's fused NVFP4 export of it (what `fp4moe convert` writes, SGLang's
// ModelOpt fused-MoE loader reads): `<prefix><name>` U8 [E, N, K/2], `<name>_weight_scale`
// F8_E4M3 [E, N, K/16], `<name>_weight_scale_2` F32 scalar (formats/storage.h rows). The matrix of
// expert `e` takes rows {e * N + first, stride}, `n` of them.
Result<StoredMatrix> find_fused_matrix(const CheckpointDir& dir, const std::string& prefix,
                                       const std::string& name, int expert, int64_t first,
                                       int64_t stride, int64_t divisor) {
  const std::string module = prefix + name;
  auto c = formats::classify_stored(module, lookup(dir));
  if (!c.ok() || c->experts == 0) {
    return Error{dir.path().string() + ": gpt-oss experts need '" + module +
                 "_blocks' and '_scales' (MXFP4) or '" + module + "' and '_weight_scale' (NVFP4)" +
                 (c.ok() ? "" : ": " + c.error().message)};
  }
  if (expert >= c->experts || c->n % divisor != 0) {
    return Error{dir.path().string() + ": '" + c->weight + "' (" + std::string(c->row->name) +
                 ") has " + std::to_string(c->experts) + " experts of " + std::to_string(c->n) +
                 " rows: no expert " + std::to_string(expert) + " of " + std::to_string(divisor) +
                 " interleaved matrices"};
  }
  auto m = stored_matrix(dir, *c, module + "[" + std::to_string(expert) + "]");
  if (!m.ok()) return m.error();
  m->n = c->n / divisor;
  m->rows = {expert * c->n + first, stride};
  return m;
}

// NVFP4's dequantization multiplier: weight_scale_2, or 1 / compressed-tensors'
// weight_global_scale.
Result<float> tensor_scale(const CheckpointDir& dir, const StoredMatrix& m) {
  auto ts = read_f32(dir, *m.tensor_scale);
  if (!ts.ok()) return ts.error();
  return m.reciprocal_tensor_scale ? 1.0f / (*ts)[0] : (*ts)[0];
}

// The matrix's rows of a stacked tensor, contiguous ([n, row_bytes]).
std::vector<uint8_t> gather_rows(std::span<const uint8_t> all, const StoredMatrix& m,
                                 int64_t row_bytes) {
  std::vector<uint8_t> out(static_cast<size_t>(m.n * row_bytes));
  for (int64_t r = 0; r < m.n; ++r) {
    const int64_t src = (m.rows.first + r * m.rows.stride) * row_bytes;
    std::copy_n(all.begin() + src, row_bytes, out.begin() + r * row_bytes);
  }
  return out;
}

// Whether the matrix is some of the rows of a stacked tensor (gpt-oss's fused experts).
bool is_stacked(const StoredMatrix& m) {
  return m.source_rows != m.n || m.rows.first != 0 || m.rows.stride != 1;
}

// NVFP4 codes and block scales of the matrix: the tensors as read, or, for some rows of a stacked
// tensor, those rows gathered into `held` (after checking the tensors hold source_rows rows of K).
Status select_nvfp4_rows(const CheckpointDir& dir, const StoredMatrix& m,
                         std::span<const uint8_t>& codes, std::span<const uint8_t>& scales,
                         std::array<std::vector<uint8_t>, 2>& held) {
  if (!is_stacked(m)) return Status::Ok();
  if (m.source_rows * m.k / 2 != static_cast<int64_t>(codes.size()) ||
      m.source_rows * (m.k / 16) != static_cast<int64_t>(scales.size())) {
    return Error{dir.path().string() + ": tensor '" + m.weight->info->name + "' does not hold " +
                 std::to_string(m.source_rows) + " NVFP4 rows of K = " + std::to_string(m.k)};
  }
  held[0] = gather_rows(codes, m, m.k / 2);
  held[1] = gather_rows(scales, m, m.k / 16);
  codes = held[0];
  scales = held[1];
  return Status::Ok();
}

// FP4MOE_TEST_CORRUPT_KERNEL_WEIGHTS=1 (tests only, like FP4MOE_TEST_PAUSE_AFTER_TENSORS): the
// kernel path's copy of every matrix gets the sign bit of every 64th byte flipped (a valid code
// in every format), the reference's does not: a packing fault `verify` must report.
bool corrupt_kernel_weights() {
  static const bool on = [] {
    const char* v = std::getenv("FP4MOE_TEST_CORRUPT_KERNEL_WEIGHTS");
    const bool set = v != nullptr && std::string(v) == "1";
    if (set)
      std::fprintf(stderr, "FP4MOE_TEST_CORRUPT_KERNEL_WEIGHTS=1: kernel weights corrupted\n");
    return set;
  }();
  return on;
}

Result<pack::PackedWeights> pack_matrix(const CheckpointDir& dir, const StoredMatrix& m) {
  auto weight = tensor_bytes(dir, *m.weight);
  if (!weight.ok()) return weight.error();
  std::vector<uint8_t> corrupted;
  if (corrupt_kernel_weights()) {
    corrupted.assign(weight->begin(), weight->end());
    for (size_t i = 0; i < corrupted.size(); i += 64) corrupted[i] ^= 0x80;
    *weight = corrupted;
  }
  auto scale = tensor_bytes(dir, *m.scale);
  if (!scale.ok()) return scale.error();
  const std::string& name = m.weight->info->name;
  switch (*m.form->codec) {
    case formats::BlockFormat::kMxfp4:
      return pack::pack_mxfp4_rows(name, *weight, *scale, m.source_rows, m.rows, m.n, m.k);
    case formats::BlockFormat::kNvfp4: {
      auto ts = tensor_scale(dir, m);
      if (!ts.ok()) return ts.error();
      std::span<const uint8_t> codes = *weight, scales = *scale;
      std::array<std::vector<uint8_t>, 2> held;
      FP4MOE_RETURN_IF_ERROR(select_nvfp4_rows(dir, m, codes, scales, held));
      return pack::pack_nvfp4(name, codes, scales, *ts, m.n, m.k);
    }
    case formats::BlockFormat::kFp8Block128Ue8m0:
      return pack::pack_fp8_block128_ue8m0(name, *weight, *scale, m.n, m.k);
    case formats::BlockFormat::kFp8Block128: {
      auto scales = read_f32(dir, *m.scale);
      if (!scales.ok()) return scales.error();
      return pack::pack_fp8_block128(name, *weight, *scales, m.n, m.k);
    }
  }
  FP4MOE_CHECK(false && "a codec without a pack function");
  return Error{"unreachable"};
}

Result<std::vector<float>> dequantize_matrix(const CheckpointDir& dir, const StoredMatrix& m) {
  auto weight = tensor_bytes(dir, *m.weight);
  if (!weight.ok()) return weight.error();
  auto scale = tensor_bytes(dir, *m.scale);
  if (!scale.ok()) return scale.error();
  std::vector<float> out(static_cast<size_t>(m.n * m.k));
  const std::string& name = m.weight->info->name;
  Status s;
  switch (*m.form->codec) {
    case formats::BlockFormat::kMxfp4: {
      if (m.source_rows * m.k / 2 != static_cast<int64_t>(weight->size()) ||
          m.source_rows * (m.k / 32) != static_cast<int64_t>(scale->size())) {
        return Error{dir.path().string() + ": tensor '" + name + "' does not hold " +
                     std::to_string(m.source_rows) + " MXFP4 rows of K = " + std::to_string(m.k)};
      }
      const std::vector<uint8_t> codes = gather_rows(*weight, m, m.k / 2);
      const std::vector<uint8_t> scales = gather_rows(*scale, m, m.k / 32);
      s = formats::dequantize_mxfp4(name, codes, scales, m.n, m.k, out);
      break;
    }
    case formats::BlockFormat::kNvfp4: {
      auto ts = tensor_scale(dir, m);
      if (!ts.ok()) return ts.error();
      std::span<const uint8_t> codes = *weight, scales = *scale;
      std::array<std::vector<uint8_t>, 2> held;
      FP4MOE_RETURN_IF_ERROR(select_nvfp4_rows(dir, m, codes, scales, held));
      s = formats::dequantize_nvfp4(name, codes, scales, *ts, m.n, m.k, out);
      break;
    }
    case formats::BlockFormat::kFp8Block128Ue8m0:
      s = formats::dequantize_fp8_block128_ue8m0(name, *weight, *scale, m.n, m.k, out);
      break;
    case formats::BlockFormat::kFp8Block128: {
      auto scales = read_f32(dir, *m.scale);
      if (!scales.ok()) return scales.error();
      s = formats::dequantize_fp8_block128(name, *weight, *scales, m.n, m.k, out);
      break;
    }
  }
  if (!s.ok()) return s.error();
  return out;
}

// Multimodal wrappers (Kimi-K2.5) keep the language model's keys under text_config.
const nlohmann::json& language_config(const nlohmann::json& top) {
  return top.contains("text_config") && top["text_config"].is_object() &&
                 !top.contains("hidden_size")
             ? top["text_config"]
             : top;
}

// Whether expert 0 of `layer` exists under `n` in a storage this project reads.
bool has_first_expert(const CheckpointDir& dir, const MoeNaming& n, int layer) {
  const std::string p = expand(n.expert_prefix, layer, 0);
  if (n.fused) {
    return dir.find(p + n.gate + "_blocks") != nullptr ||
           (dir.find(p + n.gate) != nullptr && dir.find(p + n.gate + "_weight_scale") != nullptr);
  }
  return dir.find(p + n.gate + ".weight") != nullptr ||
         dir.find(p + n.gate + ".weight_packed") != nullptr;
}

}  // namespace

Result<MoeNaming> find_moe_naming(const CheckpointDir& dir, std::string_view who) {
  const nlohmann::json& top = dir.config();
  const nlohmann::json& config = language_config(top);
  const int num_layers = json_value<int>(config, "num_hidden_layers", 0);
  for (const auto& row : namings()) {
    for (const std::string& prefix : prefixes()) {
      const MoeNaming n = with_prefix(row, prefix);
      for (int l = 0; l < num_layers; ++l) {
        if (has_first_expert(dir, n, l)) return n;
      }
    }
  }
  std::string known;
  for (const auto& n : namings()) known += (known.empty() ? "'" : ", '") + n.example + "'";
  return Error{dir.path().string() + ": model_type '" +
               json_value<std::string>(config, "model_type",
                                       json_value<std::string>(top, "model_type", "unknown")) +
               "' keeps its routed experts in none of the namings " + std::string(who) + " (" +
               known + ", with L < num_hidden_layers = " + std::to_string(num_layers) + ")"};
}

std::span<const MoeNaming> moe_namings() { return namings(); }

std::string routed_expert_glob(const MoeNaming& naming) {
  return expand_glob(naming.expert_prefix) + "*";
}

Result<MoeModelInfo> read_moe_model(const CheckpointDir& dir) {
  const nlohmann::json& top = dir.config();
  if (!top.is_object())
    return Error{dir.path().string() + ": no config.json: cannot tell the MoE semantics"};
  const nlohmann::json& config = language_config(top);
  MoeModelInfo info;
  info.model_type = json_value<std::string>(config, "model_type",
                                            json_value<std::string>(top, "model_type", "unknown"));
  info.num_layers = json_value<int>(config, "num_hidden_layers", 0);
  auto first_expert = [&dir](const MoeNaming& n, int layer) {
    return has_first_expert(dir, n, layer);
  };
  auto found = find_moe_naming(dir, "verify and bench run");
  if (!found.ok()) return found.error();
  info.naming = *found;
  const MoeNaming& naming = info.naming;
  const bool v4 = naming.routing == families::Routing::kV4 || info.model_type == "deepseek_v4";
  const bool gpt_oss = naming.routing == families::Routing::kSoftmaxOfTopK;
  auto& c = info.config;
  c.hidden = json_value<int64_t>(config, "hidden_size", 0);
  auto& r = c.router;
  r.num_experts = json_value<int>(
      config, "n_routed_experts",
      json_value<int>(config, "num_experts", json_value<int>(config, "num_local_experts", 0)));
  r.top_k = json_value<int>(config, "num_experts_per_tok",
                            json_value<int>(config, "experts_per_token", 0));
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
  // (MOE_SEMANTICS.md §1); MiniMax-M2 always does (HF MiniMaxM2SparseMoeBlock, vLLM
  // renormalize=True); the V3 family and Qwen key it on norm_topk_prob.
  r.renormalize = v4 ? r.scoring != moe::ScoringFunc::kSoftmax
                  : naming.routing == families::Routing::kAlwaysRenorm
                      ? true
                      : json_value<bool>(config, "norm_topk_prob", false);
  r.routed_scaling_factor = json_value<float>(config, "routed_scaling_factor", 1.0f);
  r.n_group = json_value<int>(config, "n_group", 1);
  r.topk_group = json_value<int>(config, "topk_group", 1);
  const float limit = json_value<float>(config, "swiglu_limit", gpt_oss ? 7.0f : 0.0f);
  c.routed_activation = {moe::GatedActivation::kSwiGlu, limit, 1.702f};
  c.shared_activation = {moe::GatedActivation::kSwiGlu, limit, 1.702f};
  if (gpt_oss) {
    // gpt-oss MLPBlock: top-k of the logits (router Linear with bias), softmax over those k;
    // swiglu(alpha 1.702, limit 7) with the +1 on the linear half (MOE_SEMANTICS.md §3).
    r.scoring = moe::ScoringFunc::kSoftmax;
    r.weight_rule = moe::WeightRule::kSoftmaxOfTopK;
    r.renormalize = false;
    c.routed_activation = {moe::GatedActivation::kSwiGluOai, limit, 1.702f};
    c.shared_activation = c.routed_activation;  // no shared expert; said alike in describe()
  }
  if (v4) info.num_hash_layers = json_value<int>(config, "num_hash_layers", 0);
  for (int l = info.num_hash_layers; l < info.num_layers; ++l) {
    if (first_expert(naming, l) && dir.find(expand(naming.router_weight, l)) != nullptr) {
      info.moe_layers.push_back(l);
    }
  }
  if (c.hidden <= 0 || r.num_experts <= 0 || r.top_k <= 0 || r.top_k > r.num_experts) {
    return Error{dir.path().string() +
                 "/config.json: hidden_size, the routed expert count (n_routed_experts, "
                 "num_experts or num_local_experts) and num_experts_per_tok must be positive "
                 "with top_k <= experts"};
  }
  if (info.moe_layers.empty()) {
    return Error{dir.path().string() + ": no " + naming.family +
                 " MoE layer with a score router ('" + naming.router_weight + "')" +
                 (info.num_hash_layers > 0 ? " past the hash-routed layers" : "")};
  }
  // BF16 (or any unrunnable) experts are reported once, here, in one sentence.
  if (!naming.fused) {
    const int l = info.moe_layers.front();
    auto m = find_matrix(dir, expand(naming.expert_prefix, l, 0) + naming.gate);
    if (!m.ok()) return m.error();
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
  auto optional_vector = [&](const std::string& pattern, std::vector<float>& to) -> Status {
    if (pattern.empty()) return Status::Ok();
    const auto* t = dir.find(expand(pattern, layer));
    if (t == nullptr) return Status::Ok();
    auto v = read_f32(dir, *t);
    if (!v.ok()) return v.error();
    to = std::move(*v);
    return Status::Ok();
  };
  FP4MOE_RETURN_IF_ERROR(optional_vector(n.router_bias, out.router_bias_));
  FP4MOE_RETURN_IF_ERROR(optional_vector(n.router_logit_bias, out.router_logit_bias_));
  // Packs the three matrices of one expert and records them.
  auto add_expert = [&](std::array<StoredMatrix, 3> matrices,
                        std::vector<std::array<StoredMatrix, 3>>& stored,
                        std::vector<moe::ExpertWeights>& weights, moe::ExpertWeights w) -> Status {
    const pack::PackedWeights** slots[3] = {&w.gate, &w.up, &w.down};
    for (size_t i = 0; i < 3; ++i) {
      auto packed = pack_matrix(dir, matrices[i]);
      if (!packed.ok()) return packed.error();
      out.packed_.push_back(std::move(*packed));
      *slots[i] = &out.packed_.back();
      out.packed_bytes_ += out.packed_.back().streamed_bytes();
      // A fused tensor holds every expert: count this expert's share.
      const double share = static_cast<double>(matrices[i].n) /
                           static_cast<double>(std::max<int64_t>(matrices[i].source_rows, 1));
      out.stored_bytes_ +=
          static_cast<size_t>(share * static_cast<double>(matrices[i].weight->info->byte_size() +
                                                          matrices[i].scale->info->byte_size()));
    }
    stored.push_back(matrices);
    weights.push_back(w);
    return Status::Ok();
  };
  auto load_expert = [&](const std::string& prefix,
                         std::vector<std::array<StoredMatrix, 3>>& stored,
                         std::vector<moe::ExpertWeights>& weights) -> Status {
    std::array<StoredMatrix, 3> matrices;
    const std::string* names[3] = {&n.gate, &n.up, &n.down};
    for (size_t i = 0; i < 3; ++i) {
      auto m = find_matrix(dir, prefix + *names[i]);
      if (!m.ok()) return m.error();
      matrices[i] = *m;
    }
    return add_expert(matrices, stored, weights, {});
  };
  const int experts = info.config.router.num_experts;
  if (n.fused) {
    const std::string p = expand(n.expert_prefix, layer);
    std::vector<float> gate_up_bias, down_bias;
    FP4MOE_RETURN_IF_ERROR(optional_vector(p + n.gate + "_bias", gate_up_bias));
    FP4MOE_RETURN_IF_ERROR(optional_vector(p + n.down + "_bias", down_bias));
    for (int e = 0; e < experts; ++e) {
      std::array<StoredMatrix, 3> m;
      // gate_up rows interleave gate (even) and up (odd): x[..., ::2], x[..., 1::2].
      for (int64_t half = 0; half < 2; ++half) {
        auto r = find_fused_matrix(dir, p, n.gate, e, half, 2, 2);
        if (!r.ok()) return r.error();
        m[static_cast<size_t>(half)] = *r;
      }
      auto d = find_fused_matrix(dir, p, n.down, e, 0, 1, 1);
      if (!d.ok()) return d.error();
      m[2] = *d;
      const int64_t inter = m[0].n, hidden = m[2].n;
      moe::ExpertWeights w;
      if (!gate_up_bias.empty() || !down_bias.empty()) {
        if (static_cast<int64_t>(gate_up_bias.size()) != int64_t{experts} * 2 * inter ||
            static_cast<int64_t>(down_bias.size()) != int64_t{experts} * hidden) {
          return Error{dir.path().string() + ": '" + p + n.gate + "_bias' / '" + p + n.down +
                       "_bias' are not [E, 2I] and [E, H] for E = " + std::to_string(experts)};
        }
        std::vector<float>& g = out.biases_.emplace_back(static_cast<size_t>(inter));
        std::vector<float>& u = out.biases_.emplace_back(static_cast<size_t>(inter));
        for (int64_t i = 0; i < inter; ++i) {
          g[static_cast<size_t>(i)] = gate_up_bias[static_cast<size_t>((e * inter + i) * 2)];
          u[static_cast<size_t>(i)] = gate_up_bias[static_cast<size_t>((e * inter + i) * 2 + 1)];
        }
        out.biases_.emplace_back(down_bias.begin() + e * hidden,
                                 down_bias.begin() + (e + 1) * hidden);
        w.gate_bias = g;
        w.up_bias = u;
        w.down_bias = out.biases_.back();
      }
      FP4MOE_RETURN_IF_ERROR(add_expert(m, out.expert_matrices_, out.experts_, w));
    }
    return out;
  }
  for (int e = 0; e < experts; ++e) {
    FP4MOE_RETURN_IF_ERROR(
        load_expert(expand(n.expert_prefix, layer, e), out.expert_matrices_, out.experts_));
  }
  if (!n.shared_prefix.empty()) {
    const std::string sp = expand(n.shared_prefix, layer);
    if (dir.find(sp + n.gate + ".weight") != nullptr ||
        dir.find(sp + n.gate + ".weight_packed") != nullptr) {
      FP4MOE_RETURN_IF_ERROR(load_expert(sp, out.shared_matrices_, out.shared_));
    }
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
Result<DenseExpert> dense_of(const CheckpointDir& dir, const std::array<StoredMatrix, 3>& m,
                             const moe::ExpertWeights& w) {
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
  e.gate_bias = w.gate_bias;
  e.up_bias = w.up_bias;
  e.down_bias = w.down_bias;
  e.inter = m[0].n;
  return e;
}
}  // namespace

Result<DenseExpert> MoeCheckpointLayer::dense_expert(int expert) const {
  const auto e = static_cast<size_t>(expert);
  return dense_of(*dir_, expert_matrices_.at(e), experts_.at(e));
}
Result<DenseExpert> MoeCheckpointLayer::dense_shared(int shared) const {
  const auto s = static_cast<size_t>(shared);
  return dense_of(*dir_, shared_matrices_.at(s), shared_.at(s));
}

Result<ReferenceOutput> reference_forward(const MoeCheckpointLayer& layer, const float* x,
                                          int64_t tokens, std::span<const int32_t> kernel_ids) {
  const auto& cfg = layer.config();
  const auto& r = cfg.router;
  const int64_t hidden = cfg.hidden;
  const int top_k = r.top_k;
  const auto router = layer.router();
  ReferenceOutput out;
  out.y.assign(static_cast<size_t>(tokens * hidden), 0.0);
  std::map<int, std::vector<std::pair<int64_t, double>>> by_expert;  // expert -> (token, weight)
  for (int64_t t = 0; t < tokens; ++t) {
    const moe::reference::Routing routing =
        moe::reference::route(r, router, x + t * hidden, hidden);
    std::vector<int> ids = routing.ids;
    std::vector<double> weights = routing.weights;
    if (!kernel_ids.empty()) {
      std::vector<int> theirs(kernel_ids.begin() + t * top_k, kernel_ids.begin() + (t + 1) * top_k);
      std::vector<int> a = ids, b = theirs;
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      if (a != b) {
        const double kth = routing.keys[static_cast<size_t>(ids.back())];
        bool tie = true;
        for (int e : theirs) {
          tie = tie && routing.keys[static_cast<size_t>(e)] >=
                           kth - kRoutingTieTolerance * std::max(1.0, std::fabs(kth));
        }
        if (tie) {
          ++out.routing_ties;
          ids = theirs;
          weights = moe::reference::weights_for(r, routing, ids);
        } else {
          ++out.routing_mismatches;
        }
      }
    }
    for (int k = 0; k < top_k; ++k) {
      by_expert[ids[static_cast<size_t>(k)]].push_back({t, weights[static_cast<size_t>(k)]});
    }
  }
  std::vector<double> xt(static_cast<size_t>(hidden));
  auto load_x = [&](int64_t t) {
    for (int64_t j = 0; j < hidden; ++j) xt[static_cast<size_t>(j)] = x[t * hidden + j];
  };
  // Each active expert dequantized once (the reference needs no more memory than one expert).
  for (const auto& [expert, uses] : by_expert) {
    auto dense = layer.dense_expert(expert);
    if (!dense.ok()) return dense.error();
    for (const auto& [t, weight] : uses) {
      load_x(t);
      moe::reference::expert_forward(dense->view(), cfg.routed_activation, xt.data(), hidden,
                                     weight, out.y.data() + t * hidden, nullptr);
    }
  }
  for (int s = 0; s < layer.shared_count(); ++s) {
    auto dense = layer.dense_shared(s);
    if (!dense.ok()) return dense.error();
    for (int64_t t = 0; t < tokens; ++t) {
      load_x(t);
      moe::reference::expert_forward(dense->view(), cfg.shared_activation, xt.data(), hidden, 1.0,
                                     out.y.data() + t * hidden, nullptr);
    }
  }
  return out;
}

}  // namespace fp4moe::model
