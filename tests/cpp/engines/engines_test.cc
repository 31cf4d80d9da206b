// The engine rules: every embedded file parses with a source per row, versions order like PyPI,
// and the rules predict what the engines' own code chose (../shared/ENGINES_RESEARCH.md, re-derived
// from the engines' code at the cited versions; tests/engines/verdicts.json is checked by
// tests/python/test_plan_cli.py once recorded).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "engines/embedded.h"
#include "engines/rules.h"

namespace fp4moe::engines {
namespace {

using detect::Activation;
using detect::ModuleGroup;
using detect::Role;
using detect::Scheme;
using nlohmann::json;

TEST(EngineRules, EveryFileParsesWithSourcesAndUniqueIds) {
  ASSERT_EQ(all_engines().size(), 3u);
  ASSERT_EQ(cpu_engines().size(), 2u);
  std::vector<const Engine*> engines;
  for (const auto* list : {&all_engines(), &cpu_engines()}) {
    for (const auto& e : *list) engines.push_back(&e);
  }
  std::set<std::string> ids;
  for (const Engine* engine : engines) {
    const Engine& e = *engine;
    EXPECT_FALSE(e.releases.empty()) << e.id;
    for (const auto& r : e.rules) {
      EXPECT_TRUE(ids.insert(r.id).second) << "duplicate rule id " << r.id;
      EXPECT_FALSE(r.source.file.empty()) << r.id;
      EXPECT_FALSE(r.source.evidence.empty()) << r.id;
      if (!r.pr.empty()) {
        EXPECT_NE(e.find_pr(r.pr), nullptr) << r.id << " cites unknown PR";
      }
      if (!r.pr_absent.empty()) {
        EXPECT_NE(e.find_pr(r.pr_absent), nullptr) << r.id;
      }
      for (const auto& [role, c] : r.modules) {
        bool known_role = role == "*";
        for (Role x : detect::kAllRoles) known_role = known_role || detect::to_string(x) == role;
        EXPECT_TRUE(known_role) << r.id << " " << role;
        if (c.fails.empty() && c.not_run.empty()) {
          EXPECT_TRUE(detect::scheme_from_string(c.reads)) << r.id << " " << c.reads;
        }
      }
    }
    for (const auto& b : e.backends) {
      EXPECT_TRUE(ids.insert(b.id).second) << "duplicate backend id " << b.id;
      EXPECT_FALSE(b.source.evidence.empty()) << b.id;
      for (const auto& id : b.rules) EXPECT_NE(find_rule(id), nullptr) << b.id << " names " << id;
      // A CPU engine's kernels run on "cpu" only, a GPU engine's never there.
      for (const auto& arch : b.archs) EXPECT_EQ(arch == "cpu", e.device == "cpu") << b.id;
    }
    for (const auto& p : e.prs) {
      for (const auto& m : p.markers) EXPECT_NE(e.find_marker(m), nullptr) << p.id << " " << m;
    }
    // Release lists are in PyPI order.
    for (size_t i = 1; i < e.releases.size(); ++i) {
      EXPECT_LT(compare_versions(e.releases[i - 1], e.releases[i]), 0) << e.releases[i];
    }
  }
  EXPECT_FALSE(embedded_resolver().empty());
}

TEST(EngineRules, BadRulesFilesAreErrors) {
  EXPECT_FALSE(parse_engine("{", "x.json").ok());
  EXPECT_FALSE(parse_engine(R"({"engine": "e", "rules": [{"id": "r"}], "backends": []})", "x.json")
                   .ok());  // a rule without modules or a source
}

TEST(EngineRules, VersionsCompareLikePyPI) {
  EXPECT_LT(compare_versions("0.5.13", "0.5.13.post1"), 0);
  EXPECT_LT(compare_versions("0.5.13.post1", "0.5.14"), 0);
  EXPECT_LT(compare_versions("0.5.9", "0.5.14"), 0);
  EXPECT_LT(compare_versions("0.22.0", "0.22.1"), 0);
  EXPECT_LT(compare_versions("0.5.14rc1", "0.5.14"), 0);
  EXPECT_LT(compare_versions("0.34.0", "main"), 0);
  EXPECT_EQ(compare_versions("0.5.23", "0.5.23"), 0);
  EXPECT_TRUE(version_in("0.5.14", "0.5.14", ""));
  EXPECT_FALSE(version_in("0.5.13.post1", "0.5.14", ""));
  EXPECT_FALSE(version_in("0.32.0", "0.21.0", "0.31.0"));
}

TEST(EngineRules, EngineSpecs) {
  auto s = parse_engine_spec("sglang");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->version, "0.5.23");
  EXPECT_TRUE(s->prs.count("25820"));
  auto old = parse_engine_spec("sglang@0.5.13.post1");
  ASSERT_TRUE(old.ok());
  EXPECT_FALSE(old->prs.count("25820"));
  EXPECT_FALSE(parse_engine_spec("sglang@0.5.99").ok());
  EXPECT_FALSE(parse_engine_spec("tgi").ok());
  EXPECT_EQ(parse_engine_spec("vllm")->version, "0.34.0");
}

// ---- the checkpoints of the research, as the engines see them --------------------------------

json nvidia_config() {  // nvidia/DeepSeek-V4-Flash-NVFP4 config.json (the parts the rules read)
  return {{"architectures", {"DeepseekV4ForCausalLM"}},
          {"model_type", "deepseek_v4"},
          {"quantization_config",
           {{"quant_method", "fp8"},
            {"weight_block_size", {128, 128}},
            {"quant_algo", "MIXED_PRECISION"},
            {"moe_quant_algo", "NVFP4"},
            {"group_size", 16},
            {"ignore", {"mtp.*"}}}}};
}

Facts facts_of(json config, json hf_quant, const char* dtype) {
  Facts f;
  f.root = {{"config", std::move(config)},
            {"hf_quant_config", std::move(hf_quant)},
            {"tensor", json::object()}};
  if (dtype != nullptr) f.root["tensor"]["routed_expert_dtype"] = dtype;
  return f;
}

Facts nvidia() { return facts_of(nvidia_config(), nullptr, "U8"); }
Facts converted() {  // fp4moe convert before the dialect change: moe_quant_algo W4A16_NVFP4
  json c = nvidia_config();
  c["quantization_config"]["moe_quant_algo"] = "W4A16_NVFP4";
  return facts_of(c, nullptr, "U8");
}
Facts stock() {
  json c = {{"architectures", {"DeepseekV4ForCausalLM"}},
            {"model_type", "deepseek_v4"},
            {"expert_dtype", "fp4"},
            {"quantization_config",
             {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}, {"scale_fmt", "ue8m0"}}}};
  return facts_of(c, nullptr, "I8");
}
Facts older_rev() {  // hf_quant_config.json only
  json c = {{"architectures", {"DeepseekV4ForCausalLM"}}, {"model_type", "deepseek_v4"}};
  json h = {{"producer", {{"name", "modelopt"}}},
            {"quantization",
             {{"quant_algo", "MIXED_PRECISION"},
              {"quantized_layers",
               {{"layers.0.ffn.experts", {{"quant_algo", "NVFP4"}, {"group_size", 16}}}}}}}};
  return facts_of(c, h, "U8");
}

ModuleGroup group(Role role, Scheme scheme, Activation act) {
  ModuleGroup g;
  g.role = role;
  g.name = "g";
  g.spec.scheme = scheme;
  g.spec.activation = act;
  return g;
}
const ModuleGroup kRoutedNvfp4 = group(Role::kRoutedExperts, Scheme::kNvfp4, Activation::kNvfp4);
const ModuleGroup kRoutedNvfp4WeightOnly =
    group(Role::kRoutedExperts, Scheme::kNvfp4, Activation::kNone);
const ModuleGroup kRoutedMxfp4 = group(Role::kRoutedExperts, Scheme::kMxfp4, Activation::kNone);
const ModuleGroup kMtpMxfp4 = group(Role::kMtpExperts, Scheme::kMxfp4, Activation::kNone);

Verdict at(const char* spec, const Facts& f, const ModuleGroup& g, const char* arch = "") {
  auto e = parse_engine_spec(spec);
  EXPECT_TRUE(e.ok()) << spec;
  return evaluate(*e, f, g, arch);
}

TEST(EnginePredictions, SglangNvidiaNvfp4NeedsPr25820) {
  Verdict before = at("sglang@0.5.13.post1", nvidia(), kRoutedNvfp4);
  EXPECT_EQ(before.conclusion.method, "Fp8MoEMethod");
  EXPECT_EQ(before.outcome, Outcome::kWrong);
  EXPECT_EQ(before.rule->id, "sglang.dsv4.fp4_probe_as_mxfp4");
  for (const char* v : {"sglang@0.5.14", "sglang@0.5.23"}) {
    Verdict after = at(v, nvidia(), kRoutedNvfp4);
    EXPECT_EQ(after.conclusion.quant_config, "HybridFp8NvFp4Config") << v;
    EXPECT_EQ(after.conclusion.method, "ModelOptNvFp4FusedMoEMethod") << v;
    EXPECT_EQ(after.outcome, Outcome::kOk) << v;
    EXPECT_EQ(at(v, nvidia(), kMtpMxfp4).conclusion.method, "Mxfp4FlashinferTrtllmMoEMethod");
  }
  // A backport: 0.5.13.post1 with the PR's code behaves like 0.5.14.
  EngineAt backport = *parse_engine_spec("sglang@0.5.13.post1");
  backport.prs.insert("25820");
  EXPECT_EQ(evaluate(backport, nvidia(), kRoutedNvfp4, "").conclusion.method,
            "ModelOptNvFp4FusedMoEMethod");
}

TEST(EnginePredictions, SglangNvfp4RunnerPerArchitecture) {
  // sm_90: auto -> flashinfer_trtllm_routed, which the constructor refuses off Blackwell.
  Verdict hopper = at("sglang@0.5.23", nvidia(), kRoutedNvfp4, "sm_90");
  EXPECT_EQ(hopper.outcome, Outcome::kFails);
  ASSERT_FALSE(hopper.alternatives.empty());
  EXPECT_EQ(hopper.alternatives[0]->flags, "--moe-runner-backend marlin");
  EXPECT_EQ(at("sglang@0.5.23", nvidia(), kRoutedNvfp4, "sm_100").backend->path, Path::kNativeFp4);
  // sm_120: 0.5.14 keeps DeepSeek-V4's SM120 auto -> marlin; 0.5.23 takes trtllm_routed (accepted,
  // the kernel's sm_120 support unverified: no figure, Marlin offered).
  EXPECT_EQ(at("sglang@0.5.14", nvidia(), kRoutedNvfp4, "sm_120").backend->path, Path::kW4A16);
  Verdict b = at("sglang@0.5.23", nvidia(), kRoutedNvfp4, "sm_120");
  EXPECT_EQ(b.backend->path, Path::kUnknown);
  EXPECT_FALSE(b.fixes.empty());
}

TEST(EnginePredictions, SglangAndVllmDoNotAcceptW4A16Nvfp4ForDeepseekV4) {
  for (const char* v : {"sglang@0.5.14", "sglang@0.5.23"}) {
    Verdict r = at(v, converted(), kRoutedNvfp4WeightOnly);
    EXPECT_EQ(r.conclusion.method, "Fp8MoEMethod") << v;
    EXPECT_EQ(r.conclusion.reads, "mxfp4") << v;
    EXPECT_EQ(r.outcome, Outcome::kWrong) << v;
  }
  for (const char* v : {"vllm@0.21.0", "vllm@0.22.0", "vllm@0.34.0"}) {
    Verdict r = at(v, converted(), kRoutedNvfp4WeightOnly);
    EXPECT_EQ(r.conclusion.method, "Mxfp4MoEMethod") << v;
    EXPECT_EQ(r.outcome, Outcome::kWrong) << v;
  }
}

TEST(EnginePredictions, WeightOnlyNvfp4IsNeverW4A4) {
  // moe_quant_algo NVFP4 without input_scale: the W4A4 method expects the activation scales.
  Verdict r = at("vllm@0.22.0", nvidia(), kRoutedNvfp4WeightOnly);
  EXPECT_EQ(r.conclusion.method, "ModelOptNvFp4FusedMoE");
  EXPECT_EQ(r.outcome, Outcome::kWrong);
  EXPECT_NE(r.why.find("input_scale"), std::string::npos);
}

TEST(EnginePredictions, VllmNvfp4FromPr42209AndMtpMisroute) {
  EXPECT_EQ(at("vllm@0.21.0", nvidia(), kRoutedNvfp4).conclusion.method, "Mxfp4MoEMethod");
  for (const char* v : {"vllm@0.22.0", "vllm@0.34.0"}) {
    EXPECT_EQ(at(v, nvidia(), kRoutedNvfp4).conclusion.method, "ModelOptNvFp4FusedMoE") << v;
  }
  Verdict mtp = at("vllm@0.22.0", nvidia(), kMtpMxfp4);  // Fp8Config never reads `ignore`
  EXPECT_EQ(mtp.conclusion.method, "ModelOptNvFp4FusedMoE");
  EXPECT_EQ(mtp.outcome, Outcome::kWrong);
  // 0.34.0 on CUDA: the deepseek_v41 config honours `ignore` (read, not run).
  EXPECT_EQ(at("vllm@0.34.0", nvidia(), kMtpMxfp4).conclusion.method, "Mxfp4MoEMethod");
}

TEST(EnginePredictions, StockMxfp4) {
  for (const char* v : {"sglang@0.5.13.post1", "sglang@0.5.14", "sglang@0.5.23"}) {
    EXPECT_EQ(at(v, stock(), kRoutedMxfp4).conclusion.method, "Fp8MoEMethod") << v;
    EXPECT_EQ(at(v, stock(), kRoutedMxfp4).outcome, Outcome::kOk) << v;
  }
  for (const char* v : {"vllm@0.21.0", "vllm@0.22.0", "vllm@0.34.0"}) {
    EXPECT_EQ(at(v, stock(), kRoutedMxfp4).conclusion.method, "Mxfp4MoEMethod") << v;
  }
  // sm_120: Marlin in vLLM, flashinfer_mxfp4 in SGLang 0.5.23; no DeepGEMM for FP8 there.
  Verdict vl = at("vllm@0.34.0", stock(), kRoutedMxfp4, "sm_120");
  ASSERT_NE(vl.backend, nullptr);
  EXPECT_EQ(vl.backend->path, Path::kW4A16);
  Verdict sg = at("sglang@0.5.23", stock(), kRoutedMxfp4, "sm_120");
  ASSERT_NE(sg.backend, nullptr);
  EXPECT_NE(sg.backend->kernel.find("flashinfer_mxfp4"), std::string::npos);
  EXPECT_EQ(sg.backend->builds, "Mxfp4FlashinferCutlassMoEMethod");  // verdicts.json, SM faked
  EXPECT_EQ(at("sglang@0.5.23", stock(), kRoutedMxfp4, "sm_100").backend->builds,
            "Mxfp4FlashinferTrtllmMoEMethod");
  const ModuleGroup attn = group(Role::kAttention, Scheme::kFp8Block, Activation::kFp8Dynamic);
  for (const char* e : {"sglang", "vllm"}) {
    Verdict a = at(e, stock(), attn, "sm_120");
    ASSERT_NE(a.backend, nullptr) << e;
    EXPECT_EQ(a.backend->kernel.find("DeepGEMM block"), std::string::npos) << e;
  }
}

TEST(EnginePredictions, OlderNvidiaRevision) {
  EXPECT_EQ(at("sglang@0.5.13.post1", older_rev(), kRoutedNvfp4).conclusion.method,
            "W4AFp8MoEMethod");
  EXPECT_EQ(at("sglang@0.5.14", older_rev(), kRoutedNvfp4).conclusion.method, "W4AFp8MoEMethod");
  EXPECT_EQ(at("sglang@0.5.23", older_rev(), kRoutedNvfp4).conclusion.quant_config,
            "ModelOptMixedPrecisionConfig");
  EXPECT_EQ(at("vllm@0.21.0", older_rev(), kRoutedNvfp4).outcome, Outcome::kFails);
  EXPECT_EQ(at("vllm@0.22.0", older_rev(), kRoutedNvfp4).outcome, Outcome::kFails);
  EXPECT_EQ(at("vllm@0.34.0", older_rev(), kRoutedNvfp4).conclusion.method,
            "ModelOptNvFp4FusedMoE");
}

TEST(EnginePredictions, TrtllmProbesTheDtype) {
  EXPECT_EQ(at("trtllm", nvidia(), kRoutedNvfp4).conclusion.reads, "nvfp4");
  EXPECT_EQ(at("trtllm", converted(), kRoutedNvfp4WeightOnly).outcome, Outcome::kWrong);
  EXPECT_EQ(at("trtllm", stock(), kRoutedMxfp4).conclusion.reads, "mxfp4");
  EXPECT_EQ(at("trtllm", facts_of(nvidia_config(), nullptr, nullptr), kRoutedNvfp4).outcome,
            Outcome::kUnknown);  // configs only: the probe cannot run
}

// detect/ and check/ name engines only through rule ids that exist.
TEST(EngineRules, RuleIdsCitedInDetectAndCheckExist) {
  const std::filesystem::path src =
      std::filesystem::path(FP4MOE_TEST_DATA_DIR) / ".." / ".." / "src";
  const std::regex cite(R"(rule ((sglang|vllm|trtllm|format)\.[a-z0-9_.]+[a-z0-9]))");
  int cited = 0;
  for (const char* dir : {"detect", "check"}) {
    for (const auto& entry : std::filesystem::directory_iterator(src / dir)) {
      std::ifstream in(entry.path());
      std::stringstream ss;
      ss << in.rdbuf();
      const std::string text = ss.str();
      for (auto it = std::sregex_iterator(text.begin(), text.end(), cite);
           it != std::sregex_iterator(); ++it) {
        ++cited;
        EXPECT_NE(find_rule((*it)[1].str()), nullptr)
            << entry.path() << " cites unknown rule " << (*it)[1].str();
      }
    }
  }
  EXPECT_GT(cited, 0);
}

TEST(EngineRules, ContractMarkdownNamesEveryRule) {
  const std::string md = contract_markdown();
  for (const auto* list : {&all_engines(), &cpu_engines()}) {
    for (const auto& e : *list) {
      for (const auto& r : e.rules) {
        EXPECT_NE(md.find("`" + r.id + "`"), std::string::npos) << r.id;
      }
    }
  }
}

// ---- the CPU engines: llama.cpp (through convert_hf_to_gguf.py) and kt-kernel -----------------

Facts with_tensor(Facts f, const char* name) {
  f.root["tensor"]["routed_expert_tensor"] = name;
  return f;
}
Facts stock_named() { return with_tensor(stock(), "layers.0.ffn.experts.0.w1.weight"); }
Facts nvidia_named() { return with_tensor(nvidia(), "layers.0.ffn.experts.0.w1.weight"); }
Facts modelopt_qwen() {  // a ModelOpt NVFP4 checkpoint with HF expert names (Qwen3-MoE style)
  json c = {{"architectures", {"Qwen3MoeForCausalLM"}},
            {"quantization_config", {{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}}}};
  return with_tensor(facts_of(c, nullptr, "U8"), "model.layers.0.mlp.experts.0.gate_proj.weight");
}
Facts gpt_oss() {
  json c = {{"architectures", {"GptOssForCausalLM"}},
            {"quantization_config", {{"quant_method", "mxfp4"}}}};
  return facts_of(c, nullptr, nullptr);
}
const ModuleGroup kAttentionFp8 = group(Role::kAttention, Scheme::kFp8Block, Activation::kNone);

TEST(CpuEngines, SpecsAndDevices) {
  auto l = parse_engine_spec("llamacpp");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->engine->device, "cpu");
  EXPECT_EQ(l->version, "0.3.36");
  EXPECT_EQ(parse_engine_spec("ktkernel@0.7.2")->engine->name, "kt-kernel");
  EXPECT_FALSE(parse_engine_spec("ktkernel@0.1.0").ok());
  EXPECT_NE(find_rule("llamacpp.dsv4.nvfp4_refused"), nullptr);
}

TEST(CpuEngines, LlamaCppConvertsStockMxfp4AndRefusesDeepseekV4Nvfp4) {
  Verdict routed = at("llamacpp", stock_named(), kRoutedMxfp4, "cpu");
  EXPECT_EQ(routed.outcome, Outcome::kOk);
  EXPECT_EQ(routed.conclusion.method, "GGML MXFP4");
  ASSERT_NE(routed.backend, nullptr);
  EXPECT_EQ(routed.backend->path, Path::kCpu);
  EXPECT_NE(routed.backend->kernel.find("ggml_vec_dot_mxfp4_q8_0"), std::string::npos);
  EXPECT_NE(routed.backend->precision.find("Q8_0"), std::string::npos);
  // DeepSeek-V4's FP8 attention becomes Q8_0 whatever --outtype says.
  EXPECT_EQ(at("llamacpp", stock_named(), kAttentionFp8, "cpu").conclusion.method, "GGML Q8_0");
  // The MTP layers are not in the main GGUF.
  EXPECT_EQ(at("llamacpp", stock_named(), kMtpMxfp4, "cpu").outcome, Outcome::kNotRun);
  // NVIDIA's NVFP4 and fp4moe's converted output: no GGUF at all, every module group fails.
  for (const Facts& f : {nvidia_named(), converted()}) {
    for (const ModuleGroup& g : {kRoutedNvfp4, kAttentionFp8}) {
      Verdict v = at("llamacpp", f, g, "cpu");
      EXPECT_EQ(v.outcome, Outcome::kFails);
      EXPECT_NE(v.why.find("Missing routed expert tensors"), std::string::npos) << v.why;
    }
  }
  // A ModelOpt NVFP4 checkpoint with HF expert names becomes GGML NVFP4 (no CPU repack).
  Verdict q = at("llamacpp", modelopt_qwen(), kRoutedNvfp4WeightOnly, "cpu");
  EXPECT_EQ(q.conclusion.method, "GGML NVFP4");
  ASSERT_NE(q.backend, nullptr);
  EXPECT_NE(q.backend->kernel.find("ggml_vec_dot_nvfp4_q8_0"), std::string::npos);
  // Without the tensor names (configs only) the rule cannot tell: unknown, not guessed.
  json c = modelopt_qwen().root["config"];
  EXPECT_EQ(at("llamacpp", facts_of(c, nullptr, "U8"), kRoutedNvfp4, "cpu").outcome,
            Outcome::kUnknown);
  EXPECT_EQ(at("llamacpp", gpt_oss(), kRoutedMxfp4, "cpu").conclusion.method, "GGML MXFP4");
  // ModelOpt NVFP4 experts under other names (MiniMax-M2's w1/w2/w3): no GGUF either.
  json minimax = {{"architectures", {"MiniMaxM2ForCausalLM"}},
                  {"quantization_config", {{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}}}};
  Verdict mm = at("llamacpp",
                  with_tensor(facts_of(minimax, nullptr, "U8"),
                              "model.layers.0.block_sparse_moe.experts.0.w1.weight"),
                  kAttentionFp8, "cpu");
  EXPECT_EQ(mm.outcome, Outcome::kFails);
  EXPECT_EQ(mm.rule->id, "llamacpp.nvfp4.expert_names_unmapped");
}

TEST(CpuEngines, KtKernelLoadersByLayout) {
  Verdict dsv4 = at("ktkernel", stock_named(), kRoutedMxfp4, "cpu");
  EXPECT_EQ(dsv4.outcome, Outcome::kOk);
  ASSERT_NE(dsv4.backend, nullptr);
  EXPECT_NE(dsv4.backend->kernel.find("AMXFP4_KGroup_MOE"), std::string::npos);
  // Everything but the routed experts runs in the GPU engine kt-kernel is paired with.
  EXPECT_EQ(at("ktkernel", stock_named(), kAttentionFp8, "cpu").outcome, Outcome::kNotRun);
  // NVFP4: only the HF expert names load, and only on the AVX2 FP4 kernel.
  Verdict q = at("ktkernel", modelopt_qwen(), kRoutedNvfp4WeightOnly, "cpu");
  EXPECT_EQ(q.outcome, Outcome::kOk);
  ASSERT_NE(q.backend, nullptr);
  EXPECT_EQ(q.backend->kernel.rfind("AVX2MXFP4_MOE only", 0), 0u) << q.backend->kernel;
  EXPECT_EQ(at("ktkernel", nvidia_named(), kRoutedNvfp4, "cpu").outcome, Outcome::kFails);
  // Compressed-tensors INT4 (Kimi-K2.5 style): kt-kernel's RAWINT4 keeps 4 bits, llama.cpp's
  // converter dequantizes to 16 bits.
  json kimi = {{"architectures", {"KimiK25ForConditionalGeneration"}},
               {"quantization_config",
                {{"quant_method", "compressed-tensors"}, {"format", "pack-quantized"}}}};
  const ModuleGroup int4 = group(Role::kRoutedExperts, Scheme::kInt4, Activation::kNone);
  Verdict k = at("ktkernel", facts_of(kimi, nullptr, "I32"), int4, "cpu");
  ASSERT_NE(k.backend, nullptr);
  EXPECT_NE(k.backend->kernel.find("AMXInt4_KGroup_MOE"), std::string::npos);
  EXPECT_EQ(at("llamacpp", facts_of(kimi, nullptr, "I32"), int4, "cpu").conclusion.method,
            "GGML BF16/F16 (dequantized INT4)");
  // FP8 per-channel experts need the AVX-512 VBMI build: there is no AVX2 kernel for them.
  Verdict pc = at("ktkernel", stock(),
                  group(Role::kRoutedExperts, Scheme::kFp8Channel, Activation::kNone), "cpu");
  ASSERT_NE(pc.backend, nullptr);
  EXPECT_NE(pc.backend->kernel.find("AMXFP8PerChannel_MOE only"), std::string::npos);
  // gpt-oss's fused MXFP4 experts have no kt-kernel loader.
  Verdict g = at("ktkernel", gpt_oss(), kRoutedMxfp4, "cpu");
  EXPECT_EQ(g.outcome, Outcome::kFails);
  EXPECT_NE(g.why.find("_blocks"), std::string::npos);
}

}  // namespace
}  // namespace fp4moe::engines
