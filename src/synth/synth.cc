// Synthetic checkpoint layouts: each real layout is a function that edits the real config and
// lists the real tensors; a Plan turns that list into data (tiled from the quantized sample) or
// file holes and streams it through checkpoint::CheckpointWriter.
#include "synth/synth.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/dtype.h"
#include "checkpoint/writer.h"
#include "families/families.h"
#include "formats/storage.h"
#include "synth/base_configs.h"
#include "synth/tiles.h"

namespace fp4moe::synth {
namespace {

namespace fs = std::filesystem;
using checkpoint::CheckpointWriter;
using checkpoint::DType;
using checkpoint::TensorSpec;
using json = nlohmann::json;
using Shape = std::vector<int64_t>;
using families::Family;
using families::FamilyNaming;

// Tensor names from the family table (families/families.h): a layer's prefix, its modules.
const FamilyNaming& row_of(Family family, int convention = 0) {
  return families::convention(family, convention);
}
std::string layer_pre(const FamilyNaming& r, int64_t layer) {
  return std::string(r.layer_prefix) + std::to_string(layer) + ".";
}
// `<pre><module>` for a module field of the row (`pre` a layer's or MTP layer's prefix).
std::string in(const std::string& pre, std::string_view module) {
  return pre + std::string(module);
}
// Expert `e`'s prefix under `pre`.
std::string expert_pre(const FamilyNaming& r, const std::string& pre, int e) {
  std::string x = in(pre, r.experts);
  if (const size_t at = x.find("{E}"); at != std::string::npos) x.replace(at, 3, std::to_string(e));
  return x;
}

// Standard deviation of the synthetic weights: the `initializer_range` of these models' configs,
// a realistic magnitude for trained linear weights too.
constexpr float kWeightStd = 0.02f;
// ModelOpt's input_scale is the calibrated activation amax / (6 * 448); 16 is a typical amax of
// RMS-normalised hidden states entering an MoE block.
constexpr float kActivationAmax = 16.0f;
constexpr float kNvfp4InputScale = kActivationAmax / (6.0f * 448.0f);
// Bounds of the small layouts: beyond them a "small" checkpoint is no longer small.
constexpr int kMaxLayers = 256;
constexpr int kMaxExperts = 1024;

constexpr std::array<LayoutInfo, 9> kLayouts = {{
    {Layout::kDsv4Mxfp4, "dsv4-mxfp4",
     "deepseek-ai/DeepSeek-V4-Flash: MXFP4 routed experts (I8 + F8_E8M0 /32), FP8 128x128 rest"},
    {Layout::kDsv4Nvfp4, "dsv4-nvfp4",
     "nvidia/DeepSeek-V4-Flash-NVFP4: ModelOpt NVFP4 routed experts, MXFP4 MTP experts, FP8 rest"},
    {Layout::kGptOssMxfp4, "gpt-oss-mxfp4",
     "openai/gpt-oss-20b: fused MXFP4 expert blocks (U8 [E,N,K/32,16] + E8M0), BF16 rest"},
    {Layout::kDsv3Fp8, "dsv3-fp8",
     "deepseek-ai/DeepSeek-V3: FP8 E4M3 with F32 weight_scale_inv per 128x128 everywhere"},
    {Layout::kCtNvfp4, "ct-nvfp4",
     "RedHatAI/DeepSeek-V4-Flash-NVFP4-FP8: compressed-tensors NVFP4 experts, FP8 block attention"},
    {Layout::kModeloptNvfp4, "modelopt-nvfp4",
     "nvidia/Qwen3-235B-A22B-NVFP4: ModelOpt NVFP4 in every linear incl. attention, FP8 KV cache"},
    {Layout::kBf16, "bf16", "Qwen/Qwen3-30B-A3B: not quantized (BF16)"},
    {Layout::kMiniMaxNvfp4, "minimax-nvfp4",
     "nvidia/MiniMax-M2.5-NVFP4: ModelOpt NVFP4 block_sparse_moe experts (w1/w2/w3), BF16 "
     "attention"},
    {Layout::kMiniMaxFp8, "minimax-fp8",
     "MiniMaxAI/MiniMax-M2.5: FP8 E4M3 with F32 weight_scale_inv per 128x128, BF16 router"},
}};

std::vector<std::byte> f32_bytes(float v) {
  std::vector<std::byte> b(sizeof v);
  std::memcpy(b.data(), &v, sizeof v);
  return b;
}

int64_t int_key(const json& c, const char* key) { return c.at(key).get<int64_t>(); }

// The stored form of an FP8 128x128 weight (its scale tensor), per producer.
namespace Fp8Scale {
constexpr auto kUe8m0 = formats::StoredForm::kFp8Block128Ue8m0;  // DeepSeek-V4: `.scale` E8M0
constexpr auto kF32ScaleInv =
    formats::StoredForm::kFp8Block128;  // DeepSeek-V3: `.weight_scale_inv`
constexpr auto kCtF32 = formats::StoredForm::kFp8Block128CompressedTensors;  // `.weight_scale` F32
}  // namespace Fp8Scale

// The dtype a stored form's tensor is written in (the first its row allows), and its name.
DType written_dtype(const formats::StoredTensorInfo& t) {
  const auto d = checkpoint::parse_dtype(formats::dtype_of(t));
  FP4MOE_CHECK(d.has_value());
  return *d;
}
std::string name_of(const std::string& module, const formats::StoredTensorInfo& t) {
  return module + std::string(t.suffix);
}

// A checkpoint's tensors in write order, each with its data source: explicit bytes, a tiling
// fill, or nothing (a file hole).
class Plan {
 public:
  Plan(const Pools* pools, uint32_t seed) : pools_(pools), rng_(0x5EED0000ull ^ seed) {}

  // Every tensor a hole (full-size header-only layouts).
  bool holes_only() const { return pools_ == nullptr; }

  void hole(std::string name, DType dtype, Shape shape) {
    entries_.push_back({{std::move(name), dtype, std::move(shape)}, {}, {}});
  }

  // RMSNorm weights: ones, the identity scale.
  void norm(std::string name, int64_t n) {
    if (holes_only()) return hole(std::move(name), DType::BF16, {n});
    std::vector<std::byte> b(n * 2);
    const uint16_t one = 0x3F80;  // BF16 1.0
    for (int64_t i = 0; i < n; ++i) std::memcpy(&b[i * 2], &one, 2);
    entries_.push_back({{std::move(name), DType::BF16, {n}}, {}, std::move(b)});
  }

  void scalar_f32(std::string name, float value, Shape shape) {
    if (holes_only()) return hole(std::move(name), DType::F32, std::move(shape));
    entries_.push_back({{std::move(name), DType::F32, std::move(shape)}, {}, f32_bytes(value)});
  }

  // Gaussian BF16 or F32 values (router gates, score biases, expert biases, BF16 experts).
  void gaussian(std::string name, DType dtype, Shape shape) {
    if (holes_only()) return hole(std::move(name), dtype, std::move(shape));
    FP4MOE_CHECK(dtype == DType::BF16 || dtype == DType::F32);
    const std::vector<uint8_t>& pool = dtype == DType::BF16 ? pools_->bf16 : pools_->f32;
    const uint64_t width = dtype == DType::BF16 ? 2 : 4;
    const uint64_t start = (rng_.next() % (pool.size() / width)) * width;
    entries_.push_back({{std::move(name), dtype, std::move(shape)}, tile_bytes(pool, start), {}});
  }

  // MXFP4 as DeepSeek-V4 stores it (formats/storage.h kMxfp4): `.weight` I8 [n, k/2] + `.scale`
  // F8_E8M0 [n, k/32].
  void mxfp4(const std::string& m, int64_t n, int64_t k) {
    const auto& row = formats::stored_form_info(formats::StoredForm::kMxfp4);
    const std::string weight = name_of(m, row.weight), scale = name_of(m, row.scale);
    if (holes_only()) {
      hole(weight, written_dtype(row.weight), {n, k / 2});
      return hole(scale, written_dtype(row.scale), {n, k / 32});
    }
    const uint64_t block = rng_.next() % pools_->mxfp4_scales.size();
    entries_.push_back({{weight, written_dtype(row.weight), {n, k / 2}},
                        tile_bytes(pools_->mxfp4_packed, block * 16),
                        {}});
    entries_.push_back({{scale, written_dtype(row.scale), {n, k / 32}},
                        tile_bytes(pools_->mxfp4_scales, block),
                        {}});
  }

  // gpt-oss fused experts: `<p>_blocks` U8 [E, n, k/32, 16] + `<p>_scales` U8 [E, n, k/32]
  // (E8M0 codes stored as U8) + `<p>_bias` BF16 [E, n].
  void gpt_oss_experts(const std::string& p, int64_t experts, int64_t n, int64_t k) {
    const auto& row = formats::stored_form_info(formats::StoredForm::kMxfp4GptOssFused);
    const Shape blocks = {experts, n, k / 32, 16}, scales = {experts, n, k / 32};
    const std::string bname = name_of(p, row.weight), sname = name_of(p, row.scale);
    if (holes_only()) {
      hole(bname, written_dtype(row.weight), blocks);
      hole(sname, written_dtype(row.scale), scales);
    } else {
      const uint64_t block = rng_.next() % pools_->mxfp4_scales.size();
      entries_.push_back({{bname, written_dtype(row.weight), blocks},
                          tile_bytes(pools_->mxfp4_packed, block * 16),
                          {}});
      entries_.push_back(
          {{sname, written_dtype(row.scale), scales}, tile_bytes(pools_->mxfp4_scales, block), {}});
    }
    gaussian(p + "_bias", DType::BF16, {experts, n});
  }

  // ModelOpt NVFP4: `.weight` U8 [n, k/2], `.weight_scale` F8_E4M3 [n, k/16], `.weight_scale_2`
  // and `.input_scale` F32 scalars.
  void nvfp4_modelopt(const std::string& m, int64_t n, int64_t k, bool data = true) {
    const auto& row = formats::stored_form_info(formats::StoredForm::kNvfp4ModelOpt);
    nvfp4_blocks(row, m, n, k, data);
    const bool scalars = data && !holes_only();
    scalar_or_hole(name_of(m, row.tensor_scale), scalars ? pools_->nvfp4_tensor_scale : 0, {},
                   scalars);
    scalar_or_hole(name_of(m, row.input_scale), kNvfp4InputScale, {}, scalars);
  }

  // compressed-tensors NVFP4 (nvfp4-pack-quantized): `.weight_packed` U8 [n, k/2], `.weight_scale`
  // F8_E4M3 [n, k/16], `.weight_global_scale` / `.input_global_scale` F32 [1], the reciprocals of
  // ModelOpt's weight_scale_2 / input_scale.
  void nvfp4_ct(const std::string& m, int64_t n, int64_t k) {
    const auto& row = formats::stored_form_info(formats::StoredForm::kNvfp4CompressedTensors);
    nvfp4_blocks(row, m, n, k, true);
    const bool scalars = !holes_only();
    scalar_or_hole(name_of(m, row.tensor_scale), scalars ? 1.0f / pools_->nvfp4_tensor_scale : 0,
                   {1}, scalars);
    scalar_or_hole(name_of(m, row.input_scale), 1.0f / kNvfp4InputScale, {1}, scalars);
  }

  // FP8 E4M3 `.weight` [n, k] with one scale per 128x128 block ([ceil(n/128), ceil(k/128)]).
  void fp8_block(const std::string& m, int64_t n, int64_t k, formats::StoredForm form,
                 bool data = true) {
    const auto& row = formats::stored_form_info(form);
    FP4MOE_CHECK(row.scale.shape == formats::ShapeRule::kGrid && row.block == 128);
    const Shape grid = {(n + 127) / 128, (k + 127) / 128};
    const std::string weight = name_of(m, row.weight), scale_name = name_of(m, row.scale);
    const DType weight_dtype = written_dtype(row.weight), scale_dtype = written_dtype(row.scale);
    if (holes_only() || !data) {
      hole(weight, weight_dtype, {n, k});
      return hole(scale_name, scale_dtype, grid);
    }
    const bool ue8m0 = scale_dtype == DType::F8_E8M0;
    const uint64_t tile = rng_.next() % Pools::kFp8Tiles;
    const std::vector<uint8_t>& q = ue8m0 ? pools_->fp8_ue8m0_q : pools_->fp8_f32_q;
    const std::vector<uint8_t>& s = ue8m0 ? pools_->fp8_ue8m0_scales : pools_->fp8_f32_scales;
    entries_.push_back({{weight, weight_dtype, {n, k}}, tile_fp8_weight(q, n, k, tile), {}});
    entries_.push_back(
        {{scale_name, scale_dtype, grid}, tile_bytes(s, tile * (ue8m0 ? 1 : 4)), {}});
  }

  void bf16_linear(const std::string& m, int64_t n, int64_t k, bool data = true) {
    const auto& row = formats::stored_form_info(formats::StoredForm::kDense);
    if (!data) return hole(name_of(m, row.weight), written_dtype(row.weight), {n, k});
    gaussian(name_of(m, row.weight), written_dtype(row.weight), {n, k});
  }

  Status write(const fs::path& dir, const SynthOptions& options, const json& config,
               const json& hf_quant_config) {
    std::vector<TensorSpec> specs;
    specs.reserve(entries_.size());
    for (const Entry& e : entries_) specs.push_back(e.spec);
    checkpoint::WriterOptions wo;
    wo.max_shard_bytes = options.max_shard_bytes;
    wo.files["config.json"] = config.dump(2) + "\n";
    if (!hf_quant_config.is_null())
      wo.files["hf_quant_config.json"] = hf_quant_config.dump(2) + "\n";
    auto writer = CheckpointWriter::create(dir, std::move(specs), std::move(wo));
    if (!writer.ok()) return writer.error();
    for (const Entry& e : entries_) {
      if (!e.bytes.empty()) {
        FP4MOE_RETURN_IF_ERROR(writer->write(e.spec.name, e.bytes));
      } else if (e.fill) {
        FP4MOE_RETURN_IF_ERROR(writer->write(e.spec.name, e.fill));
      } else {
        FP4MOE_RETURN_IF_ERROR(writer->write_hole(e.spec.name));
      }
    }
    return writer->finish();
  }

 private:
  struct Entry {
    TensorSpec spec;
    CheckpointWriter::FillFn fill;  // empty and no bytes: a hole
    std::vector<std::byte> bytes;
  };

  // The codes and block scales of an NVFP4 row: weight [n, k/2], scale [n, k/16].
  void nvfp4_blocks(const formats::StoredFormInfo& row, const std::string& m, int64_t n, int64_t k,
                    bool data) {
    const std::string weight = name_of(m, row.weight), scale = name_of(m, row.scale);
    const DType wd = written_dtype(row.weight), sd = written_dtype(row.scale);
    if (holes_only() || !data) {
      hole(weight, wd, {n, k / 2});
      return hole(scale, sd, {n, k / 16});
    }
    const uint64_t block = rng_.next() % pools_->nvfp4_scales.size();
    entries_.push_back({{weight, wd, {n, k / 2}}, tile_bytes(pools_->nvfp4_packed, block * 8), {}});
    entries_.push_back({{scale, sd, {n, k / 16}}, tile_bytes(pools_->nvfp4_scales, block), {}});
  }

  void scalar_or_hole(std::string name, float value, Shape shape, bool data) {
    if (!data) return hole(std::move(name), DType::F32, std::move(shape));
    scalar_f32(std::move(name), value, std::move(shape));
  }

  const Pools* pools_;
  Rng rng_;
  std::vector<Entry> entries_;
};

// Counts a layout is written with: the options', or the real config's when full size.
struct Counts {
  int layers;
  int experts;
  bool small;
};

// `key` = min(current, cap): top-k and similar may not exceed the smaller expert count.
void cap_key(json& c, const char* key, int64_t cap) {
  if (c.contains(key)) c[key] = std::min(c[key].get<int64_t>(), cap);
}

// ----- DeepSeek-V4 (stock MXFP4, NVIDIA NVFP4, RedHat compressed-tensors) ----------------------

void edit_dsv4_config(json& c, const Counts& n) {
  if (!n.small) return;
  const int64_t real_layers = int_key(c, "num_hidden_layers");
  c["num_hidden_layers"] = n.layers;
  c["n_routed_experts"] = n.experts;
  cap_key(c, "num_experts_per_tok", n.experts);
  // The first num_hash_layers layers route by token id (ffn.gate.tid2eid), not by score. A small
  // checkpoint uses score routing (gate weight + bias) in every layer, the path an MoE layer test
  // exercises; the full-size layouts keep the real value and the real tid2eid tensors.
  c["num_hash_layers"] = 0;
  // Group-limited routing needs the experts to split into n_group groups; one group = plain top-k.
  if (c.contains("n_group")) c["n_group"] = 1;
  if (c.contains("topk_group")) c["topk_group"] = 1;
  // compress_ratios has one entry per layer, plus one for the MTP layer when it is that long.
  if (c.contains("compress_ratios") && c["compress_ratios"].is_array()) {
    const json old = c["compress_ratios"];
    json ratios = json::array();
    for (int l = 0; l < n.layers && l < static_cast<int>(old.size()); ++l) ratios.push_back(old[l]);
    if (static_cast<int64_t>(old.size()) > real_layers) ratios.push_back(old.back());
    c["compress_ratios"] = ratios;
  }
}

enum class V4Experts { kMxfp4, kNvfp4Modelopt };

// One DeepSeek-V4 block in the reference names (layers.L.* or mtp.0.*).
void dsv4_block(Plan& p, const std::string& pre, const json& c, int experts, V4Experts form,
                bool hash_layer) {
  const int64_t h = int_key(c, "hidden_size"), inter = int_key(c, "moe_intermediate_size");
  const int64_t q_lora = int_key(c, "q_lora_rank"), heads = int_key(c, "num_attention_heads");
  const int64_t head_dim = int_key(c, "head_dim"), o_groups = int_key(c, "o_groups");
  const int64_t o_lora = int_key(c, "o_lora_rank"), shared = int_key(c, "n_shared_experts");
  p.norm(pre + "attn_norm.weight", h);
  // Attention: low-rank query, one shared KV head of head_dim, grouped low-rank output. FP8 holes.
  p.fp8_block(pre + "attn.wq_a", q_lora, h, Fp8Scale::kUe8m0, false);
  p.norm(pre + "attn.q_norm.weight", q_lora);
  p.fp8_block(pre + "attn.wq_b", heads * head_dim, q_lora, Fp8Scale::kUe8m0, false);
  p.fp8_block(pre + "attn.wkv", head_dim, h, Fp8Scale::kUe8m0, false);
  p.norm(pre + "attn.kv_norm.weight", head_dim);
  p.fp8_block(pre + "attn.wo_a", o_groups * o_lora, heads * head_dim / o_groups, Fp8Scale::kUe8m0,
              false);
  p.fp8_block(pre + "attn.wo_b", h, o_groups * o_lora, Fp8Scale::kUe8m0, false);
  p.norm(pre + "ffn_norm.weight", h);
  const FamilyNaming& r = row_of(Family::kDeepseekV4);
  p.gaussian(in(pre, r.router) + ".weight", DType::BF16, {experts, h});
  if (hash_layer) {
    p.hole(in(pre, r.router) + ".tid2eid", DType::I32,
           {int_key(c, "vocab_size"), int_key(c, "num_experts_per_tok")});
  } else {
    p.gaussian(in(pre, r.router_correction_bias), DType::F32, {experts});
  }
  for (int e = 0; e < experts; ++e) {
    const std::string x = expert_pre(r, pre, e);
    // w1 (gate) and w3 (up) are [inter, hidden]; w2 (down) is [hidden, inter].
    for (const auto& [w, n, k] :
         {std::tuple{r.gate, inter, h}, {r.down, h, inter}, {r.up, inter, h}}) {
      if (form == V4Experts::kMxfp4) {
        p.mxfp4(in(x, w), n, k);
      } else {
        p.nvfp4_modelopt(in(x, w), n, k);
      }
    }
  }
  for (const auto& [w, n, k] : {std::tuple{r.gate, shared * inter, h},
                                {r.down, h, shared * inter},
                                {r.up, shared * inter, h}}) {
    p.fp8_block(in(pre, r.shared) + std::string(w), n, k, Fp8Scale::kUe8m0);
  }
}

void dsv4_reference(Plan& p, const json& c, const Counts& n, V4Experts form) {
  const int64_t h = int_key(c, "hidden_size"), vocab = int_key(c, "vocab_size");
  const int hash_layers = static_cast<int>(int_key(c, "num_hash_layers"));
  const FamilyNaming& r = row_of(Family::kDeepseekV4);
  p.hole(std::string(r.embed) + ".weight", DType::BF16, {vocab, h});
  for (int l = 0; l < n.layers; ++l) {
    dsv4_block(p, layer_pre(r, l), c, n.experts, form, l < hash_layers);
  }
  // The MTP layer: NVIDIA's NVFP4 checkpoint ignores `mtp.*`, so its experts stay MXFP4.
  for (int m = 0; m < int_key(c, "num_nextn_predict_layers"); ++m) {
    const std::string pre = families::mtp_layer_prefix(r, r.layer_prefix, m, n.layers);
    for (std::string_view extra : r.mtp_extra) {  // e_proj, h_proj
      p.fp8_block(in(pre, extra), h, h, Fp8Scale::kUe8m0, false);
    }
    p.norm(pre + "enorm.weight", h);
    p.norm(pre + "hnorm.weight", h);
    dsv4_block(p, pre, c, n.experts, V4Experts::kMxfp4, false);
    p.norm(pre + "norm.weight", h);
  }
  p.norm("norm.weight", h);
  p.hole(std::string(r.lm_head) + ".weight", DType::BF16, {vocab, h});
}

// quantized_layers of NVIDIA's MIXED_PRECISION section: every decoder layer's routed experts.
json nvidia_v4_quantized_layers(int layers) {
  json q = json::object();
  const FamilyNaming& r = row_of(Family::kDeepseekV4);
  const std::string_view experts = r.experts.substr(0, r.experts.find(".{E}."));  // ffn.experts
  for (int l = 0; l < layers; ++l) {
    q[in(layer_pre(r, l), experts)] = {{"group_size", 16}, {"quant_algo", "NVFP4"}};
  }
  return q;
}

// RedHat's compressed-tensors export uses Hugging Face names (model.layers.L.ffn.experts.E.
// gate_proj) and fuses wq_a with wkv into attn.fused_wqa_wkv.
void dsv4_ct(Plan& p, const json& c, const Counts& n) {
  const int64_t h = int_key(c, "hidden_size"), inter = int_key(c, "moe_intermediate_size");
  const int64_t vocab = int_key(c, "vocab_size"), q_lora = int_key(c, "q_lora_rank");
  const int64_t heads = int_key(c, "num_attention_heads"), head_dim = int_key(c, "head_dim");
  const int64_t o_groups = int_key(c, "o_groups"), o_lora = int_key(c, "o_lora_rank");
  const int64_t shared = int_key(c, "n_shared_experts");
  const int hash_layers = static_cast<int>(int_key(c, "num_hash_layers"));
  const FamilyNaming& r = row_of(Family::kDeepseekV4, 1);  // the HF-style names
  p.hole(std::string(r.embed) + ".weight", DType::BF16, {vocab, h});
  for (int l = 0; l < n.layers; ++l) {
    const std::string pre = layer_pre(r, l);
    p.norm(pre + "input_layernorm.weight", h);
    p.fp8_block(pre + "attn.fused_wqa_wkv", q_lora + head_dim, h, Fp8Scale::kCtF32, false);
    p.norm(pre + "attn.q_norm.weight", q_lora);
    p.fp8_block(pre + "attn.wq_b", heads * head_dim, q_lora, Fp8Scale::kCtF32, false);
    p.norm(pre + "attn.kv_norm.weight", head_dim);
    p.fp8_block(pre + "attn.wo_a", o_groups * o_lora, heads * head_dim / o_groups, Fp8Scale::kCtF32,
                false);
    p.fp8_block(pre + "attn.wo_b", h, o_groups * o_lora, Fp8Scale::kCtF32, false);
    p.norm(pre + "post_attention_layernorm.weight", h);
    p.gaussian(in(pre, r.router) + ".weight", DType::BF16, {n.experts, h});
    if (l < hash_layers) {
      p.hole(in(pre, r.router) + ".tid2eid", DType::I32,
             {vocab, int_key(c, "num_experts_per_tok")});
    } else {
      p.gaussian(in(pre, r.router_correction_bias), DType::F32, {n.experts});
    }
    // The NVFP4 group's target `re:.*ffn.*(gate|up|down)_proj$` covers the shared expert too.
    for (int e = 0; e < n.experts; ++e) {
      const std::string x = expert_pre(r, pre, e);
      p.nvfp4_ct(in(x, r.gate), inter, h);
      p.nvfp4_ct(in(x, r.up), inter, h);
      p.nvfp4_ct(in(x, r.down), h, inter);
    }
    p.nvfp4_ct(in(pre, r.shared) + std::string(r.gate), shared * inter, h);
    p.nvfp4_ct(in(pre, r.shared) + std::string(r.up), shared * inter, h);
    p.nvfp4_ct(in(pre, r.shared) + std::string(r.down), h, shared * inter);
  }
  p.norm("model.norm.weight", h);
  p.hole(std::string(r.lm_head) + ".weight", DType::BF16, {vocab, h});
}

// ----- gpt-oss --------------------------------------------------------------------------------

void gpt_oss(Plan& p, json& c, const Counts& n) {
  if (n.small) {
    c["num_hidden_layers"] = n.layers;
    c["num_local_experts"] = n.experts;
    cap_key(c, "num_experts_per_tok", n.experts);
    cap_key(c, "experts_per_token", n.experts);
    json types = json::array();
    for (int l = 0; l < n.layers; ++l)
      types.push_back(c["layer_types"].at(l % c["layer_types"].size()));
    c["layer_types"] = types;
  }
  const int64_t h = int_key(c, "hidden_size"), inter = int_key(c, "intermediate_size");
  const int64_t heads = int_key(c, "num_attention_heads"), kv = int_key(c, "num_key_value_heads");
  const int64_t hd = int_key(c, "head_dim"), vocab = int_key(c, "vocab_size");
  const FamilyNaming& r = row_of(Family::kGptOss);
  p.hole(std::string(r.embed) + ".weight", DType::BF16, {vocab, h});
  for (int l = 0; l < n.layers; ++l) {
    const std::string pre = layer_pre(r, l);
    p.norm(pre + "input_layernorm.weight", h);
    for (const auto& [m, rows, cols] : {std::tuple{"q_proj", heads * hd, h},
                                        {"k_proj", kv * hd, h},
                                        {"v_proj", kv * hd, h},
                                        {"o_proj", h, heads * hd}}) {
      p.bf16_linear(pre + "self_attn." + m, rows, cols, false);
      p.hole(pre + "self_attn." + m + ".bias", DType::BF16, {rows});
    }
    p.hole(pre + "self_attn.sinks", DType::BF16, {heads});
    p.norm(pre + "post_attention_layernorm.weight", h);
    p.gaussian(in(pre, r.router) + ".weight", DType::BF16, {n.experts, h});
    p.gaussian(in(pre, r.router_logit_bias), DType::BF16, {n.experts});
    // gate_up_proj interleaves gate and up rows: [E, 2 * inter, hidden/32, 16].
    p.gpt_oss_experts(in(pre, r.experts) + std::string(r.gate), n.experts, 2 * inter, h);
    p.gpt_oss_experts(in(pre, r.experts) + std::string(r.down), n.experts, h, inter);
  }
  p.norm("model.norm.weight", h);
  p.hole(std::string(r.lm_head) + ".weight", DType::BF16, {vocab, h});
}

// ----- DeepSeek-V3 FP8 ------------------------------------------------------------------------

void dsv3_block(Plan& p, const std::string& pre, const json& c, int experts, bool moe) {
  const int64_t h = int_key(c, "hidden_size"), inter = int_key(c, "moe_intermediate_size");
  const int64_t heads = int_key(c, "num_attention_heads"), q_lora = int_key(c, "q_lora_rank");
  const int64_t kv_lora = int_key(c, "kv_lora_rank"), rope = int_key(c, "qk_rope_head_dim");
  const int64_t nope = int_key(c, "qk_nope_head_dim"), v_head = int_key(c, "v_head_dim");
  constexpr auto kInv = Fp8Scale::kF32ScaleInv;
  p.norm(pre + "input_layernorm.weight", h);
  p.fp8_block(pre + "self_attn.q_a_proj", q_lora, h, kInv, false);
  p.norm(pre + "self_attn.q_a_layernorm.weight", q_lora);
  p.fp8_block(pre + "self_attn.q_b_proj", heads * (nope + rope), q_lora, kInv, false);
  p.fp8_block(pre + "self_attn.kv_a_proj_with_mqa", kv_lora + rope, h, kInv, false);
  p.norm(pre + "self_attn.kv_a_layernorm.weight", kv_lora);
  p.fp8_block(pre + "self_attn.kv_b_proj", heads * (nope + v_head), kv_lora, kInv, false);
  p.fp8_block(pre + "self_attn.o_proj", h, heads * v_head, kInv, false);
  p.norm(pre + "post_attention_layernorm.weight", h);
  const FamilyNaming& r = row_of(Family::kDeepseekV3);
  if (!moe) {  // dense MLP of the first_k_dense_replace layers: holes
    const int64_t dense = int_key(c, "intermediate_size");
    const std::string mlp = in(pre, r.dense_mlp);
    p.fp8_block(in(mlp, r.dense_gate), dense, h, kInv, false);
    p.fp8_block(in(mlp, r.dense_up), dense, h, kInv, false);
    p.fp8_block(in(mlp, r.dense_down), h, dense, kInv, false);
    return;
  }
  p.gaussian(in(pre, r.router) + ".weight", DType::BF16, {experts, h});
  p.gaussian(in(pre, r.router_correction_bias), DType::F32, {experts});
  for (int e = 0; e < experts; ++e) {
    const std::string x = expert_pre(r, pre, e);
    p.fp8_block(in(x, r.gate), inter, h, kInv);
    p.fp8_block(in(x, r.up), inter, h, kInv);
    p.fp8_block(in(x, r.down), h, inter, kInv);
  }
  const int64_t shared = int_key(c, "n_shared_experts") * inter;
  const std::string sh = in(pre, r.shared);
  p.fp8_block(in(sh, r.gate), shared, h, kInv);
  p.fp8_block(in(sh, r.up), shared, h, kInv);
  p.fp8_block(in(sh, r.down), h, shared, kInv);
}

void dsv3(Plan& p, json& c, const Counts& n) {
  if (n.small) {
    // One dense layer first, as the real model has first_k_dense_replace of them, then the MoE
    // layers asked for.
    c["first_k_dense_replace"] = 1;
    c["num_hidden_layers"] = 1 + n.layers;
    c["n_routed_experts"] = n.experts;
    cap_key(c, "num_experts_per_tok", n.experts);
    c["n_group"] = 1;  // group-limited routing needs n_group | experts; one group = plain top-k
    c["topk_group"] = 1;
  }
  const int64_t h = int_key(c, "hidden_size"), vocab = int_key(c, "vocab_size");
  const int64_t layers = int_key(c, "num_hidden_layers");
  const int64_t dense = int_key(c, "first_k_dense_replace");
  const FamilyNaming& r = row_of(Family::kDeepseekV3);
  p.hole(std::string(r.embed) + ".weight", DType::BF16, {vocab, h});
  for (int64_t l = 0; l < layers; ++l) {
    dsv3_block(p, layer_pre(r, l), c, n.experts, l >= dense);
  }
  // MTP (next-n) layers follow the decoder layers as model.layers.{num_hidden_layers + i}.
  for (int64_t m = 0; m < int_key(c, "num_nextn_predict_layers"); ++m) {
    const std::string pre = families::mtp_layer_prefix(r, r.layer_prefix, static_cast<int>(m),
                                                       static_cast<int>(layers));
    p.hole(pre + "embed_tokens.weight", DType::BF16, {vocab, h});
    p.norm(pre + "enorm.weight", h);
    p.norm(pre + "hnorm.weight", h);
    for (std::string_view extra : r.mtp_extra) {  // eh_proj
      p.fp8_block(in(pre, extra), h, 2 * h, Fp8Scale::kF32ScaleInv, false);
    }
    dsv3_block(p, pre, c, n.experts, true);
    p.norm(pre + "shared_head.norm.weight", h);
    p.hole(pre + "shared_head.head.weight", DType::BF16, {vocab, h});
  }
  p.norm("model.norm.weight", h);
  p.hole(std::string(r.lm_head) + ".weight", DType::BF16, {vocab, h});
}

// ----- Qwen3 MoE (ModelOpt NVFP4, BF16) -------------------------------------------------------

void edit_qwen3_config(json& c, const Counts& n) {
  if (!n.small) return;
  c["num_hidden_layers"] = n.layers;
  c["max_window_layers"] = n.layers;
  c["num_experts"] = n.experts;
  cap_key(c, "num_experts_per_tok", n.experts);
}

// Grouped-query attention in Hugging Face names, shared by Qwen3-MoE and MiniMax-M2:
// `<pre>self_attn.{q,k,v,o}_proj`, each written by `linear` (name, rows, cols) in that order, and
// with `kv_scales` (NVIDIA's exports, kv_cache_quant_algo FP8) the calibrated k_scale / v_scale
// that ModelOpt stores after them. The norms, which differ between the families, are the caller's.
struct AttentionDims {
  int64_t hidden, heads, kv_heads, head_dim;
};

template <class Linear>
void gqa_attention(Plan& p, const std::string& pre, const AttentionDims& d, bool kv_scales,
                   Linear&& linear) {
  for (const auto& [m, rows, cols] : {std::tuple{"q_proj", d.heads * d.head_dim, d.hidden},
                                      {"k_proj", d.kv_heads * d.head_dim, d.hidden},
                                      {"v_proj", d.kv_heads * d.head_dim, d.hidden},
                                      {"o_proj", d.hidden, d.heads * d.head_dim}}) {
    linear(pre + "self_attn." + m, rows, cols);
  }
  if (kv_scales) {
    p.scalar_f32(pre + "self_attn.k_proj.k_scale", 1.0f, {});
    p.scalar_f32(pre + "self_attn.v_proj.v_scale", 1.0f, {});
  }
}

void qwen3(Plan& p, const json& c, const Counts& n, bool nvfp4) {
  const int64_t h = int_key(c, "hidden_size"), inter = int_key(c, "moe_intermediate_size");
  const int64_t heads = int_key(c, "num_attention_heads"), kv = int_key(c, "num_key_value_heads");
  const int64_t hd = int_key(c, "head_dim"), vocab = int_key(c, "vocab_size");
  auto linear = [&](const std::string& m, int64_t rows, int64_t cols, bool data) {
    if (nvfp4) {
      p.nvfp4_modelopt(m, rows, cols, data);
    } else {
      p.bf16_linear(m, rows, cols, data);
    }
  };
  const FamilyNaming& r = row_of(Family::kQwen3);
  p.hole(std::string(r.embed) + ".weight", DType::BF16, {vocab, h});
  for (int l = 0; l < n.layers; ++l) {
    const std::string pre = layer_pre(r, l);
    p.norm(pre + "input_layernorm.weight", h);
    gqa_attention(
        p, pre, {h, heads, kv, hd}, nvfp4,
        [&](const std::string& m, int64_t rows, int64_t cols) { linear(m, rows, cols, false); });
    p.norm(pre + "self_attn.q_norm.weight", hd);
    p.norm(pre + "self_attn.k_norm.weight", hd);
    p.norm(pre + "post_attention_layernorm.weight", h);
    p.gaussian(in(pre, r.router) + ".weight", DType::BF16, {n.experts, h});
    for (int e = 0; e < n.experts; ++e) {
      const std::string x = expert_pre(r, pre, e);
      linear(in(x, r.gate), inter, h, true);
      linear(in(x, r.up), inter, h, true);
      linear(in(x, r.down), h, inter, true);
    }
  }
  p.norm("model.norm.weight", h);
  p.hole(std::string(r.lm_head) + ".weight", DType::BF16, {vocab, h});
}

// exclude_modules of the ModelOpt export: every router gate, and the LM head.
json qwen3_exclude_modules(int layers) {
  std::vector<std::string> names;
  const FamilyNaming& r = row_of(Family::kQwen3);
  for (int l = 0; l < layers; ++l) names.push_back(in(layer_pre(r, l), r.router));
  std::sort(names.begin(), names.end());  // the export lists them in string order
  json out = names;
  out.push_back("lm_head");
  return out;
}

// ----- MiniMax-M2 (ModelOpt NVFP4, FP8 block-128) ----------------------------------------------

void edit_minimax_config(json& c, const Counts& n) {
  if (!n.small) return;
  c["num_hidden_layers"] = n.layers;
  c["num_local_experts"] = n.experts;
  cap_key(c, "num_experts_per_tok", n.experts);
  // attn_type_list (NVIDIA's export) has one entry per decoder layer.
  if (c.contains("attn_type_list") && c["attn_type_list"].is_array() &&
      !c["attn_type_list"].empty()) {
    const json old = c["attn_type_list"];
    json types = json::array();
    for (int l = 0; l < n.layers; ++l) types.push_back(old.at(l % old.size()));
    c["attn_type_list"] = types;
  }
}

// The exclusion list of NVIDIA's export (config.json `ignore`, hf_quant_config.json
// `exclude_modules`): lm_head, then every layer's router and attention in string order.
json minimax_exclusions(int layers) {
  std::vector<std::string> names;
  const FamilyNaming& r = row_of(Family::kMiniMax);
  for (int l = 0; l < layers; ++l) {
    const std::string pre = layer_pre(r, l);
    names.push_back(in(pre, r.router));
    names.push_back(pre + "self_attn*");
  }
  std::sort(names.begin(), names.end());
  json out = json::array({"lm_head"});
  for (const std::string& s : names) out.push_back(s);
  return out;
}

// MiniMax-M2 in its Hugging Face names: model.layers.L.self_attn.{q,k,v,o}_proj with per-layer
// q_norm/k_norm, block_sparse_moe.gate (BF16 router), block_sparse_moe.e_score_correction_bias
// (F32 selection bias) and block_sparse_moe.experts.E.w1/w2/w3 (gate, down, up); no shared
// expert. The configs declare MTP modules (use_mtp, num_mtp_modules) but, as in the released
// weights fp4moe reads, none are written.
void minimax(Plan& p, const json& c, const Counts& n, bool nvfp4) {
  const int64_t h = int_key(c, "hidden_size"), inter = int_key(c, "intermediate_size");
  const int64_t heads = int_key(c, "num_attention_heads"), kv = int_key(c, "num_key_value_heads");
  const int64_t hd = int_key(c, "head_dim"), vocab = int_key(c, "vocab_size");
  const FamilyNaming& r = row_of(Family::kMiniMax);
  p.hole(std::string(r.embed) + ".weight", DType::BF16, {vocab, h});
  for (int l = 0; l < n.layers; ++l) {
    const std::string pre = layer_pre(r, l);
    p.norm(pre + "input_layernorm.weight", h);
    // NVIDIA's export leaves attention in BF16 (self_attn* is excluded); the FP8 release
    // quantizes it like every other linear.
    gqa_attention(p, pre, {h, heads, kv, hd}, nvfp4,
                  [&](const std::string& m, int64_t rows, int64_t cols) {
                    if (nvfp4) {
                      p.bf16_linear(m, rows, cols, false);
                    } else {
                      p.fp8_block(m, rows, cols, Fp8Scale::kF32ScaleInv, false);
                    }
                  });
    p.norm(pre + "self_attn.q_norm.weight", heads * hd);  // qk_norm_type per_layer
    p.norm(pre + "self_attn.k_norm.weight", kv * hd);
    p.norm(pre + "post_attention_layernorm.weight", h);
    p.gaussian(in(pre, r.router) + ".weight", DType::BF16, {n.experts, h});
    p.gaussian(in(pre, r.router_correction_bias), DType::F32, {n.experts});
    for (int e = 0; e < n.experts; ++e) {
      const std::string x = expert_pre(r, pre, e);
      // w1 (gate) and w3 (up) are [inter, hidden]; w2 (down) is [hidden, inter].
      for (const auto& [w, rows, cols] :
           {std::tuple{r.gate, inter, h}, {r.down, h, inter}, {r.up, inter, h}}) {
        if (nvfp4) {
          p.nvfp4_modelopt(in(x, w), rows, cols);
        } else {
          p.fp8_block(in(x, w), rows, cols, Fp8Scale::kF32ScaleInv);
        }
      }
    }
  }
  p.norm("model.norm.weight", h);
  p.hole(std::string(r.lm_head) + ".weight", DType::BF16, {vocab, h});
}

// The real count of a config key (full-size layouts).
int real_count(const char* config_text, const char* key) {
  return static_cast<int>(json::parse(config_text).at(key).get<int64_t>());
}

}  // namespace

std::span<const LayoutInfo> layouts() { return kLayouts; }

Result<Layout> parse_layout(std::string_view name) {
  for (const LayoutInfo& info : kLayouts) {
    if (info.name == name) return info.layout;
  }
  std::string known;
  for (const LayoutInfo& info : kLayouts)
    known += (known.empty() ? "" : ", ") + std::string(info.name);
  return Error{"unknown synthetic layout '" + std::string(name) + "' (known: " + known + ")"};
}

Status write_synthetic(Layout layout, const fs::path& dir, const SynthOptions& options) {
  if (!options.full_size) {
    if (options.layers < 1 || options.layers > kMaxLayers) {
      return Error{"synthetic checkpoint " + dir.string() + ": layers must be 1.." +
                   std::to_string(kMaxLayers) + ", got " + std::to_string(options.layers)};
    }
    if (options.experts < 1 || options.experts > kMaxExperts) {
      return Error{"synthetic checkpoint " + dir.string() + ": experts must be 1.." +
                   std::to_string(kMaxExperts) + ", got " + std::to_string(options.experts)};
    }
  }
  if (std::error_code ec; fs::exists(dir, ec) || ec) {
    return Error{"synthetic checkpoint " + dir.string() + ": destination already exists"};
  }
  // Full-size layouts are all holes: no sample to quantize.
  Pools pools;
  if (!options.full_size) pools = make_pools(options.seed, kWeightStd);
  Plan plan(options.full_size ? nullptr : &pools, options.seed);

  auto counts = [&](const char* config_text, const char* layers_key, const char* experts_key) {
    if (!options.full_size) return Counts{options.layers, options.experts, true};
    return Counts{real_count(config_text, layers_key), real_count(config_text, experts_key), false};
  };
  json config, hf_quant;
  switch (layout) {
    case Layout::kDsv4Mxfp4:
    case Layout::kDsv4Nvfp4: {
      const bool nv = layout == Layout::kDsv4Nvfp4;
      const char* text =
          nv ? base_configs::kNvidiaDeepseekV4FlashNvfp4 : base_configs::kDeepseekV4Flash;
      const Counts n = counts(text, "num_hidden_layers", "n_routed_experts");
      config = json::parse(text);
      edit_dsv4_config(config, n);
      if (nv) {
        config["quantization_config"]["quantized_layers"] = nvidia_v4_quantized_layers(n.layers);
        hf_quant = json::parse(base_configs::kNvidiaDeepseekV4FlashNvfp4HfQuant);
        hf_quant["quantization"]["quantized_layers"] = nvidia_v4_quantized_layers(n.layers);
      }
      dsv4_reference(plan, config, n, nv ? V4Experts::kNvfp4Modelopt : V4Experts::kMxfp4);
      break;
    }
    case Layout::kCtNvfp4: {
      const char* text = base_configs::kRedHatDeepseekV4FlashNvfp4Fp8;
      const Counts n = counts(text, "num_hidden_layers", "n_routed_experts");
      config = json::parse(text);
      edit_dsv4_config(config, n);
      dsv4_ct(plan, config, n);
      break;
    }
    case Layout::kGptOssMxfp4: {
      const char* text = base_configs::kGptOss20b;
      const Counts n = counts(text, "num_hidden_layers", "num_local_experts");
      config = json::parse(text);
      gpt_oss(plan, config, n);
      break;
    }
    case Layout::kDsv3Fp8: {
      const char* text = base_configs::kDeepseekV3;
      Counts n = counts(text, "num_hidden_layers", "n_routed_experts");
      config = json::parse(text);
      dsv3(plan, config, n);
      break;
    }
    case Layout::kModeloptNvfp4:
    case Layout::kBf16: {
      const bool nv = layout == Layout::kModeloptNvfp4;
      const char* text = nv ? base_configs::kNvidiaQwen3_235bNvfp4 : base_configs::kQwen3_30bA3bFp8;
      const Counts n = counts(text, "num_hidden_layers", "num_experts");
      config = json::parse(text);
      if (!nv) config.erase("quantization_config");  // Qwen/Qwen3-30B-A3B, the BF16 original
      edit_qwen3_config(config, n);
      if (nv) {
        hf_quant = json::parse(base_configs::kNvidiaQwen3_235bNvfp4HfQuant);
        hf_quant["quantization"]["exclude_modules"] = qwen3_exclude_modules(n.layers);
      }
      qwen3(plan, config, n, nv);
      break;
    }
    case Layout::kMiniMaxNvfp4:
    case Layout::kMiniMaxFp8: {
      const bool nv = layout == Layout::kMiniMaxNvfp4;
      const char* text = nv ? base_configs::kNvidiaMiniMaxM25Nvfp4 : base_configs::kMiniMaxM25;
      const Counts n = counts(text, "num_hidden_layers", "num_local_experts");
      config = json::parse(text);
      edit_minimax_config(config, n);
      if (nv) {
        config["quantization_config"]["ignore"] = minimax_exclusions(n.layers);
        hf_quant = json::parse(base_configs::kNvidiaMiniMaxM25Nvfp4HfQuant);
        hf_quant["quantization"]["exclude_modules"] = minimax_exclusions(n.layers);
      }
      minimax(plan, config, n, nv);
      break;
    }
  }
  return plan.write(dir, options, config, hf_quant);
}

}  // namespace fp4moe::synth
