// MXFP4 -> NVFP4 transcoding that keeps every nibble (see transcode.h for the scale algebra).
#include "formats/transcode.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "formats/scalar.h"

namespace fp4moe::formats {
namespace {

constexpr int kMxBlock = 32;
constexpr int kNvBlock = 16;
constexpr int kNvBlockBytes = kNvBlock / 2;
// E4M3 represents the 18 powers of two 2^-9 .. 2^8 exactly, so a block whose exponent is at most
// 17 binades below the group's largest fits; 8 is the headroom that puts k_max at the top, 2^8.
constexpr int kWindowBinades = 17;
constexpr int kTopExponent = 8;
constexpr uint8_t kUe4m3One = 0x38;
constexpr uint8_t kUe4m3Smallest = 0x01;  // 2^-9, the smallest non-zero UE4M3

// UE4M3 code of 2^(kTopExponent - d) for d = k_max - k in the window.
struct WindowScaleCodes {
  uint8_t code[kWindowBinades + 1];
  WindowScaleCodes() {
    for (int d = 0; d <= kWindowBinades; ++d)
      code[d] = encode_e4m3(std::ldexp(1.0f, kTopExponent - d));
  }
};

// True when all 16 nibbles are +0 or -0 (codes 0x0 and 0x8).
bool half_block_is_zero(const uint8_t* bytes) {
  uint64_t word = 0;
  std::memcpy(&word, bytes, sizeof(word));
  return (word & 0x7777777777777777ull) == 0;
}

}  // namespace

void TranscodeReport::merge(const TranscodeReport& other) {
  blocks_total += other.blocks_total;
  blocks_lossless += other.blocks_lossless;
  blocks_requantized += other.blocks_requantized;
  blocks_all_zero += other.blocks_all_zero;
  max_abs_error = std::max(max_abs_error, other.max_abs_error);
  max_rel_error = std::max(max_rel_error, other.max_rel_error);
}

Result<TranscodeReport> transcode_mxfp4_to_nvfp4(std::span<const Mxfp4Source> sources,
                                                 std::span<const Nvfp4Destination> destinations) {
  FP4MOE_CHECK(sources.size() == destinations.size());
  // Pass 1: validate and find k_max over the non-zero blocks of the whole group.
  int k_max = -1;  // biased E8M0 code; -1 = no non-zero block yet
  for (const auto& src : sources) {
    if (src.rows < 0 || src.cols <= 0 || src.cols % kMxBlock != 0) {
      return Error{"tensor '" + src.name + "' [" + std::to_string(src.rows) + ", " +
                   std::to_string(src.cols) +
                   "]: last dimension is not a multiple of the MXFP4 "
                   "block size 32"};
    }
    const auto blocks_per_row = src.cols / kMxBlock;
    const auto mx_blocks = static_cast<size_t>(src.rows * blocks_per_row);
    FP4MOE_CHECK(src.scales.size() == mx_blocks && src.packed.size() == mx_blocks * kMxBlock / 2);
    for (size_t b = 0; b < mx_blocks; ++b) {
      if (src.scales[b] == kE8M0NaN) {
        const auto row = static_cast<int64_t>(b) / blocks_per_row;
        const auto block = static_cast<int64_t>(b) % blocks_per_row;
        return Error{"tensor '" + src.name + "': E8M0 scale 0xFF (NaN) at row " +
                     std::to_string(row) + ", block " + std::to_string(block) + " (elements " +
                     std::to_string(block * kMxBlock) + ".." +
                     std::to_string(block * kMxBlock + kMxBlock - 1) + ")"};
      }
      const uint8_t* bytes = src.packed.data() + b * (kMxBlock / 2);
      if (!half_block_is_zero(bytes) || !half_block_is_zero(bytes + kNvBlockBytes)) {
        k_max = std::max<int>(k_max, src.scales[b]);
      }
    }
  }

  TranscodeReport report;
  // An all-zero group has no exponent to anchor on: tensor scale 1, every block scale 1.
  const int m = k_max < 0 ? 0 : (k_max - 127) - kTopExponent;  // tensor scale = 2^m
  report.tensor_scale = std::ldexp(1.0f, m);
  const float six_tensor_scale = 6.0f * report.tensor_scale;
  const DecodeTables& tables = decode_tables();
  static const WindowScaleCodes window_codes;

  // Pass 2: copy nibbles verbatim and rewrite each half block's scale.
  for (size_t t = 0; t < sources.size(); ++t) {
    const auto& src = sources[t];
    const auto& dst = destinations[t];
    const size_t nv_blocks = src.packed.size() / kNvBlockBytes;
    FP4MOE_CHECK(dst.packed.size() == src.packed.size() && dst.block_scales.size() == nv_blocks);
    // An empty span may carry a null pointer, and memcpy from null is undefined even for 0 bytes.
    if (!src.packed.empty()) std::memcpy(dst.packed.data(), src.packed.data(), src.packed.size());
    for (size_t b = 0; b < nv_blocks; ++b) {
      const int k = src.scales[b / 2];
      uint8_t* bytes = dst.packed.data() + b * kNvBlockBytes;
      ++report.blocks_total;
      if (half_block_is_zero(bytes)) {
        ++report.blocks_all_zero;
        const int d = k_max - k;
        dst.block_scales[b] =
            (k_max >= 0 && d >= 0 && d <= kWindowBinades) ? window_codes.code[d] : kUe4m3One;
        continue;
      }
      const int d = k_max - k;
      if (d <= kWindowBinades) {
        // 2^(k - m) is exact in UE4M3, so e2m1 * 2^(k-m) * 2^m == e2m1 * 2^(k-127) bit for bit.
        dst.block_scales[b] = window_codes.code[d];
        ++report.blocks_lossless;
        continue;
      }
      // Outside the window: requantize the exact values with the NVFP4 recipe, except that the
      // block scale is kept at least 2^-9. The recipe alone would round it to 0 (these blocks are
      // at most 2^-10 of the range) and flush the block; the smallest scale keeps what E2M1 can.
      ++report.blocks_requantized;
      const float mx_scale = tables.e8m0[k];
      float exact[kNvBlock];
      float amax = 0.0f;
      for (int i = 0; i < kNvBlockBytes; ++i) {
        exact[2 * i] = tables.e2m1_pair[bytes[i]][0] * mx_scale;
        exact[2 * i + 1] = tables.e2m1_pair[bytes[i]][1] * mx_scale;
      }
      for (float v : exact) amax = std::max(amax, std::fabs(v));
      const uint8_t scale_code = std::max(encode_ue4m3(amax / six_tensor_scale), kUe4m3Smallest);
      dst.block_scales[b] = scale_code;
      const float divisor = tables.ue4m3[scale_code] * report.tensor_scale;
      for (int i = 0; i < kNvBlock; i += 2) {
        const uint8_t q_even = encode_e2m1(exact[i] / divisor);
        const uint8_t q_odd = encode_e2m1(exact[i + 1] / divisor);
        bytes[i / 2] = pack_e2m1_pair(q_even, q_odd);
        for (int j = 0; j < 2; ++j) {
          const float value = exact[i + j];
          const float decoded = decode_e2m1(j == 0 ? q_even : q_odd) * divisor;
          const double abs_error = std::fabs(static_cast<double>(decoded) - value);
          report.max_abs_error = std::max(report.max_abs_error, abs_error);
          if (value != 0.0f) {
            report.max_rel_error = std::max(report.max_rel_error, abs_error / std::fabs(value));
          }
        }
      }
    }
  }
  return report;
}

}  // namespace fp4moe::formats
