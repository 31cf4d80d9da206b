// DeepSeek-V4 variants with tensor evidence: real names, dtypes and shapes of V4-Flash
// (hidden 4096, moe_intermediate 2048, q_lora 1024), a few layers, experts 0-1 and one MTP layer.
#include "test_util.h"

namespace fp4moe::detect {
namespace {

using testing::corpus_input;
using testing::findings_text;
using testing::must_detect;

enum class ExpertForm { kMxfp4, kNvfp4, kFp8 };

void add_fp8_block(std::vector<TensorRecord>& t, const std::string& m, int64_t n, int64_t k) {
  t.push_back({m + ".weight", "F8_E4M3", {n, k}});
  t.push_back({m + ".scale", "F8_E8M0", {(n + 127) / 128, (k + 127) / 128}});
}

void add_expert(std::vector<TensorRecord>& t, const std::string& m, int64_t n, int64_t k,
                ExpertForm form) {
  switch (form) {
    case ExpertForm::kMxfp4:  // I8 [N, K/2] + F8_E8M0 [N, K/32]
      t.push_back({m + ".weight", "I8", {n, k / 2}});
      t.push_back({m + ".scale", "F8_E8M0", {n, k / 32}});
      break;
    case ExpertForm::kNvfp4:  // ModelOpt: U8 [N, K/2] + F8_E4M3 [N, K/16] + two F32 scalars
      t.push_back({m + ".weight", "U8", {n, k / 2}});
      t.push_back({m + ".weight_scale", "F8_E4M3", {n, k / 16}});
      t.push_back({m + ".weight_scale_2", "F32", {}});
      t.push_back({m + ".input_scale", "F32", {}});
      break;
    case ExpertForm::kFp8:
      add_fp8_block(t, m, n, k);
      break;
  }
}

std::vector<TensorRecord> v4_tensors(ExpertForm routed, ExpertForm mtp) {
  constexpr int64_t kHidden = 4096, kInter = 2048;
  std::vector<TensorRecord> t;
  t.push_back({"embed.weight", "BF16", {129280, kHidden}});
  t.push_back({"head.weight", "BF16", {129280, kHidden}});
  auto layer = [&](const std::string& p, ExpertForm form) {
    add_fp8_block(t, p + "attn.wq_a", 1024, kHidden);
    add_fp8_block(t, p + "attn.wq_b", 32768, 1024);
    add_fp8_block(t, p + "attn.wkv", 512, kHidden);
    add_fp8_block(t, p + "attn.wo_b", kHidden, 8192);
    t.push_back({p + "attn_norm.weight", "BF16", {kHidden}});
    t.push_back({p + "ffn.gate.weight", "BF16", {256, kHidden}});
    t.push_back({p + "ffn.gate.bias", "F32", {256}});
    for (int e = 0; e < 2; ++e) {
      const std::string x = p + "ffn.experts." + std::to_string(e) + ".";
      add_expert(t, x + "w1", kInter, kHidden, form);
      add_expert(t, x + "w3", kInter, kHidden, form);
      add_expert(t, x + "w2", kHidden, kInter, form);
    }
    add_fp8_block(t, p + "ffn.shared_experts.w1", kInter, kHidden);
    add_fp8_block(t, p + "ffn.shared_experts.w2", kHidden, kInter);
  };
  for (int l = 0; l < 3; ++l) layer("layers." + std::to_string(l) + ".", routed);
  layer("mtp.0.", mtp);
  return t;
}

TEST(DeepseekV4, StockExpertDtypeFp4WithTensors) {
  DetectInput in = corpus_input("deepseek-ai__DeepSeek-V4-Flash");
  in.tensors = v4_tensors(ExpertForm::kMxfp4, ExpertForm::kMxfp4);
  const Manifest m = must_detect(in);
  EXPECT_TRUE(m.tensors_checked);
  EXPECT_EQ(m.summary.routed_experts, Scheme::kMxfp4) << findings_text(m);
  EXPECT_EQ(m.summary.mtp_experts, Scheme::kMxfp4);
  EXPECT_EQ(m.summary.attention, Scheme::kFp8Block);
  EXPECT_EQ(m.summary.shared_experts, Scheme::kFp8Block);
  EXPECT_EQ(m.summary.lm_head, Scheme::kBf16);
  EXPECT_FALSE(m.has_finding("config_tensor_mismatch")) << findings_text(m);
  EXPECT_TRUE(m.has_finding("quant_method_hides_moe_format"));
  for (const auto& g : m.modules) {
    if (g.role == Role::kRoutedExperts) {
      EXPECT_EQ(g.spec.group_size, 32);
      EXPECT_EQ(g.spec.scale, ScaleType::kUe8m0);
      EXPECT_EQ(g.module_count, 3 * 2);  // 3 layers x 2 experts per projection group
      EXPECT_GT(g.bytes, 0);
    }
    if (g.role == Role::kAttention) {
      EXPECT_EQ(g.spec.group_size, 128);
    }
  }
}

TEST(DeepseekV4, NvidiaNvfp4MoeQuantAlgoWithIgnore) {
  DetectInput in = corpus_input("nvidia__DeepSeek-V4-Flash-NVFP4");
  in.tensors = v4_tensors(ExpertForm::kNvfp4, ExpertForm::kMxfp4);
  const Manifest m = must_detect(in);
  EXPECT_EQ(m.summary.routed_experts, Scheme::kNvfp4) << findings_text(m);
  EXPECT_EQ(m.summary.mtp_experts, Scheme::kMxfp4);
  EXPECT_EQ(m.summary.attention, Scheme::kFp8Block);
  EXPECT_EQ(m.summary.shared_experts, Scheme::kFp8Block);
  EXPECT_EQ(m.summary.kv_cache, Scheme::kBf16);
  EXPECT_FALSE(m.has_finding("config_tensor_mismatch")) << findings_text(m);
  EXPECT_TRUE(m.has_finding("quant_method_hides_moe_format"));
  EXPECT_TRUE(m.has_finding("mtp_experts_differ"));
  for (const auto& g : m.modules) {
    if (g.role == Role::kRoutedExperts) {
      EXPECT_EQ(g.spec.group_size, 16);
      EXPECT_EQ(g.spec.scale, ScaleType::kE4M3);
      EXPECT_EQ(g.spec.activation, Activation::kNvfp4);  // input_scale present: W4A4
      EXPECT_NE(g.config_source.find("quantized_layers"), std::string::npos) << g.config_source;
    }
    if (g.role == Role::kMtpExperts) {
      EXPECT_NE(g.config_source.find("mtp.*"), std::string::npos) << g.config_source;
    }
  }
}

TEST(DeepseekV4, OlderRevisionOnlyHfQuantConfig) {
  DetectInput in =
      corpus_input("nvidia__DeepSeek-V4-Flash-NVFP4__older-rev-no-quantization_config");
  in.tensors = v4_tensors(ExpertForm::kNvfp4, ExpertForm::kMxfp4);
  const Manifest m = must_detect(in);
  EXPECT_EQ(m.summary.routed_experts, Scheme::kNvfp4) << findings_text(m);
  EXPECT_EQ(m.summary.attention, Scheme::kFp8Block);
  EXPECT_EQ(m.summary.mtp_experts, Scheme::kMxfp4);
  EXPECT_TRUE(m.has_finding("mixed_precision_base_implicit"));
  EXPECT_FALSE(m.has_finding("config_tensor_mismatch")) << findings_text(m);
}

TEST(DeepseekV4, ConfigSaysMxfp4ButTensorsAreNvfp4TensorsWin) {
  DetectInput in = corpus_input("deepseek-ai__DeepSeek-V4-Flash");  // expert_dtype fp4
  in.tensors = v4_tensors(ExpertForm::kNvfp4, ExpertForm::kMxfp4);
  const Manifest m = must_detect(in);
  EXPECT_EQ(m.summary.routed_experts, Scheme::kNvfp4);
  bool found = false;
  for (const auto& f : m.findings) {
    if (f.code == "config_tensor_mismatch" && f.message.rfind("routed_experts", 0) == 0) {
      found = true;
      EXPECT_EQ(f.severity, Severity::kError);
      EXPECT_NE(f.message.find("config says mxfp4"), std::string::npos) << f.message;
      EXPECT_NE(f.message.find("tensors are nvfp4"), std::string::npos) << f.message;
      EXPECT_NE(f.message.find("U8 weight"), std::string::npos) << f.message;
    }
  }
  EXPECT_TRUE(found) << findings_text(m);
}

TEST(DeepseekV4, NoExpertDtypeButTensorsAreMxfp4) {
  DetectInput in = corpus_input("sgl-project__DeepSeek-V4-Flash-FP8");  // config: FP8 experts
  in.tensors = v4_tensors(ExpertForm::kMxfp4, ExpertForm::kMxfp4);
  const Manifest m = must_detect(in);
  EXPECT_EQ(m.summary.routed_experts, Scheme::kMxfp4);
  EXPECT_TRUE(m.has_finding("config_tensor_mismatch")) << findings_text(m);
  // And when the tensors agree with the config there is no mismatch.
  in.tensors = v4_tensors(ExpertForm::kFp8, ExpertForm::kFp8);
  const Manifest ok = must_detect(in);
  EXPECT_EQ(ok.summary.routed_experts, Scheme::kFp8Block);
  EXPECT_FALSE(ok.has_finding("config_tensor_mismatch")) << findings_text(ok);
}

TEST(DeepseekV4, NvidiaConfigButMtpConvertedToNvfp4IsReported) {
  // A re-export that converted mtp.* although the config ignores it.
  DetectInput in = corpus_input("nvidia__DeepSeek-V4-Flash-NVFP4");
  in.tensors = v4_tensors(ExpertForm::kNvfp4, ExpertForm::kNvfp4);
  const Manifest m = must_detect(in);
  EXPECT_EQ(m.summary.mtp_experts, Scheme::kNvfp4);
  EXPECT_TRUE(m.has_finding("config_tensor_mismatch")) << findings_text(m);
  EXPECT_FALSE(m.has_finding("mtp_experts_differ"));
}

}  // namespace
}  // namespace fp4moe::detect
