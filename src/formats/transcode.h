// Lossless MXFP4 -> NVFP4 transcoding (FORMATS.md §4): nibbles are kept verbatim and only scales
// are rewritten, so the NVFP4 result dequantizes to exactly the MXFP4 source.
//
// With k the unbiased exponent of an MX block scale and k_max its maximum over the non-zero blocks
// of every tensor in the group, the group's tensor scale is 2^(k_max - 8) and each NVFP4 block
// scale is 2^(k - k_max + 8): exact in UE4M3 for k_max - k <= 17 (E4M3 holds 2^-9 .. 2^8 exactly).
// Blocks outside that 18-binade window are requantized by the NVFP4 recipe from their exact values.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/status.h"

namespace fp4moe::formats {

struct Mxfp4Source {
  std::string name;                 // tensor name, for reports and errors
  std::span<const uint8_t> packed;  // [rows, cols/2]
  std::span<const uint8_t> scales;  // [rows, cols/32] E8M0
  int64_t rows = 0;
  int64_t cols = 0;
};

struct Nvfp4Destination {
  std::span<uint8_t> packed;        // [rows, cols/2]
  std::span<uint8_t> block_scales;  // [rows, cols/16] UE4M3
};

struct TranscodeReport {
  int64_t blocks_total = 0;     // NVFP4 blocks (16 elements) written
  int64_t blocks_lossless = 0;  // non-zero blocks whose scale fit the window: bit-exact
  int64_t blocks_requantized = 0;
  int64_t blocks_all_zero = 0;
  double max_abs_error = 0.0;  // over requantized blocks, against the exact MXFP4 values
  double max_rel_error = 0.0;  // max |err| / |exact| over requantized non-zero elements
  float tensor_scale = 0.0f;   // the shared weight_scale_2

  void merge(const TranscodeReport& other);  // sums counts, maxes errors (tensor_scale kept)
};

// Transcodes a group of tensors that share one tensor scale (w1 and w3 of one expert); `sources`
// and `destinations` correspond one to one. An E8M0 scale of 0xFF is an error naming the tensor and
// the (row, block) position; nothing useful is left in the destinations then.
Result<TranscodeReport> transcode_mxfp4_to_nvfp4(std::span<const Mxfp4Source> sources,
                                                 std::span<const Nvfp4Destination> destinations);

}  // namespace fp4moe::formats
