// Pattern semantics of every dialect: globs, bare names, re: regexes, containers, VLM prefixes.
#include "detect/pattern.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace fp4moe::detect {
namespace {

Pattern parse(const std::string& s) {
  auto p = Pattern::parse(s, "test");
  EXPECT_TRUE(p.ok()) << s;
  return p.value();
}

TEST(Glob, StarCrossesDotsAndDigits) {
  EXPECT_TRUE(glob_match("*.attn.*", "layers.3.attn.wq_a"));
  EXPECT_TRUE(glob_match("mtp.*", "mtp.0.ffn.experts.1.w1"));
  EXPECT_TRUE(glob_match("model.layers.1*", "model.layers.15.mlp.gate_proj"));
  EXPECT_FALSE(glob_match("model.layers.1.*", "model.layers.15.mlp.gate_proj"));
  EXPECT_TRUE(glob_match("a?c", "abc"));
  EXPECT_FALSE(glob_match("a?c", "ac"));
  EXPECT_TRUE(glob_match("layer[0-2].x", "layer1.x"));
  EXPECT_FALSE(glob_match("layer[!0-2].x", "layer1.x"));
  EXPECT_TRUE(glob_match("a[b", "a[b"));  // unterminated class is a literal
  EXPECT_TRUE(glob_match("**", ""));
  EXPECT_FALSE(glob_match("", "x"));
}

TEST(Pattern, BareNamesMatchWholeComponents) {
  const Pattern head = parse("head");
  EXPECT_TRUE(head.matches("head"));
  EXPECT_FALSE(head.matches("lm_head"));
  EXPECT_FALSE(head.matches("mtp.0.shared_head.norm"));
  const Pattern gate = parse("gate");
  EXPECT_TRUE(gate.matches("model.layers.0.block_sparse_moe.gate"));
  EXPECT_FALSE(gate.matches("model.layers.0.mlp.gate_proj"));
  EXPECT_TRUE(gate.matches_substring("model.layers.0.mlp.gate_proj"));
  EXPECT_FALSE(gate.matches_exact("model.layers.0.block_sparse_moe.gate"));
  // VLM prefixes: a bare "lm_head" covers "language_model.lm_head".
  EXPECT_TRUE(parse("lm_head").matches("language_model.lm_head"));
}

TEST(Pattern, WholeContainerKeys) {
  const Pattern c = parse("layers.0.ffn.experts");
  EXPECT_TRUE(c.matches("layers.0.ffn.experts.17.w1"));
  EXPECT_FALSE(c.matches("layers.10.ffn.experts.17.w1"));
  EXPECT_FALSE(c.matches("mtp.0.ffn.shared_experts.w1"));
  // A glob naming a container covers what is inside (gpt-oss modules_to_not_convert).
  EXPECT_TRUE(parse("model.layers.*.self_attn").matches("model.layers.3.self_attn.q_proj"));
  EXPECT_TRUE(parse("model.language_model.layers.3.self_attn*")
                  .matches("model.language_model.layers.3.self_attn.o_proj"));
}

TEST(Pattern, RegexIsAnchoredAtStartOnly) {
  const Pattern r = parse("re:.*ffn.*(gate|up|down)_proj$");
  EXPECT_EQ(r.kind(), Pattern::Kind::kRegex);
  EXPECT_TRUE(r.matches("model.layers.3.ffn.experts.1.gate_proj"));
  EXPECT_TRUE(r.matches("model.layers.3.ffn.shared_experts.down_proj"));
  EXPECT_FALSE(r.matches("model.layers.3.ffn.experts.1.gate_proj.weight"));
  const Pattern start = parse("re:mlp");
  EXPECT_FALSE(start.matches("model.mlp"));  // re.match, not re.search
  EXPECT_TRUE(start.matches("mlp.fc1"));
}

// Catastrophic backtracking patterns (a 60-byte config held `re:(.*.*)*z`) match in linear time:
// with a backtracking engine each of these calls would take longer than the test's timeout.
TEST(Pattern, HostileRegexesMatchInLinearTime) {
  const std::string long_name =
      "model.layers.61.mlp.experts.255.gate_proj" + std::string(4000, 'a');
  for (const char* hostile : {"re:(.*.*)*z", "re:(a+)+$b", "re:(a|aa)*c", "re:(.*a){20}z"}) {
    SCOPED_TRACE(hostile);
    const Pattern p = parse(hostile);
    EXPECT_FALSE(p.matches(long_name));
    EXPECT_FALSE(p.matches(std::string(100000, 'a')));
  }
  // Python's syntax that RE2 lacks (lookaround, backreferences) is an error naming the entry.
  auto look = Pattern::parse("re:(?!mtp).*", "config.json quantization_config.ignore");
  ASSERT_FALSE(look.ok());
  EXPECT_NE(look.error().message.find("without backreferences or lookaround"), std::string::npos);
}

TEST(Pattern, BadInputIsAnError) {
  EXPECT_FALSE(Pattern::parse("re:(unclosed", "cfg").ok());
  EXPECT_FALSE(Pattern::parse("", "cfg").ok());
  auto e = Pattern::parse("re:[", "config.json ignore");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("config.json ignore"), std::string::npos);
}

TEST(PatternSet, FastPathAgreesWithLinearScan) {
  PatternSet set;
  for (const char* p : {"lm_head", "model.layers.0.self_attn.q_a_proj", "*.attn.*", "re:^mtp\\."}) {
    set.add(parse(p));
  }
  const char* names[] = {"lm_head",
                         "model.layers.0.self_attn.q_a_proj",
                         "model.layers.1.self_attn.q_a_proj",
                         "layers.2.attn.wo_a",
                         "mtp.0.ffn.experts.0.w1",
                         "model.layers.0.mlp.gate_proj"};
  for (const char* n : names) {
    bool any = false;
    for (const auto& p : set.patterns()) any = any || p.matches(n);
    EXPECT_EQ(set.match(n) != nullptr, any) << n;
  }
}

TEST(PatternDiagnostics, DigitStarAndSubstringFindings) {
  // ModelOpt-style exclude list with "model.layers.1*" (catches 10-19) and a bare "gate".
  DetectInput in;
  in.config = {{"model_type", "qwen3_moe"},
               {"num_hidden_layers", 12},
               {"num_experts", 4},
               {"mlp_only_layers", {0}}};  // layer 0 dense: has mlp.gate_proj
  in.hf_quant_config = {{"quantization",
                         {{"quant_algo", "NVFP4"},
                          {"group_size", 16},
                          {"exclude_modules", {"lm_head", "model.layers.1*", "mlp.gate"}}}}};
  const Manifest m = testing::must_detect(in);
  bool digit = false, substr = false;
  for (const auto& f : m.findings) {
    if (f.code != "pattern_semantics") continue;
    digit = digit || f.message.find("model.layers.1*") != std::string::npos;
    substr = substr || f.message.find("substrings") != std::string::npos;
  }
  EXPECT_TRUE(digit) << testing::findings_text(m);
  EXPECT_TRUE(substr) << testing::findings_text(m);
  // Layers 1 and 10-11 excluded: attention is NVFP4 with some modules left BF16.
  EXPECT_EQ(m.summary.attention, Scheme::kNvfp4);
  EXPECT_TRUE(m.has_finding("partially_quantized"));
}

}  // namespace
}  // namespace fp4moe::detect
