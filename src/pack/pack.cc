// Repacking checkpoint layouts into the kernel layout; the layout itself is documented in
// kernels/types.h next to PackedMatrix.
#include "pack/pack.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "formats/scalar.h"

namespace fp4moe::pack {

namespace {

using kernels::fp4_chunk_byte;
using kernels::kChunkBytes;
using kernels::kFp4ChunkK;
using kernels::kFp8ChunkK;
using kernels::kFp8ScaleBlock;
using kernels::kTileRows;
using kernels::WeightFormat;

Error pack_error(std::string_view tensor, const std::string& reason) {
  return Error{"pack: tensor '" + std::string(tensor) + "': " + reason};
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

class PackedWeightsBuilder {
 public:
  static Result<PackedWeights> make(std::string_view tensor, WeightFormat format, int64_t n,
                                    int64_t k, int64_t chunks, size_t scale_bytes) {
    PackedWeights w;
    const int64_t n_tiles = ceil_div(n, kTileRows);
    w.codes_bytes_ = static_cast<size_t>(n_tiles * chunks * kChunkBytes);
    w.scale_bytes_ = scale_bytes;
    // Streamed memory: large matrices in 2 MiB pages where the host grants them
    // (core/streamed_memory.h).
    const size_t total = w.codes_bytes_ + scale_bytes;
    w.storage_ = allocate_streamed(total);
    if (w.storage_ == nullptr)
      return pack_error(tensor, "out of memory for " + std::to_string(total) + " bytes");
    uint8_t* p = w.storage_.get();
    w.view_ =
        kernels::PackedMatrix{format, n, k, n_tiles, chunks, p, p + w.codes_bytes_, nullptr, 1.0f};
    if (format == WeightFormat::kFp8Block128) {
      w.view_.block_scales = nullptr;
      w.view_.fp8_scales = reinterpret_cast<const float*>(p + w.codes_bytes_);
    }
    return w;
  }
  static uint8_t* codes(PackedWeights& w) { return w.storage_.get(); }
  static uint8_t* scales(PackedWeights& w) { return w.storage_.get() + w.codes_bytes_; }
  static void set_tensor_scale(PackedWeights& w, float s) { w.view_.tensor_scale = s; }
};

namespace {

Status check_shape(std::string_view tensor, int64_t n, int64_t k, int64_t k_block) {
  if (n <= 0 || k <= 0) {
    return pack_error(
        tensor, "shape [" + std::to_string(n) + ", " + std::to_string(k) + "] must be positive");
  }
  if (k % k_block != 0) {
    return pack_error(tensor, "K = " + std::to_string(k) + " is not a multiple of the block (" +
                                  std::to_string(k_block) + ")");
  }
  return Status::Ok();
}

Status check_size(std::string_view tensor, std::string_view what, size_t got, int64_t want) {
  if (got != static_cast<size_t>(want)) {
    return pack_error(tensor, std::string(what) + " has " + std::to_string(got) +
                                  " elements, expected " + std::to_string(want));
  }
  return Status::Ok();
}

// FP4 codes: checkpoint rows (element 2i low nibble) -> tiles of 32-byte chunks (types.h). Row r
// of the matrix is checkpoint row rows.first + r * rows.stride.
void pack_fp4_codes(std::span<const uint8_t> packed, RowSelection rows, int64_t n, int64_t k,
                    uint8_t* out) {
  const int64_t row_bytes = k / 2;
  const int64_t chunks = k / kFp4ChunkK;
  const int64_t n_tiles = ceil_div(n, kTileRows);
  for (int64_t t = 0; t < n_tiles; ++t) {
    for (int r8 = 0; r8 < kTileRows; ++r8) {
      const int64_t row = t * kTileRows + r8;
      uint8_t* tile = out + t * chunks * kChunkBytes;
      if (row >= n) {
        for (int64_t c = 0; c < chunks; ++c) {
          for (int j = 0; j < 4; ++j) tile[c * kChunkBytes + fp4_chunk_byte(r8, j)] = 0;
        }
        continue;
      }
      const uint8_t* src = packed.data() + (rows.first + row * rows.stride) * row_bytes;
      for (int64_t c = 0; c < chunks; ++c) {
        // The row's 4 bytes for k = 8c .. 8c+7: element e is nibble (e % 2) of byte e / 2.
        uint32_t bits;
        std::memcpy(&bits, src + c * 4, 4);
        for (int j = 0; j < 4; ++j) {
          const uint32_t lo = (bits >> (4 * j)) & 0xF;        // k = 8c + j
          const uint32_t hi = (bits >> (4 * (j + 4))) & 0xF;  // k = 8c + 4 + j
          tile[c * kChunkBytes + fp4_chunk_byte(r8, j)] = static_cast<uint8_t>(lo | (hi << 4));
        }
      }
    }
  }
}

// FP4 block scales: checkpoint rows of k_blocks -> [tile][block][8 rows]; padding rows get code 0.
void pack_fp4_scales(std::span<const uint8_t> scales, RowSelection rows, int64_t n,
                     int64_t k_blocks, uint8_t* out) {
  const int64_t n_tiles = ceil_div(n, kTileRows);
  for (int64_t t = 0; t < n_tiles; ++t) {
    for (int64_t b = 0; b < k_blocks; ++b) {
      for (int r = 0; r < kTileRows; ++r) {
        const int64_t row = t * kTileRows + r;
        out[(t * k_blocks + b) * kTileRows + r] =
            row < n ? scales[(rows.first + row * rows.stride) * k_blocks + b] : 0;
      }
    }
  }
}

Result<PackedWeights> pack_fp4(std::string_view tensor, WeightFormat format,
                               std::span<const uint8_t> packed, std::span<const uint8_t> scales,
                               int64_t n, int64_t k, RowSelection rows = {},
                               int64_t source_rows = -1) {
  const int64_t k_block = kernels::weight_format_k_block(format);
  FP4MOE_RETURN_IF_ERROR(check_shape(tensor, n, k, k_block));
  if (source_rows < 0) source_rows = n;
  if (rows.first < 0 || rows.stride < 1 || rows.first + (n - 1) * rows.stride >= source_rows) {
    return pack_error(tensor, "rows " + std::to_string(rows.first) + " + i * " +
                                  std::to_string(rows.stride) + " for i < " + std::to_string(n) +
                                  " do not fit its " + std::to_string(source_rows) + " rows");
  }
  FP4MOE_RETURN_IF_ERROR(check_size(tensor, "packed codes", packed.size(), source_rows * k / 2));
  FP4MOE_RETURN_IF_ERROR(
      check_size(tensor, "block scales", scales.size(), source_rows * (k / k_block)));
  const int64_t k_blocks = k / k_block;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t row = rows.first + r * rows.stride;
    for (int64_t b = 0; b < k_blocks; ++b) {
      const uint8_t s = scales[static_cast<size_t>(row * k_blocks + b)];
      const bool bad =
          format == WeightFormat::kNvfp4 ? ((s & 0x80) != 0 || s == 0x7F) : s == formats::kE8M0NaN;
      if (bad) {
        return pack_error(tensor, "block scale " + std::to_string(row * k_blocks + b) + " (row " +
                                      std::to_string(row) + ") is code " + std::to_string(s) +
                                      ", not a finite unsigned scale");
      }
    }
  }
  const int64_t n_tiles = ceil_div(n, kTileRows);
  const size_t scale_bytes = static_cast<size_t>(n_tiles * (k / k_block) * kTileRows);
  auto built = PackedWeightsBuilder::make(tensor, format, n, k, k / kFp4ChunkK, scale_bytes);
  if (!built.ok()) return built.error();
  PackedWeights w = std::move(built).value();
  pack_fp4_codes(packed, rows, n, k, PackedWeightsBuilder::codes(w));
  pack_fp4_scales(scales, rows, n, k_blocks, PackedWeightsBuilder::scales(w));
  return w;
}

Result<PackedWeights> pack_fp8(std::string_view tensor, std::span<const uint8_t> q,
                               std::span<const float> scales, int64_t n, int64_t k) {
  FP4MOE_RETURN_IF_ERROR(check_shape(tensor, n, k, 1));
  FP4MOE_RETURN_IF_ERROR(check_size(tensor, "codes", q.size(), n * k));
  const int64_t grid = ceil_div(n, kFp8ScaleBlock) * ceil_div(k, kFp8ScaleBlock);
  FP4MOE_RETURN_IF_ERROR(check_size(tensor, "block scales", scales.size(), grid));
  for (size_t i = 0; i < scales.size(); ++i) {
    if (!std::isfinite(scales[i])) {
      return pack_error(tensor, "block scale " + std::to_string(i) + " is not finite");
    }
  }
  const int64_t chunks = ceil_div(k, kFp8ChunkK);
  auto built = PackedWeightsBuilder::make(tensor, WeightFormat::kFp8Block128, n, k, chunks,
                                          sizeof(float) * static_cast<size_t>(grid));
  if (!built.ok()) return built.error();
  PackedWeights w = std::move(built).value();
  uint8_t* out = PackedWeightsBuilder::codes(w);
  const int64_t n_tiles = ceil_div(n, kTileRows);
  for (int64_t t = 0; t < n_tiles; ++t) {
    for (int r = 0; r < kTileRows; ++r) {
      const int64_t row = t * kTileRows + r;
      uint8_t* tile = out + t * chunks * kChunkBytes;
      for (int64_t kk = 0; kk < chunks * kFp8ChunkK; ++kk) {
        uint8_t code = 0;
        if (row < n && kk < k) {
          code = q[row * k + kk];
          if ((code & 0x7F) == 0x7F) {
            return pack_error(tensor, "element [" + std::to_string(row) + ", " +
                                          std::to_string(kk) + "] is an E4M3 NaN");
          }
        }
        tile[(kk / kFp8ChunkK) * kChunkBytes + (kk % kFp8ChunkK) * kTileRows + r] = code;
      }
    }
  }
  std::memcpy(PackedWeightsBuilder::scales(w), scales.data(), sizeof(float) * scales.size());
  return w;
}

}  // namespace

Result<PackedWeights> pack_nvfp4(std::string_view tensor, std::span<const uint8_t> packed,
                                 std::span<const uint8_t> block_scales, float tensor_scale,
                                 int64_t n, int64_t k) {
  if (!std::isfinite(tensor_scale)) return pack_error(tensor, "tensor scale is not finite");
  auto w = pack_fp4(tensor, WeightFormat::kNvfp4, packed, block_scales, n, k);
  if (w.ok()) PackedWeightsBuilder::set_tensor_scale(*w, tensor_scale);
  return w;
}

Result<PackedWeights> pack_mxfp4(std::string_view tensor, std::span<const uint8_t> packed,
                                 std::span<const uint8_t> scales, int64_t n, int64_t k) {
  return pack_fp4(tensor, WeightFormat::kMxfp4, packed, scales, n, k);
}

Result<PackedWeights> pack_mxfp4_rows(std::string_view tensor, std::span<const uint8_t> packed,
                                      std::span<const uint8_t> scales, int64_t source_rows,
                                      RowSelection rows, int64_t n, int64_t k) {
  return pack_fp4(tensor, WeightFormat::kMxfp4, packed, scales, n, k, rows, source_rows);
}

Result<PackedWeights> pack_fp8_block128(std::string_view tensor, std::span<const uint8_t> q,
                                        std::span<const float> scales, int64_t n, int64_t k) {
  return pack_fp8(tensor, q, scales, n, k);
}

Result<PackedWeights> pack_fp8_block128_ue8m0(std::string_view tensor, std::span<const uint8_t> q,
                                              std::span<const uint8_t> scales, int64_t n,
                                              int64_t k) {
  std::vector<float> widened(scales.size());
  for (size_t i = 0; i < scales.size(); ++i) {
    if (scales[i] == formats::kE8M0NaN) {
      return pack_error(tensor, "block scale " + std::to_string(i) + " is the E8M0 NaN (0xFF)");
    }
    widened[i] = formats::decode_e8m0(scales[i]);
  }
  return pack_fp8(tensor, q, widened, n, k);
}

}  // namespace fp4moe::pack
