// The one table of `check` finding ids: severity, meaning, engine consequence, fix, and how it is
// judged. The CLI's --help footer, the JSON report and docs/CHECK.md (`check --findings-md`) are
// all read from it.
#include <fmt/core.h>

#include <algorithm>

#include "check/check.h"

namespace fp4moe::check {

const std::vector<FindingInfo>& finding_table() {
  using S = Severity;
  static const std::vector<FindingInfo> table = {
      {"shard_unreadable", S::kError,
       "a shard cannot be opened or its header is invalid (truncated, not safetensors)",
       "the safetensors reader refuses the file, so loading the checkpoint fails",
       "download the file again and compare its size and hash with the source",
       "every shard is opened with the strict safetensors reader (header length and JSON, dtypes, "
       "shapes and offsets with checked arithmetic, data inside the file); one that fails is one "
       "finding with the reader's reason, and the other shards are still checked"},
      {"shard_missing", S::kError,
       "model.safetensors.index.json names a shard file that is not in the directory",
       "loading by the index's weight_map fails on the missing file",
       "download the missing shard (or fix the index's weight_map)",
       "each shard file named in the index's weight_map is looked up: one finding per missing "
       "file; the tensors the index puts there are skipped, the other shards are still checked"},
      {"scale_shape_mismatch", S::kError,
       "a module's scale tensors are missing or do not fit its weight (wrong shape for the block "
       "size, a per-tensor scale that is not one float)",
       "loaders that check shapes refuse the tensor; those that do not read scales of other "
       "blocks: wrong output",
       "re-export the module; the scale grid must be [N, K/block]",
       "dimension by dimension: FP4 scales [..., N, K/block] for a packed weight [..., N, K/2] "
       "(gpt-oss: the blocks' shape without its last 16), FP8 block scales [ceil(N/b), ceil(K/b)]; "
       "per-tensor scales one F32/BF16/F16 value; NVFP4 needs weight_scale_2 or "
       "weight_global_scale. A module whose dtypes say FP4 or FP8 with a block scale is checked "
       "even when its shapes did not classify, so a transposed grid (same element count) is "
       "found too"},
      {"scale_nan_code", S::kError, "block scales hold NaN codes (E4M3 0x7F/0xFF, E8M0 0xFF)",
       "the block dequantizes to NaN, which every GEMM propagates into whole output rows: NaN "
       "logits for every token that reaches the module",
       "re-quantize the module from its source weights",
       "every block scale byte of every quantized module is read: E4M3 codes with all exponent "
       "and mantissa bits set (0x7F, 0xFF), E8M0/U8 exponent 0xFF; count = NaN codes, examples "
       "give the scale tensor, row and block"},
      {"scale_not_finite", S::kError,
       "F32 block or tensor scales (weight_scale_inv, weight_scale_2, weight_global_scale, an "
       "FP8 input_scale) are NaN or infinite",
       "the module's output is NaN/Inf for every token", "re-quantize or re-calibrate the module",
       "every F32 block scale and every per-tensor weight scale is read; NaN or +-Inf. Such "
       "blocks (or the whole module, for a per-tensor scale) are left out of the value checks, "
       "which would only repeat it. A non-finite input scale of an NVFP4 module is reported as "
       "w4a4_without_input_scale"},
      {"tensor_scale_nonpositive", S::kError,
       "a per-tensor scale (weight_scale_2, weight_global_scale, input_scale) is zero or negative",
       "zero makes the module output zero; a negative value flips its sign (or, as a divisor, "
       "divides by zero)",
       "re-quantize the module; per-tensor scales are amax / (6 * 448) > 0",
       "weight_scale_2, weight_global_scale, FP8 weight_scale, input_scale and input_global_scale "
       "<= 0; the module's values are then not judged (no RMS for the outlier check)"},
      {"block_scale_nonpositive", S::kError,
       "block scales are zero or negative: F32 weight_scale_inv <= 0, or a UE4M3 scale with its "
       "sign bit set",
       "zeroed or sign-flipped blocks in every product of the module",
       "re-quantize the module from its source weights",
       "every F32 block scale <= 0, and every UE4M3 (NVFP4) scale code 0x80..0xFE: the format is "
       "unsigned, no quantizer sets the bit, and decoded as E4M3 the code is a negative scale. "
       "A zero UE4M3 code is not flagged: producers write it for all-zero blocks"},
      {"global_scale_convention", S::kError,
       "an NVFP4 per-tensor scale's magnitude shows the other convention: a compressed-tensors "
       "divisor (448*6/amax) stored as ModelOpt's weight_scale_2 multiplier, or the reverse",
       "read in the convention its name says, every weight of the module comes out "
       "scaled by about the square of the value (orders of magnitude off): garbage output",
       "store the reciprocal, or rename the tensor to the convention its values follow "
       "(ModelOpt weight_scale_2 = amax/2688, compressed-tensors weight_global_scale = 2688/amax)",
       "from the largest UE4M3 block scale S and the stored value v, the implied |w|max is "
       "6*S*v read as a multiplier (ModelOpt) and 6*S/v read as a divisor (compressed-tensors); "
       "flagged when the reading the tensor's name implies lies outside [2^-20, 2^12] and the "
       "other inside (values within about [0.66, 1.5] are plausible both ways and never "
       "flagged). The module is then measured with the other reading, so the gate/up and "
       "outlier checks do not report the same defect again"},
      {"gate_up_scale_mismatch", S::kWarning,
       "gate (w1) and up (w3) projections of one expert have different per-tensor scales",
       "vLLM fuses them into one GEMM with one scale: ModelOptNvFp4FusedMoE."
       "process_weights_after_loading (vllm/model_executor/layers/quantization/modelopt.py) warns "
       "'w1_weight_scale_2 must match w3_weight_scale_2' and keeps w1's, so up_proj is off by "
       "the ratio",
       "requantize w1 and w3 with the shared scale max(amax(w1), amax(w3)) / 2688 (fp4moe convert "
       "does, from the BF16, FP8 or MXFP4 source: `fp4moe convert SRC DST`)",
       "NVFP4 pairs by name (.gate_proj/.up_proj, .w1/.w3 under one prefix) whose per-tensor "
       "scales "
       "(compressed-tensors divisors inverted) differ by more than 1e-5 relative (vLLM's allclose "
       "rtol); count = pairs, the summary gives the pairs per decoder layer and the worst ratio, "
       "examples the worst pairs. Modules flagged by global_scale_convention are left out, and "
       "FP8 per-tensor pairs are not judged: the ModelOpt FP8 MoE methods of vLLM and SGLang "
       "(modelopt.py, modelopt_quant.py: \"We take the max of the w1 and w3 scales\") requantize "
       "both to the larger scale"},
      {"w4a4_without_input_scale", S::kError,
       "activation quantization is declared (W4A4 NVFP4) but input_scale is missing or not "
       "finite for some modules",
       "a W4A4 kernel multiplies by input_scale (alpha = weight_scale_2 * input_scale): a loader "
       "that expects the tensor fails, one that defaults it computes with a wrong scale",
       "calibrate the activations again, or declare the modules weight-only (W4A16_NVFP4)",
       "modules held in NVFP4 whose config claim has NVFP4 activations (quant_algo NVFP4, a "
       "compressed-tensors group with 4-bit float input_activations) and no input_scale / "
       "input_global_scale tensor; and any NVFP4 input scale that is NaN or infinite"},
      {"input_scale_default", S::kWarning,
       "every NVFP4 module's activation scale (input_scale / input_global_scale) is exactly 1.0: "
       "a placeholder (activation amax 6 * 448 = 2688), not a calibration; `fp4moe convert` "
       "writes it when no --activation-amax is given",
       "weight-only NVFP4 MoE kernels never read it (engine backends sglang.moe.nvfp4.marlin, "
       "vllm.moe.nvfp4.marlin: --moe-runner-backend marlin, --moe-backend marlin); W4A4 kernels "
       "(the sm_100 defaults) quantize activations with it: values above 2688 clip and block "
       "maxima below about 0.1 lose precision",
       "calibrate, and convert again from the source with the measured maxima: `fp4moe convert "
       "SRC DST --activation-amax FILE` (FILE: amax per module glob, docs/CONVERT.md; it writes "
       "input_scale = amax / (6 * 448)); or serve with a weight-only MoE backend",
       "every input scale of every module held in NVFP4 is read; reported when there is at least "
       "one and all are exactly 1.0 (count = input scales; the example is one of them)"},
      {"exclude_matches_nothing", S::kWarning,
       "an exclusion pattern of the config (ignore, exclude_modules, modules_to_not_convert) "
       "matches no module of the checkpoint",
       "the module it meant is treated as quantized; if it is not, its BF16 bytes are read as "
       "packed FP4",
       "write the pattern with the checkpoint's module names (fused names such as qkv_proj, "
       "per-expert names)",
       "each exclusion entry of config.json and hf_quant_config.json is matched (glob, bare "
       "name, re:) against every module of the shards and of the index (also modules of missing "
       "shards); the example names the pattern, the detail the file and key"},
      {"excluded_but_quantized", S::kError,
       "modules the config excludes from quantization hold packed FP4 tensors",
       "a loader that follows the configs builds an unquantized layer and reads packed bytes as "
       "BF16: garbage",
       "remove them from the exclusion list (or store them unquantized)",
       "a module whose tensors classify as NVFP4 or MXFP4 (dtypes and shapes) while the "
       "config's claim for it is unquantized because an exclusion pattern matches it"},
      {"quantized_but_not_declared", S::kError,
       "modules hold packed FP4 tensors that the configs do not declare as quantized",
       "a loader that follows the configs builds an unquantized layer and fails on the shape or "
       "reads garbage",
       "declare them (quantized_layers, config_groups) or store them unquantized",
       "the same without a matching exclusion: the dialect's rules leave the module unquantized "
       "(routers, quant_method mxfp4 outside the experts, DeepSeek-V4 gates, modules outside "
       "quantized_layers or config_groups targets)"},
      {"declared_but_not_quantized", S::kError,
       "modules the configs declare quantized hold unquantized (BF16/F16/F32) weights",
       "a loader that follows the configs builds a quantized layer and fails on the tensor "
       "shapes, or reads BF16 "
       "bytes as packed FP4",
       "add them to the exclusion list or quantize them",
       "a linear module (routed, shared or MTP experts, attention, dense MLP) holds a float "
       "weight without scales while the config's claim for it is a quantized scheme"},
      {"all_zero_tensor", S::kWarning,
       "tensors whose bytes are all zero: a weight or block-scale tensor in a file hole (never "
       "written), or a weight that was written as zeros",
       "the module outputs zeros: the model runs and its quality drops silently",
       "download or export the tensor again; a sparse file means the writer never filled it",
       "file holes are found with SEEK_DATA without reading (tensors under 8 KiB excepted), so a "
       "sparse full-size checkpoint is checked in seconds; a module whose weight is a hole still "
       "has its scales read in full. A written weight is all zero when every element is +-0, "
       "judged on the whole tensor (read in full when the sampled rows are all zero). count = "
       "tensors"},
      {"all_zero_blocks_share", S::kWarning,
       "a large share (over half) of a weight tensor's sampled blocks are all zero",
       "those weights are zero in every product: quality drops silently",
       "check the export; pruned models are the only legitimate source of this",
       "over half of the sampled blocks (16 or 32 FP4 elements, 128 FP8 elements) hold only +-0 "
       "(FP4 nibbles 0 and 8, FP8 bytes 0x00 and 0x80)"},
      {"scale_range_suspicious", S::kWarning,
       "block scales are constant along the dimension they should vary in (along K in every row, "
       "or along N in every column) while they differ the other way: a per-channel scale "
       "broadcast into blocks, or a transposed grid",
       "dequantized weights carry the wrong scale per block: degraded or garbage output",
       "re-export the scales in [N, K/block] order from the quantizer",
       "on one-byte scale grids of at least 4 lines: at least 90% of the rows (columns) hold "
       "one code along at least 8 blocks, the constant lines do not all hold the same code, and "
       "chance explains under 45% of them (with codes drawn independently from the grid's own "
       "histogram p, a line of n blocks is constant with probability sum p_i^n). Power-of-two "
       "MX scales of well-behaved weights often sit in one or two binades, so short lines are "
       "often constant by chance; at 8 blocks even a Gaussian row placed best in one binade is "
       "constant with probability 0.93^8 = 58% (blocks of 32), under the 90% asked for"},
      {"dequant_not_finite", S::kError, "sampled dequantized weights are NaN or infinite",
       "NaN/Inf outputs from the module", "re-quantize the module",
       "the sampled rows (16 per tensor, seeded; all rows with --full) are dequantized; a value "
       "that is NaN, infinite or beyond float32's largest finite value counts (FP8 weight codes "
       "0x7F/0xFF, overflowing scale products). Blocks whose scale is already reported (NaN, "
       "Inf, negative UE4M3) are left out. count = values, examples one per block"},
      {"weight_magnitude_outlier", S::kWarning,
       "a module's dequantized RMS is over 100x off the median of its peers (same name with "
       "other layer/expert indices)",
       "a scale in the wrong convention or a wrong tensor scale: the module dominates or vanishes",
       "compare the module's scales with its peers'; re-quantize it",
       "the RMS of each module's sampled dequantized values against the median RMS of its peers "
       "(the name with its numeric components as wildcards, so w1 and w2 stay apart; at least 3 "
       "peers); over 100x or under 1/100 of the median. Modules without trusted values (a bad "
       "per-tensor scale) or with RMS 0 are left out"},
  };
  return table;
}

const FindingInfo* find_finding(std::string_view id) {
  const auto& table = finding_table();
  const auto it =
      std::find_if(table.begin(), table.end(), [&](const FindingInfo& f) { return f.id == id; });
  return it == table.end() ? nullptr : &*it;
}

std::string findings_markdown() {
  std::string out;
  for (const auto& f : finding_table()) {
    out += fmt::format(
        "### `{}`\n\n- severity: {}\n- what: {}\n- engine consequence: {}\n- fix: {}\n"
        "- how it is judged: {}\n\n",
        f.id, detect::to_string(f.severity), f.what, f.consequence, f.fix, f.judged);
  }
  return out;
}

}  // namespace fp4moe::check
