// The quantization manifest: how every module group of a checkpoint is stored, from all evidence.
//
// This is the contract between detection and the tools that act on it (`plan`, `convert`, the JSON
// of `fp4moe inspect`). A manifest says, per module group (one role, one name pattern, one scheme):
// the weight scheme the checkpoint really holds, what the configs claim, where each came from,
// and what disagrees (findings). Tensors are the ground truth; configs are claims.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fp4moe::detect {

// The storage format of a module's weights. `kBf16` means "not quantized", whatever the float width
// (F32/F16/BF16). `kAbsent`: the model has no such module. `kUnknown`: the evidence cannot tell.
enum class Scheme {
  kNvfp4,       // E2M1 x16 + UE4M3 block scale + F32 tensor scale
  kMxfp4,       // E2M1 x32 + E8M0 block scale (gpt-oss, DeepSeek-V4 experts, CT mxfp4)
  kFp8Block,    // E4M3 + one scale per 128x128 block (DeepSeek-V3 style)
  kFp8Tensor,   // E4M3 + one F32 scale per tensor (ModelOpt FP8)
  kFp8Channel,  // E4M3 + one scale per output channel
  kMxfp8,       // E4M3 x32 + E8M0 block scale
  kInt4,        // INT4 groups + BF16/F16 scales (compressed-tensors pack-quantized, AWQ)
  kBf16,
  kAbsent,
  kUnknown,
};

// What a module is in the network. The first six (and the KV cache) form the summary.
enum class Role {
  kRoutedExperts,
  kSharedExperts,
  kAttention,  // incl. MLA projections, linear attention, sparse-attention indexers
  kDenseMlp,
  kLmHead,
  kMtpExperts,  // routed experts of MTP / draft (next-n) layers
  kMtpOther,    // everything else in MTP layers
  kEmbedding,
  kRouter,  // router gates, expert score bias, shared-expert gates
  kSsm,     // Mamba mixers (Nemotron-H)
  kVision,  // vision tower and projector
  kOther,   // norms, biases, anything without a linear weight
};

// How activations enter the matmul, as far as the evidence says.
enum class Activation {
  kNone,        // weight-only (A16) or not quantized
  kFp8Dynamic,  // FP8 computed per token / token group at run time
  kFp8Static,   // FP8 with a calibrated per-tensor scale (input_scale)
  kNvfp4,       // NVFP4 activations (W4A4)
  kMxfp8,
  kUnknown,
};

// The element type of the block/group scale.
enum class ScaleType { kNone, kE4M3, kUe8m0, kF32, kBf16, kF16, kUnknown };

enum class Severity { kInfo, kWarning, kError };

std::string_view to_string(Scheme scheme);
std::string_view to_string(Role role);
std::string_view to_string(Activation activation);
std::string_view to_string(ScaleType scale);
std::string_view to_string(Severity severity);
std::optional<Scheme> scheme_from_string(std::string_view name);

// A scheme with its parameters. `group_size` is the number of elements that share one scale along
// K (16 NVFP4, 32 MX, 128 for 128x128 FP8 blocks); 0 when the scale is per tensor/channel or n/a.
struct SchemeSpec {
  Scheme scheme = Scheme::kUnknown;
  Activation activation = Activation::kUnknown;
  int group_size = 0;
  ScaleType scale = ScaleType::kUnknown;

  friend bool operator==(const SchemeSpec&, const SchemeSpec&) = default;
};

SchemeSpec not_quantized();

// One module group: modules of one role whose names differ only in layer/expert indices and that
// share one scheme. `name` writes indices as `*` ("model.layers.*.mlp.experts.*.down_proj").
struct ModuleGroup {
  Role role = Role::kOther;
  std::string name;
  SchemeSpec spec;                          // the answer: tensors when checked, else the config
  Scheme config_scheme = Scheme::kUnknown;  // what the configs claim
  std::optional<Scheme> tensor_scheme;      // what the tensors hold; nullopt when not checked
  std::string config_source;  // e.g. "hf_quant_config.json quantization.quant_algo=NVFP4"
  std::string tensor_source;  // e.g. "U8 weight [2048,1024] + F8_E4M3 scale /16"
  int64_t module_count = 0;   // modules (linear layers; one fused expert tensor = 1)
  int64_t tensor_count = 0;
  // Bytes of the group's tensors, and where the figure came from: the safetensors headers
  // (exact), or the config's dimensions times the scheme's bytes per parameter (an estimate, for
  // configs only). nullopt: unknown (a shape the config does not give), never 0.
  std::optional<int64_t> bytes;
  std::string bytes_source;  // "safetensors headers", "config dimensions (...)", "unknown: ..."
};

struct Finding {
  Severity severity = Severity::kInfo;
  std::string code;     // stable identifier, e.g. "config_tensor_mismatch"
  std::string message;  // plain language, says the consequence
};

// Per role: the scheme that role's weights are stored in. When a role mixes quantized and
// unquantized modules (e.g. o_proj NVFP4 and the other MLA projections BF16) the summary gives the
// quantized scheme and a finding says which modules stay unquantized; when it mixes two quantized
// schemes it gives the one with more modules, with a finding.
struct Summary {
  Scheme routed_experts = Scheme::kUnknown;
  Scheme shared_experts = Scheme::kUnknown;
  Scheme attention = Scheme::kUnknown;
  Scheme dense_mlp = Scheme::kUnknown;
  Scheme lm_head = Scheme::kUnknown;
  Scheme mtp_experts = Scheme::kUnknown;
  Scheme kv_cache = Scheme::kUnknown;  // kBf16: KV cache not quantized
};

// Where the tensor evidence came from.
enum class TensorEvidenceKind {
  kHeaders,     // the safetensors headers: names, dtypes, shapes
  kIndexNames,  // model.safetensors.index.json names only (shards not downloaded)
  kNone,        // configs only
};
std::string_view to_string(TensorEvidenceKind kind);

struct Manifest {
  std::string dialect;           // e.g. "modelopt NVFP4 (hf_quant_config.json)"
  bool tensors_checked = false;  // false: the safetensors headers were not read
  TensorEvidenceKind tensor_evidence = TensorEvidenceKind::kNone;
  // Bytes of all tensors: the headers' sum, else the index's metadata.total_size, else the sum
  // of the groups' estimates when every one is known; nullopt = unknown.
  std::optional<int64_t> total_bytes;
  std::string total_bytes_source;
  Summary summary;
  std::vector<ModuleGroup> modules;
  std::vector<Finding> findings;

  Scheme scheme_of(Role role) const;  // summary lookup for the six summary roles
  bool has_finding(std::string_view code) const;
};

// The version of the JSON contract (docs/JSON.md, docs/schema/*.schema.json): bumped when a field
// is removed or changes meaning; adding a field keeps it.
inline constexpr int kJsonSchemaVersion = 1;

// Every value of the enums the JSON carries, in declaration order (docs/JSON.md lists them; a
// test compares). A new enumerator must be added here: the static_asserts in manifest.cc fail.
inline constexpr Scheme kAllSchemes[] = {
    Scheme::kNvfp4, Scheme::kMxfp4, Scheme::kFp8Block, Scheme::kFp8Tensor, Scheme::kFp8Channel,
    Scheme::kMxfp8, Scheme::kInt4,  Scheme::kBf16,     Scheme::kAbsent,    Scheme::kUnknown};
inline constexpr Role kAllRoles[] = {Role::kRoutedExperts, Role::kSharedExperts, Role::kAttention,
                                     Role::kDenseMlp,      Role::kLmHead,        Role::kMtpExperts,
                                     Role::kMtpOther,      Role::kEmbedding,     Role::kRouter,
                                     Role::kSsm,           Role::kVision,        Role::kOther};
inline constexpr Activation kAllActivations[] = {Activation::kNone,      Activation::kFp8Dynamic,
                                                 Activation::kFp8Static, Activation::kNvfp4,
                                                 Activation::kMxfp8,     Activation::kUnknown};
inline constexpr ScaleType kAllScaleTypes[] = {
    ScaleType::kNone, ScaleType::kE4M3, ScaleType::kUe8m0,  ScaleType::kF32,
    ScaleType::kBf16, ScaleType::kF16,  ScaleType::kUnknown};
inline constexpr Severity kAllSeverities[] = {Severity::kInfo, Severity::kWarning,
                                              Severity::kError};
inline constexpr TensorEvidenceKind kAllTensorEvidenceKinds[] = {
    TensorEvidenceKind::kHeaders, TensorEvidenceKind::kIndexNames, TensorEvidenceKind::kNone};

// The JSON contract of `fp4moe inspect --json`.
nlohmann::json to_json(const Manifest& manifest);
// The human-readable table and findings of `fp4moe inspect`.
std::string to_table(const Manifest& manifest);

}  // namespace fp4moe::detect
