// Real config.json / hf_quant_config.json texts (from tests/data/corpus/) that synthetic layouts
// edit.
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
extern const char* const kQwen3_30bA3b;  // BF16 original (quantization_config removed)

}  // namespace fp4moe::synth::base_configs
