// The architecture reader on real config shapes: per-layer MoE lists beside the integer form.
#include "detect/arch.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "detect/detect.h"

namespace fp4moe::detect {
namespace {

std::vector<bool> moe_layers(const nlohmann::json& config) {
  auto arch = read_arch(config);
  EXPECT_TRUE(arch.ok()) << arch.error().message;
  std::vector<bool> out;
  if (arch.ok()) {
    for (const auto& l : arch->layers) out.push_back(l.moe);
  }
  return out;
}

TEST(Arch, MoeLayerFreqAsAnIntegerOrAPerLayerList) {
  nlohmann::json config = {{"model_type", "deepseek_v3"},
                           {"num_hidden_layers", 5},
                           {"n_routed_experts", 8},
                           {"first_k_dense_replace", 1},
                           {"moe_layer_freq", 2}};
  EXPECT_EQ(moe_layers(config), (std::vector<bool>{false, false, true, false, true}));
  // A real config shape that used to abort inspect ("'moe_layer_freq' must be an integer").
  config["moe_layer_freq"] = {0, 1, 1, 0, true};
  EXPECT_EQ(moe_layers(config), (std::vector<bool>{false, true, true, false, true}));
  // A list shorter than the layers leaves the rest dense.
  config["moe_layer_freq"] = {1, 1};
  EXPECT_EQ(moe_layers(config), (std::vector<bool>{true, true, false, false, false}));
}

TEST(Arch, Llama4InterleavedMoeLayersUnderTextConfigWithASharedExpert) {
  // meta-llama/Llama-4-Maverick's shape (tests/data/outside): MoE layers are
  // range(step - 1, layers, step), a dense MLP between them; every MoE block has a shared expert.
  nlohmann::json config = {{"model_type", "llama4"},
                           {"text_config",
                            {{"model_type", "llama4_text"},
                             {"num_hidden_layers", 5},
                             {"num_local_experts", 128},
                             {"interleave_moe_layer_step", 2}}}};
  EXPECT_EQ(moe_layers(config), (std::vector<bool>{false, true, false, true, false}));
  auto arch = read_arch(config);
  ASSERT_TRUE(arch.ok());
  EXPECT_TRUE(arch->shared_experts);
  EXPECT_TRUE(arch->layers[0].dense_mlp && !arch->layers[1].dense_mlp);
  config["text_config"]["interleave_moe_layer_step"] = 1;  // Scout: every layer
  EXPECT_EQ(moe_layers(config), (std::vector<bool>(5, true)));
}

bool has_code(const Manifest& m, std::string_view code, std::string_view in_message) {
  for (const auto& f : m.findings) {
    if (f.code == code && f.message.find(in_message) != std::string::npos) return true;
  }
  return false;
}

Manifest detect_config(const nlohmann::json& config, const nlohmann::json& hfq = nullptr) {
  DetectInput in;
  in.config = config;
  in.hf_quant_config = hfq;
  auto r = detect(in);
  EXPECT_TRUE(r.ok()) << r.error().message;
  return r.ok() ? r.value() : Manifest{};
}

// A VLM wrapper's text_config with the counting keys other families use.
TEST(Arch, SharedExpertsAndDenseLayersFromTheRealKeys) {
  const nlohmann::json config = {{"model_type", "some_vlm"},
                                 {"vision_config", {{"hidden_size", 8}}},
                                 {"text_config",
                                  {{"model_type", "qwen3_moe"},
                                   {"num_hidden_layers", 3},
                                   {"num_experts", 4},
                                   {"num_shared_experts", 2},
                                   {"first_k_dense_replace", 1}}}};
  auto arch = read_arch(config);
  ASSERT_TRUE(arch.ok());
  EXPECT_TRUE(arch->shared_experts);
  ASSERT_EQ(arch->layers.size(), 3u);
  EXPECT_FALSE(arch->layers[0].moe);
  EXPECT_TRUE(arch->layers[0].dense_mlp);
  EXPECT_TRUE(arch->layers[1].moe);
  const Manifest m = detect_config(config);
  EXPECT_EQ(m.summary.shared_experts, Scheme::kBf16);
  EXPECT_EQ(m.summary.dense_mlp, Scheme::kBf16);
  EXPECT_EQ(m.summary.routed_experts, Scheme::kBf16);
}

TEST(Arch, FieldsOfUnexpectedTypeAreFindingsNotAborts) {
  const nlohmann::json config = {{"model_type", "qwen3_moe"}, {"num_hidden_layers", 4},
                                 {"num_experts", "eight"},    {"mlp_only_layers", {0, "x"}},
                                 {"layer_types", "all_full"}, {"first_k_dense_replace", {1, 2}},
                                 {"text_config", 7}};
  auto arch = read_arch(config);
  ASSERT_TRUE(arch.ok()) << arch.error().message;
  EXPECT_EQ(arch->num_layers, 4);
  const Manifest m = detect_config(config);
  for (const char* key : {"'num_experts'", "'mlp_only_layers'", "'layer_types'",
                          "'first_k_dense_replace'", "'text_config'"}) {
    EXPECT_TRUE(has_code(m, "config_field_type", key)) << key;
  }
}

// ModelOpt MIXED_PRECISION entries under a prefix this tool does not synthesize: every entry
// matches nothing, so nothing is known about any role (it used to say bf16 everywhere).
TEST(Arch, ARoleWhoseModulesCannotBeNamedIsUnknown) {
  const nlohmann::json config = {
      {"model_type", "minimax_m2"}, {"num_hidden_layers", 2}, {"num_local_experts", 4}};
  nlohmann::json layers = nlohmann::json::object();
  for (int l = 0; l < 2; ++l) {
    for (int e = 0; e < 4; ++e) {
      for (const char* w : {"w1", "w2", "w3"}) {
        layers["language_model.model.layers." + std::to_string(l) + ".block_sparse_moe.experts." +
               std::to_string(e) + "." + w] = {{"quant_algo", "NVFP4"}, {"group_size", 16}};
      }
    }
  }
  const nlohmann::json hfq = {
      {"quantization", {{"quant_algo", "MIXED_PRECISION"}, {"quantized_layers", layers}}}};
  const Manifest m = detect_config(config, hfq);
  EXPECT_EQ(m.summary.routed_experts, Scheme::kUnknown);
  EXPECT_EQ(m.summary.attention, Scheme::kUnknown);
  EXPECT_TRUE(m.has_finding("roles_unnamed"));
  // The same entries under the names the tool knows: NVFP4 experts, known.
  nlohmann::json plain = nlohmann::json::object();
  for (const auto& [name, spec] : layers.items()) plain[name.substr(15)] = spec;
  const Manifest known = detect_config(
      config, {{"quantization", {{"quant_algo", "MIXED_PRECISION"}, {"quantized_layers", plain}}}});
  EXPECT_EQ(known.summary.routed_experts, Scheme::kNvfp4);
  EXPECT_FALSE(known.has_finding("roles_unnamed"));
  // Per-expert entries are matched against the modules they name: no false "match no module"
  // for experts 1..3 (the configs-only inventory stands expert 0 for all).
  EXPECT_FALSE(known.has_finding("pattern_unmatched"));
}

}  // namespace
}  // namespace fp4moe::detect
