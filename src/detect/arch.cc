// Architecture facts from config.json and the module naming table of the corpus architectures.
#include "detect/arch.h"

#include <algorithm>
#include <array>
#include <charconv>

#include "detect/json_util.h"
#include "detect/pattern.h"

namespace fp4moe::detect {
namespace {

using nlohmann::json;

constexpr std::string_view kWhere = "config.json";

// A key of an unexpected type is a finding and detection goes on without it (real configs hold
// per-layer lists where others hold integers, strings where others hold numbers).
#define DETECT_ASSIGN(lhs, expr)                                                              \
  do {                                                                                        \
    auto detect_r_ = (expr);                                                                  \
    if (detect_r_.ok()) {                                                                     \
      lhs = std::move(detect_r_).value();                                                     \
    } else {                                                                                  \
      a.findings.push_back({Severity::kWarning, "config_field_type",                          \
                            detect_r_.error().message + ": ignored, detection goes on as if " \
                                                        "it were absent"});                   \
    }                                                                                         \
  } while (0)

int64_t positive_or_zero(const std::optional<int64_t>& v) { return v && *v > 0 ? *v : 0; }

}  // namespace

std::string_view to_string(Family family) { return families::first_row(family).display; }

Result<ArchInfo> read_arch(const json& config) {
  ArchInfo a;
  if (config.is_null()) return a;
  if (!config.is_object()) return Error{"config.json: top level must be a JSON object"};
  a.has_config = true;
  const json* text_ptr = jsonu::member(config, "text_config");
  if (text_ptr != nullptr && !text_ptr->is_object()) {
    a.findings.push_back({Severity::kWarning, "config_field_type",
                          "config.json: 'text_config' is " + text_ptr->dump().substr(0, 80) +
                              ", not an object: the top level is read as the text model"});
    text_ptr = nullptr;
  }
  const json& text = text_ptr != nullptr ? *text_ptr : config;
  std::optional<std::string> mt, top_mt;
  DETECT_ASSIGN(top_mt, jsonu::get_string(config, "model_type", kWhere));
  DETECT_ASSIGN(mt, jsonu::get_string(text, "model_type", kWhere));
  a.top_model_type = top_mt.value_or("");
  a.model_type = mt.value_or(a.top_model_type);
  a.family = families::family_of(a.model_type);
  if (a.family == Family::kGeneric) {
    // Architectures name the family when model_type is a mirror's own alias.
    if (const json* archs = jsonu::member(config, "architectures"); archs && archs->is_array()) {
      for (const auto& n : *archs) {
        if (n.is_string() && n.get<std::string>().rfind("DeepseekV4", 0) == 0) {
          a.family = Family::kDeepseekV4;
        }
      }
    }
  }
  a.vision = jsonu::member(config, "vision_config") != nullptr;

  std::optional<int64_t> layers, routed, first_dense, freq, sparse_step, nextn;
  DETECT_ASSIGN(layers, jsonu::get_int(text, "num_hidden_layers", kWhere));
  for (const char* key : {"n_routed_experts", "num_experts", "num_local_experts"}) {
    std::optional<int64_t> v;
    DETECT_ASSIGN(v, jsonu::get_int(text, key, kWhere));
    if (v && *v > 0) routed = v;
  }
  a.n_routed_experts = static_cast<int>(positive_or_zero(routed));
  for (const char* key :
       {"n_shared_experts", "num_shared_experts", "shared_expert_intermediate_size",
        "moe_shared_expert_intermediate_size", "share_expert_dim", "shared_intermediate_size"}) {
    std::optional<int64_t> v;
    DETECT_ASSIGN(v, jsonu::get_int(text, key, kWhere));
    if (v && *v > 0) a.shared_experts = true;
  }
  // Llama-4 has no key for it: every MoE block has one shared expert (HF Llama4TextMoe builds
  // feed_forward.shared_expert unconditionally).
  if (a.model_type == "llama4_text" || (a.model_type == "llama4" && a.n_routed_experts > 0)) {
    a.shared_experts = true;
  }
  DETECT_ASSIGN(first_dense, jsonu::get_int(text, "first_k_dense_replace", kWhere));
  // moe_layer_freq: an integer (every freq-th layer is MoE) or, in some configs, one entry per
  // layer (1/true: MoE, 0/false: dense).
  std::vector<bool> moe_per_layer;
  if (const json* f = jsonu::member(text, "moe_layer_freq"); f && f->is_array()) {
    for (const auto& v : *f) {
      moe_per_layer.push_back(v.is_boolean() ? v.get<bool>()
                                             : v.is_number() && v.get<double>() != 0.0);
    }
  } else {
    DETECT_ASSIGN(freq, jsonu::get_int(text, "moe_layer_freq", kWhere));
  }
  DETECT_ASSIGN(sparse_step, jsonu::get_int(text, "decoder_sparse_step", kWhere));
  // Llama-4 (llama4_text): MoE layers are range(step - 1, layers, step) (HF Llama4TextModel), the
  // same rule as decoder_sparse_step; Maverick's step 2 puts a dense MLP between MoE layers.
  if (!sparse_step) {
    DETECT_ASSIGN(sparse_step, jsonu::get_int(text, "interleave_moe_layer_step", kWhere));
  }
  for (const char* key : {"num_nextn_predict_layers", "mtp_num_hidden_layers"}) {
    std::optional<int64_t> v;
    DETECT_ASSIGN(v, jsonu::get_int(text, key, kWhere));
    if (v && *v > 0) nextn = v;
  }
  std::optional<bool> use_mtp;
  DETECT_ASSIGN(use_mtp, jsonu::get_bool(text, "use_mtp", kWhere));
  if (use_mtp.value_or(false) && !nextn) {
    std::optional<int64_t> modules;
    DETECT_ASSIGN(modules, jsonu::get_int(text, "num_mtp_modules", kWhere));
    nextn = modules.value_or(1);
  }
  a.num_mtp_layers = static_cast<int>(positive_or_zero(nextn));
  std::optional<std::string> expert_dtype;
  DETECT_ASSIGN(expert_dtype, jsonu::get_string(config, "expert_dtype", kWhere));
  if (!expert_dtype) DETECT_ASSIGN(expert_dtype, jsonu::get_string(text, "expert_dtype", kWhere));
  a.expert_dtype = expert_dtype.value_or("");

  // Hybrid layer patterns (Nemotron-H): a string of M/E/*/- or a list of block names.
  std::string pattern;
  if (a.family == Family::kNemotronH) {
    std::optional<std::string> p;
    DETECT_ASSIGN(p, jsonu::get_string(text, "hybrid_override_pattern", kWhere));
    if (p) pattern = *p;
    if (const json* blocks = jsonu::member(text, "layers_block_type")) {
      if (!blocks->is_array()) {
        a.findings.push_back({Severity::kWarning, "config_field_type",
                              "config.json: 'layers_block_type' is not a list: ignored"});
      }
    }
    if (const json* blocks = jsonu::member(text, "layers_block_type");
        blocks && blocks->is_array()) {
      pattern.clear();
      for (const auto& b : *blocks) {
        const std::string s = b.is_string() ? b.get<std::string>() : "";
        if (s == "mamba")
          pattern += 'M';
        else if (s == "moe")
          pattern += 'E';
        else if (s == "attention")
          pattern += '*';
        else if (s == "mlp")
          pattern += '-';
        else {
          // A block this tool does not know: no role is assumed for that layer.
          a.findings.push_back({Severity::kWarning, "config_field_type",
                                "config.json: unknown layers_block_type entry " + b.dump() +
                                    ": that layer's modules are not assumed"});
          pattern += '?';
        }
      }
    }
    if (!layers && !pattern.empty()) layers = static_cast<int64_t>(pattern.size());
  }
  a.num_layers = layers ? static_cast<int>(*layers) : -1;
  if (a.num_layers < -1 || a.num_layers > 100000) {
    a.findings.push_back({Severity::kWarning, "config_field_type",
                          "config.json: num_hidden_layers out of range: " +
                              std::to_string(a.num_layers) + ": the layer count is unknown"});
    a.num_layers = -1;
  }

  // Per-layer shapes.
  const json* mlp_types = jsonu::member(text, "mlp_layer_types");
  const json* layer_types = jsonu::member(text, "layer_types");
  std::vector<int64_t> mlp_only;
  if (const json* m = jsonu::member(text, "mlp_only_layers")) {
    bool ok = m->is_array();
    for (const auto& v : m->is_array() ? *m : json::array()) {
      if (v.is_number_integer()) {
        mlp_only.push_back(v.get<int64_t>());
      } else {
        ok = false;
      }
    }
    if (!ok) {
      a.findings.push_back(
          {Severity::kWarning, "config_field_type",
           "config.json: 'mlp_only_layers' should be a list of layer indices, got " +
               m->dump().substr(0, 80) + ": entries that are not indices ignored"});
    }
  }
  for (const char* key : {"mlp_layer_types", "layer_types"}) {
    if (const json* v = jsonu::member(text, key); v && !v->is_array()) {
      a.findings.push_back({Severity::kWarning, "config_field_type",
                            "config.json: '" + std::string(key) +
                                "' should be a per-layer list, got " + v->dump().substr(0, 80) +
                                ": ignored"});
    }
  }
  std::optional<bool> moe_block;
  DETECT_ASSIGN(moe_block, jsonu::get_bool(text, "enable_moe_block", kWhere));
  const bool has_experts = a.n_routed_experts > 0;
  for (int l = 0; l < std::max(a.num_layers, 0); ++l) {
    LayerShape s;
    switch (a.family) {
      case Family::kDeepseekV3:
      case Family::kStep: {
        s.mixer = a.family == Family::kDeepseekV3 ? LayerShape::Mixer::kMla
                                                  : LayerShape::Mixer::kSelfAttention;
        bool moe = has_experts && l >= first_dense.value_or(0) &&
                   (freq.value_or(1) <= 1 || l % *freq == 0);
        if (!moe_per_layer.empty()) {
          moe = has_experts && l < static_cast<int>(moe_per_layer.size()) &&
                moe_per_layer[static_cast<size_t>(l)];
        }
        if (mlp_types && mlp_types->is_array() && l < static_cast<int>(mlp_types->size())) {
          moe = (*mlp_types)[l] == "sparse";
        }
        s.moe = moe;
        s.dense_mlp = !moe;
        break;
      }
      case Family::kDeepseekV4:
        s.mixer = LayerShape::Mixer::kMla;
        s.moe = has_experts;
        s.dense_mlp = !has_experts;
        break;
      case Family::kQwen3:
      case Family::kQwen35:
      case Family::kGeneric: {
        if (a.family == Family::kQwen35 && layer_types && layer_types->is_array() &&
            l < static_cast<int>(layer_types->size()) && (*layer_types)[l] == "linear_attention") {
          s.mixer = LayerShape::Mixer::kLinearAttention;
        }
        const bool only_mlp = std::find(mlp_only.begin(), mlp_only.end(), l) != mlp_only.end();
        const int64_t step = std::max<int64_t>(sparse_step.value_or(1), 1);
        // first_k_dense_replace (DeepSeek's key, also in other families' configs): the first k
        // layers have a dense MLP.
        s.moe = has_experts && !only_mlp && (l + 1) % step == 0 && l >= first_dense.value_or(0);
        if (mlp_types && mlp_types->is_array() && l < static_cast<int>(mlp_types->size()) &&
            (*mlp_types)[l].is_string()) {
          s.moe = has_experts && (*mlp_types)[l] == "sparse";
        }
        s.dense_mlp = !s.moe;
        break;
      }
      case Family::kMiniMax:
      case Family::kGptOss:
        s.moe = true;
        break;
      case Family::kGemma4:
        s.dense_mlp = true;
        s.moe = has_experts && moe_block.value_or(false);
        break;
      case Family::kNemotronH: {
        const char c = l < static_cast<int>(pattern.size()) ? pattern[l] : '?';
        s.mixer = c == 'M'   ? LayerShape::Mixer::kMamba
                  : c == '*' ? LayerShape::Mixer::kSelfAttention
                             : LayerShape::Mixer::kNone;
        s.moe = c == 'E';
        s.dense_mlp = c == '-';
        break;
      }
    }
    a.layers.push_back(s);
  }
  a.sparse_indexer = a.model_type == "deepseek_v32" || a.model_type == "glm_moe_dsa";

  // Naming (family table): layer prefix, head and embedding names, MTP placement, a multimodal
  // wrapper's prefix (Kimi-K2.5), and whether the names are confirmed.
  const families::FamilyNaming& row = families::first_row(a.family);
  const std::string vlm(families::vlm_prefix_of(a.top_model_type));
  a.layer_prefix = vlm + std::string(row.layer_prefix);
  a.lm_head_name = vlm + std::string(row.lm_head);
  a.embed_name = vlm + std::string(row.embed);
  a.mtp_appended = row.mtp == families::MtpPlacement::kAppended;
  a.mtp_names_known = row.mtp != families::MtpPlacement::kUnknown;
  if (!row.names_confirmed) {
    a.names_assumed = true;
  } else if (!row.experts_confirmed) {
    a.names_assumed = has_experts;
  }
  return a;
}

namespace {

// Index of the decoder layer in a name ("...layers.12.mlp" -> 12), or -1.
int layer_index(std::string_view name) {
  size_t pos = 0;
  while ((pos = name.find("layers.", pos)) != std::string_view::npos) {
    if (pos == 0 || name[pos - 1] == '.') {
      const char* b = name.data() + pos + 7;
      const char* e = name.data() + name.size();
      int v = -1;
      auto [p, ec] = std::from_chars(b, e, v);
      if (ec == std::errc() && (p == e || *p == '.')) return v;
    }
    pos += 7;
  }
  return -1;
}

bool has(std::string_view name, std::string_view comp) { return component_run_match(comp, name); }

std::string_view last_component(std::string_view name) {
  const size_t dot = name.rfind('.');
  return dot == std::string_view::npos ? name : name.substr(dot + 1);
}

}  // namespace

Role classify_module(std::string_view name, const ArchInfo& arch) {
  // Norm weights carry no quantization anywhere (also inside MTP layers: enorm, hnorm, attn_norm).
  if (last_component(name).find("norm") != std::string_view::npos) return Role::kOther;
  // MTP / next-n layers: a top-level "mtp" tree, or (DeepSeek-V3 style) layers past the last
  // decoder layer.
  bool mtp = name.rfind("mtp.", 0) == 0 || name == "mtp" || has(name, "mtp");
  if (!mtp && arch.mtp_appended && arch.num_layers > 0) {
    mtp = layer_index(name) >= arch.num_layers;
  }
  for (std::string_view v : {"visual", "vision_tower", "vision_model", "mm_projector",
                             "multi_modal_projector", "embed_vision", "vision_embed"}) {
    if (has(name, v)) return Role::kVision;
  }
  const std::string_view last = last_component(name);
  const bool routed =
      (has(name, "experts") || has(name, "experts_blocks")) && !has(name, "shared_experts");
  if (routed) return mtp ? Role::kMtpExperts : Role::kRoutedExperts;
  // Routers (also inside MTP layers): mlp.gate, ffn.gate, block_sparse_moe.gate, mixer.gate,
  // mlp.router, shared_expert_gate, and their score-correction biases.
  if (last == "shared_expert_gate" || last == "e_score_correction_bias" || last == "router" ||
      has(name, "router") || last == "tid2eid" || last == "gate") {
    return Role::kRouter;
  }
  if (mtp) return Role::kMtpOther;
  if (name == arch.lm_head_name || name == "lm_head" || name == "head" || name == "output" ||
      (last == "lm_head" && layer_index(name) < 0)) {
    return Role::kLmHead;
  }
  for (std::string_view e : {"embed_tokens", "embeddings", "wte", "tok_embeddings"}) {
    if (last == e) return Role::kEmbedding;
  }
  if (name == "embed" || name == arch.embed_name) return Role::kEmbedding;
  for (std::string_view s : {"shared_experts", "shared_expert", "shared_mlp", "share_expert"}) {
    if (has(name, s)) return Role::kSharedExperts;
  }
  if (last.find("norm") != std::string_view::npos) return Role::kOther;
  for (std::string_view a : {"self_attn", "attn", "attention", "linear_attn", "indexer"}) {
    if (has(name, a)) return Role::kAttention;
  }
  if (has(name, "mixer")) {  // Nemotron-H: the mixer is Mamba, attention, MoE or MLP
    if (has(name, "q_proj") || has(name, "k_proj") || has(name, "v_proj") || has(name, "o_proj")) {
      return Role::kAttention;
    }
    if (has(name, "in_proj") || has(name, "out_proj") || has(name, "conv1d") ||
        has(name, "dt_bias") || last == "A_log" || last == "D") {
      return Role::kSsm;
    }
    if (has(name, "up_proj") || has(name, "down_proj")) return Role::kDenseMlp;
  }
  for (std::string_view m : {"mlp", "ffn", "feed_forward"}) {
    if (has(name, m)) return Role::kDenseMlp;
  }
  return Role::kOther;
}

std::string_view convention_name(Family family, int convention) {
  const families::FamilyNaming& row = families::convention(family, convention);
  return row.convention.empty() ? row.display : row.convention;
}

std::vector<SyntheticModule> synthesize_modules(const ArchInfo& arch, int convention) {
  std::vector<SyntheticModule> out;
  const int64_t experts = std::max(arch.n_routed_experts, 1);
  auto add = [&](std::string name, int64_t mult = 1) { out.push_back({std::move(name), mult}); };
  const bool v4 = arch.family == Family::kDeepseekV4;
  const bool v4_hf = v4 && convention == 1;
  // The MoE block, dense MLP, MTP, head and embedding names are the family table's row.
  const families::FamilyNaming& row = families::convention(arch.family, convention);
  const std::string prefix = convention > 0 ? std::string(row.layer_prefix) : arch.layer_prefix;

  // One decoder (or MTP) layer under `p` (ending in '.').
  auto layer = [&](const std::string& p, const LayerShape& s, bool mtp) {
    switch (arch.family) {
      case Family::kDeepseekV4:
        if (v4_hf) {
          for (const char* m : {"fused_wqa_wkv", "wq_b", "wo_a", "wo_b"}) add(p + "attn." + m);
        } else {
          for (const char* m : {"wq_a", "wq_b", "wkv", "wo_a", "wo_b"}) add(p + "attn." + m);
        }
        break;
      case Family::kDeepseekV3:
        for (const char* m :
             {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"}) {
          add(p + "self_attn." + m);
        }
        if (arch.sparse_indexer) {
          for (const char* m : {"wq_b", "wk", "weights_proj"}) add(p + "self_attn.indexer." + m);
        }
        break;
      case Family::kNemotronH:
        if (s.mixer == LayerShape::Mixer::kMamba) {
          add(p + "mixer.in_proj");
          add(p + "mixer.out_proj");
        } else if (s.mixer == LayerShape::Mixer::kSelfAttention) {
          for (const char* m : {"q_proj", "k_proj", "v_proj", "o_proj"}) add(p + "mixer." + m);
        }
        break;
      default:
        if (s.mixer == LayerShape::Mixer::kLinearAttention) {
          for (const char* m : {"in_proj_qkv", "in_proj_z", "out_proj"})
            add(p + "linear_attn." + m);
        } else {
          for (const char* m : {"q_proj", "k_proj", "v_proj", "o_proj"}) add(p + "self_attn." + m);
        }
        break;
    }
    auto members = [](std::string_view g, std::string_view u, std::string_view d) {
      std::vector<std::string> m;
      for (std::string_view x : {g, u, d}) {
        if (!x.empty()) m.emplace_back(x);
      }
      return m;
    };
    if (s.moe) {
      const std::string ex = std::string(p) + std::string(row.experts);
      if (row.layout == families::ExpertLayout::kFusedGateUp) {
        add(ex + std::string(row.gate));
        add(ex + std::string(row.down));
      } else {
        const std::string e0 = ex.substr(0, ex.find("{E}")) + "0" + ex.substr(ex.find("{E}") + 3);
        for (const auto& m : members(row.gate, row.up, row.down)) add(e0 + m, experts);
        if (arch.shared_experts && !row.shared.empty()) {
          for (const auto& m : members(row.gate, row.up, row.down)) {
            add(p + std::string(row.shared) + m);
          }
          if (!row.shared_gate.empty()) add(p + std::string(row.shared_gate));
        }
      }
      add(p + std::string(row.router));
    }
    if (s.dense_mlp) {
      for (const auto& m : members(row.dense_gate, row.dense_up, row.dense_down)) {
        add(p + std::string(row.dense_mlp) + m);
      }
    }
    if (mtp) {
      for (std::string_view m : row.mtp_extra) add(p + std::string(m));
    }
  };

  for (int l = 0; l < static_cast<int>(arch.layers.size()); ++l) {
    layer(prefix + std::to_string(l) + ".", arch.layers[l], false);
  }
  if (arch.num_mtp_layers > 0 && arch.mtp_names_known &&
      row.mtp != families::MtpPlacement::kUnknown) {
    LayerShape mtp_shape;
    mtp_shape.mixer = arch.family == Family::kDeepseekV3 || v4 ? LayerShape::Mixer::kMla
                                                               : LayerShape::Mixer::kSelfAttention;
    mtp_shape.moe = arch.n_routed_experts > 0;
    mtp_shape.dense_mlp = !mtp_shape.moe;
    for (int i = 0; i < arch.num_mtp_layers; ++i) {
      layer(families::mtp_layer_prefix(row, prefix, i, arch.num_layers), mtp_shape, true);
    }
  }
  add(convention > 0 ? std::string(row.lm_head) : arch.lm_head_name);
  add(convention > 0 ? std::string(row.embed) : arch.embed_name);
  if (arch.vision) {
    if (arch.family == Family::kQwen35) {
      add("model.visual.blocks.0.attn.qkv");
    } else if (arch.family == Family::kGemma4) {
      add("model.vision_tower.encoder.layers.0.self_attn.q_proj");
      add("model.embed_vision.embedding_projection");
    } else {
      add("vision_tower.encoder.blocks.0.mlp.fc0");
      add("mm_projector.proj.0");
    }
  }
  return out;
}

}  // namespace fp4moe::detect
