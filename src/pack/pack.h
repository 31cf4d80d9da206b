// Load-time repacking from checkpoint layouts to the kernel layout (kernels/types.h). This is the
// only code that knows both; kernels never see a checkpoint layout. Bad input (wrong sizes, NaN
// scales or codes, illegal shapes) is an Error naming the tensor and the reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/streamed_memory.h"
#include "kernels/types.h"

namespace fp4moe::pack {

// A packed weight matrix that owns its (64-byte aligned, huge-page advised) storage.
class PackedWeights {
 public:
  PackedWeights() = default;
  const kernels::PackedMatrix& view() const { return view_; }
  kernels::WeightFormat format() const { return view_.format; }
  int64_t n() const { return view_.n; }
  int64_t k() const { return view_.k; }
  // Bytes a product streams: codes plus scales (the padding of the last tile included).
  size_t streamed_bytes() const { return codes_bytes_ + scale_bytes_; }

 private:
  friend class PackedWeightsBuilder;
  StreamedBuffer storage_;
  size_t codes_bytes_ = 0;
  size_t scale_bytes_ = 0;
  kernels::PackedMatrix view_{};
};

// NVFP4 (ModelOpt / compressed-tensors after taking the reciprocal of weight_global_scale):
// packed [n, k/2] (element 2i in the low nibble), block_scales [n, k/16] UE4M3, tensor_scale F32.
Result<PackedWeights> pack_nvfp4(std::string_view tensor, std::span<const uint8_t> packed,
                                 std::span<const uint8_t> block_scales, float tensor_scale,
                                 int64_t n, int64_t k);
// MXFP4: packed [n, k/2], scales [n, k/32] E8M0.
Result<PackedWeights> pack_mxfp4(std::string_view tensor, std::span<const uint8_t> packed,
                                 std::span<const uint8_t> scales, int64_t n, int64_t k);
// Which rows of a stacked checkpoint tensor make the matrix: row r is row first + r * stride.
// gpt-oss stores all experts in one tensor, gate_up_proj_blocks [E, 2I, K/32, 16] with the gate
// and up rows interleaved (MOE_SEMANTICS.md §3): expert e's gate is {first e*2I, stride 2}, its
// up {e*2I + 1, 2}, its down (down_proj_blocks [E, H, I/32, 16]) {e*H, 1}.
struct RowSelection {
  int64_t first = 0;
  int64_t stride = 1;
};
// MXFP4 rows of a stacked tensor: packed [source_rows, k/2], scales [source_rows, k/32] E8M0
// (gpt-oss `*_blocks` [E, N, K/32, 16] and `*_scales` [E, N, K/32] are these with E*N rows).
Result<PackedWeights> pack_mxfp4_rows(std::string_view tensor, std::span<const uint8_t> packed,
                                      std::span<const uint8_t> scales, int64_t source_rows,
                                      RowSelection rows, int64_t n, int64_t k);
// FP8 block-128: q [n, k] E4M3, scales [ceil(n/128), ceil(k/128)] F32 (weight_scale_inv) ...
Result<PackedWeights> pack_fp8_block128(std::string_view tensor, std::span<const uint8_t> q,
                                        std::span<const float> scales, int64_t n, int64_t k);
// ... or E8M0 (DeepSeek-V3.2/V4 `scale`), widened exactly to F32.
Result<PackedWeights> pack_fp8_block128_ue8m0(std::string_view tensor, std::span<const uint8_t> q,
                                              std::span<const uint8_t> scales, int64_t n,
                                              int64_t k);

}  // namespace fp4moe::pack
