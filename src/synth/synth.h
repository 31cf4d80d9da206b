// Synthetic checkpoints: small but faithful copies of real FP4/FP8 MoE checkpoint layouts (real
// config dialects, tensor names, dtypes and shape relations; random but valid data), plus
// full-size header-only variants whose tensors are file holes. Used by tests, the demo and
// `fp4moe synth`.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string_view>

#include "core/status.h"

namespace fp4moe::synth {

enum class Layout {
  kDsv4Mxfp4,      // deepseek-ai/DeepSeek-V4-Flash: MXFP4 routed experts (I8 + E8M0), FP8 rest
  kDsv4Nvfp4,      // nvidia/DeepSeek-V4-Flash-NVFP4: ModelOpt NVFP4 routed experts, MXFP4 MTP
  kGptOssMxfp4,    // openai/gpt-oss-20b: fused MXFP4 expert blocks, BF16 rest
  kDsv3Fp8,        // deepseek-ai/DeepSeek-V3: FP8 128x128 blocks with F32 weight_scale_inv
  kCtNvfp4,        // RedHatAI/DeepSeek-V4-Flash-NVFP4-FP8: compressed-tensors NVFP4 + FP8 block
  kModeloptNvfp4,  // nvidia/Qwen3-235B-A22B-NVFP4: ModelOpt NVFP4 in every linear incl. attention
  kBf16,           // Qwen/Qwen3-30B-A3B: not quantized
  kMiniMaxNvfp4,   // nvidia/MiniMax-M2.5-NVFP4: ModelOpt NVFP4 experts, BF16 attention
  kMiniMaxFp8,     // MiniMaxAI/MiniMax-M2.5: FP8 128x128 blocks with F32 weight_scale_inv
};

struct LayoutInfo {
  Layout layout;
  std::string_view name;
  std::string_view description;
};

// Every layout in enum order. Names: dsv4-mxfp4, dsv4-nvfp4, gpt-oss-mxfp4, dsv3-fp8, ct-nvfp4,
// modelopt-nvfp4, bf16, minimax-nvfp4, minimax-fp8 (`fp4moe synth --list-layouts`).
std::span<const LayoutInfo> layouts();
Result<Layout> parse_layout(std::string_view name);

struct SynthOptions {
  int layers = 2;   // MoE layers written (full_size: the real count)
  int experts = 8;  // routed experts per layer (full_size: the real count)
  bool full_size =
      false;  // real layer/expert counts, every tensor a file hole (sparse), header-only use
  uint32_t seed = 1;
  uint64_t max_shard_bytes = 5'000'000'000;
};

// Writes a checkpoint directory `dir` (must not exist): config.json (+ hf_quant_config.json where
// the real layout has one) in the real dialect with counts edited to the options, and safetensors
// with real tensor names, dtypes and per-expert shapes. MoE tensors (router gate and score bias,
// routed and shared experts) carry random valid data tiled from one quantized Gaussian sample;
// embeddings, the LM head, attention and dense-MLP projections are file holes (they read as zeros,
// which is valid data) because this project computes MoE layers and they would dominate the size.
Status write_synthetic(Layout layout, const std::filesystem::path& dir,
                       const SynthOptions& options);

}  // namespace fp4moe::synth
