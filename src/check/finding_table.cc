// The one table of `check` finding ids: severity, meaning, engine consequence, fix. The CLI's
// --help, the JSON report and docs/CHECK.md are read from / checked against it.
#include <algorithm>

#include "check/check.h"

namespace fp4moe::check {

const std::vector<FindingInfo>& finding_table() {
  using S = Severity;
  static const std::vector<FindingInfo> table = {
      {"shard_unreadable", S::kError,
       "a shard cannot be opened or its header is invalid (truncated, not safetensors)",
       "every engine fails to load the checkpoint (safetensors raises on open)",
       "download the file again and compare its size and hash with the source"},
      {"shard_missing", S::kError,
       "model.safetensors.index.json names a shard file that is not in the directory",
       "engines that load by the index fail with a missing-file error",
       "download the missing shard (or fix the index's weight_map)"},
      {"scale_shape_mismatch", S::kError,
       "a module's scale tensor does not fit its weight (wrong shape for the block size)",
       "loaders that check shapes refuse the tensor; those that do not read scales of other "
       "blocks: wrong output",
       "re-export the module; the scale grid must be [N, K/block]"},
      {"scale_nan_code", S::kError,
       "block scales hold NaN codes (E4M3 0x7F/0xFF, E8M0 0xFF)",
       "the block dequantizes to NaN, which every GEMM propagates into whole output rows: NaN "
       "logits for every token that reaches the module",
       "re-quantize the module from its source weights"},
      {"scale_not_finite", S::kError,
       "F32 block or tensor scales (weight_scale_inv, weight_scale_2, weight_global_scale, "
       "input_scale) are NaN or infinite",
       "the module's output is NaN/Inf for every token", "re-quantize or re-calibrate the module"},
      {"tensor_scale_nonpositive", S::kError,
       "a per-tensor scale (weight_scale_2, weight_global_scale, input_scale) is zero or negative",
       "zero makes the module output zero; a negative value flips its sign (or, as a divisor, "
       "divides by zero)",
       "re-quantize the module; per-tensor scales are amax / (6 * 448) > 0"},
      {"block_scale_nonpositive", S::kError,
       "F32 block scales (weight_scale_inv) are zero or negative",
       "zeroed or sign-flipped blocks in every product of the module",
       "re-quantize the module from its source weights"},
      {"global_scale_convention", S::kError,
       "an NVFP4 per-tensor scale's magnitude shows the other convention: a compressed-tensors "
       "divisor (448*6/amax) stored as ModelOpt's weight_scale_2 multiplier, or the reverse",
       "an engine applies the value as its name says: every weight of the module comes out "
       "scaled by about the square of the value (orders of magnitude off): garbage output",
       "store the reciprocal, or rename the tensor to the convention its values follow "
       "(ModelOpt weight_scale_2 = amax/2688, compressed-tensors weight_global_scale = 2688/amax)"},
      {"gate_up_scale_mismatch", S::kWarning,
       "gate (w1) and up (w3) projections of one expert have different per-tensor scales",
       "vLLM fuses them into one GEMM with one scale: ModelOptNvFp4FusedMoE."
       "process_weights_after_loading (vllm/model_executor/layers/quantization/modelopt.py) warns "
       "'w1_weight_scale_2 must match w3_weight_scale_2' and keeps w1's, so up_proj is off by "
       "the ratio",
       "requantize w1 and w3 with the shared scale max(amax(w1), amax(w3)) / 2688 (fp4moe convert "
       "does)"},
      {"w4a4_without_input_scale", S::kError,
       "activation quantization is declared (W4A4 NVFP4) but input_scale is missing or not "
       "finite for some modules",
       "a W4A4 kernel multiplies by input_scale (alpha = weight_scale_2 * input_scale): a loader "
       "that expects the tensor fails, one that defaults it computes with a wrong scale",
       "calibrate the activations again, or declare the modules weight-only (W4A16_NVFP4)"},
      {"exclude_matches_nothing", S::kWarning,
       "an exclusion pattern of the config (ignore, exclude_modules, modules_to_not_convert) "
       "matches no module of the checkpoint",
       "the module it meant is treated as quantized; if it is not, its BF16 bytes are read as "
       "packed FP4",
       "write the pattern with the checkpoint's module names (fused names such as qkv_proj, "
       "per-expert names)"},
      {"excluded_but_quantized", S::kError,
       "modules the config excludes from quantization hold packed FP4 tensors",
       "an engine builds an unquantized layer for them and loads packed bytes as BF16: garbage",
       "remove them from the exclusion list (or store them unquantized)"},
      {"quantized_but_not_declared", S::kError,
       "modules hold packed FP4 tensors that the configs do not declare as quantized",
       "an engine builds an unquantized layer and fails on the shape or loads garbage",
       "declare them (quantized_layers, config_groups) or store them unquantized"},
      {"declared_but_not_quantized", S::kError,
       "modules the configs declare quantized hold unquantized (BF16/F16/F32) weights",
       "an engine builds a quantized layer and fails to load the tensor shapes, or reads BF16 "
       "bytes as packed FP4",
       "add them to the exclusion list or quantize them"},
      {"all_zero_tensor", S::kWarning,
       "weight tensors whose bytes are all zero (a file hole: never written)",
       "the module outputs zeros: the model runs and its quality drops silently",
       "download or export the tensor again; a sparse file means the writer never filled it"},
      {"all_zero_blocks_share", S::kWarning,
       "a large share (over half) of a weight tensor's sampled blocks are all zero",
       "those weights are zero in every product: quality drops silently",
       "check the export; pruned models are the only legitimate source of this"},
      {"scale_range_suspicious", S::kWarning,
       "block scales are constant along the dimension they should vary in (along K in every row, "
       "or along N in every column) while they differ the other way: a per-channel scale "
       "broadcast into blocks, or a transposed grid",
       "dequantized weights carry the wrong scale per block: degraded or garbage output",
       "re-export the scales in [N, K/block] order from the quantizer"},
      {"dequant_not_finite", S::kError,
       "sampled dequantized weights are NaN or infinite", "NaN/Inf outputs from the module",
       "re-quantize the module"},
      {"weight_magnitude_outlier", S::kWarning,
       "a module's dequantized RMS is over 100x off the median of its peers (same name with "
       "other layer/expert indices)",
       "a scale in the wrong convention or a wrong tensor scale: the module dominates or vanishes",
       "compare the module's scales with its peers'; re-quantize it"},
  };
  return table;
}

const FindingInfo* find_finding(std::string_view id) {
  const auto& table = finding_table();
  const auto it =
      std::find_if(table.begin(), table.end(), [&](const FindingInfo& f) { return f.id == id; });
  return it == table.end() ? nullptr : &*it;
}

}  // namespace fp4moe::check
