// What the architecture config says about a model's modules: which roles exist, how its
// checkpoint names them, and the role of any module name (tensor names or config patterns).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "detect/manifest.h"
#include "families/families.h"

namespace fp4moe::detect {

// The families and their naming: one row each in the family table (families/families.h).
using families::Family;

std::string_view to_string(Family family);

// Per decoder layer: which blocks it has.
struct LayerShape {
  enum class Mixer { kSelfAttention, kMla, kLinearAttention, kMamba, kNone };
  Mixer mixer = Mixer::kSelfAttention;
  bool moe = false;
  bool dense_mlp = false;
};

struct ArchInfo {
  bool has_config = false;
  std::string model_type;  // of the text model
  std::string top_model_type;
  Family family = Family::kGeneric;
  std::string layer_prefix = "model.layers.";  // VLMs add "language_model." / ".language_model"
  std::string lm_head_name = "lm_head";
  std::string embed_name = "model.embed_tokens";
  int num_layers = -1;  // -1: unknown (no config.json)
  int n_routed_experts = 0;
  bool shared_experts = false;
  bool sparse_indexer = false;  // DeepSeek-V3.2 / GLM-5 sparse attention indexer
  std::vector<LayerShape> layers;
  int num_mtp_layers = 0;        // declared MTP / next-n layers
  bool mtp_appended = false;     // MTP layers are model.layers.{num_layers + i} (DeepSeek-V3)
  bool mtp_names_known = false;  // we know how this family names its MTP modules
  bool vision = false;
  std::string expert_dtype;       // top-level DeepSeek-V4 key, "" when absent
  bool names_assumed = false;     // the naming table guesses (finding)
  std::vector<Finding> findings;  // keys of an unexpected type, ignored (config_field_type)
};

// Reads the architecture part of config.json (or its text_config). A null config gives an
// ArchInfo with has_config=false. A key of an unexpected type is a finding (ArchInfo::findings)
// and detection goes on without it; only a top level that is not an object is an Error.
Result<ArchInfo> read_arch(const nlohmann::json& config);

// The role of a module from its name alone (plus the layer count, for appended MTP layers).
Role classify_module(std::string_view name, const ArchInfo& arch);

// A module the architecture implies, for config-only inspection.
struct SyntheticModule {
  std::string name;          // a real name, expert index 0 standing for all experts
  int64_t multiplicity = 1;  // modules it stands for (experts)
};

// Alternative naming conventions of one family, its rows in the family table (DeepSeek-V4:
// reference names vs. the HF-style names of re-exported checkpoints). Index 0 is the family's own
// checkpoint naming.
std::string_view convention_name(Family family, int convention);
std::vector<SyntheticModule> synthesize_modules(const ArchInfo& arch, int convention);

}  // namespace fp4moe::detect
