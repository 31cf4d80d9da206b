// Tensor-family classification from safetensors headers (FORMATS.md section 3).
#include "detect/tensors.h"

#include <algorithm>
#include <array>
#include <climits>
#include <set>
#include <string_view>

#include "formats/storage.h"

namespace fp4moe::detect {
namespace {

// Suffixes that name a part of one linear module, longest first so ".weight_scale_2" is not read
// as ".weight" + junk.
constexpr std::array<std::string_view, 20> kSuffixes = {".weight_scale_inv",
                                                        ".weight_global_scale",
                                                        ".input_global_scale",
                                                        ".weight_zero_point",
                                                        ".weight_scale_2",
                                                        ".pre_quant_scale",
                                                        ".weight_packed",
                                                        ".weight_shape",
                                                        ".weight_scale",
                                                        ".input_scale",
                                                        ".weight",
                                                        ".scale",
                                                        ".bias",
                                                        "_weight_scale_2",
                                                        "_weight_scale",
                                                        "_input_scale",
                                                        "_blocks",
                                                        "_scales",
                                                        "_bias",
                                                        ".qweight"};

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

std::string describe(const TensorRecord& t, std::string_view what) {
  return t.dtype + " " + std::string(what) + " " + shape_str(t.shape);
}

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    if (d < 0 || (d != 0 && n > INT64_MAX / d)) return -1;
    n *= d;
  }
  return n;
}

ScaleType scale_type(const std::string& dtype) {
  if (dtype == "F8_E4M3") return ScaleType::kE4M3;
  if (dtype == "F8_E8M0" || dtype == "U8") return ScaleType::kUe8m0;
  if (dtype == "F32") return ScaleType::kF32;
  if (dtype == "BF16") return ScaleType::kBf16;
  if (dtype == "F16") return ScaleType::kF16;
  return ScaleType::kUnknown;
}

bool is_float_dtype(const std::string& d) {
  return d == "BF16" || d == "F16" || d == "F32" || d == "F64";
}

// The detect scheme of a row of formats/'s stored-form table.
SchemeSpec spec_of(const formats::StoredMatrix& c, const std::string& scale_dtype,
                   bool has_input_scale) {
  using formats::StoredForm;
  const ScaleType st = scale_type(scale_dtype);
  switch (c.row->form) {
    case StoredForm::kNvfp4ModelOpt:
    case StoredForm::kNvfp4ModelOptFused:
    case StoredForm::kNvfp4CompressedTensors:
      return {Scheme::kNvfp4, has_input_scale ? Activation::kNvfp4 : Activation::kNone, c.group,
              ScaleType::kE4M3};
    case StoredForm::kMxfp4:
    case StoredForm::kMxfp4CompressedTensors:
    case StoredForm::kMxfp4GptOssFused:
      return {Scheme::kMxfp4, Activation::kNone, c.group, ScaleType::kUe8m0};
    case StoredForm::kFp8Block128:
    case StoredForm::kFp8Block128Ue8m0:
    case StoredForm::kFp8Block128CompressedTensors:
      return {Scheme::kFp8Block, Activation::kFp8Dynamic, c.group, st};
    case StoredForm::kFp8Tensor:
      return {Scheme::kFp8Tensor,
              has_input_scale ? Activation::kFp8Static : Activation::kFp8Dynamic, 0, st};
    case StoredForm::kFp8Channel:
      return {Scheme::kFp8Channel, Activation::kFp8Dynamic, 0, st};
    case StoredForm::kMxfp8:
      return {Scheme::kMxfp8, Activation::kMxfp8, c.group, ScaleType::kUe8m0};
    case StoredForm::kInt4CompressedTensors:
      return {Scheme::kInt4, Activation::kNone, c.group, st};
    case StoredForm::kDense:
      return not_quantized();
  }
  return {Scheme::kUnknown, Activation::kUnknown, 0, ScaleType::kUnknown};
}

// From names alone (an index whose shards are not downloaded): only suffixes that no other
// scheme uses decide; "weight" + "weight_scale" (FP8, MXFP4, NVFP4 of other writers) stays
// unknown so the configs' claim stands.
void classify_by_names(TensorModule& m) {
  auto has = [&](std::string_view s) { return m.parts.count(std::string(s)) != 0; };
  m.has_input_scale = has("input_scale") || has("input_global_scale");
  const Activation a4 = m.has_input_scale ? Activation::kNvfp4 : Activation::kNone;
  std::string parts;
  for (const auto& [suffix, t] : m.parts) parts += (parts.empty() ? "" : " + ") + suffix;
  m.evidence = "index names: " + parts;
  m.spec = {Scheme::kUnknown, Activation::kUnknown, 0, ScaleType::kUnknown};
  const bool weight = has("weight") || has("weight_packed") || has("qweight") || has("_blocks");
  if (!weight) {
    m.spec = not_quantized();  // norms, biases, buffers
  } else if (has("_blocks") && has("_scales")) {
    m.spec = {Scheme::kMxfp4, Activation::kNone, 32, ScaleType::kUe8m0};
    m.evidence += " (gpt-oss MXFP4)";
  } else if (has("weight") && has("weight_scale") && has("weight_scale_2")) {
    m.spec = {Scheme::kNvfp4, a4, 16, ScaleType::kE4M3};
    m.evidence += " (ModelOpt NVFP4)";
  } else if (has("weight_packed") && has("weight_scale") && has("weight_global_scale")) {
    m.spec = {Scheme::kNvfp4, a4, 16, ScaleType::kE4M3};
    m.evidence += " (compressed-tensors NVFP4)";
  } else if (has("weight") && has("weight_scale_inv")) {
    m.spec = {Scheme::kFp8Block, Activation::kFp8Dynamic, 128, ScaleType::kUnknown};
    m.evidence += " (FP8 blocks)";
  } else if (has("weight") && !has("weight_scale") && !has("scale") && !has("weight_packed")) {
    m.spec = not_quantized();
    m.evidence += " (no scale: not quantized)";
  }
}

// From the headers: formats/'s classifier over this module's tensors (`find`: every tensor of the
// checkpoint by name).
void classify(TensorModule& m, const std::map<std::string, const TensorRecord*>& all) {
  if (m.names_only) {
    classify_by_names(m);
    return;
  }
  auto part = [&](std::string_view s) -> const TensorRecord* {
    auto it = m.parts.find(std::string(s));
    return it == m.parts.end() ? nullptr : it->second;
  };
  m.has_input_scale = part("input_scale") || part("input_global_scale");
  m.spec = {Scheme::kUnknown, Activation::kUnknown, 0, ScaleType::kUnknown};
  if (!part("weight") && !part("weight_packed") && !part("qweight") && !part("_blocks")) {
    m.evidence = "no weight tensor";
    m.spec = not_quantized();  // norms' parameters, router biases, buffers
    for (const auto& [suffix, t] : m.parts) {
      if (!is_float_dtype(t->dtype) && t->dtype != "I32" && t->dtype != "I64") {
        m.spec.scheme = Scheme::kUnknown;
      }
    }
    return;
  }
  const formats::TensorLookup find =
      [&all](const std::string& name) -> std::optional<formats::TensorDesc> {
    auto it = all.find(name);
    if (it == all.end()) return std::nullopt;
    return formats::TensorDesc{it->second->dtype, it->second->shape};
  };
  const auto c = formats::classify_stored(m.name, find);
  if (!c.ok()) {
    m.evidence = c.error().message;
    return;
  }
  const TensorRecord* w = all.at(c->weight);
  const TensorRecord* s = c->scale.empty() ? nullptr : all.at(c->scale);
  m.evidence = describe(*w, "weight") + (s ? " + " + describe(*s, "scale") : "");
  m.spec = spec_of(*c, s ? s->dtype : "", m.has_input_scale);
}

}  // namespace

std::pair<std::string, std::string> split_tensor_name(const std::string& name) {
  for (std::string_view suf : kSuffixes) {
    if (name.size() > suf.size() && name.compare(name.size() - suf.size(), suf.size(), suf) == 0) {
      // gpt-oss "_blocks/_scales/_bias" only follow a projection ("gate_up_proj_blocks"); a
      // router's "e_score_correction_bias" is a parameter name, not a suffix.
      if (suf[0] == '_' && !name.substr(0, name.size() - suf.size()).ends_with("proj")) continue;
      // ModelOpt's fused-expert export (gpt-oss NVFP4) spells ".weight_scale" as "_weight_scale".
      const bool fused_scale = suf.starts_with("_weight_scale") || suf == "_input_scale";
      std::string key(suf[0] == '.' || fused_scale ? suf.substr(1) : suf);
      return {name.substr(0, name.size() - suf.size()), key};
    }
  }
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos) return {name, ""};
  return {name.substr(0, dot), name.substr(dot + 1)};
}

int dtype_size(const std::string& d) {
  if (d == "U8" || d == "I8" || d == "F8_E4M3" || d == "F8_E5M2" || d == "F8_E8M0" || d == "BOOL") {
    return 1;
  }
  if (d == "BF16" || d == "F16" || d == "I16" || d == "U16") return 2;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  return 0;
}

TensorEvidence classify_tensors(const std::vector<TensorRecord>& tensors) {
  TensorEvidence ev;
  std::map<std::string, TensorModule> modules;
  // ModelOpt's fused-expert export names the packed weight with no suffix at all
  // ("mlp.experts.gate_up_proj" beside "mlp.experts.gate_up_proj_weight_scale").
  std::set<std::string> names;
  for (const auto& t : tensors) names.insert(t.name);
  for (const auto& t : tensors) {
    auto [module, suffix] = names.count(t.name + "_weight_scale")
                                ? std::pair<std::string, std::string>{t.name, "weight"}
                                : split_tensor_name(t.name);
    if (suffix == "k_scale" || suffix == "v_scale") {
      ev.kv_scale_tensors.push_back(t.name);
      continue;
    }
    TensorModule& m = modules[module];
    m.name = module;
    m.parts[suffix] = &t;
    if (t.dtype.empty()) {  // a name from the index: no dtype, no shape, no bytes
      m.names_only = true;
      continue;
    }
    const int size = dtype_size(t.dtype);
    if (size == 0) {
      ev.unknown_dtypes.push_back(t.name + " (" + t.dtype + ")");
    }
    const int64_t n = numel(t.shape);
    if (n >= 0 && size > 0 && n <= INT64_MAX / size && m.bytes <= INT64_MAX - n * size) {
      m.bytes += n * size;
    }
  }
  std::map<std::string, const TensorRecord*> by_name;
  for (const auto& t : tensors) by_name.emplace(t.name, &t);
  for (auto& [name, m] : modules) {
    classify(m, by_name);
    ev.modules.push_back(std::move(m));
  }
  return ev;
}

}  // namespace fp4moe::detect
