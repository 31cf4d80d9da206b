/* C ABI of fp4moe for the Python binding (python/fp4moe) and its oracle tests: the format layer
   and one product through the CPU kernels (fp4moe_linear). Every function returns 0 on success; on
   bad input it returns 1 and writes the message into `error` (NUL-terminated, at most `error_size`
   bytes). Buffer sizes follow formats/block.h. */
#ifndef FP4MOE_C_H_
#define FP4MOE_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element codecs over arrays: kind is one of "e2m1", "e4m3", "ue4m3", "e8m0" (one byte per
   value) or "bf16", "fp16" (one uint16 per value). */
int fp4moe_encode(const char* kind, const float* x, void* codes, size_t n);
int fp4moe_decode(const char* kind, const void* codes, float* x, size_t n);

/* tensor_scale_in: NaN means "compute amax/(6*448) from x"; the scale used is written out. */
int fp4moe_quantize_nvfp4(const float* x, int64_t rows, int64_t cols, float tensor_scale_in,
                          uint8_t* packed, uint8_t* block_scales, float* tensor_scale_out,
                          char* error, size_t error_size);
int fp4moe_dequantize_nvfp4(const uint8_t* packed, const uint8_t* block_scales, float tensor_scale,
                            int64_t rows, int64_t cols, float* out, char* error, size_t error_size);
/* rule: 0 = OCP floor, 1 = round-up. */
int fp4moe_quantize_mxfp4(const float* x, int64_t rows, int64_t cols, int rule, uint8_t* packed,
                          uint8_t* scales, char* error, size_t error_size);
int fp4moe_dequantize_mxfp4(const uint8_t* packed, const uint8_t* scales, int64_t rows,
                            int64_t cols, float* out, char* error, size_t error_size);
/* ue8m0 = 0: F32 scales (float*), 1: E8M0 scales (uint8_t*). */
int fp4moe_quantize_fp8_block128(const float* x, int64_t rows, int64_t cols, int ue8m0, uint8_t* q,
                                 void* scales, char* error, size_t error_size);
int fp4moe_dequantize_fp8_block128(const uint8_t* q, const void* scales, int64_t rows, int64_t cols,
                                   int ue8m0, float* out, char* error, size_t error_size);

/* Transcodes `count` MXFP4 tensors sharing one tensor scale. counts_out: blocks total, lossless,
   requantized, all-zero; errors_out: max absolute, max relative error. */
int fp4moe_transcode_mxfp4_to_nvfp4(size_t count, const uint8_t* const* packed,
                                    const uint8_t* const* scales, const int64_t* rows,
                                    const int64_t* cols, uint8_t* const* out_packed,
                                    uint8_t* const* out_block_scales, float* tensor_scale_out,
                                    int64_t* counts_out, double* errors_out, char* error,
                                    size_t error_size);

/* y [m, n] = x [m, k] . W^T through the CPU kernels: W in checkpoint layout ("nvfp4": packed
   [n, k/2] + UE4M3 [n, k/16] + tensor_scale; "mxfp4": packed + E8M0 [n, k/32], tensor_scale
   ignored), packed once, then one product. precision: "w4a16" (exact) or "w4a8"; isa: "scalar",
   "avx2", "avx512", "avx512_vnni" (ISA levels: each family runs its best kernel at or below the
   level) or NULL for the best the host has. Single-threaded. */
int fp4moe_linear(const char* format, const char* precision, const char* isa, const uint8_t* packed,
                  const uint8_t* scales, float tensor_scale, int64_t n, int64_t k, const float* x,
                  int64_t m, float* y, char* error, size_t error_size);

#ifdef __cplusplus
}
#endif
#endif /* FP4MOE_C_H_ */
