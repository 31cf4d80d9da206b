// MXFP4 -> NVFP4 checkpoint conversion: find the MXFP4 modules, transcode each gate/up group with a
// shared tensor scale, stream every tensor to the writer in source order, rewrite the configs.
#include "convert/convert.h"

#include <fnmatch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "check/check.h"
#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/holes.h"
#include "checkpoint/tensor_values.h"
#include "checkpoint/writer.h"
#include "detect/directory.h"
#include "formats/block.h"
#include "formats/scalar.h"
#include "formats/storage.h"
#include "model/moe_checkpoint.h"

namespace fp4moe::convert {
namespace {

namespace fs = std::filesystem;
using checkpoint::CheckpointDir;
using checkpoint::CheckpointTensor;
using checkpoint::DType;
using checkpoint::TensorSpec;

constexpr const char* kVersion = "0.1.0";

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool matches_any(const std::string& name, const std::vector<std::string>& patterns) {
  for (const auto& p : patterns) {
    if (fnmatch(p.c_str(), name.c_str(), 0) == 0) return true;
  }
  return false;
}

// Gate and up of one expert feed one fused GEMM, so they share one tensor scale; their names are
// the family table's (model/: w1/w3, gate_proj/up_proj). A fused gpt-oss gate_up tensor is one
// module already.
std::string group_key(const std::string& module) {
  for (const auto& naming : model::moe_namings()) {
    if (naming.up.empty()) continue;
    for (const std::string* suffix : {&naming.gate, &naming.up}) {
      const std::string dotted = "." + *suffix;
      if (ends_with(module, dotted)) {
        return module.substr(0, module.size() - dotted.size()) + "." + naming.gate + "+" +
               naming.up;
      }
    }
  }
  return module;
}

// The container a module belongs to in ModelOpt's quantized_layers ("layers.3.ffn.experts").
std::string container_of(const std::string& module) {
  const auto pos = module.rfind(".experts.");
  return pos == std::string::npos ? module : module.substr(0, pos + 8);
}

// Whether a tensor's bytes are a file hole of its shard (checkpoint/holes.h): such tensors are
// written as holes, which keeps sparse checkpoints (the full-size test layouts) sparse.
bool is_file_hole(const CheckpointDir& dir, const CheckpointTensor& t) {
  return checkpoint::is_file_hole(dir.shard_path(t.shard),
                                  dir.shard_header(t.shard).data_offset() + t.info->data_begin,
                                  t.info->byte_size());
}

enum class SourceKind { kMxfp4, kFloat, kFp8Block, kNvfp4Ct };

std::string_view source_kind_name(SourceKind kind) {
  switch (kind) {
    case SourceKind::kMxfp4:
      return "MXFP4";
    case SourceKind::kFloat:
      return "BF16";
    case SourceKind::kFp8Block:
      return "FP8 block-128";
    case SourceKind::kNvfp4Ct:
      return "compressed-tensors NVFP4";
  }
  return "?";
}

struct Module {
  std::string name;
  SourceKind kind = SourceKind::kFloat;
  const CheckpointTensor* weight = nullptr;
  const CheckpointTensor* scale = nullptr;  // block scales of MXFP4 / FP8 / NVFP4; null for BF16
  const CheckpointTensor* global_scale = nullptr;        // compressed-tensors weight_global_scale
  const CheckpointTensor* input_global_scale = nullptr;  // compressed-tensors, if present
  int64_t rows = 0, cols = 0;                            // logical [N, K]
  // gpt-oss's fused experts: the source is `<name>_blocks` [E, N, K/32, 16] + `<name>_scales`,
  // seen as one [E*N, K] matrix; the output is ModelOpt's fused export, `<name>` [E, N, K/2] and
  // `<name>_weight_scale` [E, N, K/16] with scalar `<name>_weight_scale_2` / `_input_scale`.
  int64_t fused_experts = 0;  // E; 0 for a per-module linear
  size_t group = 0;
  std::vector<uint8_t> packed, block_scales;  // output, alive until written
  float tensor_scale = 1.0f;
  float input_scale = 1.0f;  // NVFP4 W4A4 output: activation amax / (6 * 448)
  bool hole = false;         // the source is file holes (all zeros): outputs written as holes

  // Output tensor names: "<name>.weight_scale" per module, "<name>_weight_scale" fused.
  std::string out(std::string_view what) const {
    if (fused_experts > 0) return what == "weight" ? name : name + "_" + std::string(what);
    return name + "." + std::string(what);
  }
  // Output shape of a tensor with `per_row` entries per row: [N, per_row] or [E, N / E, per_row].
  std::vector<int64_t> out_shape(int64_t per_row) const {
    if (fused_experts > 0) return {fused_experts, rows / fused_experts, per_row};
    return {rows, per_row};
  }
};

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string describe_tensor(const CheckpointTensor* t) {
  return std::string(checkpoint::dtype_name(t->info->dtype)) + " " + shape_text(t->info->shape);
}

// The classifier's view of the checkpoint (formats/storage.h): a tensor's dtype and shape by name.
formats::TensorLookup lookup(const CheckpointDir& dir) {
  return [&dir](const std::string& name) -> std::optional<formats::TensorDesc> {
    const auto* t = dir.find(name);
    if (t == nullptr) return std::nullopt;
    return formats::TensorDesc{checkpoint::dtype_name(t->info->dtype), t->info->shape};
  };
}

// The storage of `module` (its row of formats/storage.h's table), or why it cannot be converted.
Result<Module> classify_module(const CheckpointDir& dir, const CheckpointTensor& weight,
                               const std::string& module, TargetFormat to) {
  const auto* scale = dir.find(module + ".scale");
  Module m;
  m.name = module;
  m.weight = &weight;
  const auto fail = [&](const std::string& why) {
    return Error{dir.path().string() + ": module '" + module + "' (weight " +
                 describe_tensor(&weight) + (scale ? ", scale " + describe_tensor(scale) : "") +
                 "): " + why + "; cannot convert it to " +
                 (to == TargetFormat::kNvfp4 ? "NVFP4" : "MXFP4")};
  };
  auto c = formats::classify_stored(module, lookup(dir));
  if (!c.ok()) return fail(c.error().message);
  if (c->weight != weight.info->name) {
    return fail("its weight is '" + c->weight + "' (" + std::string(c->row->name) + ")");
  }
  if (weight.info->shape.size() != 2) return fail("not a 2-D linear weight");
  switch (c->row->form) {
    case formats::StoredForm::kNvfp4CompressedTensors:
      // Re-labeled exactly into ModelOpt's names.
      if (to != TargetFormat::kNvfp4) return fail("already NVFP4 (compressed-tensors)");
      m.kind = SourceKind::kNvfp4Ct;
      m.global_scale = dir.find(c->tensor_scale);
      if (!c->input_scale.empty()) m.input_global_scale = dir.find(c->input_scale);
      break;
    case formats::StoredForm::kMxfp4:
      m.kind = SourceKind::kMxfp4;
      break;
    case formats::StoredForm::kDense:
      m.kind = SourceKind::kFloat;
      break;
    case formats::StoredForm::kFp8Block128:
    case formats::StoredForm::kFp8Block128Ue8m0:
      m.kind = SourceKind::kFp8Block;
      break;
    case formats::StoredForm::kNvfp4ModelOpt:
    case formats::StoredForm::kNvfp4ModelOptFused:
      return fail("already NVFP4 (ModelOpt layout)");
    case formats::StoredForm::kMxfp4CompressedTensors:
    case formats::StoredForm::kMxfp4GptOssFused:
    case formats::StoredForm::kFp8Block128CompressedTensors:
    case formats::StoredForm::kFp8Tensor:
    case formats::StoredForm::kFp8Channel:
    case formats::StoredForm::kMxfp8:
    case formats::StoredForm::kInt4CompressedTensors:
      return fail("stored as " + std::string(c->row->name) +
                  ", not MXFP4, BF16/F16/F32, FP8 block-128 or compressed-tensors NVFP4");
  }
  m.scale = c->scale.empty() ? nullptr : dir.find(c->scale);
  m.rows = c->n;
  m.cols = c->k;
  if (to == TargetFormat::kMxfp4 && m.kind == SourceKind::kMxfp4) {
    return fail(std::string("already ") + std::string(source_kind_name(m.kind)));
  }
  const int block = to == TargetFormat::kNvfp4 ? 16 : 32;
  if (m.cols % block != 0) {
    return fail("K = " + std::to_string(m.cols) + " is not a multiple of the block size " +
                std::to_string(block));
  }
  return m;
}

// gpt-oss's fused experts: `<module>_blocks` U8 [E, N, K/32, 16] + `<module>_scales` U8/E8M0
// [E, N, K/32], one MXFP4 matrix of E*N rows (the nibble and scale bytes are already row-major).
Result<Module> classify_fused(const CheckpointDir& dir, const CheckpointTensor& blocks,
                              const std::string& module, TargetFormat to) {
  const auto* scales = dir.find(module + "_scales");
  const auto& b = blocks.info->shape;
  const auto c = formats::classify_stored(module, lookup(dir));
  if (!c.ok() || c->row->form != formats::StoredForm::kMxfp4GptOssFused) {
    return Error{dir.path().string() + ": '" + module + "_blocks' (" + describe_tensor(&blocks) +
                 ") with '" + module + "_scales' is not gpt-oss's MXFP4 layout (" +
                 (c.ok() ? std::string(c->row->name) : c.error().message) + "); cannot convert it"};
  }
  if (to != TargetFormat::kNvfp4) {
    return Error{dir.path().string() + ": '" + module +
                 "_blocks' is already MXFP4 (gpt-oss's fused layout); --to mxfp4 has nothing to "
                 "do for it"};
  }
  Module m;
  m.name = module;
  m.kind = SourceKind::kMxfp4;
  m.weight = &blocks;
  m.scale = scales;
  m.fused_experts = b[0];
  m.rows = b[0] * b[1];
  m.cols = b[2] * 32;
  return m;
}

// The language model's part of config.json (a VLM wrapper such as Kimi-K2.5 keeps it in
// text_config), as model/ reads it.
const nlohmann::json& language_config(const nlohmann::json& config) {
  return config.is_object() && config.contains("text_config") &&
                 config["text_config"].is_object() && !config.contains("hidden_size")
             ? config["text_config"]
             : config;
}

// The numbered decoder layers of a family whose multi-token-prediction layers follow them under
// the same prefix (DeepSeek-V3, Kimi-K2, GLM-5: `model.layers.{num_hidden_layers + i}`, counted by
// num_nextn_predict_layers): the prefix comes from model/'s family table, the count from the
// config. DeepSeek-V4 keeps its MTP block apart (`mtp.*`), which no layer number reaches.
struct LayerIndex {
  std::string prefix;  // "model.layers.", "language_model.model.layers."; empty: unknown
  int num_layers = 0;  // num_hidden_layers

  // The layer number of `module`, or -1 when it is not in a numbered layer.
  int of(std::string_view module) const {
    if (prefix.empty() || module.substr(0, prefix.size()) != prefix) return -1;
    size_t i = prefix.size();
    int layer = 0;
    for (; i < module.size() && module[i] >= '0' && module[i] <= '9'; ++i) {
      if (layer > 1'000'000) return -1;
      layer = layer * 10 + (module[i] - '0');
    }
    if (i == prefix.size() || (i < module.size() && module[i] != '.')) return -1;
    return layer;
  }
  bool is_mtp(std::string_view module) const { return num_layers > 0 && of(module) >= num_layers; }
};

LayerIndex layer_index(const CheckpointDir& dir) {
  LayerIndex index;
  auto naming = model::find_moe_naming(dir, "convert converts by default");
  if (!naming.ok()) return index;
  const auto at = naming->expert_prefix.find("{L}");
  if (at == std::string::npos) return index;
  const nlohmann::json& c = language_config(dir.config());
  const auto n = c.is_object() ? c.find("num_hidden_layers") : c.end();
  if (!c.is_object() || n == c.end() || !n->is_number_integer()) return index;
  index.prefix = naming->expert_prefix.substr(0, at);
  index.num_layers = n->get<int>();
  return index;
}

bool is_compressed_tensors(const nlohmann::json& config) {
  return config.is_object() && config.contains("quantization_config") &&
         config["quantization_config"].is_object() &&
         config["quantization_config"].value("quant_method", "") == "compressed-tensors";
}

bool uses_modelopt_form(const CheckpointDir& dir);

// The modules to convert: those matching the patterns, or by default the routed experts of the
// checkpoint's family as model/'s table names them (model::find_moe_naming): one home per fact.
// Where the output takes NVIDIA's plain ModelOpt form (every family but DeepSeek-V4), the default
// is what NVIDIA's NVFP4 releases of those families quantize: every MLP linear of the main layers,
// i.e. also the shared experts and the dense MLP of the first layers (nvidia/DeepSeek-V3.1-NVFP4,
// GLM-5-NVFP4 and Kimi-K2.5-NVFP4 exclude only attention, lm_head and the MTP layer), named from
// the same table row; the plain form could only call them unquantized (BF16), and DeepSeek-V4's
// form keeps its shared experts FP8 as NVIDIA does. A compressed-tensors source is re-labeled
// exactly, nothing quantized beside it. By default the MTP layers are left as they are (NVIDIA's
// NVFP4 releases of DeepSeek-V3.1/V3.2 exclude `model.layers.61*`; DeepSeek-V4's `mtp.*` stays
// MXFP4 the same way); --modules can name them. A checkpoint whose family or storage convert
// cannot handle gets one sentence naming it.
Result<std::vector<Module>> find_modules(const CheckpointDir& dir,
                                         std::vector<std::string> patterns, TargetFormat to) {
  LayerIndex skip_mtp;  // empty unless the patterns are the default ones
  if (patterns.empty()) {
    auto naming =
        model::find_moe_naming(dir, "convert converts by default; name them with --modules");
    if (!naming.ok()) return naming.error();
    patterns.push_back(model::routed_expert_glob(*naming));
    skip_mtp = layer_index(dir);
    if (to == TargetFormat::kNvfp4 && !is_compressed_tensors(dir.config()) &&
        uses_modelopt_form(dir)) {
      // "{P}layers.{L}.mlp.experts.{E}." -> shared "{P}layers.*.mlp.shared_experts.*", dense
      // "{P}layers.*.mlp.gate_proj" (`*` crosses dots, but ".mlp.gate_proj" ends only a dense MLP).
      if (!naming->shared_prefix.empty()) {
        std::string glob = naming->shared_prefix;
        if (const auto at = glob.find("{L}"); at != std::string::npos) glob.replace(at, 3, "*");
        patterns.push_back(glob + "*");
      }
      const std::string experts = "experts.{E}.";
      if (!naming->fused && ends_with(naming->expert_prefix, experts)) {
        std::string mlp =
            naming->expert_prefix.substr(0, naming->expert_prefix.size() - experts.size());
        if (const auto at = mlp.find("{L}"); at != std::string::npos) mlp.replace(at, 3, "*");
        for (const std::string* w : {&naming->gate, &naming->up, &naming->down}) {
          patterns.push_back(mlp + *w);
        }
      }
    }
    // A compressed-tensors checkpoint cannot be half compressed-tensors, half ModelOpt: every
    // compressed-tensors NVFP4 module is re-labeled (the shared experts too, where they are).
    for (const auto& t : dir.tensors()) {
      if (ends_with(t.info->name, ".weight_packed")) {
        patterns.push_back(t.info->name.substr(0, t.info->name.size() - 14));
      }
    }
  }
  std::vector<Module> modules;
  std::map<std::string, size_t> groups;
  for (const auto& t : dir.tensors()) {
    const std::string& name = t.info->name;
    Result<Module> m = Error{""};
    std::string module;
    if (ends_with(name, ".weight") || ends_with(name, ".weight_packed")) {
      module = name.substr(0, name.rfind('.'));
      // A glob over a layer's attention or MLP also covers its norms: 1-D, not linears.
      if (!matches_any(module, patterns) || t.info->shape.size() < 2) continue;
      // compressed-tensors modules are all re-labeled, the MTP layer's too (see above).
      if (skip_mtp.is_mtp(module) && !ends_with(name, ".weight_packed")) continue;
      m = classify_module(dir, t, module, to);
    } else if (ends_with(name, "_blocks")) {
      module = name.substr(0, name.size() - 7);
      if (!matches_any(module, patterns)) continue;
      m = classify_fused(dir, t, module, to);
    } else {
      continue;
    }
    if (!m.ok()) return m.error();
    m->group = groups.emplace(group_key(module), groups.size()).first->second;
    modules.push_back(std::move(*m));
  }
  if (modules.empty()) {
    std::string list;
    for (const auto& p : patterns) list += (list.empty() ? "" : ", ") + p;
    return Error{dir.path().string() +
                 ": no linear weight ('.weight', '.weight_packed' or "
                 "gpt-oss '_blocks') matches the module patterns (" +
                 list + ")"};
  }
  return modules;
}

using checkpoint::tensor_bytes;

// 1 / weight_global_scale in float32: compressed-tensors' global scale is the reciprocal of
// ModelOpt's weight_scale_2 (FORMATS.md §2); it must be finite and > 0.
Result<float> ct_tensor_scale(const CheckpointDir& dir, const Module& m) {
  auto gs = checkpoint::read_f32(dir, *m.global_scale);
  if (!gs.ok()) return gs.error();
  const float g = (*gs)[0];
  if (!std::isfinite(g) || g <= 0.0f) {
    return Error{dir.path().string() + ": '" + m.global_scale->info->name + "' is " +
                 std::to_string(g) + ", not a finite positive global scale"};
  }
  return 1.0f / g;
}

// The module's exact values in float32 (BF16/F16 widen exactly; FP8 and MXFP4 dequantize exactly).
Result<std::vector<float>> module_values(const CheckpointDir& dir, const Module& m) {
  auto w = tensor_bytes(dir, *m.weight);
  if (!w.ok()) return w.error();
  std::vector<float> out(static_cast<size_t>(m.rows * m.cols));
  const std::string& name = m.weight->info->name;
  switch (m.kind) {
    case SourceKind::kFloat:
      return checkpoint::read_f32(dir, *m.weight);
    case SourceKind::kFp8Block: {
      auto s = tensor_bytes(dir, *m.scale);
      if (!s.ok()) return s.error();
      Status st;
      if (m.scale->info->dtype == DType::F8_E8M0) {
        st = formats::dequantize_fp8_block128_ue8m0(name, *w, *s, m.rows, m.cols, out);
      } else {
        auto scales = checkpoint::read_f32(dir, *m.scale);
        if (!scales.ok()) return scales.error();
        st = formats::dequantize_fp8_block128(name, *w, *scales, m.rows, m.cols, out);
      }
      if (!st.ok()) return st.error();
      return out;
    }
    case SourceKind::kMxfp4: {
      auto s = tensor_bytes(dir, *m.scale);
      if (!s.ok()) return s.error();
      const Status st = formats::dequantize_mxfp4(name, *w, *s, m.rows, m.cols, out);
      if (!st.ok()) return st.error();
      return out;
    }
    case SourceKind::kNvfp4Ct: {
      auto s = tensor_bytes(dir, *m.scale);
      if (!s.ok()) return s.error();
      auto ts = ct_tensor_scale(dir, m);
      if (!ts.ok()) return ts.error();
      const Status st = formats::dequantize_nvfp4(name, *w, *s, *ts, m.rows, m.cols, out);
      if (!st.ok()) return st.error();
      return out;
    }
  }
  return out;
}

// compressed-tensors NVFP4 -> ModelOpt NVFP4, exactly: the nibbles and the E4M3 block scales are
// the same bytes in both (FORMATS.md §3), only the names change; the tensor scale is the float32
// reciprocal of weight_global_scale, which is how the readers of compressed-tensors themselves
// turn it into the dequantization multiplier (model/ here, the engines' NVFP4 MoE methods).
Status relabel_group(const CheckpointDir& dir, std::vector<Module*>& members,
                     ConvertSummary& summary) {
  for (Module* m : members) {
    auto packed = tensor_bytes(dir, *m->weight);
    if (!packed.ok()) return packed.error();
    auto scales = tensor_bytes(dir, *m->scale);
    if (!scales.ok()) return scales.error();
    auto ts = ct_tensor_scale(dir, *m);
    if (!ts.ok()) return ts.error();
    m->packed.assign(packed->begin(), packed->end());
    m->block_scales.assign(scales->begin(), scales->end());
    m->tensor_scale = *ts;
  }
  summary.modules_relabeled += members.size();
  return Status::Ok();
}

bool module_is_hole(const CheckpointDir& dir, const Module& m) {
  return is_file_hole(dir, *m.weight) && (m.scale == nullptr || is_file_hole(dir, *m.scale));
}

// MXFP4 -> NVFP4 of a group sharing one tensor scale: nibbles kept, scales rewritten.
Status transcode_group(const CheckpointDir& dir, std::vector<Module*>& members,
                       ConvertSummary& summary) {
  std::vector<formats::Mxfp4Source> sources;
  std::vector<formats::Nvfp4Destination> destinations;
  for (Module* m : members) {
    auto packed = tensor_bytes(dir, *m->weight);
    if (!packed.ok()) return packed.error();
    auto scales = tensor_bytes(dir, *m->scale);
    if (!scales.ok()) return scales.error();
    m->packed.resize(packed->size());
    m->block_scales.resize(packed->size() / 8);
    sources.push_back({m->weight->info->name, *packed, *scales, m->rows, m->cols});
    destinations.push_back({m->packed, m->block_scales});
  }
  auto report = formats::transcode_mxfp4_to_nvfp4(sources, destinations);
  if (!report.ok()) return Error{dir.path().string() + ": " + report.error().message};
  for (Module* m : members) m->tensor_scale = report->tensor_scale;
  summary.report.merge(*report);
  summary.modules_transcoded += members.size();
  return Status::Ok();
}

// BF16 / FP8 (or MXFP4 to MXFP4's sibling) values quantized by the published recipes; the error of
// each module is measured against its exact values.
Status quantize_group(const CheckpointDir& dir, std::vector<Module*>& members, TargetFormat to,
                      ConvertSummary& summary) {
  std::vector<std::vector<float>> values;
  float amax = 0.0f;
  for (Module* m : members) {
    auto v = module_values(dir, *m);
    if (!v.ok()) return v.error();
    for (float x : *v) {
      if (!std::isfinite(x)) break;  // the quantizer reports the position
      amax = std::max(amax, std::fabs(x));
    }
    values.push_back(std::move(*v));
  }
  // w1 and w3 share weight_scale_2 = max(amax(w1), amax(w3)) / (6 * 448): one fused GEMM.
  const float tensor_scale = formats::nvfp4_tensor_scale_from_amax(amax);
  for (size_t i = 0; i < members.size(); ++i) {
    Module& m = *members[i];
    const std::vector<float>& x = values[i];
    const std::string& name = m.weight->info->name;
    m.packed.resize(x.size() / 2);
    std::vector<float> back(x.size());
    Status st;
    if (to == TargetFormat::kNvfp4) {
      m.block_scales.resize(x.size() / 16);
      m.tensor_scale = tensor_scale;
      st = formats::quantize_nvfp4(name, x, m.rows, m.cols, tensor_scale, m.packed, m.block_scales);
      if (st.ok()) {
        st = formats::dequantize_nvfp4(name, m.packed, m.block_scales, tensor_scale, m.rows, m.cols,
                                       back);
      }
    } else {
      m.block_scales.resize(x.size() / 32);
      st = formats::quantize_mxfp4(name, x, m.rows, m.cols, formats::MxScaleRule::kOcpFloor,
                                   m.packed, m.block_scales);
      if (st.ok())
        st = formats::dequantize_mxfp4(name, m.packed, m.block_scales, m.rows, m.cols, back);
    }
    if (!st.ok()) return Error{dir.path().string() + ": " + st.error().message};
    double err2 = 0, ref2 = 0;
    for (size_t j = 0; j < x.size(); ++j) {
      const double d = static_cast<double>(back[j]) - x[j];
      err2 += d * d;
      ref2 += static_cast<double>(x[j]) * x[j];
    }
    if (ref2 > 0)
      summary.max_quantize_rel_error =
          std::max(summary.max_quantize_rel_error, std::sqrt(err2 / ref2));
  }
  summary.modules_quantized += members.size();
  return Status::Ok();
}

Status convert_group(const CheckpointDir& dir, std::vector<Module*>& members, TargetFormat to,
                     ConvertSummary& summary) {
  // A group stored as file holes is all zeros: zero codes with zero scales dequantize to the same
  // zeros, so it stays a hole (tensor scale 1).
  if (std::all_of(members.begin(), members.end(),
                  [&](const Module* m) { return module_is_hole(dir, *m); })) {
    for (Module* m : members) {
      m->hole = true;
      m->tensor_scale = 1.0f;
      const auto blocks = m->rows * m->cols / 16;
      if (m->kind == SourceKind::kMxfp4) {
        summary.report.blocks_total += blocks;
        summary.report.blocks_all_zero += blocks;
        ++summary.modules_transcoded;
      } else if (m->kind == SourceKind::kNvfp4Ct) {
        ++summary.modules_relabeled;
      } else {
        ++summary.modules_quantized;
      }
    }
    return Status::Ok();
  }
  const auto all = [&](SourceKind kind) {
    return std::all_of(members.begin(), members.end(),
                       [&](const Module* m) { return m->kind == kind; });
  };
  if (to == TargetFormat::kNvfp4 && all(SourceKind::kMxfp4)) {
    return transcode_group(dir, members, summary);
  }
  if (to == TargetFormat::kNvfp4 && all(SourceKind::kNvfp4Ct)) {
    return relabel_group(dir, members, summary);
  }
  return quantize_group(dir, members, to, summary);
}

nlohmann::json producer_of(Nvfp4Dialect dialect, bool calibrated) {
  const bool w4a4 = dialect == Nvfp4Dialect::kW4A4;
  const char* note =
      !w4a4 ? "weight-only NVFP4 (ModelOpt W4A16_NVFP4): no input_scale tensors; activations "
              "stay in BF16"
      : calibrated
          ? "NVFP4 (ModelOpt NVFP4, W4A4): input_scale calibrated (the activation amax file "
            "given to fp4moe convert --activation-amax, or the source's own input scales)"
          : "NVFP4 (ModelOpt NVFP4, W4A4) declared so that engines route the experts to their "
            "NVFP4 MoE methods; input_scale is an UNCALIBRATED default (1.0, activation amax "
            "2688): right for weight-only (Marlin) kernels, which ignore it, not for W4A4 kernels";
  return {{"name", "fp4moe"}, {"version", kVersion}, {"note", note}};
}

// The source's ModelOpt per-module declaration, `quantized_layers` (config.json's
// quantization_config, else hf_quant_config.json's quantization): null when it has none.
const nlohmann::json* source_quantized_layers(const CheckpointDir& dir) {
  const nlohmann::json& c = language_config(dir.config());
  for (const nlohmann::json* q :
       {c.is_object() && c.contains("quantization_config") ? &c["quantization_config"] : nullptr,
        dir.config().is_object() && dir.config().contains("quantization_config")
            ? &dir.config()["quantization_config"]
            : nullptr,
        dir.hf_quant_config().is_object() && dir.hf_quant_config().contains("quantization")
            ? &dir.hf_quant_config()["quantization"]
            : nullptr}) {
    if (q != nullptr && q->is_object() && q->contains("quantized_layers") &&
        (*q)["quantized_layers"].is_object() && !(*q)["quantized_layers"].empty()) {
      return &(*q)["quantized_layers"];
    }
  }
  return nullptr;
}

// What an earlier quantization left in ModelOpt's storage (a `.weight_scale` beside the weight:
// NVFP4 from NVIDIA or an earlier fp4moe convert, ModelOpt FP8) and this run does not touch: it
// stays quantized in the output, so its declaration must stay too. `layers` gets, per module, the
// source's quantized_layers entry that covers it (its key and value as they were), or for an
// undeclared NVFP4 module (a plain-form source) its own container with NVFP4 (input_scale
// present) or W4A16_NVFP4. Returns the modules kept.
std::set<std::string> kept_modelopt_modules(const CheckpointDir& dir,
                                            const std::vector<Module>& modules,
                                            nlohmann::json& layers) {
  std::set<std::string> converted, kept;
  for (const auto& m : modules) converted.insert(m.name);
  const nlohmann::json* declared = source_quantized_layers(dir);
  for (const auto& t : dir.tensors()) {
    const std::string& name = t.info->name;
    if (!ends_with(name, ".weight") ||
        dir.find(name.substr(0, name.size() - 7) + ".weight_scale") == nullptr) {
      continue;
    }
    const std::string module = name.substr(0, name.size() - 7);
    if (converted.count(module)) continue;
    // ModelOpt's stored forms (formats/storage.h): NVFP4, FP8 per tensor or per channel.
    const auto c = formats::classify_stored(module, lookup(dir));
    if (!c.ok() || c->weight != name) continue;
    const auto form = c->row->form;
    const bool nvfp4 = form == formats::StoredForm::kNvfp4ModelOpt;
    if (!nvfp4 && form != formats::StoredForm::kFp8Tensor &&
        form != formats::StoredForm::kFp8Channel) {
      continue;
    }
    // The entry covering it: its own name or that of a container of it ("layers.3.ffn.experts").
    bool found = false;
    for (size_t end = module.size(); declared != nullptr && end != std::string::npos && !found;
         end = end == 0 ? std::string::npos : module.rfind('.', end - 1)) {
      const std::string key = module.substr(0, end);
      if (auto it = declared->find(key); it != declared->end()) {
        layers[key] = *it;
        found = true;
      }
    }
    if (!found && !nvfp4) continue;  // not declared and not NVFP4: judged by the caller
    if (!found) {
      const bool w4a4 = !c->input_scale.empty();
      layers[container_of(module)] = {
          {"quant_algo",
           std::string(dialect_name(w4a4 ? Nvfp4Dialect::kW4A4 : Nvfp4Dialect::kW4A16))},
          {"group_size", 16}};
    }
    kept.insert(module);
  }
  return kept;
}

// The quantized_layers of the output: what stays quantized from before (kept_modelopt_modules),
// then each converted module's container. A key that would declare two algorithms (a container
// half converted now, half quantized before in another dialect) cannot be written: one sentence.
Result<nlohmann::json> output_quantized_layers(const CheckpointDir& dir,
                                               const std::vector<Module>& modules,
                                               const std::string& algo,
                                               std::set<std::string>* kept) {
  nlohmann::json layers = nlohmann::json::object();
  auto before = kept_modelopt_modules(dir, modules, layers);
  const nlohmann::json entry = {{"quant_algo", algo}, {"group_size", 16}};
  for (const auto& m : modules) {
    const std::string key = container_of(m.name);
    if (layers.contains(key) && layers[key].is_object() &&
        layers[key].value("quant_algo", algo) != algo) {
      return Error{dir.path().string() + ": '" + key + "' is declared " +
                   layers[key].value("quant_algo", "") + " in the source and module '" + m.name +
                   "' of it would be written " + algo +
                   "; convert with the --dialect of the modules already there"};
    }
    layers[key] = entry;
  }
  if (kept != nullptr) *kept = std::move(before);
  return layers;
}

Result<std::pair<nlohmann::json, nlohmann::json>> rewrite_nvfp4_configs(
    const CheckpointDir& dir, const std::vector<Module>& modules, Nvfp4Dialect dialect,
    const nlohmann::json& producer) {
  const bool w4a4 = dialect == Nvfp4Dialect::kW4A4;
  const std::string algo(dialect_name(dialect));
  // A re-convert (NVIDIA's NVFP4 routed experts, converted again with the MTP experts) keeps the
  // entries of what was quantized before: a module left out of quantized_layers would be read as
  // the FP8 base.
  auto layers = output_quantized_layers(dir, modules, algo, nullptr);
  if (!layers.ok()) return layers.error();
  nlohmann::json config = dir.config().is_object() ? dir.config() : nlohmann::json::object();
  nlohmann::json qc =
      config.contains("quantization_config") && config["quantization_config"].is_object()
          ? config["quantization_config"]
          : nlohmann::json::object();
  const bool deepseek_v4 = config.value("model_type", "") == "deepseek_v4";
  // NVIDIA's DeepSeek-V4-Flash-NVFP4 form (FORMATS.md §3): the FP8 base stays (`quant_method:
  // fp8`, 128x128 UE8M0 blocks for attention and shared experts) and the routed experts are named
  // by `moe_quant_algo` and `quantized_layers`; SGLang keys its NVFP4 MoE path on `moe_quant_algo`,
  // TensorRT-LLM reads hf_quant_config.json, vLLM reads quantized_layers per module.
  if (!qc.contains("quant_method")) qc["quant_method"] = "modelopt";
  qc["quant_algo"] = "MIXED_PRECISION";
  // The DeepSeek-V4 paths of SGLang and vLLM compare this key with "NVFP4" exactly
  // (docs/ENGINES.md); W4A16_NVFP4 there falls through to their MXFP4 expert method.
  qc["moe_quant_algo"] = algo;
  qc["group_size"] = 16;
  qc["kv_cache_quant_algo"] = nullptr;
  qc["producer"] = producer;
  qc["quantized_layers"] = *layers;
  qc["config_groups"] = {
      {"group_0",
       {{"targets", {"Linear"}},
        {"weights", {{"num_bits", 4}, {"type", "float"}, {"group_size", 16}, {"dynamic", false}}},
        {"input_activations", w4a4 ? nlohmann::json{{"num_bits", 4},
                                                    {"type", "float"},
                                                    {"group_size", 16},
                                                    {"dynamic", false}}
                                   : nlohmann::json(nullptr)}}}};
  // NVIDIA's exclusions for DeepSeek-V4, less any the user chose to convert with --modules.
  nlohmann::json ignore = nlohmann::json::array();
  if (deepseek_v4) {
    for (const char* pattern : {"*.attn.*", "*.ffn.shared_experts.*", "head", "mtp.*"}) {
      const bool converted = std::any_of(modules.begin(), modules.end(), [&](const Module& m) {
        return fnmatch(pattern, (m.name + ".weight").c_str(), 0) == 0;
      });
      if (!converted) ignore.push_back(pattern);
    }
  }
  qc["ignore"] = ignore;
  config["quantization_config"] = qc;
  nlohmann::json hf_quant = {{"producer", producer},
                             {"quantization",
                              {{"quant_algo", "MIXED_PRECISION"},
                               {"kv_cache_quant_algo", nullptr},
                               {"group_size", 16},
                               {"exclude_modules", ignore},
                               {"quantized_layers", *layers}}}};
  return std::pair{config, hf_quant};
}

// Which config form the NVFP4 output gets, by the family model/'s table names (the one home of
// family facts, model::find_moe_naming): NVIDIA publishes DeepSeek-V4 in its own mixed form
// (nvidia/DeepSeek-V4-Flash-NVFP4: the FP8 base kept, the experts named by `moe_quant_algo`,
// which the DeepSeek-V4 paths of SGLang and vLLM read), and every other family in ModelOpt's plain
// `NVFP4` form: the DeepSeek-V3 names (nvidia/DeepSeek-V3.1-NVFP4, DeepSeek-V3.2-NVFP4,
// GLM-5-NVFP4, Kimi-K2.5-NVFP4), Qwen3-MoE (nvidia/Qwen3-235B-A22B-NVFP4), MiniMax-M2
// (nvidia/MiniMax-M2.5-NVFP4) and gpt-oss (ModelOpt's export). A DeepSeek-V3 loader never reads
// DeepSeek-V4's `moe_quant_algo`. A compressed-tensors source is written in the plain form too:
// its own config describes tensors the output no longer has. Where the table knows no naming
// (modules named with --modules in another family), only model_type deepseek_v4 keeps its form.
bool uses_modelopt_form(const CheckpointDir& dir) {
  const nlohmann::json& config = dir.config();
  if (is_compressed_tensors(config)) return true;
  if (auto naming = model::find_moe_naming(dir, "convert converts"); naming.ok()) {
    return naming->family != "deepseek_v4";
  }
  const nlohmann::json& c = language_config(config);
  return !c.is_object() || c.value("model_type", "") != "deepseek_v4";
}

bool is_float_dtype(DType d) { return d == DType::BF16 || d == DType::F16 || d == DType::F32; }

// The FP8 block-128 linears convert does not quantize, in the plain ModelOpt form: that form can
// only call them unquantized, and NVIDIA's NVFP4 checkpoints of the FP8 releases keep such modules
// in BF16 (nvidia/MiniMax-M2.5-NVFP4's attention, from MiniMaxAI's FP8 release), so they are
// written in BF16: the exact FP8 values rounded once to nearest even.
std::vector<Module> fp8_modules_left(const CheckpointDir& dir, const std::vector<Module>& modules) {
  std::set<std::string> converted;
  for (const auto& m : modules) converted.insert(m.name);
  std::vector<Module> out;
  for (const auto& t : dir.tensors()) {
    const std::string& name = t.info->name;
    if (!ends_with(name, ".weight") || t.info->dtype != DType::F8_E4M3) continue;
    const std::string module = name.substr(0, name.size() - 7);
    if (converted.count(module)) continue;
    auto m = classify_module(dir, t, module, TargetFormat::kNvfp4);
    if (m.ok() && m->kind == SourceKind::kFp8Block) out.push_back(std::move(*m));
  }
  return out;
}

// NVIDIA's exclusion list for the modules left as they are: every linear that is not converted,
// a layer's attention as one `<prefix>layers.L.self_attn*` entry (how NVIDIA writes it, and what
// covers the engines' fused qkv names), an MTP layer none of whose modules is converted as one
// `<prefix>layers.L*` entry (nvidia/DeepSeek-V3.1-NVFP4's `model.layers.61*`), the rest by name;
// embeddings are not linears. Modules quantized before in ModelOpt's storage (`kept`) stay
// quantized and are declared, not excluded. Any other module left quantized cannot be declared
// unquantized: one sentence names it.
Result<nlohmann::json> modelopt_exclusions(const CheckpointDir& dir,
                                           const std::vector<Module>& modules,
                                           const std::vector<Module>& to_bf16,
                                           const std::set<std::string>& kept) {
  const bool compressed_tensors = is_compressed_tensors(dir.config());
  const LayerIndex layers = layer_index(dir);
  std::set<std::string> converted, bf16, out;
  std::set<int> mtp_converted;  // MTP layers with a converted module: listed module by module
  for (const auto& m : modules) {
    converted.insert(m.name);
    if (layers.is_mtp(m.name)) mtp_converted.insert(layers.of(m.name));
  }
  for (const auto& m : to_bf16) bf16.insert(m.name);
  for (const auto& t : dir.tensors()) {
    const std::string& name = t.info->name;
    std::string module;
    if (ends_with(name, ".weight") || ends_with(name, ".weight_packed")) {
      module = name.substr(0, name.rfind('.'));
    } else if (ends_with(name, "_blocks")) {
      module = name.substr(0, name.size() - 7);
    } else {
      continue;
    }
    if (converted.count(module) || kept.count(module)) continue;
    const bool quantized =
        !bf16.count(module) && (!is_float_dtype(t.info->dtype) || ends_with(name, "_blocks") ||
                                dir.find(module + ".weight_scale") != nullptr ||
                                dir.find(module + ".weight_scale_inv") != nullptr ||
                                dir.find(module + ".scale") != nullptr);
    if (quantized && compressed_tensors) {
      return Error{dir.path().string() + ": compressed-tensors checkpoint: '" + name + "' (" +
                   describe_tensor(&t) +
                   ") is quantized in a storage ModelOpt's NVFP4 form cannot declare, so it "
                   "cannot be re-labeled exactly into a ModelOpt checkpoint; engines read its "
                   "compressed-tensors NVFP4 as it is"};
    }
    if (quantized) {
      return Error{dir.path().string() + ": '" + name + "' (" + describe_tensor(&t) +
                   ") stays quantized, but ModelOpt's NVFP4 form (what NVIDIA publishes for " +
                   "this family) declares every module it does not convert as unquantized, so "
                   "the output would be read wrongly; convert it too with --modules, or serve "
                   "the source as it is"};
    }
    if (t.info->shape.size() != 2) continue;
    if (layers.is_mtp(module) && !mtp_converted.count(layers.of(module))) {
      out.insert(layers.prefix + std::to_string(layers.of(module)) + "*");
      continue;
    }
    if (module.find("embed") != std::string::npos) continue;
    const auto attn = module.find(".self_attn.");
    out.insert(attn == std::string::npos ? module : module.substr(0, attn) + ".self_attn*");
  }
  return nlohmann::json(std::vector<std::string>(out.begin(), out.end()));
}

// config.json and hf_quant_config.json in ModelOpt's plain form, as nvidia/MiniMax-M2.5-NVFP4
// and nvidia/Kimi-K2.5-NVFP4 write them (tests/data/corpus): `quant_method: modelopt`, one
// `quant_algo`, `ignore` / `exclude_modules` from modelopt_exclusions; the source's own
// quantization_config (FP8 blocks, gpt-oss's mxfp4, compressed-tensors) is replaced, since its
// tensors are gone. Where modules quantized before stay (a re-convert) and one `quant_algo` cannot
// declare them all (the source has quantized_layers, or they are in the other dialect), it is
// ModelOpt's MIXED_PRECISION form instead: `quantized_layers` with the earlier entries kept.
Result<std::pair<nlohmann::json, nlohmann::json>> rewrite_modelopt_configs(
    const CheckpointDir& dir, const std::vector<Module>& modules,
    const std::vector<Module>& to_bf16, Nvfp4Dialect dialect, const nlohmann::json& producer) {
  const bool w4a4 = dialect == Nvfp4Dialect::kW4A4;
  const std::string algo(dialect_name(dialect));
  std::set<std::string> kept;
  auto layers = output_quantized_layers(dir, modules, algo, &kept);
  if (!layers.ok()) return layers.error();
  bool mixed = !kept.empty() && source_quantized_layers(dir) != nullptr;
  for (const auto& [key, entry] : layers->items()) {
    mixed = mixed || !entry.is_object() || entry.value("quant_algo", "") != algo;
  }
  auto exclude = modelopt_exclusions(dir, modules, to_bf16, kept);
  if (!exclude.ok()) return exclude.error();
  const nlohmann::json fp4 = {
      {"num_bits", 4}, {"type", "float"}, {"group_size", 16}, {"dynamic", false}};
  nlohmann::json config = dir.config().is_object() ? dir.config() : nlohmann::json::object();
  nlohmann::json qc = {{"config_groups",
                        {{"group_0",
                          {{"input_activations", w4a4 ? fp4 : nlohmann::json(nullptr)},
                           {"weights", fp4},
                           {"targets", {"Linear"}}}}}},
                       {"quant_algo", algo},
                       // The KV cache is not quantized: said where engines look first.
                       {"kv_cache_scheme", nullptr},
                       {"producer", producer},
                       {"quant_method", "modelopt"},
                       {"ignore", *exclude}};
  nlohmann::json hf = {{"quant_algo", algo},
                       {"kv_cache_quant_algo", nullptr},
                       {"group_size", 16},
                       {"exclude_modules", *exclude}};
  if (mixed) {
    qc.erase("config_groups");
    qc["quant_algo"] = hf["quant_algo"] = "MIXED_PRECISION";
    qc["quantized_layers"] = hf["quantized_layers"] = *layers;
  }
  // A VLM wrapper (Kimi-K2.5) keeps it at the top, as nvidia/Kimi-K2.5-NVFP4 does; a
  // quantization_config of its text_config describes the source's tensors and goes.
  if (config.contains("text_config") && config["text_config"].is_object()) {
    config["text_config"].erase("quantization_config");
  }
  config["quantization_config"] = qc;
  nlohmann::json hf_quant = {{"producer", producer}, {"quantization", hf}};
  return std::pair{config, hf_quant};
}

template <class T>
std::span<const std::byte> as_tensor_bytes(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}

// DeepSeek-V4's stock dialect marks MXFP4 routed experts with the top-level `expert_dtype: fp4`
// and nothing else, so only that model family, and only all of its routed experts, can be written.
Result<nlohmann::json> rewrite_mxfp4_config(const CheckpointDir& dir,
                                            const std::vector<Module>& modules) {
  nlohmann::json config = dir.config().is_object() ? dir.config() : nlohmann::json::object();
  if (config.value("model_type", "") != "deepseek_v4") {
    return Error{dir.path().string() +
                 "/config.json: --to mxfp4 writes DeepSeek-V4's stock layout "
                 "(expert_dtype: fp4); model_type '" +
                 config.value("model_type", "") + "' has no MXFP4 dialect in this converter"};
  }
  std::map<std::string, bool> converted;
  for (const auto& m : modules) converted[m.name] = true;
  for (const auto& t : dir.tensors()) {
    const std::string& name = t.info->name;
    if (!ends_with(name, ".weight")) continue;
    const std::string module = name.substr(0, name.size() - 7);
    const bool routed = fnmatch("layers.*.ffn.experts.*", module.c_str(), 0) == 0;
    if (routed != (converted.count(module) > 0)) {
      return Error{dir.path().string() + ": module '" + module +
                   "': DeepSeek-V4's expert_dtype "
                   "covers exactly the routed experts (layers.*.ffn.experts.*); convert all of "
                   "them and nothing else to MXFP4"};
    }
  }
  config["expert_dtype"] = "fp4";
  return config;
}

// The input scale of every converted module: from the calibration entries (first glob match), or
// the documented default when none were given. A module no entry covers is an error, so a
// calibration file that misses a layer cannot pass silently.
Status assign_input_scales(const CheckpointDir& dir, const std::vector<ActivationAmax>& amax,
                           std::vector<Module>& modules, ConvertSummary& summary) {
  for (auto& m : modules) {
    double a = kDefaultActivationAmax;
    if (amax.empty() && m.input_global_scale != nullptr) {
      // compressed-tensors calibrated it already: input_scale = 1 / input_global_scale.
      auto igs = checkpoint::read_f32(dir, *m.input_global_scale);
      if (!igs.ok()) return igs.error();
      if (!std::isfinite((*igs)[0]) || (*igs)[0] <= 0.0f) {
        return Error{dir.path().string() + ": '" + m.input_global_scale->info->name + "' is " +
                     std::to_string((*igs)[0]) + ", not a finite positive global scale"};
      }
      m.input_scale = 1.0f / (*igs)[0];
      ++summary.input_scales_calibrated;
      continue;
    }
    if (!amax.empty()) {
      const auto it = std::find_if(amax.begin(), amax.end(), [&](const ActivationAmax& e) {
        return fnmatch(e.modules.c_str(), m.name.c_str(), 0) == 0;
      });
      if (it == amax.end()) {
        return Error{"--activation-amax: no entry matches module '" + m.name +
                     "'; every converted module needs its activation amax"};
      }
      a = it->amax;
      ++summary.input_scales_calibrated;
    } else {
      ++summary.input_scales_default;
    }
    m.input_scale = static_cast<float>(a / (6.0 * 448.0));
  }
  return Status::Ok();
}

}  // namespace

std::string_view dialect_name(Nvfp4Dialect dialect) {
  return dialect == Nvfp4Dialect::kW4A4 ? "NVFP4" : "W4A16_NVFP4";
}

Result<std::vector<ActivationAmax>> read_activation_amax(const fs::path& file) {
  auto json = checkpoint::read_json_file(file);
  if (!json.ok()) return json.error();
  const std::string where = file.string() + ": ";
  if (!json->is_object() || json->value("format", "") != "fp4moe.activation_amax.v1") {
    return Error{where +
                 "not an activation amax file (expected an object with \"format\": "
                 "\"fp4moe.activation_amax.v1\")"};
  }
  const auto entries = json->find("amax");
  if (entries == json->end() || !entries->is_array() || entries->empty()) {
    return Error{where + "\"amax\" must be a non-empty list of {\"modules\": GLOB, \"amax\": X}"};
  }
  std::vector<ActivationAmax> out;
  for (size_t i = 0; i < entries->size(); ++i) {
    const auto& e = (*entries)[i];
    const std::string at = where + "amax[" + std::to_string(i) + "]: ";
    if (!e.is_object() || !e.contains("modules") || !e["modules"].is_string() ||
        e["modules"].get<std::string>().empty()) {
      return Error{at + "needs \"modules\", a non-empty glob over module names"};
    }
    if (!e.contains("amax") || !e["amax"].is_number()) {
      return Error{at + "needs \"amax\", a number"};
    }
    const double a = e["amax"].get<double>();
    if (!std::isfinite(a) || a <= 0) {
      return Error{at + "amax must be finite and > 0, got " + e["amax"].dump()};
    }
    out.push_back({e["modules"].get<std::string>(), a});
  }
  return out;
}

Result<ConvertSummary> convert_checkpoint(const fs::path& source, const fs::path& destination_in,
                                          const ConvertOptions& options) {
  // Every check below and the writer act on one path: "out/", "link/../out" and a symlinked
  // parent all name what the kernel will rename (checkpoint/writer.h).
  const fs::path destination = checkpoint::resolve_destination(destination_in);
  const auto interrupted = [&] {
    return Error{destination.string() +
                     ": interrupted; the partial output was removed and the destination left as "
                     "it was",
                 ErrorKind::kInterrupted};
  };
  const auto cancelled = [&] { return options.cancel != nullptr && options.cancel->load(); };
  const auto start = std::chrono::steady_clock::now();
  std::error_code ec;
  if (!fs::is_directory(source, ec)) {
    return Error{source.string() + ": not a checkpoint directory (missing or not a directory)"};
  }
  const auto dest_type = fs::symlink_status(destination, ec).type();
  if (dest_type != fs::file_type::not_found) {
    if (!options.force) {
      return Error{destination.string() + ": destination exists; pass --force to replace it"};
    }
    const auto src = fs::canonical(source, ec);
    const auto dst = fs::canonical(destination, ec);
    if (checkpoint::path_is_inside(src, dst) || checkpoint::path_is_inside(dst, src)) {
      return Error{destination.string() +
                   ": refusing to replace a destination that is or holds the source " +
                   source.string()};
    }
    // --force replaces a checkpoint directory (not a symlink to one), never an arbitrary directory
    // or file named by mistake.
    bool checkpoint_like = dest_type == fs::file_type::directory && fs::is_empty(destination, ec);
    for (auto it = fs::directory_iterator(destination, ec);
         dest_type == fs::file_type::directory && !ec && it != fs::end(it); it.increment(ec)) {
      const std::string name = it->path().filename().string();
      checkpoint_like = checkpoint_like || name == "config.json" || ends_with(name, ".safetensors");
    }
    if (!checkpoint_like) {
      return Error{destination.string() +
                   ": refusing to replace it with --force: not an empty directory or a checkpoint "
                   "(no config.json or *.safetensors in it)"};
    }
  }
  // Conversion rewrites the configs from what they claim: a source whose configs contradict its
  // tensors (an error finding of inspect) would produce a checkpoint that lies, so it is refused.
  auto inspected = detect::detect_directory(source);
  if (!inspected.ok()) return inspected.error();
  for (const auto& f : inspected->manifest.findings) {
    if (f.severity == detect::Severity::kError) {
      return Error{source.string() + ": refusing to convert: fp4moe inspect reports [" + f.code +
                   "] " + f.message};
    }
  }
  // The numbers, not just the configs: `fp4moe check` error findings refuse the source (a NaN
  // scale would be copied into the output or fail halfway), unless allowed on purpose.
  const auto check_findings = [&](const fs::path& dir,
                                  std::string_view what) -> std::optional<std::string> {
    check::CheckOptions check_options;
    check_options.cancel = options.cancel;
    auto report = check::check_checkpoint(dir, check_options);
    if (cancelled()) return std::string("interrupted");
    if (!report.ok()) return report.error().message;
    for (const auto& f : report->findings) {
      if (f.severity != detect::Severity::kError) continue;
      if (std::find(options.allow_findings.begin(), options.allow_findings.end(), f.id) !=
          options.allow_findings.end()) {
        continue;
      }
      std::string where;
      if (!f.examples.empty()) {
        const auto& e = f.examples.front();
        where = " (e.g. " + e.tensor + (e.row >= 0 ? " row " + std::to_string(e.row) : "") +
                (e.block >= 0 ? " block " + std::to_string(e.block) : "") +
                (e.detail.empty() ? "" : ": " + e.detail) + ")";
      }
      return std::string(what) + ": fp4moe check reports [" + f.id + "] " + f.summary + where +
             "; pass --allow-findings " + f.id + " to proceed anyway";
    }
    return std::nullopt;
  };
  if (auto refused = check_findings(source, "refusing to convert")) {
    if (cancelled()) return interrupted();
    return Error{source.string() + ": " + *refused};
  }
  auto dir = CheckpointDir::open(source);
  if (!dir.ok()) return dir.error();
  auto found = find_modules(*dir, options.module_patterns, options.to);
  if (!found.ok()) return found.error();
  // Fused gpt-oss tensors and compressed-tensors NVFP4 have only the NVFP4 form.
  for (const auto& m : *found) {
    if (options.to != TargetFormat::kNvfp4 &&
        (m.fused_experts > 0 || m.kind == SourceKind::kNvfp4Ct)) {
      return Error{source.string() + ": module '" + m.name + "' is " +
                   std::string(source_kind_name(m.kind)) +
                   "; --to mxfp4 writes only "
                   "DeepSeek-V4's per-module MXFP4 layout"};
    }
  }
  std::vector<Module> modules = std::move(*found);
  const bool to_nvfp4 = options.to == TargetFormat::kNvfp4;

  ConvertSummary summary;
  const bool w4a4 = to_nvfp4 && options.dialect == Nvfp4Dialect::kW4A4;
  summary.dialect = options.dialect;
  if (!to_nvfp4 && !options.activation_amax.empty()) {
    return Error{"--activation-amax applies to NVFP4 output only (--to nvfp4)"};
  }
  if (to_nvfp4 && !w4a4 && !options.activation_amax.empty()) {
    return Error{
        "--activation-amax gives input scales, which the weight-only dialect "
        "W4A16_NVFP4 does not have; drop it or write the NVFP4 dialect"};
  }
  if (w4a4) {
    FP4MOE_RETURN_IF_ERROR(assign_input_scales(*dir, options.activation_amax, modules, summary));
  }
  checkpoint::WriterOptions writer_options;
  writer_options.max_shard_bytes = options.max_shard_bytes;
  writer_options.source_dir = source;
  writer_options.replace_existing = options.force;
  writer_options.cancel = options.cancel;
  writer_options.on_remove_progress = options.on_remove_progress;
  std::vector<Module> to_bf16;  // FP8 blocks left by the plain ModelOpt form, written in BF16
  if (to_nvfp4) {
    const nlohmann::json producer =
        producer_of(options.dialect, summary.input_scales_calibrated > 0);
    if (uses_modelopt_form(*dir)) {
      to_bf16 = fp8_modules_left(*dir, modules);
      auto configs = rewrite_modelopt_configs(*dir, modules, to_bf16, options.dialect, producer);
      if (!configs.ok()) return configs.error();
      std::tie(summary.config, summary.hf_quant_config) = std::move(*configs);
    } else {
      auto configs = rewrite_nvfp4_configs(*dir, modules, options.dialect, producer);
      if (!configs.ok()) return configs.error();
      std::tie(summary.config, summary.hf_quant_config) = std::move(*configs);
    }
    writer_options.files["hf_quant_config.json"] = summary.hf_quant_config.dump(2) + "\n";
  } else {
    auto config = rewrite_mxfp4_config(*dir, modules);
    if (!config.ok()) return config.error();
    summary.config = std::move(*config);
  }
  writer_options.files["config.json"] = summary.config.dump(2) + "\n";

  std::map<std::string, size_t> module_of_weight, module_of_scale;
  for (size_t i = 0; i < modules.size(); ++i) {
    module_of_weight[modules[i].weight->info->name] = i;
    for (const CheckpointTensor* t :
         {modules[i].scale, modules[i].global_scale, modules[i].input_global_scale}) {
      if (t != nullptr) module_of_scale[t->info->name] = i;
    }
    // A source activation scale (an FP8 module's) belongs to the old format: NVFP4 output writes
    // its own (W4A4) or none (weight-only).
    if (to_nvfp4 && dir->find(modules[i].name + ".input_scale") != nullptr) {
      module_of_scale[modules[i].name + ".input_scale"] = i;
    }
  }
  std::map<std::string, size_t> bf16_of_weight;
  std::set<std::string> bf16_scales;
  for (size_t i = 0; i < to_bf16.size(); ++i) {
    bf16_of_weight[to_bf16[i].weight->info->name] = i;
    bf16_scales.insert(to_bf16[i].scale->info->name);
    if (dir->find(to_bf16[i].name + ".input_scale") != nullptr) {
      bf16_scales.insert(to_bf16[i].name + ".input_scale");
    }
  }
  // The plan: source order; a converted weight becomes the target's tensors, its scales dropped.
  std::vector<TensorSpec> plan;
  for (const auto& t : dir->tensors()) {
    const std::string& name = t.info->name;
    if (module_of_scale.count(name) || bf16_scales.count(name)) continue;
    if (bf16_of_weight.count(name)) {
      plan.push_back({name, DType::BF16, t.info->shape});
      continue;
    }
    if (auto it = module_of_weight.find(name); it != module_of_weight.end()) {
      const auto& m = modules[it->second];
      if (to_nvfp4) {
        plan.push_back({m.out("weight"), DType::U8, m.out_shape(m.cols / 2)});
        plan.push_back({m.out("weight_scale"), DType::F8_E4M3, m.out_shape(m.cols / 16)});
        plan.push_back({m.out("weight_scale_2"), DType::F32, {}});
        if (w4a4) plan.push_back({m.out("input_scale"), DType::F32, {}});
      } else {
        plan.push_back({m.name + ".weight", DType::I8, {m.rows, m.cols / 2}});
        plan.push_back({m.name + ".scale", DType::F8_E8M0, {m.rows, m.cols / 32}});
      }
    } else {
      plan.push_back({name, t.info->dtype, t.info->shape});
    }
  }
  // The output check, on the complete output before it is renamed into place: it opens as a
  // checkpoint with exactly the planned tensors, and inspect finds no error in it.
  writer_options.check_before_publish = [&](const fs::path& staged) -> Status {
    if (cancelled()) return interrupted();
    const auto failed = [&](const std::string& why) {
      return Error{
          destination.string() + ": output check failed, nothing was renamed into place: " + why,
          ErrorKind::kFailed};
    };
    auto out = CheckpointDir::open(staged);
    if (!out.ok()) return failed(out.error().message);
    if (out->tensors().size() != plan.size()) {
      return failed(std::to_string(out->tensors().size()) + " tensors written, " +
                    std::to_string(plan.size()) + " planned");
    }
    auto manifest = detect::detect_directory(staged);
    if (!manifest.ok()) return failed(manifest.error().message);
    for (const auto& f : manifest->manifest.findings) {
      if (f.severity == detect::Severity::kError) return failed("[" + f.code + "] " + f.message);
    }
    if (auto bad = check_findings(staged, "the output")) {
      if (cancelled()) return interrupted();
      return failed(*bad);
    }
    if (cancelled()) return interrupted();
    if (options.check_output) {
      if (Status st = options.check_output(staged, *manifest); !st.ok()) {
        return failed(st.error().message);
      }
    }
    return Status::Ok();
  };
  auto writer = checkpoint::CheckpointWriter::create(destination, plan, writer_options);
  if (!writer.ok()) return writer.error();

  std::vector<std::vector<Module*>> groups;
  for (auto& m : modules) {
    if (groups.size() <= m.group) groups.resize(m.group + 1);
    groups[m.group].push_back(&m);
  }
  std::vector<bool> group_done(groups.size(), false);
  ConvertProgress progress{0, dir->total_tensor_bytes(), 0, dir->tensors().size()};
  const std::string scale_name = to_nvfp4 ? "weight_scale" : "scale";
  for (const auto& t : dir->tensors()) {
    if (cancelled()) {
      (void)writer->discard();  // removed now, with progress, before the error is reported
      return interrupted();
    }
    const std::string& name = t.info->name;
    if (auto it = module_of_weight.find(name); it != module_of_weight.end()) {
      Module& m = modules[it->second];
      if (!group_done[m.group]) {
        FP4MOE_RETURN_IF_ERROR(convert_group(*dir, groups[m.group], options.to, summary));
        group_done[m.group] = true;
      }
      if (m.hole) {
        FP4MOE_RETURN_IF_ERROR(writer->write_hole(m.out("weight")));
        FP4MOE_RETURN_IF_ERROR(writer->write_hole(m.out(scale_name)));
      } else {
        FP4MOE_RETURN_IF_ERROR(writer->write(m.out("weight"), as_tensor_bytes(m.packed)));
        FP4MOE_RETURN_IF_ERROR(writer->write(m.out(scale_name), as_tensor_bytes(m.block_scales)));
      }
      if (to_nvfp4) {
        FP4MOE_RETURN_IF_ERROR(
            writer->write(m.out("weight_scale_2"), std::as_bytes(std::span(&m.tensor_scale, 1))));
        if (w4a4) {
          FP4MOE_RETURN_IF_ERROR(
              writer->write(m.out("input_scale"), std::as_bytes(std::span(&m.input_scale, 1))));
        }
      }
      summary.bytes_written +=
          static_cast<uint64_t>(m.rows * m.cols) / (to_nvfp4 ? 16 : 32) * (to_nvfp4 ? 9 : 17);
      std::vector<uint8_t>().swap(m.packed);  // keep memory to the groups in flight
      std::vector<uint8_t>().swap(m.block_scales);
      ++summary.modules_converted;
    } else if (auto b = bf16_of_weight.find(name); b != bf16_of_weight.end()) {
      const Module& m = to_bf16[b->second];
      if (module_is_hole(*dir, m)) {
        FP4MOE_RETURN_IF_ERROR(writer->write_hole(name));
      } else {
        auto values = module_values(*dir, m);
        if (!values.ok()) return values.error();
        std::vector<uint16_t> bits(values->size());
        double err2 = 0, ref2 = 0;
        for (size_t j = 0; j < bits.size(); ++j) {
          bits[j] = formats::encode_bf16((*values)[j]);
          const double d = static_cast<double>(formats::decode_bf16(bits[j])) - (*values)[j];
          err2 += d * d;
          ref2 += static_cast<double>((*values)[j]) * (*values)[j];
        }
        if (ref2 > 0) {
          summary.max_dequantize_rel_error =
              std::max(summary.max_dequantize_rel_error, std::sqrt(err2 / ref2));
        }
        FP4MOE_RETURN_IF_ERROR(writer->write(name, as_tensor_bytes(bits)));
      }
      summary.bytes_written += static_cast<uint64_t>(m.rows * m.cols) * 2;
      ++summary.modules_dequantized;
    } else if (!module_of_scale.count(name) && !bf16_scales.count(name)) {
      if (is_file_hole(*dir, t)) {
        FP4MOE_RETURN_IF_ERROR(writer->write_hole(name));
      } else {
        auto bytes = dir->data(t);
        if (!bytes.ok()) return bytes.error();
        FP4MOE_RETURN_IF_ERROR(writer->write(name, *bytes));
      }
      summary.bytes_written += t.info->byte_size();
      ++summary.tensors_copied;
    }
    progress.bytes_done += t.info->byte_size();
    summary.bytes_read += t.info->byte_size();
    ++progress.tensors_done;
    if (options.on_progress) options.on_progress(progress);
  }
  FP4MOE_RETURN_IF_ERROR(writer->finish());
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

}  // namespace fp4moe::convert
