// Names, JSON and table rendering of the quantization manifest.
#include "detect/manifest.h"

#include <algorithm>
#include <cstdio>
#include <iterator>

namespace fp4moe::detect {

std::string_view to_string(Scheme s) {
  switch (s) {
    case Scheme::kNvfp4:
      return "nvfp4";
    case Scheme::kMxfp4:
      return "mxfp4";
    case Scheme::kFp8Block:
      return "fp8_block";
    case Scheme::kFp8Tensor:
      return "fp8_tensor";
    case Scheme::kFp8Channel:
      return "fp8_channel";
    case Scheme::kMxfp8:
      return "mxfp8";
    case Scheme::kInt4:
      return "int4";
    case Scheme::kBf16:
      return "bf16";
    case Scheme::kAbsent:
      return "absent";
    case Scheme::kUnknown:
      return "unknown";
  }
  return "unknown";
}

std::optional<Scheme> scheme_from_string(std::string_view name) {
  for (Scheme s : kAllSchemes) {
    if (to_string(s) == name) return s;
  }
  return std::nullopt;
}

std::string_view to_string(Role r) {
  switch (r) {
    case Role::kRoutedExperts:
      return "routed_experts";
    case Role::kSharedExperts:
      return "shared_experts";
    case Role::kAttention:
      return "attention";
    case Role::kDenseMlp:
      return "dense_mlp";
    case Role::kLmHead:
      return "lm_head";
    case Role::kMtpExperts:
      return "mtp_experts";
    case Role::kMtpOther:
      return "mtp_other";
    case Role::kEmbedding:
      return "embedding";
    case Role::kRouter:
      return "router";
    case Role::kSsm:
      return "ssm";
    case Role::kVision:
      return "vision";
    case Role::kOther:
      return "other";
  }
  return "other";
}

std::string_view to_string(Activation a) {
  switch (a) {
    case Activation::kNone:
      return "none";
    case Activation::kFp8Dynamic:
      return "fp8_dynamic";
    case Activation::kFp8Static:
      return "fp8_static";
    case Activation::kNvfp4:
      return "nvfp4";
    case Activation::kMxfp8:
      return "mxfp8";
    case Activation::kUnknown:
      return "unknown";
  }
  return "unknown";
}

std::string_view to_string(ScaleType s) {
  switch (s) {
    case ScaleType::kNone:
      return "none";
    case ScaleType::kE4M3:
      return "e4m3";
    case ScaleType::kUe8m0:
      return "ue8m0";
    case ScaleType::kF32:
      return "f32";
    case ScaleType::kBf16:
      return "bf16";
    case ScaleType::kF16:
      return "f16";
    case ScaleType::kUnknown:
      return "unknown";
  }
  return "unknown";
}

std::string_view to_string(Severity s) {
  switch (s) {
    case Severity::kInfo:
      return "info";
    case Severity::kWarning:
      return "warning";
    case Severity::kError:
      return "error";
  }
  return "info";
}

std::string_view to_string(TensorEvidenceKind k) {
  switch (k) {
    case TensorEvidenceKind::kHeaders:
      return "headers";
    case TensorEvidenceKind::kIndexNames:
      return "index_names";
    case TensorEvidenceKind::kNone:
      return "none";
  }
  return "none";
}

// The kAll* lists hold every enumerator: each list ends with its enum's last value.
static_assert(std::size(kAllSchemes) == static_cast<size_t>(Scheme::kUnknown) + 1);
static_assert(std::size(kAllRoles) == static_cast<size_t>(Role::kOther) + 1);
static_assert(std::size(kAllActivations) == static_cast<size_t>(Activation::kUnknown) + 1);
static_assert(std::size(kAllScaleTypes) == static_cast<size_t>(ScaleType::kUnknown) + 1);
static_assert(std::size(kAllSeverities) == static_cast<size_t>(Severity::kError) + 1);
static_assert(std::size(kAllTensorEvidenceKinds) ==
              static_cast<size_t>(TensorEvidenceKind::kNone) + 1);

SchemeSpec not_quantized() { return {Scheme::kBf16, Activation::kNone, 0, ScaleType::kNone}; }

Scheme Manifest::scheme_of(Role role) const {
  switch (role) {
    case Role::kRoutedExperts:
      return summary.routed_experts;
    case Role::kSharedExperts:
      return summary.shared_experts;
    case Role::kAttention:
      return summary.attention;
    case Role::kDenseMlp:
      return summary.dense_mlp;
    case Role::kLmHead:
      return summary.lm_head;
    case Role::kMtpExperts:
      return summary.mtp_experts;
    case Role::kMtpOther:
    case Role::kEmbedding:
    case Role::kRouter:
    case Role::kSsm:
    case Role::kVision:
    case Role::kOther:
      break;
  }
  return Scheme::kUnknown;
}

bool Manifest::has_finding(std::string_view code) const {
  return std::any_of(findings.begin(), findings.end(),
                     [&](const Finding& f) { return f.code == code; });
}

nlohmann::json to_json(const Manifest& m) {
  nlohmann::json j;
  j["schema_version"] = kJsonSchemaVersion;
  j["dialect"] = m.dialect;
  j["tensors_checked"] = m.tensors_checked;
  j["tensor_evidence"] = to_string(m.tensor_evidence);
  j["total_bytes"] = m.total_bytes ? nlohmann::json(*m.total_bytes) : nlohmann::json(nullptr);
  j["total_bytes_source"] = m.total_bytes_source;
  j["summary"] = {
      {"routed_experts", to_string(m.summary.routed_experts)},
      {"shared_experts", to_string(m.summary.shared_experts)},
      {"attention", to_string(m.summary.attention)},
      {"dense_mlp", to_string(m.summary.dense_mlp)},
      {"lm_head", to_string(m.summary.lm_head)},
      {"mtp_experts", to_string(m.summary.mtp_experts)},
      {"kv_cache", to_string(m.summary.kv_cache)},
  };
  j["modules"] = nlohmann::json::array();
  for (const auto& g : m.modules) {
    nlohmann::json e = {
        {"role", to_string(g.role)},
        {"name", g.name},
        {"scheme", to_string(g.spec.scheme)},
        {"activation", to_string(g.spec.activation)},
        {"group_size", g.spec.group_size},
        {"scale_type", to_string(g.spec.scale)},
        {"config_scheme", to_string(g.config_scheme)},
        {"tensor_scheme",
         g.tensor_scheme ? nlohmann::json(to_string(*g.tensor_scheme)) : nlohmann::json(nullptr)},
        {"config_source", g.config_source},
        {"tensor_source", g.tensor_source},
        {"module_count", g.module_count},
        {"tensor_count", g.tensor_count},
        {"bytes", g.bytes ? nlohmann::json(*g.bytes) : nlohmann::json(nullptr)},
        {"bytes_source", g.bytes_source},
    };
    j["modules"].push_back(std::move(e));
  }
  j["findings"] = nlohmann::json::array();
  for (const auto& f : m.findings) {
    j["findings"].push_back(
        {{"severity", to_string(f.severity)}, {"code", f.code}, {"message", f.message}});
  }
  return j;
}

namespace {

std::string human_bytes(int64_t b) {
  char buf[32];
  if (b >= (int64_t{1} << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(b) / (1 << 30));
  } else if (b >= (1 << 20)) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1 << 20));
  } else {
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(b));
  }
  return buf;
}

std::string pad(std::string s, size_t w) {
  if (s.size() < w) s.append(w - s.size(), ' ');
  return s;
}

}  // namespace

std::string to_table(const Manifest& m) {
  std::string out;
  out += "dialect: " + m.dialect + "\n";
  out += std::string("tensors: ") +
         (m.tensor_evidence == TensorEvidenceKind::kHeaders      ? "checked"
          : m.tensor_evidence == TensorEvidenceKind::kIndexNames ? "names from the index only"
                                                                 : "NOT checked (configs only)") +
         "\n";
  out += "bytes: " +
         (m.total_bytes
              ? human_bytes(*m.total_bytes) + " <- " + m.total_bytes_source
              : "unknown" + (m.total_bytes_source.empty() ? std::string()
                                                          : " (" + m.total_bytes_source + ")")) +
         "\n\n";
  out += "summary\n";
  const std::pair<const char*, Scheme> rows[] = {{"routed_experts", m.summary.routed_experts},
                                                 {"shared_experts", m.summary.shared_experts},
                                                 {"attention", m.summary.attention},
                                                 {"dense_mlp", m.summary.dense_mlp},
                                                 {"lm_head", m.summary.lm_head},
                                                 {"mtp_experts", m.summary.mtp_experts},
                                                 {"kv_cache", m.summary.kv_cache}};
  for (const auto& [name, s] : rows) out += "  " + pad(name, 16) + std::string(to_string(s)) + "\n";
  out += "\nmodules\n";
  out += "  " + pad("role", 15) + pad("scheme", 12) + pad("act", 12) + pad("group", 6) +
         pad("scale", 8) + pad("count", 8) + pad("tensors", 8) + pad("bytes", 11) +
         "name / evidence\n";
  for (const auto& g : m.modules) {
    if (g.role == Role::kOther) continue;  // norms and buffers: in --json only
    out += "  " + pad(std::string(to_string(g.role)), 15) +
           pad(std::string(to_string(g.spec.scheme)), 12) +
           pad(std::string(to_string(g.spec.activation)), 12) +
           pad(g.spec.group_size ? std::to_string(g.spec.group_size) : "-", 6) +
           pad(std::string(to_string(g.spec.scale)), 8) + pad(std::to_string(g.module_count), 8) +
           pad(m.tensors_checked ? std::to_string(g.tensor_count) : "-", 8) +
           pad(g.bytes ? (m.tensors_checked ? "" : "~") + human_bytes(*g.bytes) : "unknown", 11) +
           g.name + "\n";
    out += std::string(2 + 15, ' ') + "config: " + std::string(to_string(g.config_scheme)) +
           " <- " + g.config_source + "\n";
    if (g.tensor_scheme) {
      out += std::string(2 + 15, ' ') + "tensors: " + std::string(to_string(*g.tensor_scheme)) +
             " <- " + g.tensor_source + "\n";
    }
  }
  out += "\nfindings\n";
  if (m.findings.empty()) out += "  (none)\n";
  for (const auto& f : m.findings) {
    out += "  [" + std::string(to_string(f.severity)) + "] " + f.code + ": " + f.message + "\n";
  }
  return out;
}

}  // namespace fp4moe::detect
