/* C ABI of fp4moe for the Python binding (python/fp4moe) and its oracle tests: the format layer
   and one product through the CPU kernels (fp4moe_linear). Every function returns 0 on success; on
   bad input it returns 1 and writes the message into `error` (NUL-terminated, at most `error_size`
   bytes; nothing when `error` is NULL). Buffer layouts follow formats/block.h.

   Sizes: every buffer argument `p` comes with `p_size`, the number of elements the caller owns at
   `p`, counted in p's element type (bytes for uint8_t, floats for float, uint16s for the 16-bit
   codes; for a void* argument the type is named beside it). Before touching any memory the
   library checks each size against what the shape needs and returns 1 with a message naming the
   argument, e.g. "argument 'scales': 1 bytes, the shape [4, 32] needs 8". A larger buffer is
   fine (its first elements are used); NULL is accepted only where nothing is needed (a shape
   the format rejects needs nothing: it is reported as a shape error). A pointer without a size
   (tensor_scale_out) is one element and never NULL. A shape whose element count does not fit
   int64_t is an error. */
#ifndef FP4MOE_C_H_
#define FP4MOE_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version of the signatures below, raised on every change to them; the binding refuses a
   library of another version (a stale build would be called with the wrong arguments). */
#define FP4MOE_C_ABI_VERSION 2
int fp4moe_abi_version(void);

/* Element codecs over n values: kind is one of "e2m1", "e4m3", "ue4m3", "e8m0" (codes: one
   uint8_t per value, codes_size in bytes) or "bf16", "fp16" (codes: one uint16_t per value,
   codes_size in uint16s). x_size in floats. An unknown kind is an error. */
int fp4moe_encode(const char* kind, const float* x, size_t x_size, void* codes, size_t codes_size,
                  size_t n, char* error, size_t error_size);
int fp4moe_decode(const char* kind, const void* codes, size_t codes_size, float* x, size_t x_size,
                  size_t n, char* error, size_t error_size);

/* x [rows, cols] floats; packed [rows, cols/2] bytes; block_scales [rows, cols/16] bytes;
   tensor_scale_out: one float. tensor_scale_in: NaN means "compute amax/(6*448) from x"; the
   scale used is written out. */
int fp4moe_quantize_nvfp4(const float* x, size_t x_size, int64_t rows, int64_t cols,
                          float tensor_scale_in, uint8_t* packed, size_t packed_size,
                          uint8_t* block_scales, size_t block_scales_size, float* tensor_scale_out,
                          char* error, size_t error_size);
int fp4moe_dequantize_nvfp4(const uint8_t* packed, size_t packed_size, const uint8_t* block_scales,
                            size_t block_scales_size, float tensor_scale, int64_t rows,
                            int64_t cols, float* out, size_t out_size, char* error,
                            size_t error_size);
/* x / out [rows, cols] floats; packed [rows, cols/2] bytes; scales [rows, cols/32] E8M0 bytes.
   rule: 0 = OCP floor, 1 = round-up. */
int fp4moe_quantize_mxfp4(const float* x, size_t x_size, int64_t rows, int64_t cols, int rule,
                          uint8_t* packed, size_t packed_size, uint8_t* scales, size_t scales_size,
                          char* error, size_t error_size);
int fp4moe_dequantize_mxfp4(const uint8_t* packed, size_t packed_size, const uint8_t* scales,
                            size_t scales_size, int64_t rows, int64_t cols, float* out,
                            size_t out_size, char* error, size_t error_size);
/* x / out [rows, cols] floats; q [rows, cols] E4M3 bytes; scales [ceil(rows/128),
   ceil(cols/128)]: ue8m0 = 0: F32 (float*, scales_size in floats), 1: E8M0 (uint8_t*, in bytes). */
int fp4moe_quantize_fp8_block128(const float* x, size_t x_size, int64_t rows, int64_t cols,
                                 int ue8m0, uint8_t* q, size_t q_size, void* scales,
                                 size_t scales_size, char* error, size_t error_size);
int fp4moe_dequantize_fp8_block128(const uint8_t* q, size_t q_size, const void* scales,
                                   size_t scales_size, int64_t rows, int64_t cols, int ue8m0,
                                   float* out, size_t out_size, char* error, size_t error_size);

/* Transcodes `count` MXFP4 tensors sharing one tensor scale. Every array argument (packed,
   packed_sizes, scales, ..., out_block_scales_sizes) has `count` entries; tensor i has the shape
   [rows[i], cols[i]], packed[i] [rows, cols/2] bytes (packed_sizes[i]), scales[i] [rows, cols/32]
   bytes, out_packed[i] [rows, cols/2] bytes, out_block_scales[i] [rows, cols/16] bytes.
   tensor_scale_out: one float; counts_out (>= 4 int64s): blocks total, lossless, requantized,
   all-zero; errors_out (>= 2 doubles): max absolute, max relative error. */
int fp4moe_transcode_mxfp4_to_nvfp4(size_t count, const uint8_t* const* packed,
                                    const size_t* packed_sizes, const uint8_t* const* scales,
                                    const size_t* scales_sizes, const int64_t* rows,
                                    const int64_t* cols, uint8_t* const* out_packed,
                                    const size_t* out_packed_sizes,
                                    uint8_t* const* out_block_scales,
                                    const size_t* out_block_scales_sizes, float* tensor_scale_out,
                                    int64_t* counts_out, size_t counts_out_size, double* errors_out,
                                    size_t errors_out_size, char* error, size_t error_size);

/* y [m, n] = x [m, k] . W^T through the CPU kernels: W in checkpoint layout, packed once, then one
   product. format (the kernels' names): "nvfp4": packed [n, k/2] bytes + UE4M3 scales [n, k/16]
   bytes + tensor_scale; "mxfp4": packed [n, k/2] + E8M0 scales [n, k/32] bytes; "fp8_block":
   packed = E4M3 codes [n, k] bytes + F32 scales [ceil(n/128), ceil(k/128)] (scales_size in
   floats). Only nvfp4 reads tensor_scale. x_size: m*k floats; y_size: m*n floats.
   precision: "w4a16" (exact) or "w4a8" (FP4 formats only: the dispatch layer rejects FP8); isa:
   "scalar", "avx2", "avx512", "avx512_vnni", "amx_int8" (ISA levels: each family runs its best kernel at or
   below the level) or NULL for the best the host has. Single-threaded. */
int fp4moe_linear(const char* format, const char* precision, const char* isa, const uint8_t* packed,
                  size_t packed_size, const void* scales, size_t scales_size, float tensor_scale,
                  int64_t n, int64_t k, const float* x, size_t x_size, int64_t m, float* y,
                  size_t y_size, char* error, size_t error_size);

#ifdef __cplusplus
}
#endif
#endif /* FP4MOE_C_H_ */
