// libFuzzer target: config detection on hostile configs. The input is the text of a config.json
// (its first line may instead be an hf_quant_config.json, split at the first NUL byte); detection
// over it and a fixed DeepSeek-V4-style tensor list must return a manifest or an error naming the
// problem, never throw, crash or take super-linear time (libFuzzer's -timeout catches a hang).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/checkpoint_dir.h"
#include "core/check.h"
#include "detect/detect.h"

namespace {

nlohmann::json parse(std::string_view text) {
  auto parsed = fp4moe::checkpoint::parse_json_text(text, "fuzz");
  return parsed.ok() ? *parsed : nlohmann::json();
}

const std::vector<fp4moe::detect::TensorRecord>& tensors() {
  static const std::vector<fp4moe::detect::TensorRecord> records = {
      {"layers.0.ffn.experts.0.w1.weight", "I8", {256, 128}},
      {"layers.0.ffn.experts.0.w1.scale", "F8_E8M0", {256, 8}},
      {"layers.0.ffn.experts.0.w2.weight", "U8", {256, 128}},
      {"layers.0.ffn.experts.0.w2.weight_scale", "F8_E4M3", {256, 16}},
      {"layers.0.ffn.experts.0.w2.weight_scale_2", "F32", {}},
      {"layers.0.attn.wq_a.weight", "F8_E4M3", {128, 256}},
      {"layers.0.attn.wq_a.scale", "F8_E8M0", {1, 2}},
      {"model.layers.1.mlp.experts.gate_up_proj_blocks", "U8", {4, 256, 8, 16}},
      {"model.layers.1.mlp.experts.gate_up_proj_scales", "U8", {4, 256, 8}},
      {"model.layers.1.self_attn.q_proj.weight", "BF16", {128, 128}},
      {"lm_head.weight", "BF16", {1000, 128}},
  };
  return records;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  const size_t nul = all.find('\0');
  fp4moe::detect::DetectInput input;
  input.config = parse(all.substr(0, nul));
  if (nul != std::string_view::npos) input.hf_quant_config = parse(all.substr(nul + 1));
  for (const bool with_tensors : {false, true}) {
    if (with_tensors) input.tensors = tensors();
    auto manifest = fp4moe::detect::detect(input);
    if (!manifest.ok()) FP4MOE_CHECK(!manifest.error().message.empty());
  }
  return 0;
}
