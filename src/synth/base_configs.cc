// The real configs each synthetic layout starts from, copied from tests/data/corpus/ (see its
// SOURCES.md) so that `fp4moe synth` works from any directory. Generated lists that depend on the
// layer count (quantized_layers, exclude_modules) are emptied here and rebuilt by synth.cc.
#include "synth/base_configs.h"

namespace fp4moe::synth::base_configs {

// deepseek-ai__DeepSeek-V4-Flash/config.json
const char* const kDeepseekV4Flash = R"json(
{
 "architectures": [
  "DeepseekV4ForCausalLM"
 ],
 "attention_bias": false,
 "attention_dropout": 0.0,
 "bos_token_id": 0,
 "eos_token_id": 1,
 "expert_dtype": "fp4",
 "hc_eps": 1e-06,
 "hc_mult": 4,
 "hc_sinkhorn_iters": 20,
 "head_dim": 512,
 "hidden_act": "silu",
 "hidden_size": 4096,
 "index_head_dim": 128,
 "index_n_heads": 64,
 "index_topk": 512,
 "initializer_range": 0.02,
 "max_position_embeddings": 1048576,
 "model_type": "deepseek_v4",
 "moe_intermediate_size": 2048,
 "n_routed_experts": 256,
 "n_shared_experts": 1,
 "norm_topk_prob": true,
 "num_attention_heads": 64,
 "num_experts_per_tok": 6,
 "num_hidden_layers": 43,
 "num_hash_layers": 3,
 "num_key_value_heads": 1,
 "num_nextn_predict_layers": 1,
 "o_groups": 8,
 "o_lora_rank": 1024,
 "q_lora_rank": 1024,
 "qk_rope_head_dim": 64,
 "quantization_config": {
  "activation_scheme": "dynamic",
  "fmt": "e4m3",
  "quant_method": "fp8",
  "scale_fmt": "ue8m0",
  "weight_block_size": [
   128,
   128
  ]
 },
 "rms_norm_eps": 1e-06,
 "rope_scaling": {
  "beta_fast": 32,
  "beta_slow": 1,
  "factor": 16,
  "original_max_position_embeddings": 65536,
  "type": "yarn"
 },
 "rope_theta": 10000,
 "routed_scaling_factor": 1.5,
 "scoring_func": "sqrtsoftplus",
 "sliding_window": 128,
 "swiglu_limit": 10.0,
 "tie_word_embeddings": false,
 "topk_method": "noaux_tc",
 "torch_dtype": "bfloat16",
 "transformers_version": "4.57.1",
 "use_cache": true,
 "vocab_size": 129280,
 "compress_rope_theta": 160000,
 "compress_ratios": [
  0,
  0,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  0
 ]
}
)json";

// nvidia__DeepSeek-V4-Flash-NVFP4/config.json (quantized_layers emptied: rebuilt per layer count)
const char* const kNvidiaDeepseekV4FlashNvfp4 = R"json(
{
 "architectures": [
  "DeepseekV4ForCausalLM"
 ],
 "attention_bias": false,
 "attention_dropout": 0.0,
 "bos_token_id": 0,
 "compress_ratios": [
  0,
  0,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  0
 ],
 "compress_rope_theta": 160000,
 "eos_token_id": 1,
 "expert_dtype": "fp4",
 "hc_eps": 1e-06,
 "hc_mult": 4,
 "hc_sinkhorn_iters": 20,
 "head_dim": 512,
 "hidden_act": "silu",
 "hidden_size": 4096,
 "index_head_dim": 128,
 "index_n_heads": 64,
 "index_topk": 512,
 "initializer_range": 0.02,
 "max_position_embeddings": 1048576,
 "model_type": "deepseek_v4",
 "moe_intermediate_size": 2048,
 "n_routed_experts": 256,
 "n_shared_experts": 1,
 "norm_topk_prob": true,
 "num_attention_heads": 64,
 "num_experts_per_tok": 6,
 "num_hash_layers": 3,
 "num_hidden_layers": 43,
 "num_key_value_heads": 1,
 "num_nextn_predict_layers": 1,
 "o_groups": 8,
 "o_lora_rank": 1024,
 "q_lora_rank": 1024,
 "qk_rope_head_dim": 64,
 "quantization_config": {
  "activation_scheme": "dynamic",
  "config_groups": {
   "group_0": {
    "input_activations": {
     "dynamic": false,
     "group_size": 16,
     "num_bits": 4,
     "type": "float"
    },
    "targets": [
     "Linear"
    ],
    "weights": {
     "dynamic": false,
     "group_size": 16,
     "num_bits": 4,
     "type": "float"
    }
   }
  },
  "fmt": "e4m3",
  "group_size": 16,
  "ignore": [
   "*.attn.*",
   "*.ffn.shared_experts.*",
   "head",
   "mtp.*"
  ],
  "kv_cache_quant_algo": null,
  "moe_quant_algo": "NVFP4",
  "producer": {
   "name": "modelopt",
   "version": "dsv4-nvfp4-experts"
  },
  "quant_algo": "MIXED_PRECISION",
  "quant_method": "fp8",
  "quantized_layers": {},
  "scale_fmt": "ue8m0",
  "weight_block_size": [
   128,
   128
  ]
 },
 "rms_norm_eps": 1e-06,
 "rope_scaling": {
  "beta_fast": 32,
  "beta_slow": 1,
  "factor": 16,
  "original_max_position_embeddings": 65536,
  "type": "yarn"
 },
 "rope_theta": 10000,
 "routed_scaling_factor": 1.5,
 "scoring_func": "sqrtsoftplus",
 "sliding_window": 128,
 "swiglu_limit": 10.0,
 "tie_word_embeddings": false,
 "topk_method": "noaux_tc",
 "torch_dtype": "bfloat16",
 "transformers_version": "4.57.1",
 "use_cache": true,
 "vocab_size": 129280
}
)json";

// nvidia__DeepSeek-V4-Flash-NVFP4/hf_quant_config.json (quantized_layers emptied: rebuilt per layer
// count)
const char* const kNvidiaDeepseekV4FlashNvfp4HfQuant = R"json(
{
 "producer": {
  "name": "modelopt",
  "version": "dsv4-nvfp4-experts"
 },
 "quantization": {
  "quant_algo": "MIXED_PRECISION",
  "kv_cache_quant_algo": null,
  "group_size": 16,
  "quantized_layers": {},
  "exclude_modules": [
   "*.attn.*",
   "*.ffn.shared_experts.*",
   "head",
   "mtp.*"
  ]
 }
}
)json";

// openai__gpt-oss-20b/config.json
const char* const kGptOss20b = R"json(
{
 "architectures": [
  "GptOssForCausalLM"
 ],
 "attention_bias": true,
 "attention_dropout": 0.0,
 "eos_token_id": 200002,
 "experts_per_token": 4,
 "head_dim": 64,
 "hidden_act": "silu",
 "hidden_size": 2880,
 "initial_context_length": 4096,
 "initializer_range": 0.02,
 "intermediate_size": 2880,
 "layer_types": [
  "sliding_attention",
  "full_attention",
  "sliding_attention",
  "full_attention",
  "sliding_attention",
  "full_attention",
  "sliding_attention",
  "full_attention",
  "sliding_attention",
  "full_attention",
  "sliding_attention",
  "full_attention",
  "sliding_attention",
  "full_attention",
  "sliding_attention",
  "full_attention",
  "sliding_attention",
  "full_attention",
  "sliding_attention",
  "full_attention",
  "sliding_attention",
  "full_attention",
  "sliding_attention",
  "full_attention"
 ],
 "max_position_embeddings": 131072,
 "model_type": "gpt_oss",
 "num_attention_heads": 64,
 "num_experts_per_tok": 4,
 "num_hidden_layers": 24,
 "num_key_value_heads": 8,
 "num_local_experts": 32,
 "output_router_logits": false,
 "pad_token_id": 199999,
 "quantization_config": {
  "modules_to_not_convert": [
   "model.layers.*.self_attn",
   "model.layers.*.mlp.router",
   "model.embed_tokens",
   "lm_head"
  ],
  "quant_method": "mxfp4"
 },
 "rms_norm_eps": 1e-05,
 "rope_scaling": {
  "beta_fast": 32.0,
  "beta_slow": 1.0,
  "factor": 32.0,
  "original_max_position_embeddings": 4096,
  "rope_type": "yarn",
  "truncate": false
 },
 "rope_theta": 150000,
 "router_aux_loss_coef": 0.9,
 "sliding_window": 128,
 "swiglu_limit": 7.0,
 "tie_word_embeddings": false,
 "transformers_version": "4.55.0.dev0",
 "use_cache": true,
 "vocab_size": 201088
}
)json";

// deepseek-ai__DeepSeek-V3/config.json
const char* const kDeepseekV3 = R"json(
{
 "architectures": [
  "DeepseekV3ForCausalLM"
 ],
 "attention_bias": false,
 "attention_dropout": 0.0,
 "auto_map": {
  "AutoConfig": "configuration_deepseek.DeepseekV3Config",
  "AutoModel": "modeling_deepseek.DeepseekV3Model",
  "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"
 },
 "bos_token_id": 0,
 "eos_token_id": 1,
 "ep_size": 1,
 "first_k_dense_replace": 3,
 "hidden_act": "silu",
 "hidden_size": 7168,
 "initializer_range": 0.02,
 "intermediate_size": 18432,
 "kv_lora_rank": 512,
 "max_position_embeddings": 163840,
 "model_type": "deepseek_v3",
 "moe_intermediate_size": 2048,
 "moe_layer_freq": 1,
 "n_group": 8,
 "n_routed_experts": 256,
 "n_shared_experts": 1,
 "norm_topk_prob": true,
 "num_attention_heads": 128,
 "num_experts_per_tok": 8,
 "num_hidden_layers": 61,
 "num_key_value_heads": 128,
 "num_nextn_predict_layers": 1,
 "q_lora_rank": 1536,
 "qk_nope_head_dim": 128,
 "qk_rope_head_dim": 64,
 "quantization_config": {
  "activation_scheme": "dynamic",
  "fmt": "e4m3",
  "quant_method": "fp8",
  "weight_block_size": [
   128,
   128
  ]
 },
 "rms_norm_eps": 1e-06,
 "rope_scaling": {
  "beta_fast": 32,
  "beta_slow": 1,
  "factor": 40,
  "mscale": 1.0,
  "mscale_all_dim": 1.0,
  "original_max_position_embeddings": 4096,
  "type": "yarn"
 },
 "rope_theta": 10000,
 "routed_scaling_factor": 2.5,
 "scoring_func": "sigmoid",
 "tie_word_embeddings": false,
 "topk_group": 4,
 "topk_method": "noaux_tc",
 "torch_dtype": "bfloat16",
 "transformers_version": "4.33.1",
 "use_cache": true,
 "v_head_dim": 128,
 "vocab_size": 129280
}
)json";

// RedHatAI__DeepSeek-V4-Flash-NVFP4-FP8/config.json
const char* const kRedHatDeepseekV4FlashNvfp4Fp8 = R"json(
{
 "architectures": [
  "DeepseekV4ForCausalLM"
 ],
 "attention_bias": false,
 "attention_dropout": 0.0,
 "bos_token_id": 0,
 "compress_ratios": [
  0,
  0,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4,
  128,
  4
 ],
 "compress_rope_parameters": {
  "beta_fast": 32,
  "beta_slow": 1,
  "factor": 16,
  "original_max_position_embeddings": 65536,
  "partial_rotary_factor": 0.125,
  "rope_theta": 160000,
  "rope_type": "yarn",
  "type": "yarn"
 },
 "compress_rope_theta": 160000,
 "dtype": "bfloat16",
 "eos_token_id": 1,
 "expert_dtype": "fp4",
 "first_k_dense_replace": null,
 "hc_eps": 1e-06,
 "hc_mult": 4,
 "hc_sinkhorn_iters": 20,
 "head_dim": 512,
 "hidden_act": "silu",
 "hidden_size": 4096,
 "index_head_dim": 128,
 "index_n_heads": 64,
 "index_topk": 512,
 "initializer_range": 0.02,
 "kv_lora_rank": null,
 "max_position_embeddings": 1048576,
 "model_type": "deepseek_v4",
 "moe_intermediate_size": 2048,
 "n_group": null,
 "n_routed_experts": 256,
 "n_shared_experts": 1,
 "norm_topk_prob": true,
 "num_attention_heads": 64,
 "num_experts_per_tok": 6,
 "num_hash_layers": 3,
 "num_hidden_layers": 43,
 "num_key_value_heads": 1,
 "num_nextn_predict_layers": 1,
 "o_groups": 8,
 "o_lora_rank": 1024,
 "output_router_logits": false,
 "pad_token_id": null,
 "partial_rotary_factor": 0.125,
 "pretraining_tp": 1,
 "q_lora_rank": 1024,
 "qk_nope_head_dim": 448,
 "qk_rope_head_dim": 64,
 "quantization_config": {
  "config_groups": {
   "group_0": {
    "format": "float-quantized",
    "input_activations": {
     "actorder": null,
     "block_structure": null,
     "dynamic": true,
     "group_size": 128,
     "num_bits": 8,
     "observer": null,
     "observer_kwargs": {},
     "scale_dtype": null,
     "strategy": "group",
     "symmetric": true,
     "type": "float",
     "zp_dtype": null
    },
    "output_activations": null,
    "targets": [
     "re:.*attn.*(fused_wqa_wkv|wq_b|wo_a|wo_b)$"
    ],
    "weights": {
     "actorder": null,
     "block_structure": [
      128,
      128
     ],
     "dynamic": false,
     "group_size": null,
     "num_bits": 8,
     "observer": "memoryless_minmax",
     "observer_kwargs": {},
     "scale_dtype": null,
     "strategy": "block",
     "symmetric": true,
     "type": "float",
     "zp_dtype": null
    }
   },
   "group_1": {
    "format": "nvfp4-pack-quantized",
    "input_activations": {
     "actorder": null,
     "block_structure": null,
     "dynamic": "local",
     "group_size": 16,
     "num_bits": 4,
     "observer": "static_minmax",
     "observer_kwargs": {},
     "scale_dtype": "torch.float8_e4m3fn",
     "strategy": "tensor_group",
     "symmetric": true,
     "type": "float",
     "zp_dtype": null
    },
    "output_activations": null,
    "targets": [
     "re:.*ffn.*(gate|up|down)_proj$"
    ],
    "weights": {
     "actorder": null,
     "block_structure": null,
     "dynamic": false,
     "group_size": 16,
     "num_bits": 4,
     "observer": "memoryless_minmax",
     "observer_kwargs": {},
     "scale_dtype": "torch.float8_e4m3fn",
     "strategy": "tensor_group",
     "symmetric": true,
     "type": "float",
     "zp_dtype": null
    }
   }
  },
  "format": "mixed-precision",
  "global_compression_ratio": null,
  "ignore": [],
  "kv_cache_scheme": null,
  "quant_method": "compressed-tensors",
  "quantization_status": "compressed",
  "sparsity_config": {},
  "transform_config": {},
  "version": "0.15.1.dev15+g11daf97.d20260427"
 },
 "rms_norm_eps": 1e-06,
 "rope_interleave": true,
 "rope_parameters": {
  "beta_fast": 32,
  "beta_slow": 1,
  "factor": 16,
  "original_max_position_embeddings": 65536,
  "partial_rotary_factor": 0.125,
  "rope_theta": 10000,
  "rope_type": "yarn",
  "type": "yarn"
 },
 "rope_theta": 10000,
 "routed_scaling_factor": 1.5,
 "router_aux_loss_coef": 0.001,
 "router_jitter_noise": 0.0,
 "scoring_func": "sqrtsoftplus",
 "sliding_window": 128,
 "swiglu_limit": 10.0,
 "tie_word_embeddings": false,
 "topk_group": null,
 "topk_method": "noaux_tc",
 "transformers_version": "5.7.0.dev0",
 "use_cache": true,
 "v_head_dim": null,
 "vocab_size": 129280
}
)json";

// nvidia__Qwen3-235B-A22B-NVFP4/config.json
const char* const kNvidiaQwen3_235bNvfp4 = R"json(
{
 "architectures": [
  "Qwen3MoeForCausalLM"
 ],
 "attention_bias": false,
 "attention_dropout": 0.0,
 "bos_token_id": 151643,
 "decoder_sparse_step": 1,
 "eos_token_id": 151645,
 "head_dim": 128,
 "hidden_act": "silu",
 "hidden_size": 4096,
 "initializer_range": 0.02,
 "intermediate_size": 12288,
 "max_position_embeddings": 40960,
 "max_window_layers": 94,
 "mlp_only_layers": [],
 "model_type": "qwen3_moe",
 "moe_intermediate_size": 1536,
 "norm_topk_prob": true,
 "num_attention_heads": 64,
 "num_experts": 128,
 "num_experts_per_tok": 8,
 "num_hidden_layers": 94,
 "num_key_value_heads": 4,
 "output_router_logits": false,
 "rms_norm_eps": 1e-06,
 "rope_scaling": null,
 "rope_theta": 1000000.0,
 "router_aux_loss_coef": 0.001,
 "sliding_window": null,
 "tie_word_embeddings": false,
 "torch_dtype": "bfloat16",
 "transformers_version": "4.51.3",
 "use_cache": true,
 "use_sliding_window": false,
 "vocab_size": 151936
}
)json";

// nvidia__Qwen3-235B-A22B-NVFP4/hf_quant_config.json (exclude_modules emptied: rebuilt per layer
// count)
const char* const kNvidiaQwen3_235bNvfp4HfQuant = R"json(
{
 "producer": {
  "name": "modelopt",
  "version": "0.33.0"
 },
 "quantization": {
  "quant_algo": "NVFP4",
  "kv_cache_quant_algo": "FP8",
  "group_size": 16,
  "exclude_modules": []
 }
}
)json";

// Qwen__Qwen3-30B-A3B-FP8/config.json without quantization_config (the BF16 original)
const char* const kQwen3_30bA3b = R"json(
{
 "architectures": [
  "Qwen3MoeForCausalLM"
 ],
 "attention_bias": false,
 "attention_dropout": 0.0,
 "bos_token_id": 151643,
 "decoder_sparse_step": 1,
 "eos_token_id": 151645,
 "head_dim": 128,
 "hidden_act": "silu",
 "hidden_size": 2048,
 "initializer_range": 0.02,
 "intermediate_size": 6144,
 "max_position_embeddings": 40960,
 "max_window_layers": 48,
 "mlp_only_layers": [],
 "model_type": "qwen3_moe",
 "moe_intermediate_size": 768,
 "norm_topk_prob": true,
 "num_attention_heads": 32,
 "num_experts": 128,
 "num_experts_per_tok": 8,
 "num_hidden_layers": 48,
 "num_key_value_heads": 4,
 "output_router_logits": false,
 "rms_norm_eps": 1e-06,
 "rope_scaling": null,
 "rope_theta": 1000000.0,
 "router_aux_loss_coef": 0.001,
 "sliding_window": null,
 "tie_word_embeddings": false,
 "torch_dtype": "bfloat16",
 "transformers_version": "4.51.0",
 "use_cache": true,
 "use_sliding_window": false,
 "vocab_size": 151936
}
)json";

}  // namespace fp4moe::synth::base_configs
