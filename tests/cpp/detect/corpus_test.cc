// Every real config of tests/data/corpus, inspected from configs alone: the expected scheme of
// each summary role, written by reading each config (see tests/data/corpus/SOURCES.md).
#include <filesystem>
#include <set>

#include "test_util.h"

namespace fp4moe::detect {
namespace {

using testing::corpus_input;
using testing::findings_text;
using testing::must_detect;

struct Expected {
  const char* dir;
  const char* routed;
  const char* shared;
  const char* attention;
  const char* dense;
  const char* lm_head;
  const char* mtp;
  const char* kv;
  const char* finding;  // a finding code that must be present, or ""
};

// Columns: routed, shared, attention, dense_mlp, lm_head, mtp_experts, kv_cache.
const Expected kCorpus[] = {
    // HF block FP8: everything FP8 128x128 except the output head; no KV quantization.
    {"MiniMaxAI__MiniMax-M2.5", "fp8_block", "absent", "fp8_block", "absent", "bf16", "unknown",
     "bf16", "mtp_unknown"},
    {"MiniMaxAI__MiniMax-M2.7", "fp8_block", "absent", "fp8_block", "absent", "bf16", "unknown",
     "bf16", "pattern_semantics"},
    {"Qwen__Qwen3-235B-A22B-FP8", "fp8_block", "absent", "fp8_block", "absent", "bf16", "absent",
     "bf16", ""},
    {"Qwen__Qwen3-30B-A3B-FP8", "fp8_block", "absent", "fp8_block", "absent", "bf16", "absent",
     "bf16", ""},
    {"Qwen__Qwen3-32B-FP8", "absent", "absent", "fp8_block", "fp8_block", "bf16", "absent", "bf16",
     ""},
    // ModelOpt FP8 per tensor, flat in config.json without quant_method.
    {"Qwen__Qwen3-32B-FP8-Static-PerTensor", "absent", "absent", "fp8_tensor", "fp8_tensor", "bf16",
     "absent", "fp8_tensor", "missing_quant_method"},
    // compressed-tensors mixed: NVFP4 ffn (routed + shared) and FP8 block attention.
    {"RedHatAI__DeepSeek-V4-Flash-NVFP4-FP8", "nvfp4", "nvfp4", "fp8_block", "absent", "bf16",
     "unknown", "bf16", "stale_expert_dtype"},
    {"deepseek-ai__DeepSeek-R1", "fp8_block", "fp8_block", "fp8_block", "fp8_block", "bf16",
     "fp8_block", "bf16", ""},
    {"deepseek-ai__DeepSeek-V3", "fp8_block", "fp8_block", "fp8_block", "fp8_block", "bf16",
     "fp8_block", "bf16", ""},
    // Stock V4: expert_dtype fp4 makes routed and MTP experts MXFP4.
    {"deepseek-ai__DeepSeek-V4-Flash", "mxfp4", "fp8_block", "fp8_block", "absent", "bf16", "mxfp4",
     "bf16", "quant_method_hides_moe_format"},
    {"moonshotai__Kimi-K2-Instruct", "fp8_block", "fp8_block", "fp8_block", "fp8_block", "bf16",
     "absent", "bf16", ""},
    // compressed-tensors INT4 W4A16 under text_config; attention/shared/dense ignored.
    {"moonshotai__Kimi-K2.5", "int4", "bf16", "bf16", "bf16", "bf16", "absent", "bf16",
     "pattern_semantics"},
    // ModelOpt NVFP4: MLA q/kv projections excluded but o_proj is not -> attention nvfp4 (partly).
    {"nvidia__DeepSeek-V3.1-NVFP4", "nvfp4", "nvfp4", "nvfp4", "nvfp4", "bf16", "bf16",
     "fp8_tensor", "partially_quantized"},
    {"nvidia__DeepSeek-V3.2-NVFP4", "nvfp4", "nvfp4", "nvfp4", "nvfp4", "bf16", "bf16",
     "fp8_tensor", "partially_quantized"},
    // NVIDIA V4: NVFP4 routed experts; attention/shared keep FP8; mtp.* keeps MXFP4.
    {"nvidia__DeepSeek-V4-Flash-NVFP4", "nvfp4", "fp8_block", "fp8_block", "absent", "bf16",
     "mxfp4", "bf16", "quant_method_hides_moe_format"},
    {"nvidia__DeepSeek-V4-Flash-NVFP4__older-rev-no-quantization_config", "nvfp4", "fp8_block",
     "fp8_block", "absent", "bf16", "mxfp4", "bf16", "mixed_precision_base_implicit"},
    // GLM-5 NVFP4: attention (incl. o_proj and indexer) excluded, MTP layer 78 excluded.
    {"nvidia__GLM-5-NVFP4", "nvfp4", "nvfp4", "bf16", "nvfp4", "bf16", "bf16", "fp8_tensor",
     "sidecar_only"},
    // GLM-5.1+: dense layers 0-2 and shared experts excluded too.
    {"nvidia__GLM-5.1-NVFP4", "nvfp4", "bf16", "bf16", "bf16", "bf16", "bf16", "fp8_tensor", ""},
    {"nvidia__GLM-5.2-NVFP4", "nvfp4", "bf16", "bf16", "bf16", "bf16", "bf16", "fp8_tensor", ""},
    {"nvidia__GLM-5.3-NVFP4", "nvfp4", "bf16", "bf16", "bf16", "bf16", "bf16", "fp8_tensor", ""},
    {"nvidia__Gemma-4-26B-A4B-NVFP4", "nvfp4", "absent", "bf16", "bf16", "bf16", "absent",
     "fp8_tensor", "names_assumed"},
    // Kimi K2.5 NVFP4: only attention excluded (language_model. prefix).
    {"nvidia__Kimi-K2.5-NVFP4", "nvfp4", "nvfp4", "bf16", "nvfp4", "bf16", "absent", "fp8_tensor",
     ""},
    {"nvidia__Kimi-K2.6-NVFP4", "nvfp4", "bf16", "bf16", "bf16", "bf16", "absent", "fp8_tensor",
     ""},
    {"nvidia__MiniMax-M2.5-NVFP4", "nvfp4", "absent", "bf16", "absent", "bf16", "unknown",
     "fp8_tensor", "mtp_unknown"},
    {"nvidia__MiniMax-M2.7-NVFP4", "nvfp4", "absent", "bf16", "absent", "bf16", "unknown",
     "fp8_tensor", "mtp_unknown"},
    {"nvidia__NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4", "nvfp4", "nvfp4", "bf16", "absent", "bf16",
     "absent", "fp8_tensor", ""},
    // Stubs without exclude_modules: lm_head and MTP cannot be told.
    {"nvidia__NVIDIA-Nemotron-3-Super-120B-A12B-FP8", "fp8_tensor", "fp8_tensor", "fp8_tensor",
     "absent", "unknown", "unknown", "fp8_tensor", "modelopt_incomplete"},
    {"nvidia__NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4", "nvfp4", "nvfp4", "nvfp4", "absent",
     "unknown", "unknown", "fp8_tensor", "modelopt_incomplete"},
    {"nvidia__NVIDIA-Nemotron-3-Ultra-550B-A55B-FP8", "fp8_tensor", "fp8_tensor", "fp8_tensor",
     "absent", "unknown", "unknown", "fp8_tensor", "modelopt_incomplete"},
    {"nvidia__NVIDIA-Nemotron-3-Ultra-550B-A55B-NVFP4", "nvfp4", "nvfp4", "nvfp4", "absent",
     "unknown", "unknown", "fp8_tensor", "modelopt_incomplete"},
    // Only routers excluded: attention NVFP4 as well.
    {"nvidia__Qwen3-235B-A22B-NVFP4", "nvfp4", "absent", "nvfp4", "absent", "bf16", "absent",
     "fp8_tensor", ""},
    {"nvidia__Qwen3.5-122B-A10B-NVFP4", "nvfp4", "bf16", "bf16", "absent", "bf16", "bf16",
     "fp8_tensor", ""},
    {"nvidia__Qwen3.5-397B-A17B-NVFP4", "nvfp4", "bf16", "bf16", "absent", "bf16", "bf16",
     "fp8_tensor", ""},
    // MIXED_PRECISION: FP8 attention, W4A16 NVFP4 MLP and lm_head.
    {"nvidia__Qwen3.6-27B-NVFP4", "absent", "absent", "fp8_tensor", "nvfp4", "nvfp4", "absent",
     "fp8_tensor", "mixed_precision"},
    {"openai__gpt-oss-20b", "mxfp4", "absent", "bf16", "absent", "bf16", "absent", "bf16", ""},
    // No config.json: architecture reconstructed from names; MTP cannot be told apart, and
    // whether shared experts and dense MLPs exist is not known (no entry names one).
    {"peaceh-nv_TRTLLM__DeepSeek-R1-FP4-hf_quant_config", "nvfp4", "unknown", "nvfp4", "unknown",
     "bf16", "unknown", "bf16", "no_config_json"},
    {"sgl-project__DeepSeek-V4-Flash-FP8", "fp8_block", "fp8_block", "fp8_block", "absent", "bf16",
     "fp8_block", "bf16", "expert_format_from_tensors_only"},
    {"stepfun-ai__Step-3.7-Flash-FP8", "fp8_block", "fp8_block", "fp8_block", "fp8_block", "bf16",
     "fp8_block", "bf16", "names_assumed"},
    {"zai-org__GLM-5-FP8", "fp8_block", "fp8_block", "fp8_block", "fp8_block", "bf16", "fp8_block",
     "bf16", ""},
    {"zai-org__GLM-5.1-FP8", "fp8_block", "fp8_block", "fp8_block", "fp8_block", "bf16",
     "fp8_block", "bf16", ""},
};

class CorpusTest : public ::testing::TestWithParam<Expected> {};

TEST_P(CorpusTest, SummaryMatchesHandWrittenExpectation) {
  const Expected& e = GetParam();
  const Manifest m = must_detect(corpus_input(e.dir));
  const std::string why = m.dialect + "\n" + findings_text(m);
  EXPECT_EQ(to_string(m.summary.routed_experts), e.routed) << why;
  EXPECT_EQ(to_string(m.summary.shared_experts), e.shared) << why;
  EXPECT_EQ(to_string(m.summary.attention), e.attention) << why;
  EXPECT_EQ(to_string(m.summary.dense_mlp), e.dense) << why;
  EXPECT_EQ(to_string(m.summary.lm_head), e.lm_head) << why;
  EXPECT_EQ(to_string(m.summary.mtp_experts), e.mtp) << why;
  EXPECT_EQ(to_string(m.summary.kv_cache), e.kv) << why;
  EXPECT_FALSE(m.tensors_checked);
  EXPECT_TRUE(m.has_finding("tensors_not_checked") || std::string(e.dir).find("peaceh") == 0);
  if (*e.finding) {
    EXPECT_TRUE(m.has_finding(e.finding)) << e.finding << "\n" << why;
  }
  // The JSON contract: every summary key present, every finding has severity/code/message.
  const auto j = to_json(m);
  for (const char* key : {"routed_experts", "shared_experts", "attention", "dense_mlp", "lm_head",
                          "mtp_experts", "kv_cache"}) {
    ASSERT_TRUE(j["summary"].contains(key)) << key;
    EXPECT_TRUE(scheme_from_string(j["summary"][key].get<std::string>()).has_value());
  }
  for (const auto& f : j["findings"]) {
    EXPECT_TRUE(f.contains("severity") && f.contains("code") && f.contains("message"));
  }
  EXPECT_FALSE(to_table(m).empty());
}

INSTANTIATE_TEST_SUITE_P(Corpus, CorpusTest, ::testing::ValuesIn(kCorpus),
                         [](const ::testing::TestParamInfo<Expected>& info) {
                           std::string n = info.param.dir;
                           for (char& c : n) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return n;
                         });

// Every corpus directory has a row, so a new directory cannot be added without an expectation.
TEST(CorpusTest, EveryDirectoryHasAnExpectation) {
  std::set<std::string> rows;
  for (const auto& e : kCorpus) rows.insert(e.dir);
  int dirs = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(FP4MOE_TEST_DATA_DIR) + "/corpus")) {
    if (!entry.is_directory()) continue;
    ++dirs;
    EXPECT_TRUE(rows.count(entry.path().filename().string())) << entry.path();
  }
  EXPECT_EQ(dirs, 40);
  EXPECT_EQ(rows.size(), 40u);
}

}  // namespace
}  // namespace fp4moe::detect
