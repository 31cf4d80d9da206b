// Real config.json / hf_quant_config.json texts of tests/data/corpus/ (see its SOURCES.md),
// embedded at build time by src/synth/CMakeLists.txt, that synthetic layouts start from. The lists
// that depend on the layer count (quantized_layers, exclude_modules) are rebuilt by synth.cc.
#pragma once

namespace fp4moe::synth::base_configs {

extern const char* const kDeepseekV4Flash;                    // stock MXFP4 experts
extern const char* const kNvidiaDeepseekV4FlashNvfp4;         // NVIDIA hybrid, config.json
extern const char* const kNvidiaDeepseekV4FlashNvfp4HfQuant;  // NVIDIA hybrid, hf_quant_config.json
extern const char* const kGptOss20b;
extern const char* const kDeepseekV3;
extern const char* const kRedHatDeepseekV4FlashNvfp4Fp8;  // compressed-tensors mixed-precision
extern const char* const kNvidiaQwen3_235bNvfp4;          // ModelOpt NVFP4 (no quantization_config)
extern const char* const kNvidiaQwen3_235bNvfp4HfQuant;
extern const char* const kNvidiaMiniMaxM25Nvfp4;         // ModelOpt NVFP4, config.json
extern const char* const kNvidiaMiniMaxM25Nvfp4HfQuant;  // its hf_quant_config.json
extern const char* const kMiniMaxM25;                    // the FP8 block-128 release
extern const char* const kQwen3_30bA3bFp8;               // the FP8 release; synth.cc drops its
                                            // quantization_config for the BF16 original

}  // namespace fp4moe::synth::base_configs
