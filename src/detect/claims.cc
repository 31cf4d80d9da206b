// Reads every quantization declaration dialect into per-module claims (see claims.h).
#include "detect/claims.h"

#include <algorithm>
#include <cctype>

#include "detect/json_util.h"

namespace fp4moe::detect {
namespace {

using nlohmann::json;

#define DETECT_ASSIGN(lhs, expr)                   \
  do {                                             \
    auto detect_r_ = (expr);                       \
    if (!detect_r_.ok()) return detect_r_.error(); \
    lhs = std::move(detect_r_).value();            \
  } while (0)

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

SchemeSpec spec(Scheme s, Activation a, int group, ScaleType scale) { return {s, a, group, scale}; }

SchemeSpec unknown_spec() {
  return spec(Scheme::kUnknown, Activation::kUnknown, 0, ScaleType::kUnknown);
}

// Roles whose modules are linear layers that a "quantize every Linear" declaration covers.
// Routers are left out: every producer here keeps them high precision or lists them.
bool linear_role(Role role) {
  switch (role) {
    case Role::kRoutedExperts:
    case Role::kSharedExperts:
    case Role::kAttention:
    case Role::kDenseMlp:
    case Role::kLmHead:
    case Role::kMtpExperts:
    case Role::kMtpOther:
    case Role::kSsm:
    case Role::kVision:
      return true;
    case Role::kEmbedding:
    case Role::kRouter:
    case Role::kOther:
      return false;
  }
  return false;
}

bool expert_role(Role role) { return role == Role::kRoutedExperts || role == Role::kMtpExperts; }

Result<PatternSet> read_patterns(const json& list, const std::string& where) {
  PatternSet set;
  if (!list.is_array()) return Error{where + " must be a list of module patterns"};
  for (const auto& item : list) {
    if (!item.is_string()) return Error{where + ": entry " + item.dump() + " is not a string"};
    auto p = Pattern::parse(item.get<std::string>(), where);
    if (!p.ok()) return p.error();
    set.add(std::move(p).value());
  }
  return set;
}

// The reference DeepSeek-V4 storage of a module that no NVFP4 section converted.
SchemeSpec deepseek_v4_native(const ArchInfo& arch, Role role, ScaleType block_scale,
                              std::string* source) {
  if (expert_role(role)) {
    if (arch.expert_dtype == "fp4") {
      *source = "top-level expert_dtype: fp4 (reference MXFP4 experts)";
      return spec(Scheme::kMxfp4, Activation::kUnknown, 32, ScaleType::kUe8m0);
    }
    if (arch.expert_dtype.empty() || arch.expert_dtype == "fp8") {
      *source = arch.expert_dtype.empty() ? "no expert_dtype: experts follow quant_method fp8"
                                          : "top-level expert_dtype: fp8";
      return spec(Scheme::kFp8Block, Activation::kFp8Dynamic, 128, block_scale);
    }
    *source = "top-level expert_dtype: " + arch.expert_dtype + " (not a known value)";
    return unknown_spec();
  }
  if (role == Role::kLmHead || role == Role::kEmbedding || role == Role::kRouter ||
      role == Role::kOther) {
    *source = "DeepSeek-V4 keeps head, embed and gates unquantized";
    return not_quantized();
  }
  *source = "DeepSeek-V4 reference layout: FP8 128x128 blocks";
  return spec(Scheme::kFp8Block, Activation::kFp8Dynamic, 128, block_scale);
}

Result<SchemeSpec> ct_group_spec(const json& group, const std::string& fmt_default,
                                 const std::string& where) {
  const json* w = jsonu::member(group, "weights");
  if (w == nullptr || !w->is_object()) return unknown_spec();
  std::optional<int64_t> bits, gsize;
  std::optional<std::string> type, strategy, fmt;
  DETECT_ASSIGN(bits, jsonu::get_int(*w, "num_bits", where));
  DETECT_ASSIGN(gsize, jsonu::get_int(*w, "group_size", where));
  DETECT_ASSIGN(type, jsonu::get_string(*w, "type", where));
  DETECT_ASSIGN(strategy, jsonu::get_string(*w, "strategy", where));
  DETECT_ASSIGN(fmt, jsonu::get_string(group, "format", where));
  const std::string format = fmt.value_or(fmt_default);
  Activation act = Activation::kNone;
  if (const json* in = jsonu::member(group, "input_activations"); in && in->is_object()) {
    std::optional<int64_t> abits;
    std::optional<std::string> atype;
    DETECT_ASSIGN(abits, jsonu::get_int(*in, "num_bits", where));
    DETECT_ASSIGN(atype, jsonu::get_string(*in, "type", where));
    const json* dyn = jsonu::member(*in, "dynamic");
    const bool dynamic = dyn && ((dyn->is_boolean() && dyn->get<bool>()) || dyn->is_string());
    if (abits == 4 && atype == "float")
      act = Activation::kNvfp4;
    else if (abits == 8 && atype == "float")
      act = dynamic ? Activation::kFp8Dynamic : Activation::kFp8Static;
    else
      act = Activation::kUnknown;
  }
  const std::string st = strategy.value_or("");
  if (bits == 4 && type == "float") {
    if (format == "mxfp4-pack-quantized" || gsize == 32) {
      return spec(Scheme::kMxfp4, act, 32, ScaleType::kUe8m0);
    }
    if (gsize.value_or(16) == 16) return spec(Scheme::kNvfp4, act, 16, ScaleType::kE4M3);
    return unknown_spec();
  }
  if (bits == 4 && type == "int") {
    return spec(Scheme::kInt4, act, st == "channel" ? 0 : static_cast<int>(gsize.value_or(0)),
                ScaleType::kBf16);
  }
  if (bits == 8 && type == "float") {
    if (st == "block") {
      int block = 128;
      if (const json* bs = jsonu::member(*w, "block_structure");
          bs && bs->is_array() && bs->size() == 2 && (*bs)[1].is_number_integer()) {
        block = (*bs)[1].get<int>();
      }
      return spec(Scheme::kFp8Block, act, block, ScaleType::kF32);
    }
    if (st == "channel") return spec(Scheme::kFp8Channel, act, 0, ScaleType::kF32);
    if (st == "group" && gsize == 32) return spec(Scheme::kMxfp8, act, 32, ScaleType::kUe8m0);
    if (st == "tensor" || st.empty()) return spec(Scheme::kFp8Tensor, act, 0, ScaleType::kF32);
  }
  return unknown_spec();
}

struct Reader {
  const ArchInfo& arch;
  std::vector<Finding>& findings;

  void find(Severity s, std::string code, std::string message) {
    findings.push_back({s, std::move(code), std::move(message)});
  }

  Status read_kv(Section& sec, const json& q, const std::string& where) {
    for (const char* key : {"kv_cache_quant_algo", "kv_cache_scheme"}) {
      auto it = q.is_object() ? q.find(key) : q.end();
      if (it == q.end()) continue;
      sec.kv_declared = true;
      const auto kv = kv_scheme(*it);
      sec.kv = kv.value_or(Scheme::kUnknown);
      sec.kv_source = where + " " + key + "=" + it->dump();
      if (!kv) {
        find(Severity::kWarning, "kv_cache_unknown",
             sec.kv_source +
                 " is a KV-cache spelling this tool does not know; the KV cache "
                 "format is reported as unknown");
      }
    }
    return Status::Ok();
  }

  // ModelOpt: hf_quant_config.json "quantization" object, or the flat config.json form.
  Result<Section> modelopt(const json& q, const std::string& file, bool flat) {
    Section sec;
    sec.file = file;
    std::optional<std::string> algo;
    std::optional<int64_t> group;
    DETECT_ASSIGN(algo, jsonu::get_string(q, "quant_algo", file));
    DETECT_ASSIGN(group, jsonu::get_int(q, "group_size", file));
    if (!group && flat) {
      // The flat (config.json) ModelOpt form keeps the group size in config_groups.*.weights.
      if (const json* groups = jsonu::member(q, "config_groups"); groups && groups->is_object()) {
        for (const auto& [gname, g] : groups->items()) {
          if (const json* w = jsonu::member(g, "weights"); w && !group) {
            DETECT_ASSIGN(group,
                          jsonu::get_int(*w, "group_size", file + " config_groups." + gname));
          }
        }
      }
    }
    const char* ex_key = flat ? "ignore" : "exclude_modules";
    const json* ex = jsonu::member(q, ex_key);
    if (ex == nullptr && flat) ex = jsonu::member(q, (ex_key = "exclude_modules"));
    if (ex != nullptr) {
      DETECT_ASSIGN(sec.excludes, read_patterns(*ex, file + " " + ex_key));
      sec.excludes_declared = true;
    }
    sec.excludes_key = ex_key;
    FP4MOE_RETURN_IF_ERROR(read_kv(sec, q, file));
    const std::string a = upper(algo.value_or(""));
    if (a == "MIXED_PRECISION") {
      sec.kind = Section::Kind::kModeloptMixed;
      sec.dialect = "modelopt MIXED_PRECISION";
      const json* layers = jsonu::member(q, "quantized_layers");
      if (layers == nullptr || !layers->is_object()) {
        return Error{file + ": quant_algo MIXED_PRECISION needs a 'quantized_layers' object"};
      }
      for (const auto& [name, entry] : layers->items()) {
        const std::string where = file + " quantized_layers['" + name + "']";
        std::optional<std::string> la;
        std::optional<int64_t> lg;
        DETECT_ASSIGN(la, jsonu::get_string(entry, "quant_algo", where));
        DETECT_ASSIGN(lg, jsonu::get_int(entry, "group_size", where));
        if (!la) return Error{where + ": entry has no quant_algo"};
        auto s = modelopt_algo(upper(*la), lg ? lg : group);
        if (!s) {
          find(Severity::kWarning, "unknown_quant_algo",
               where + ": quant_algo '" + *la +
                   "' is not a ModelOpt algorithm this tool knows; "
                   "its modules are reported as unknown");
        }
        auto p = Pattern::parse(name, where);
        if (!p.ok()) return p.error();
        sec.rules.push_back({std::move(p).value(), false, s.value_or(unknown_spec()),
                             file + " quantized_layers '" + name + "' quant_algo=" + *la});
      }
      sec.native_base = arch.family == Family::kDeepseekV4;
      return sec;
    }
    auto s = modelopt_algo(a, group);
    if (!s) {
      sec.kind = Section::Kind::kUnknown;
      sec.dialect = "modelopt quant_algo '" + algo.value_or("<missing>") + "' (unknown)";
      find(Severity::kError, "unknown_dialect",
           file + ": quant_algo '" + algo.value_or("<missing>") +
               "' is not a ModelOpt algorithm this tool knows; every module is reported unknown "
               "rather than guessed");
      return sec;
    }
    sec.kind = Section::Kind::kModelopt;
    sec.dialect = "modelopt " + a;
    sec.all_linears = *s;
    sec.all_linears_source = file + " quant_algo=" + a;
    if (s->scheme == Scheme::kNvfp4 && !group) {
      find(Severity::kWarning, "modelopt_incomplete",
           file + ": quant_algo " + a +
               " without group_size: NVFP4 implies 16, but vLLM's "
               "ModelOpt NVFP4 loader rejects a config without group_size");
    }
    if (!sec.excludes_declared) {
      find(Severity::kWarning, "modelopt_incomplete",
           file + ": no " + ex_key +
               " list. Real ModelOpt exports always list the modules "
               "left in high precision (at least lm_head), so this file looks like a stub; "
               "lm_head and MTP layers are reported unknown, everything else as " +
               a + ". vLLM's ModelOpt loader rejects a config without exclude_modules");
    }
    return sec;
  }

  Result<Section> compressed_tensors(const json& q, const std::string& file) {
    Section sec;
    sec.file = file;
    sec.kind = Section::Kind::kCompressedTensors;
    std::optional<std::string> fmt;
    DETECT_ASSIGN(fmt, jsonu::get_string(q, "format", file));
    sec.dialect = "compressed-tensors " + fmt.value_or("");
    const json* groups = jsonu::member(q, "config_groups");
    if (groups == nullptr || !groups->is_object()) {
      return Error{file + ": compressed-tensors config needs a 'config_groups' object"};
    }
    for (const auto& [gname, group] : groups->items()) {
      const std::string where = file + " config_groups." + gname;
      if (!group.is_object()) return Error{where + " must be an object"};
      SchemeSpec s;
      DETECT_ASSIGN(s, ct_group_spec(group, fmt.value_or(""), where));
      if (s.scheme == Scheme::kUnknown) {
        find(Severity::kWarning, "unknown_dialect",
             where + ": a weight scheme this tool does not know (" +
                 (jsonu::member(group, "weights") ? jsonu::member(group, "weights")->dump()
                                                  : std::string("no 'weights'")) +
                 "); its targets are reported unknown");
      }
      const json* targets = jsonu::member(group, "targets");
      if (targets == nullptr || !targets->is_array()) {
        return Error{where + ": 'targets' must be a list"};
      }
      for (const auto& t : *targets) {
        if (!t.is_string()) return Error{where + ": target " + t.dump() + " is not a string"};
        const std::string text = t.get<std::string>();
        auto p = Pattern::parse(text, where + ".targets");
        if (!p.ok()) return p.error();
        sec.rules.push_back(
            {std::move(p).value(), text == "Linear", s, where + " target '" + text + "'"});
      }
    }
    if (const json* ig = jsonu::member(q, "ignore")) {
      DETECT_ASSIGN(sec.excludes, read_patterns(*ig, file + " ignore"));
      sec.excludes_declared = true;
    }
    sec.excludes_key = "ignore";
    FP4MOE_RETURN_IF_ERROR(read_kv(sec, q, file));
    return sec;
  }

  // config.json quantization_config (or compression_config): dispatch on quant_method.
  Result<Section> config_section(const json& q, const std::string& file) {
    if (!q.is_object()) return Error{file + " must be an object"};
    std::optional<std::string> method;
    DETECT_ASSIGN(method, jsonu::get_string(q, "quant_method", file));
    std::optional<std::string> algo, moe_algo;
    DETECT_ASSIGN(algo, jsonu::get_string(q, "quant_algo", file));
    DETECT_ASSIGN(moe_algo, jsonu::get_string(q, "moe_quant_algo", file));
    if (!method) {
      if (algo) {
        find(Severity::kWarning, "missing_quant_method",
             file + " has quant_algo '" + *algo +
                 "' but no quant_method. SGLang treats it as "
                 "ModelOpt; vLLM only takes ModelOpt when quant_method starts with "
                 "'modelopt', so it does not recognize this section (TensorRT-LLM reads "
                 "hf_quant_config.json instead)");
        return modelopt(q, file, /*flat=*/true);
      }
      if (jsonu::member(q, "config_groups") && jsonu::member(q, "format")) {
        return compressed_tensors(q, file);
      }
      Section sec;
      sec.file = file;
      sec.kind = Section::Kind::kUnknown;
      sec.dialect = "unknown (no quant_method)";
      find(Severity::kError, "unknown_dialect",
           file + " has no quant_method and no quant_algo; every module is reported unknown");
      return sec;
    }
    const std::string m = *method;
    if (m == "compressed-tensors") return compressed_tensors(q, file);
    if (m.rfind("modelopt", 0) == 0) return modelopt(q, file, /*flat=*/true);
    if (m == "mxfp4") {
      Section sec;
      sec.file = file;
      sec.kind = Section::Kind::kHfMxfp4;
      sec.dialect = "mxfp4 (gpt-oss)";
      sec.all_linears = spec(Scheme::kMxfp4, Activation::kNone, 32, ScaleType::kUe8m0);
      sec.all_linears_source = file + " quant_method=mxfp4";
      if (const json* ex = jsonu::member(q, "modules_to_not_convert")) {
        DETECT_ASSIGN(sec.excludes, read_patterns(*ex, file + " modules_to_not_convert"));
        sec.excludes_declared = true;
      }
      sec.excludes_key = "modules_to_not_convert";
      return sec;
    }
    if (m == "fp8") {
      Section sec;
      sec.file = file;
      std::optional<std::string> scale_fmt, act_scheme;
      DETECT_ASSIGN(scale_fmt, jsonu::get_string(q, "scale_fmt", file));
      DETECT_ASSIGN(act_scheme, jsonu::get_string(q, "activation_scheme", file));
      const json* wbs = jsonu::member(q, "weight_block_size");
      int block = 0;
      if (wbs != nullptr) {
        if (!wbs->is_array() || wbs->size() != 2 || !(*wbs)[0].is_number_integer() ||
            !(*wbs)[1].is_number_integer() || (*wbs)[0].get<int64_t>() <= 0 ||
            (*wbs)[1].get<int64_t>() <= 0) {
          return Error{file + ": weight_block_size must be two positive integers, got " +
                       wbs->dump()};
        }
        block = (*wbs)[1].get<int>();
        if ((*wbs)[0] != (*wbs)[1]) {
          find(Severity::kInfo, "nonsquare_block",
               file + ": weight_block_size " + wbs->dump() +
                   " is not square; group_size "
                   "reports the K extent");
        }
      }
      const Activation act =
          act_scheme == "static" ? Activation::kFp8Static : Activation::kFp8Dynamic;
      const ScaleType scale = scale_fmt == "ue8m0" ? ScaleType::kUe8m0 : ScaleType::kF32;
      sec.all_linears = block > 0 ? spec(Scheme::kFp8Block, act, block, scale)
                                  : spec(Scheme::kFp8Tensor, act, 0, ScaleType::kF32);
      sec.all_linears_source = file + " quant_method=fp8" +
                               (block > 0 ? " weight_block_size=" + wbs->dump() : "") +
                               (scale_fmt ? " scale_fmt=" + *scale_fmt : "");
      if (const json* ex = jsonu::member(q, "modules_to_not_convert")) {
        DETECT_ASSIGN(sec.excludes, read_patterns(*ex, file + " modules_to_not_convert"));
        sec.excludes_declared = true;
      }
      sec.excludes_key = "modules_to_not_convert";
      sec.kind = Section::Kind::kHfFp8;
      sec.dialect = block > 0 ? "fp8 block" : "fp8 per-tensor";
      sec.native_base = arch.family == Family::kDeepseekV4;
      if (algo || moe_algo) {
        // NVIDIA's DeepSeek-V4 NVFP4: the fp8 section carries a ModelOpt MIXED_PRECISION
        // declaration for the experts (what each engine makes of it: src/engines/rules).
        sec.kind = Section::Kind::kDeepseekV4Hybrid;
        sec.dialect =
            "deepseek-v4 hybrid: fp8 base + " + moe_algo.value_or(algo.value_or("")) + " experts";
        sec.native_base = true;
        if (const json* layers = jsonu::member(q, "quantized_layers")) {
          if (!layers->is_object()) return Error{file + ": quantized_layers must be an object"};
          std::optional<int64_t> group;
          DETECT_ASSIGN(group, jsonu::get_int(q, "group_size", file));
          for (const auto& [name, entry] : layers->items()) {
            const std::string where = file + " quantized_layers['" + name + "']";
            std::optional<std::string> la;
            std::optional<int64_t> lg;
            DETECT_ASSIGN(la, jsonu::get_string(entry, "quant_algo", where));
            DETECT_ASSIGN(lg, jsonu::get_int(entry, "group_size", where));
            auto s = modelopt_algo(upper(la.value_or("")), lg ? lg : group);
            auto p = Pattern::parse(name, where);
            if (!p.ok()) return p.error();
            sec.rules.push_back(
                {std::move(p).value(), false, s.value_or(unknown_spec()),
                 file + " quantized_layers '" + name + "' quant_algo=" + la.value_or("?")});
          }
        }
        if (moe_algo) {
          std::optional<int64_t> group;
          DETECT_ASSIGN(group, jsonu::get_int(q, "group_size", file));
          sec.moe_override = modelopt_algo(upper(*moe_algo), group);
          sec.moe_override_source = file + " moe_quant_algo=" + *moe_algo;
          if (!sec.moe_override) {
            sec.moe_override = unknown_spec();
            find(Severity::kError, "unknown_dialect",
                 file + ": moe_quant_algo '" + *moe_algo +
                     "' is not known; routed experts are "
                     "reported unknown");
          }
          if (arch.family != Family::kDeepseekV4 && arch.has_config) {
            // moe_quant_algo is known as a key of the engines' DeepSeek-V4 code paths only (rules
            // sglang.dsv4.nvfp4_hybrid, vllm.dsv4.nvfp4); no rule covers it for other models.
            find(Severity::kWarning, "quant_method_hides_moe_format",
                 file + " says quant_method 'fp8' and moe_quant_algo '" + *moe_algo +
                     "' for model_type '" + arch.model_type +
                     "': the engines are known to read moe_quant_algo only on their DeepSeek-V4 "
                     "paths; no engine rule covers it for this model, and a loader that reads "
                     "quant_method alone builds FP8 experts for these " +
                     upper(*moe_algo) +
                     " weights. `fp4moe plan DIR --target sm_100` (your GPU's sm_XX) shows what "
                     "each engine's rules say of this checkpoint");
          } else {
            find(
                Severity::kWarning, "quant_method_hides_moe_format",
                file + " says quant_method 'fp8' but moe_quant_algo '" + *moe_algo +
                    "': the routed experts are " + upper(*moe_algo) +
                    ", not FP8. SGLang before PR #25820 reads them as MXFP4 (rule "
                    "sglang.dsv4.fp4_probe_as_mxfp4); SGLang >= 0.5.14 and vLLM >= 0.22.0 route "
                    "them to their ModelOpt NVFP4 MoE only for moe_quant_algo exactly NVFP4 "
                    "(rules sglang.dsv4.nvfp4_hybrid, vllm.dsv4.nvfp4); TensorRT-LLM ignores the "
                    "key and probes the expert dtype (rule trtllm.dsv4.probe_nvfp4). `fp4moe "
                    "plan DIR --target sm_100` (your GPU's sm_XX) applies them to this checkpoint");
          }
        }
        if (const json* ig = jsonu::member(q, "ignore")) {
          DETECT_ASSIGN(sec.excludes, read_patterns(*ig, file + " ignore"));
          sec.excludes_declared = true;
          sec.excludes_key = "ignore";
        }
        FP4MOE_RETURN_IF_ERROR(read_kv(sec, q, file));
      }
      return sec;
    }
    Section sec;
    sec.file = file;
    sec.kind = Section::Kind::kUnknown;
    sec.dialect = "quant_method '" + m + "' (unknown)";
    find(Severity::kError, "unknown_dialect",
         file + ": quant_method '" + m +
             "' is not a dialect this tool knows; every module is "
             "reported unknown rather than guessed");
    return sec;
  }
};

}  // namespace

std::optional<SchemeSpec> modelopt_algo(std::string_view algo, std::optional<int64_t> group) {
  const int g = static_cast<int>(group.value_or(0));
  if (algo == "NVFP4" || algo == "NVFP4_AWQ") {
    return spec(Scheme::kNvfp4, Activation::kNvfp4, g ? g : 16, ScaleType::kE4M3);
  }
  if (algo == "W4A16_NVFP4")
    return spec(Scheme::kNvfp4, Activation::kNone, g ? g : 16, ScaleType::kE4M3);
  if (algo == "W4A8_NVFP4_FP8") {
    return spec(Scheme::kNvfp4, Activation::kFp8Static, g ? g : 16, ScaleType::kE4M3);
  }
  if (algo == "W4A8_MXFP4_FP8") {
    return spec(Scheme::kMxfp4, Activation::kFp8Static, 32, ScaleType::kUe8m0);
  }
  if (algo == "FP8") return spec(Scheme::kFp8Tensor, Activation::kFp8Static, 0, ScaleType::kF32);
  if (algo == "FP8_PER_CHANNEL_PER_TOKEN") {
    return spec(Scheme::kFp8Channel, Activation::kFp8Dynamic, 0, ScaleType::kF32);
  }
  if (algo == "FP8_PB_WO")
    return spec(Scheme::kFp8Block, Activation::kNone, g ? g : 128, ScaleType::kF32);
  if (algo == "MXFP8") return spec(Scheme::kMxfp8, Activation::kMxfp8, 32, ScaleType::kUe8m0);
  if (algo == "W4A16_AWQ")
    return spec(Scheme::kInt4, Activation::kNone, g ? g : 128, ScaleType::kF16);
  if (algo == "W4A8_AWQ")
    return spec(Scheme::kInt4, Activation::kFp8Static, g ? g : 128, ScaleType::kF16);
  return std::nullopt;
}

std::optional<Scheme> kv_scheme(const json& v) {
  if (v.is_null()) return Scheme::kBf16;
  if (v.is_string()) {
    const std::string s = upper(v.get<std::string>());
    if (s.empty() || s == "NONE" || s == "AUTO" || s == "BF16" || s == "FP16" || s == "FLOAT16" ||
        s == "BFLOAT16") {
      return Scheme::kBf16;
    }
    if (s == "FP8" || s == "FP8_E4M3" || s == "E4M3") return Scheme::kFp8Tensor;
    if (s == "NVFP4") return Scheme::kNvfp4;
    return std::nullopt;
  }
  if (v.is_object()) {
    const json* bits = jsonu::member(v, "num_bits");
    const json* type = jsonu::member(v, "type");
    const json* strategy = jsonu::member(v, "strategy");
    const std::string st =
        strategy && strategy->is_string() ? strategy->get<std::string>() : "tensor";
    if (bits && type && *bits == 8 && *type == "float") {
      if (st == "tensor") return Scheme::kFp8Tensor;
      if (st == "channel" || st == "attn_head" || st == "head") return Scheme::kFp8Channel;
    }
    if (bits && type && *bits == 4 && *type == "float") return Scheme::kNvfp4;
    return std::nullopt;
  }
  return std::nullopt;
}

namespace {

// The role a module's claim is judged by. An MTP layer's own token embedding and output head
// (DeepSeek-V3's model.layers.{N}.embed_tokens and .shared_head.head) are grouped as MTP modules
// but are an embedding and an output head: no dialect converts them (the V3 FP8 release keeps
// them BF16 like model.embed_tokens and lm_head), so they are claimed as such.
Role claim_role(std::string_view module, Role role) {
  if (role != Role::kMtpOther) return role;
  const size_t dot = module.rfind('.');
  const std::string_view last = dot == std::string_view::npos ? module : module.substr(dot + 1);
  if (last == "embed_tokens" || last == "embeddings" || last == "embed") return Role::kEmbedding;
  const std::string_view head = ".shared_head.head";
  if (last == "lm_head" ||
      (module.size() > head.size() && module.substr(module.size() - head.size()) == head)) {
    return Role::kLmHead;
  }
  return role;
}

}  // namespace

Claim ConfigClaims::claim(const Section& sec, std::string_view module, Role role) const {
  role = claim_role(module, role);
  const ScaleType v4_scale = sec.all_linears && sec.all_linears->scale == ScaleType::kUe8m0
                                 ? ScaleType::kUe8m0
                             : sec.native_base && !sec.all_linears ? ScaleType::kUe8m0
                                                                   : ScaleType::kF32;
  auto base = [&](std::string why) -> Claim {
    if (sec.native_base) {
      std::string src;
      SchemeSpec s = deepseek_v4_native(arch, role, v4_scale, &src);
      return {s, why.empty() ? src : why + "; " + src};
    }
    return {not_quantized(), why.empty() ? sec.file + ": not listed, so not quantized" : why};
  };
  if (sec.kind == Section::Kind::kNone) {
    if (arch.family == Family::kDeepseekV4 && !arch.expert_dtype.empty()) {
      std::string src;
      SchemeSpec s = deepseek_v4_native(arch, role, ScaleType::kUe8m0, &src);
      return {s, "no quantization_config; " + src};
    }
    return {not_quantized(), "no quantization declared"};
  }
  if (sec.kind == Section::Kind::kUnknown) return {unknown_spec(), sec.dialect};
  if (role == Role::kEmbedding || role == Role::kOther) {
    return {not_quantized(), "embeddings and norms are not quantized by these dialects"};
  }
  if (const Pattern* p = sec.excludes.match(module)) {
    return base(sec.file + " " + sec.excludes_key + " '" + p->text() + "'");
  }
  for (const auto& rule : sec.rules) {
    if (rule.linear_class ? linear_role(role) : rule.pattern.matches(module)) {
      return {rule.spec, rule.source};
    }
  }
  if (sec.moe_override && role == Role::kRoutedExperts) {
    return {*sec.moe_override, sec.moe_override_source};
  }
  switch (sec.kind) {
    case Section::Kind::kHfFp8:
    case Section::Kind::kDeepseekV4Hybrid:
      if (role == Role::kLmHead) {
        return {not_quantized(), "quant_method fp8 never converts the output head"};
      }
      if (sec.native_base || role == Role::kRouter) return base("");
      return {*sec.all_linears, sec.all_linears_source};
    case Section::Kind::kHfMxfp4:
      if (expert_role(role)) return {*sec.all_linears, sec.all_linears_source};
      return {not_quantized(), "quant_method mxfp4 converts only the MoE experts"};
    case Section::Kind::kModelopt:
      if (!sec.excludes_declared &&
          (role == Role::kLmHead || role == Role::kMtpExperts || role == Role::kMtpOther)) {
        return {unknown_spec(), sec.file +
                                    " has no exclude list; ModelOpt leaves lm_head and "
                                    "MTP layers unquantized by default"};
      }
      if (role == Role::kRouter) return {not_quantized(), "router gates stay high precision"};
      return {*sec.all_linears, sec.all_linears_source};
    case Section::Kind::kModeloptMixed:
    case Section::Kind::kCompressedTensors:
      return base("");
    case Section::Kind::kNone:
    case Section::Kind::kUnknown:
      break;
  }
  return {unknown_spec(), sec.dialect};
}

Result<ConfigClaims> read_claims(const json& config, const json& hfq, const ArchInfo& arch) {
  ConfigClaims c;
  c.arch = arch;
  Reader r{c.arch, c.findings};

  // config.json: quantization_config, text_config.quantization_config, compression_config.
  const json* q = nullptr;
  std::string qfile;
  if (config.is_object()) {
    const json* text = jsonu::member(config, "text_config");
    for (auto [obj, key, label] :
         {std::tuple{&config, "quantization_config", "config.json quantization_config"},
          std::tuple{text, "quantization_config", "config.json text_config.quantization_config"},
          std::tuple{&config, "compression_config", "config.json compression_config"}}) {
      if (obj == nullptr || q != nullptr) continue;
      if (const json* v = jsonu::member(*obj, key)) {
        q = v;
        qfile = label;
      }
    }
  }
  std::optional<Section> from_config, from_hfq;
  if (q != nullptr) {
    Section s;
    DETECT_ASSIGN(s, r.config_section(*q, qfile));
    from_config = std::move(s);
  }
  if (!hfq.is_null()) {
    if (!hfq.is_object()) return Error{"hf_quant_config.json: top level must be a JSON object"};
    const json* nested = jsonu::member(hfq, "quantization");
    if (nested != nullptr && !nested->is_object()) {
      return Error{"hf_quant_config.json: 'quantization' must be an object"};
    }
    Section s;
    DETECT_ASSIGN(s, r.modelopt(nested ? *nested : hfq, "hf_quant_config.json", nested == nullptr));
    s.dialect += " (hf_quant_config.json)";
    from_hfq = std::move(s);
  }
  if (from_config) {
    c.primary = std::move(*from_config);
    c.sidecar = std::move(from_hfq);
  } else if (from_hfq) {
    c.primary = std::move(*from_hfq);
    if (config.is_object()) {
      r.find(Severity::kInfo, "sidecar_only",
             "config.json has no quantization_config; the declaration is only in "
             "hf_quant_config.json (ModelOpt export). SGLang and vLLM fall back to it; "
             "TensorRT-LLM reads it first anyway");
    }
  } else {
    c.primary.kind = Section::Kind::kNone;
    c.primary.dialect = arch.family == Family::kDeepseekV4 && !arch.expert_dtype.empty()
                            ? "deepseek-v4 reference layout (from architecture keys)"
                            : "not quantized (no quantization config)";
  }
  if (c.primary.kind == Section::Kind::kModeloptMixed && arch.family == Family::kDeepseekV4) {
    r.find(Severity::kWarning, "mixed_precision_base_implicit",
           c.primary.file +
               " declares MIXED_PRECISION with only the routed experts in "
               "quantized_layers and no quantization_config in config.json: the FP8 attention and "
               "shared experts (and MXFP4 MTP experts) are not stated anywhere and come from the "
               "DeepSeek-V4 architecture. SGLang < 0.5.15 reads it as w4afp8 (rule "
               "sglang.hf_quant_only.w4afp8), later SGLang as modelopt_mixed with everything "
               "unquantized (rule sglang.hf_quant_only.modelopt_mixed); vLLM < 0.32 rejects "
               "MIXED_PRECISION (rule vllm.hf_quant_only.unknown_algo), later vLLM leaves the FP8 "
               "modules unquantized (rule vllm.hf_quant_only.modelopt_mixed); TensorRT-LLM probes "
               "the expert tensor dtype (rule trtllm.dsv4.probe_nvfp4)");
  }
  if (arch.family == Family::kDeepseekV4 && arch.expert_dtype == "fp4" &&
      c.primary.kind == Section::Kind::kHfFp8) {
    r.find(Severity::kWarning, "quant_method_hides_moe_format",
           "quantization_config says quant_method 'fp8', but the top-level expert_dtype 'fp4' "
           "makes the routed experts MXFP4 (I8 weight + F8_E8M0 scale per 32). A loader that "
           "reads only quant_method loads the experts as FP8 blocks and gets them wrong; vLLM "
           "reads expert_dtype (rule vllm.dsv4.mxfp4), SGLang and TensorRT-LLM probe one expert "
           "tensor's dtype (rules sglang.dsv4.fp4_probe_as_mxfp4, trtllm.dsv4.probe_mxfp4)");
  }
  if (arch.family == Family::kDeepseekV4 && arch.expert_dtype.empty() &&
      c.primary.kind == Section::Kind::kHfFp8) {
    r.find(Severity::kInfo, "expert_format_from_tensors_only",
           "DeepSeek-V4 config without expert_dtype: the routed experts are taken as FP8 blocks. "
           "A config cannot tell this layout from a reference checkpoint that lost its "
           "expert_dtype; SGLang probes a routed-expert tensor's dtype and takes U8 and I8 alike "
           "as MXFP4 (rule sglang.dsv4.fp4_probe_as_mxfp4), TensorRT-LLM takes U8 as NVFP4 and "
           "I8 as MXFP4 (rules trtllm.dsv4.probe_nvfp4, trtllm.dsv4.probe_mxfp4); this tool "
           "reads the tensors when present");
  }
  if (arch.family == Family::kDeepseekV4 && arch.expert_dtype == "fp4" &&
      c.primary.kind == Section::Kind::kCompressedTensors) {
    r.find(Severity::kWarning, "stale_expert_dtype",
           "config.json keeps the base model's expert_dtype 'fp4' (MXFP4) while its "
           "compressed-tensors section declares the experts' real format; a loader that "
           "trusts expert_dtype first would pick MXFP4 kernels for these weights");
  }
  if (c.primary.kind == Section::Kind::kModeloptMixed && arch.family != Family::kDeepseekV4) {
    r.find(Severity::kInfo, "mixed_precision",
           c.primary.file +
               ": MIXED_PRECISION. Modules outside quantized_layers are not "
               "quantized; each listed module has its own algorithm. Known misroute: reading "
               "MIXED_PRECISION as NVFP4 everywhere gives FP8 layers NVFP4 kernels");
  }
  return c;
}

}  // namespace fp4moe::detect
