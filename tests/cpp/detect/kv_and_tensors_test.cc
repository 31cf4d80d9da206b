// KV-cache spellings, tensor-family classification, and bad input.
#include "checkpoint/checkpoint_dir.h"
#include "detect/claims.h"
#include "test_util.h"

namespace fp4moe::detect {
namespace {

using nlohmann::json;

TEST(KvCache, EverySpelling) {
  EXPECT_EQ(kv_scheme(json("FP8")), Scheme::kFp8Tensor);
  EXPECT_EQ(kv_scheme(json("fp8")), Scheme::kFp8Tensor);
  EXPECT_EQ(kv_scheme(json("NVFP4")), Scheme::kNvfp4);
  EXPECT_EQ(kv_scheme(json(nullptr)), Scheme::kBf16);
  EXPECT_EQ(kv_scheme(json("none")), Scheme::kBf16);
  EXPECT_EQ(kv_scheme(json("NONE")), Scheme::kBf16);
  EXPECT_EQ(kv_scheme(json("auto")), Scheme::kBf16);
  EXPECT_EQ(kv_scheme(json{{"num_bits", 8}, {"type", "float"}, {"dynamic", false}}),
            Scheme::kFp8Tensor);
  EXPECT_EQ(kv_scheme(json{{"num_bits", 8}, {"type", "float"}, {"strategy", "tensor"}}),
            Scheme::kFp8Tensor);
  EXPECT_EQ(kv_scheme(json{{"num_bits", 8}, {"type", "float"}, {"strategy", "attn_head"}}),
            Scheme::kFp8Channel);
  EXPECT_FALSE(kv_scheme(json("INT8")).has_value());
  EXPECT_FALSE(kv_scheme(json{{"num_bits", 8}, {"type", "int"}}).has_value());
  EXPECT_FALSE(kv_scheme(json(3)).has_value());
}

TEST(KvCache, UnknownSpellingIsAFindingAndUnknown) {
  DetectInput in;
  in.hf_quant_config = {
      {"quantization",
       {{"quant_algo", "FP8"}, {"kv_cache_quant_algo", "INT8"}, {"exclude_modules", {"lm_head"}}}}};
  const Manifest m = testing::must_detect(in);
  EXPECT_EQ(m.summary.kv_cache, Scheme::kUnknown);
  EXPECT_TRUE(m.has_finding("kv_cache_unknown"));
}

TEST(KvCache, ScalesInTensorsButUndeclared) {
  DetectInput in;
  in.config = {
      {"model_type", "qwen3"},
      {"num_hidden_layers", 1},
      {"quantization_config", {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}}}};
  in.tensors = std::vector<TensorRecord>{
      {"model.layers.0.self_attn.q_proj.weight", "F8_E4M3", {256, 256}},
      {"model.layers.0.self_attn.q_proj.weight_scale_inv", "F32", {2, 2}},
      {"model.layers.0.self_attn.k_proj.k_scale", "F32", {}},
  };
  const Manifest m = testing::must_detect(in);
  EXPECT_TRUE(m.has_finding("kv_scales_undeclared")) << testing::findings_text(m);
  EXPECT_EQ(m.summary.attention, Scheme::kFp8Block);
}

SchemeSpec classify_one(std::vector<TensorRecord> t) {
  auto ev = classify_tensors(t);
  EXPECT_EQ(ev.modules.size(), 1u);
  return ev.modules.empty() ? SchemeSpec{} : ev.modules[0].spec;
}

TEST(Tensors, FamiliesOfFormatsSection3) {
  // ModelOpt NVFP4, W4A16 variant without input_scale.
  auto s = classify_one({{"m.weight", "U8", {64, 32}},
                         {"m.weight_scale", "F8_E4M3", {64, 4}},
                         {"m.weight_scale_2", "F32", {}}});
  EXPECT_EQ(s.scheme, Scheme::kNvfp4);
  EXPECT_EQ(s.activation, Activation::kNone);
  EXPECT_EQ(s.group_size, 16);
  // compressed-tensors NVFP4 and MXFP4.
  EXPECT_EQ(classify_one({{"m.weight_packed", "U8", {64, 32}},
                          {"m.weight_scale", "F8_E4M3", {64, 4}},
                          {"m.weight_global_scale", "F32", {1}}})
                .scheme,
            Scheme::kNvfp4);
  EXPECT_EQ(
      classify_one({{"m.weight_packed", "U8", {64, 32}}, {"m.weight_scale", "U8", {64, 2}}}).scheme,
      Scheme::kMxfp4);
  // compressed-tensors INT4 g32: 8 nibbles per I32.
  s = classify_one({{"m.weight_packed", "I32", {64, 16}},
                    {"m.weight_scale", "BF16", {64, 4}},
                    {"m.weight_shape", "I64", {2}}});
  EXPECT_EQ(s.scheme, Scheme::kInt4);
  EXPECT_EQ(s.group_size, 32);
  // gpt-oss fused experts.
  auto ev = classify_tensors(
      {{"model.layers.0.mlp.experts.gate_up_proj_blocks", "U8", {32, 5760, 90, 16}},
       {"model.layers.0.mlp.experts.gate_up_proj_scales", "U8", {32, 5760, 90}},
       {"model.layers.0.mlp.experts.gate_up_proj_bias", "BF16", {32, 5760}}});
  ASSERT_EQ(ev.modules.size(), 1u);
  EXPECT_EQ(ev.modules[0].name, "model.layers.0.mlp.experts.gate_up_proj");
  EXPECT_EQ(ev.modules[0].spec.scheme, Scheme::kMxfp4);
  // FP8: per tensor (ModelOpt), per channel, 128x128 blocks with ragged edges, MXFP8.
  s = classify_one({{"m.weight", "F8_E4M3", {300, 200}},
                    {"m.weight_scale", "F32", {}},
                    {"m.input_scale", "F32", {}}});
  EXPECT_EQ(s.scheme, Scheme::kFp8Tensor);
  EXPECT_EQ(s.activation, Activation::kFp8Static);
  EXPECT_EQ(classify_one({{"m.weight", "F8_E4M3", {300, 200}}, {"m.weight_scale", "F32", {300, 1}}})
                .scheme,
            Scheme::kFp8Channel);
  s = classify_one({{"m.weight", "F8_E4M3", {300, 200}}, {"m.weight_scale_inv", "F32", {3, 2}}});
  EXPECT_EQ(s.scheme, Scheme::kFp8Block);
  EXPECT_EQ(s.group_size, 128);
  EXPECT_EQ(
      classify_one({{"m.weight", "F8_E4M3", {64, 64}}, {"m.weight_scale", "F8_E8M0", {64, 2}}})
          .scheme,
      Scheme::kMxfp8);
  EXPECT_EQ(classify_one({{"m.weight", "BF16", {64, 64}}}).scheme, Scheme::kBf16);
  // Never a guess: a wrong scale shape, a missing scale, an odd dtype.
  EXPECT_EQ(
      classify_one({{"m.weight", "U8", {64, 32}}, {"m.weight_scale", "F8_E4M3", {64, 3}}}).scheme,
      Scheme::kUnknown);
  EXPECT_EQ(classify_one({{"m.weight", "U8", {64, 32}}}).scheme, Scheme::kUnknown);
  EXPECT_EQ(classify_one({{"m.weight", "F8_E5M2", {64, 32}}, {"m.weight_scale", "F32", {}}}).scheme,
            Scheme::kUnknown);
  // The stored-form table's rules (formats/storage.h), stricter than detect's own were: NVFP4
  // needs its tensor scale and U8 codes; a BF16 weight beside a scale is no dense matrix.
  EXPECT_EQ(
      classify_one({{"m.weight", "U8", {64, 32}}, {"m.weight_scale", "F8_E4M3", {64, 4}}}).scheme,
      Scheme::kUnknown);
  EXPECT_EQ(classify_one({{"m.weight", "I8", {64, 32}},
                          {"m.weight_scale", "F8_E4M3", {64, 4}},
                          {"m.weight_scale_2", "F32", {}}})
                .scheme,
            Scheme::kUnknown);
  auto refused = classify_tensors({{"m.weight", "BF16", {64, 64}}, {"m.weight_scale", "F32", {}}});
  ASSERT_EQ(refused.modules.size(), 1u);
  EXPECT_EQ(refused.modules[0].spec.scheme, Scheme::kUnknown);
  EXPECT_NE(refused.modules[0].evidence.find("'m.weight_scale'"), std::string::npos)
      << refused.modules[0].evidence;
}

TEST(Tensors, SuffixSplitting) {
  EXPECT_EQ(split_tensor_name("a.b.weight_scale_2").second, "weight_scale_2");
  EXPECT_EQ(split_tensor_name("a.b.weight_scale_inv").first, "a.b");
  EXPECT_EQ(split_tensor_name("x.mlp.gate.e_score_correction_bias").first, "x.mlp.gate");
  EXPECT_EQ(split_tensor_name("x.experts.down_proj_scales").first, "x.experts.down_proj");
}

TEST(Roles, NamingConventionsOfTheCorpus) {
  ArchInfo a;
  a.num_layers = 61;
  a.mtp_appended = true;
  EXPECT_EQ(classify_module("model.layers.61.mlp.experts.3.up_proj", a), Role::kMtpExperts);
  EXPECT_EQ(classify_module("model.layers.60.mlp.experts.3.up_proj", a), Role::kRoutedExperts);
  EXPECT_EQ(classify_module("model.layers.3.mlp.shared_experts.up_proj", a), Role::kSharedExperts);
  EXPECT_EQ(classify_module("model.layers.3.self_attn.kv_a_proj_with_mqa", a), Role::kAttention);
  EXPECT_EQ(classify_module("model.layers.3.self_attn.indexer.wk", a), Role::kAttention);
  EXPECT_EQ(classify_module("model.layers.0.mlp.gate_proj", a), Role::kDenseMlp);
  EXPECT_EQ(classify_module("model.layers.3.mlp.gate", a), Role::kRouter);
  EXPECT_EQ(classify_module("lm_head", a), Role::kLmHead);
  EXPECT_EQ(classify_module("language_model.lm_head", a), Role::kLmHead);
  ArchInfo v4;
  v4.lm_head_name = "head";
  EXPECT_EQ(classify_module("head", v4), Role::kLmHead);
  EXPECT_EQ(classify_module("mtp.0.ffn.experts.1.w2", v4), Role::kMtpExperts);
  EXPECT_EQ(classify_module("mtp.0.attn.wq_a", v4), Role::kMtpOther);
  EXPECT_EQ(classify_module("layers.2.ffn.gate", v4), Role::kRouter);
  EXPECT_EQ(classify_module("model.language_model.layers.0.linear_attn.in_proj_qkv", v4),
            Role::kAttention);
  EXPECT_EQ(classify_module("model.language_model.layers.0.mlp.shared_expert.up_proj", v4),
            Role::kSharedExperts);
  EXPECT_EQ(classify_module("model.language_model.layers.0.mlp.shared_expert_gate", v4),
            Role::kRouter);
  EXPECT_EQ(classify_module("model.layers.1.block_sparse_moe.experts.7.w1", v4),
            Role::kRoutedExperts);
  EXPECT_EQ(classify_module("backbone.layers.4.mixer.in_proj", v4), Role::kSsm);
  EXPECT_EQ(classify_module("backbone.layers.5.mixer.q_proj", v4), Role::kAttention);
  EXPECT_EQ(classify_module("backbone.layers.1.mixer.experts.3.up_proj", v4), Role::kRoutedExperts);
  EXPECT_EQ(classify_module("model.visual.blocks.0.attn.qkv", v4), Role::kVision);
  EXPECT_EQ(classify_module("model.layers.0.mlp.router", v4), Role::kRouter);
}

TEST(BadInput, ErrorsNotCrashes) {
  auto err = [](json config, json hfq) {
    DetectInput in;
    in.config = std::move(config);
    in.hf_quant_config = std::move(hfq);
    auto r = detect(in);
    EXPECT_FALSE(r.ok());
    return r.ok() ? std::string() : r.error().message;
  };
  EXPECT_NE(err(nullptr, nullptr).find("nothing to inspect"), std::string::npos);
  EXPECT_NE(err(json::array(), nullptr).find("config.json"), std::string::npos);
  EXPECT_NE(err({{"quantization_config", {{"quant_method", 8}}}}, nullptr).find("quant_method"),
            std::string::npos);
  EXPECT_NE(err({{"quantization_config",
                  {{"quant_method", "fp8"}, {"modules_to_not_convert", "lm_head"}}}},
                nullptr)
                .find("modules_to_not_convert"),
            std::string::npos);
  EXPECT_NE(err({{"quantization_config", {{"quant_method", "fp8"}, {"weight_block_size", {128}}}}},
                nullptr)
                .find("weight_block_size"),
            std::string::npos);
  EXPECT_NE(err(nullptr, {{"quantization", {{"quant_algo", "MIXED_PRECISION"}}}})
                .find("quantized_layers"),
            std::string::npos);
  EXPECT_NE(err({{"quantization_config",
                  {{"quant_method", "compressed-tensors"},
                   {"config_groups", {{"g", {{"targets", {"re:("}}}}}}}}},
                nullptr)
                .find("regex"),
            std::string::npos);
  // An architecture key of an unexpected type is a finding, and detection goes on (issue 12:
  // real configs hold per-layer lists and strings where others hold integers).
  {
    DetectInput in;
    in.config = {{"num_hidden_layers", "61"}, {"quantization_config", {{"quant_method", "fp8"}}}};
    auto r = detect(in);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_TRUE(r->has_finding("config_field_type"));
    bool named = false;
    for (const auto& f : r->findings) {
      named = named || (f.code == "config_field_type" &&
                        f.message.find("num_hidden_layers") != std::string::npos);
    }
    EXPECT_TRUE(named);
  }
  EXPECT_FALSE(checkpoint::parse_json_text("{\"a\": [1, 2", "x.json").ok());
  EXPECT_FALSE(
      checkpoint::parse_json_text(std::string(100, '[') + std::string(100, ']'), "x.json").ok());
  auto inf = checkpoint::parse_json_text(
      "{\"t\": [0.0, Infinity], \"s\": \"NaN\", \"n\": -Infinity}", "x");
  ASSERT_TRUE(inf.ok());
  EXPECT_TRUE(inf.value()["t"][1].is_null());
  EXPECT_EQ(inf.value()["s"], "NaN");
}

TEST(UnknownDialect, NeverAGuess) {
  DetectInput in;
  in.config = {{"model_type", "llama"},
               {"num_hidden_layers", 2},
               {"quantization_config", {{"quant_method", "awq"}, {"bits", 4}}}};
  const Manifest m = testing::must_detect(in);
  EXPECT_EQ(m.summary.attention, Scheme::kUnknown);
  EXPECT_EQ(m.summary.dense_mlp, Scheme::kUnknown);
  EXPECT_TRUE(m.has_finding("unknown_dialect"));
  in.config["quantization_config"] = {{"quant_method", "modelopt"},
                                      {"quant_algo", "W8A8_SQ_PER_CHANNEL"}};
  const Manifest m2 = testing::must_detect(in);
  EXPECT_EQ(m2.summary.attention, Scheme::kUnknown);
  EXPECT_TRUE(m2.has_finding("unknown_dialect"));
}

TEST(Sources, ConfigAndSidecarDisagree) {
  DetectInput in;
  in.config = {{"model_type", "qwen3"},
               {"num_hidden_layers", 2},
               {"quantization_config",
                {{"quant_method", "modelopt"}, {"quant_algo", "FP8"}, {"ignore", {"lm_head"}}}}};
  in.hf_quant_config = {
      {"quantization",
       {{"quant_algo", "NVFP4"}, {"group_size", 16}, {"exclude_modules", {"lm_head"}}}}};
  const Manifest m = testing::must_detect(in);
  EXPECT_EQ(m.summary.attention, Scheme::kFp8Tensor);  // config.json first, like SGLang/vLLM
  EXPECT_TRUE(m.has_finding("config_sources_disagree")) << testing::findings_text(m);
}

}  // namespace
}  // namespace fp4moe::detect
