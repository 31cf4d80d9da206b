// What the quantization configs claim, per module: config.json quantization_config (also under
// text_config, or compression_config), hf_quant_config.json (nested or flat ModelOpt), and
// top-level keys (expert_dtype, scale_fmt, weight_block_size).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "detect/arch.h"
#include "detect/manifest.h"
#include "detect/pattern.h"

namespace fp4moe::detect {

struct Claim {
  SchemeSpec spec;
  std::string source;  // the key or pattern that decided it
};

// One file's quantization declaration, as one engine that reads only that file would see it.
struct Section {
  enum class Kind {
    kNone,              // no declaration: not quantized
    kHfFp8,             // quant_method fp8 (transformers FineGrainedFP8 / DeepSeek block FP8)
    kHfMxfp4,           // quant_method mxfp4 (gpt-oss)
    kModelopt,          // ModelOpt single algorithm (NVFP4, FP8, ...)
    kModeloptMixed,     // ModelOpt MIXED_PRECISION with quantized_layers
    kDeepseekV4Hybrid,  // quant_method fp8 + quant_algo/moe_quant_algo (NVIDIA DeepSeek-V4)
    kCompressedTensors,
    kUnknown,  // a dialect this tool does not know: everything `unknown`
  };
  struct Rule {
    Pattern pattern;
    bool linear_class = false;  // the compressed-tensors target "Linear": every linear layer
    SchemeSpec spec;
    std::string source;
  };

  Kind kind = Kind::kNone;
  std::string file;     // "config.json quantization_config", "hf_quant_config.json"
  std::string dialect;  // human-readable
  std::optional<SchemeSpec> all_linears;  // single-algorithm dialects
  std::string all_linears_source;
  std::vector<Rule> rules;  // first match wins
  PatternSet excludes;
  std::string excludes_key;  // "ignore", "exclude_modules", "modules_to_not_convert"
  bool excludes_declared = false;
  std::optional<SchemeSpec> moe_override;  // moe_quant_algo
  std::string moe_override_source;
  bool native_base = false;  // DeepSeek-V4: modules not converted keep the reference FP8/MXFP4
  Scheme kv = Scheme::kBf16;
  std::string kv_source;
  bool kv_declared = false;
};

struct ConfigClaims {
  Section primary;                 // what we (and SGLang/vLLM) read: config.json first
  std::optional<Section> sidecar;  // hf_quant_config.json when config.json also declares
  ArchInfo arch;
  std::vector<Finding> findings;

  Claim claim(const Section& section, std::string_view module, Role role) const;
  Claim claim(std::string_view module, Role role) const { return claim(primary, module, role); }
};

Result<ConfigClaims> read_claims(const nlohmann::json& config,
                                 const nlohmann::json& hf_quant_config, const ArchInfo& arch);

// Maps a ModelOpt quant_algo name; nullopt for names this tool does not know.
std::optional<SchemeSpec> modelopt_algo(std::string_view algo, std::optional<int64_t> group_size);
// KV-cache declaration in any of its spellings (string, dict, null, "none"); nullopt = unknown.
std::optional<Scheme> kv_scheme(const nlohmann::json& value);

}  // namespace fp4moe::detect
