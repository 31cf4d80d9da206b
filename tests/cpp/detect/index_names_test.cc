// Configs-only detection with model.safetensors.index.json names as tensor evidence, and module
// bytes estimated from the config's dimensions (unknown stays unknown, never 0).
#include <map>

#include "detect/sizes.h"
#include "test_util.h"

namespace fp4moe::detect {
namespace {

using nlohmann::json;
using testing::findings_text;
using testing::must_detect;

// A small Qwen3-MoE: 2 layers, 4 experts of width 32, hidden 64, 4 heads (2 KV) of 16.
json qwen3_moe_config() {
  return {{"model_type", "qwen3_moe"}, {"num_hidden_layers", 2},      {"num_experts", 4},
          {"hidden_size", 64},         {"moe_intermediate_size", 32}, {"intermediate_size", 128},
          {"num_attention_heads", 4},  {"num_key_value_heads", 2},    {"head_dim", 16},
          {"vocab_size", 100},         {"num_experts_per_tok", 2},    {"torch_dtype", "bfloat16"}};
}

json nvfp4_quant_config() {
  return {{"quantization",
           {{"quant_algo", "NVFP4"},
            {"group_size", 16},
            {"exclude_modules", {"lm_head", "*self_attn*", "*mlp.gate"}}}}};
}

// Index names of the model: experts with the given suffixes, BF16 attention, router and head.
std::vector<TensorRecord> index_names(const std::vector<std::string>& expert_suffixes) {
  std::vector<TensorRecord> out;
  auto add = [&](const std::string& name) { out.push_back({name, "", {}}); };
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const char* m : {"q_proj", "k_proj", "v_proj", "o_proj"})
      add(p + "self_attn." + m + ".weight");
    add(p + "input_layernorm.weight");
    add(p + "mlp.gate.weight");
    for (int e = 0; e < 4; ++e) {
      for (const char* m : {"gate_proj", "up_proj", "down_proj"}) {
        for (const auto& s : expert_suffixes) {
          add(p + "mlp.experts." + std::to_string(e) + "." + m + "." + s);
        }
      }
    }
  }
  add("model.embed_tokens.weight");
  add("lm_head.weight");
  return out;
}

const ModuleGroup* group(const Manifest& m, Role role) {
  for (const auto& g : m.modules) {
    if (g.role == role) return &g;
  }
  return nullptr;
}

TEST(IndexNames, Nvfp4NamesAgreeWithTheConfig) {
  DetectInput in;
  in.config = qwen3_moe_config();
  in.hf_quant_config = nvfp4_quant_config();
  in.tensors = index_names({"weight", "weight_scale", "weight_scale_2", "input_scale"});
  in.tensor_names_only = true;
  in.index_total_size = 123456;
  const Manifest m = must_detect(in);
  EXPECT_FALSE(m.tensors_checked);
  EXPECT_EQ(m.tensor_evidence, TensorEvidenceKind::kIndexNames);
  EXPECT_EQ(m.summary.routed_experts, Scheme::kNvfp4);
  EXPECT_EQ(m.summary.attention, Scheme::kBf16);
  EXPECT_FALSE(m.has_finding("config_tensor_mismatch")) << findings_text(m);
  EXPECT_FALSE(m.has_finding("tensors_not_checked")) << findings_text(m);
  const ModuleGroup* experts = group(m, Role::kRoutedExperts);
  ASSERT_NE(experts, nullptr);
  ASSERT_TRUE(experts->tensor_scheme.has_value());
  EXPECT_EQ(*experts->tensor_scheme, Scheme::kNvfp4);
  EXPECT_NE(experts->tensor_source.find("index names"), std::string::npos);
  EXPECT_EQ(experts->spec.activation, Activation::kNvfp4);  // input_scale: W4A4
  EXPECT_EQ(m.total_bytes, 123456);
  EXPECT_EQ(m.total_bytes_source, "model.safetensors.index.json metadata.total_size");
  // Per-module estimates: 8 modules (2 layers x 4 experts) of 32x64 per projection at 0.5625 B.
  ASSERT_TRUE(experts->bytes.has_value()) << experts->bytes_source;
  EXPECT_EQ(*experts->bytes, 8 * static_cast<int64_t>(32 * 64 * 0.5625));
  EXPECT_NE(experts->bytes_source.find("config dimensions"), std::string::npos);
}

TEST(IndexNames, NamesThatContradictTheConfigWin) {
  DetectInput in;
  in.config = qwen3_moe_config();
  in.hf_quant_config = {{"quantization", {{"quant_algo", "FP8"}}}};
  in.tensors = index_names({"weight", "weight_scale", "weight_scale_2"});
  in.tensor_names_only = true;
  const Manifest m = must_detect(in);
  EXPECT_EQ(m.summary.routed_experts, Scheme::kNvfp4);
  EXPECT_TRUE(m.has_finding("config_tensor_mismatch")) << findings_text(m);
}

TEST(IndexNames, NamesThatCannotTellLeaveTheClaim) {
  DetectInput in;
  in.config = qwen3_moe_config();
  in.hf_quant_config = nvfp4_quant_config();
  in.tensors = index_names({"weight", "weight_scale"});  // FP8? MXFP4? names alone cannot say
  in.tensor_names_only = true;
  const Manifest m = must_detect(in);
  EXPECT_EQ(m.summary.routed_experts, Scheme::kNvfp4);
  EXPECT_FALSE(m.has_finding("config_tensor_mismatch")) << findings_text(m);
  const ModuleGroup* experts = group(m, Role::kRoutedExperts);
  ASSERT_NE(experts, nullptr);
  EXPECT_FALSE(experts->tensor_scheme.has_value());
}

TEST(IndexNames, GptOssBlocksAndScalesAreMxfp4) {
  DetectInput in;
  in.config = {{"model_type", "gpt_oss"}, {"num_hidden_layers", 1},  {"num_local_experts", 4},
               {"hidden_size", 64},       {"intermediate_size", 64}, {"vocab_size", 10}};
  std::vector<TensorRecord> names;
  for (const char* n : {"model.layers.0.mlp.experts.gate_up_proj_blocks",
                        "model.layers.0.mlp.experts.gate_up_proj_scales",
                        "model.layers.0.mlp.experts.gate_up_proj_bias",
                        "model.layers.0.mlp.experts.down_proj_blocks",
                        "model.layers.0.mlp.experts.down_proj_scales"}) {
    names.push_back({n, "", {}});
  }
  in.tensors = names;
  in.tensor_names_only = true;
  const Manifest m = must_detect(in);
  EXPECT_EQ(m.summary.routed_experts, Scheme::kMxfp4) << findings_text(m);
  // Fused: one module holds all 4 experts; gate_up is two matrices of 64x64.
  int64_t total = 0;
  for (const auto& g : m.modules) {
    if (g.role == Role::kRoutedExperts) {
      ASSERT_TRUE(g.bytes.has_value()) << g.bytes_source;
      total += *g.bytes;
    }
  }
  const int64_t per_expert = 3 * 64 * 64;
  EXPECT_EQ(total, static_cast<int64_t>(4 * per_expert * (0.5 + 1.0 / 32)));
}

TEST(Sizes, ConfigsOnlyBytesFromDimensions) {
  DetectInput in;
  in.config = qwen3_moe_config();
  const Manifest m = must_detect(in);
  EXPECT_EQ(m.tensor_evidence, TensorEvidenceKind::kNone);
  int64_t sum = 0;
  for (const auto& g : m.modules) {
    ASSERT_TRUE(g.bytes.has_value()) << g.name << ": " << g.bytes_source;
    sum += *g.bytes;
    const std::map<std::string, int64_t> expected = {
        {"model.layers.*.mlp.experts.*.down_proj", 2 * 4 * 64 * 32 * 2},  // L x E x [64,32] x 2 B
        {"model.layers.*.self_attn.q_proj", 2 * 64 * 64 * 2},
        {"model.layers.*.self_attn.k_proj", 2 * 32 * 64 * 2},
        {"lm_head", 100 * 64 * 2}};
    if (const auto it = expected.find(g.name); it != expected.end()) {
      EXPECT_EQ(*g.bytes, it->second) << g.name;
    }
  }
  ASSERT_TRUE(m.total_bytes.has_value()) << m.total_bytes_source;
  EXPECT_EQ(*m.total_bytes, sum);
  EXPECT_NE(m.total_bytes_source.find("estimate"), std::string::npos);
}

TEST(Sizes, UnknownIsUnknownNeverZero) {
  DetectInput in;
  in.config = qwen3_moe_config();
  in.config.erase("hidden_size");
  const Manifest m = must_detect(in);
  for (const auto& g : m.modules) {
    EXPECT_FALSE(g.bytes.has_value()) << g.name;
    EXPECT_NE(g.bytes_source.find("unknown"), std::string::npos) << g.bytes_source;
  }
  EXPECT_FALSE(m.total_bytes.has_value());
  const json j = to_json(m);
  EXPECT_TRUE(j["total_bytes"].is_null());
  EXPECT_TRUE(j["modules"][0]["bytes"].is_null());
  EXPECT_NE(to_table(m).find("unknown"), std::string::npos);
}

TEST(Sizes, MlaAndSharedExperts) {
  const json config = {
      {"model_type", "deepseek_v3"}, {"hidden_size", 7168},    {"num_attention_heads", 128},
      {"q_lora_rank", 1536},         {"kv_lora_rank", 512},    {"qk_nope_head_dim", 128},
      {"qk_rope_head_dim", 64},      {"v_head_dim", 128},      {"moe_intermediate_size", 2048},
      {"n_shared_experts", 1},       {"n_routed_experts", 256}};
  ArchInfo arch;
  arch.family = Family::kDeepseekV3;
  const ModelDims d = read_dims(config);
  EXPECT_EQ(module_params("model.layers.3.self_attn.q_b_proj", Role::kAttention, arch, d),
            int64_t{128} * 192 * 1536);
  EXPECT_EQ(module_params("model.layers.3.self_attn.kv_a_proj_with_mqa", Role::kAttention, arch, d),
            int64_t{576} * 7168);
  EXPECT_EQ(module_params("model.layers.3.self_attn.o_proj", Role::kAttention, arch, d),
            int64_t{7168} * 128 * 128);
  EXPECT_EQ(
      module_params("model.layers.3.mlp.shared_experts.down_proj", Role::kSharedExperts, arch, d),
      int64_t{7168} * 2048);
  EXPECT_EQ(module_params("model.layers.3.mlp.gate", Role::kRouter, arch, d), int64_t{256} * 7168);
  EXPECT_FALSE(module_params("model.layers.3.self_attn.mystery", Role::kAttention, arch, d));
}

}  // namespace
}  // namespace fp4moe::detect
