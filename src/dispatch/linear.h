// One linear layer's kernel choice, made once when the layer is planned (never inside a loop),
// and the products it runs on the thread pool. describe() says what was chosen and why.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "kernels/registry.h"
#include "kernels/types.h"

namespace fp4moe::dispatch {

// Which product a plan computes. kExact (W4A16, the default): decoded weights times the F32
// activations, accumulated in F32. kW4A8: the separate int8-activation kernel family, with the
// error bound stated in kernels/types.h; only for the FP4 formats, and only when asked for.
enum class Precision : uint8_t { kExact, kW4A8 };
std::string_view precision_name(Precision p);  // "w4a16" | "w4a8"
Result<Precision> parse_precision(std::string_view name);

// Int8 activations for W4A8 products: storage sized once (no allocation per product), filled by
// quantize() and read by every product that takes the same activations (gate and up share one).
// Row r lives at a fixed place (row stride max_k codes, max_k / block scales), so rows can be
// quantized independently (one task per row) and a product can start at any row.
class QuantizedActivationBuffer {
 public:
  QuantizedActivationBuffer() = default;
  // Room for `max_rows` rows of up to `max_k` activations, quantized per `block`.
  QuantizedActivationBuffer(int64_t max_rows, int64_t max_k, int block);
  // Quantizes x [m, k] (row stride ldx; k a multiple of the block) into rows 0..m-1 with
  // `quantizer` (resolved once by the caller, e.g. LinearPlan::activation_quantizer(); every ISA's
  // gives the same bits), rows split over the pool, and returns the view of row 0.
  kernels::QuantizedActivations quantize(const float* x, int64_t ldx, int64_t m, int64_t k,
                                         kernels::QuantizeActivationsFn quantizer,
                                         ThreadPool& pool);
  // The same for rows [row0, row0 + rows) on the calling thread.
  void quantize_rows(const float* x, int64_t ldx, int64_t row0, int64_t rows, int64_t k,
                     kernels::QuantizeActivationsFn quantizer);
  // The view a kernel reads, starting at `row0`.
  kernels::QuantizedActivations view(int64_t row0) const;
  int block() const { return block_; }

 private:
  int64_t max_rows_ = 0, max_k_ = 0;
  int block_ = 1;
  std::vector<int8_t> q_;
  std::vector<float> scales_;
  std::vector<int32_t> offsets_;
};

class LinearPlan {
 public:
  // Chooses the kernel for `w` (which must outlive the plan): `isa` if given, else the forced ISA
  // (test hook / FP4MOE_ISA), else the best the host supports. An ISA the host lacks is an Error.
  // The ISA levels are nested (kernels/types.h): the plan runs its family's kernel of the highest
  // level at or below the chosen one, and isa() and describe() say which. W4A8 for FP8 is an
  // Error (the W4A8 family covers the FP4 formats).
  static Result<LinearPlan> create(const kernels::PackedMatrix& w,
                                   std::optional<kernels::Isa> isa = std::nullopt,
                                   Precision precision = Precision::kExact);

  // y[m, n] = x[m, k] . W^T in F32, split over the pool's threads by tile ranges: always the exact
  // (W4A16) kernel; a W4A8 plan's own product is run_w4a8 / run_quantizing.
  void run(const float* x, int64_t ldx, int64_t m, float* y, int64_t ldy, ThreadPool& pool) const;
  // BF16 activations x [m, k]: by the plan's BF16-activation kernel where it has one
  // (bf16_kernel()), at every M, else widened to F32 (exactly) into `scratch` (>= m * k floats)
  // and run as above. Both are exact products summed in F32 (in different orders:
  // kernels/types.h). At every M: on the 2-core Zen 4 of stop 28, NVFP4 4096 -> 2048 from DRAM,
  // two threads, the BF16 kernel (groups of 4 tokens, each re-decoding) ran 192-271 GFLOP/s at
  // 5-64 tokens and 188 at 256, the F32 kernels on widened activations (their panel path from 5)
  // 120-172 at 5-256; and a token's bits then do not depend on the batch it came in.
  void run_bf16(const uint16_t* x, int64_t m, float* y, int64_t ldy, std::span<float> scratch,
                ThreadPool& pool) const;
  // The BF16-activation kernel an exact plan runs for BF16 callers, or nullptr: the family's best
  // at or below the plan's ISA, when it is at least the exact kernel's level (so not on AVX2 or
  // plain AVX-512 hosts, where the family has only its scalar oracle), and none for W4A8 plans.
  const kernels::Bf16KernelInfo* bf16_kernel() const { return bf16_; }
  // Tiles [tile_begin, tile_end) on the calling thread, for callers that build their own tasks.
  void run_tiles(const float* x, int64_t ldx, int64_t m, float* y, int64_t ldy, int64_t tile_begin,
                 int64_t tile_end) const {
    kernel_->fn(*w_, x, ldx, m, y, ldy, tile_begin, tile_end);
  }

  // BF16 activations x [m, k] (row stride ldx), tiles [tile_begin, tile_end) on the calling
  // thread: the BF16-activation kernel where the plan has one, else the exact kernel on the values
  // widened to F32 (exactly) in a per-thread buffer.
  void run_tiles_bf16(const uint16_t* x, int64_t ldx, int64_t m, float* y, int64_t ldy,
                      int64_t tile_begin, int64_t tile_end) const;

  // W4A8 plans: the product over activations already quantized for this plan's block ...
  void run_w4a8(const kernels::QuantizedActivations& x, int64_t m, float* y, int64_t ldy,
                ThreadPool& pool) const;
  void run_tiles_w4a8(const kernels::QuantizedActivations& x, int64_t m, float* y, int64_t ldy,
                      int64_t tile_begin, int64_t tile_end) const {
    w4a8_->fn(*w_, x, m, y, ldy, tile_begin, tile_end);
  }
  // ... or quantize x into `buffer` first (the cost a single product pays).
  void run_quantizing(const float* x, int64_t ldx, int64_t m, float* y, int64_t ldy,
                      QuantizedActivationBuffer& buffer, ThreadPool& pool) const;

  Precision precision() const { return w4a8_ != nullptr ? Precision::kW4A8 : Precision::kExact; }
  // K elements per activation scale of a W4A8 plan (the weight format's block).
  int activation_block() const { return kernels::weight_format_k_block(w_->format); }
  // The ISA of the kernel this plan's product runs: for a W4A8 plan the W4A8 kernel's (it may be
  // above or below the exact kernel's: avx512_vnni vs avx512, avx2 vs avx512), and the level its
  // activations are quantized at (the best quantizer at or below it).
  kernels::Isa isa() const { return isa_; }
  // A W4A8 plan's activation quantizer: the best at or below isa(), resolved once here (nullptr
  // for an exact plan).
  kernels::QuantizeActivationsFn activation_quantizer() const { return quantizer_; }
  std::string_view kernel_name() const { return w4a8_ != nullptr ? w4a8_->name : kernel_->name; }
  const kernels::KernelInfo& kernel() const { return *kernel_; }
  const kernels::PackedMatrix& weights() const { return *w_; }
  int64_t n_tiles() const { return w_->n_tiles; }
  std::string describe() const;

 private:
  LinearPlan(const kernels::PackedMatrix* w, kernels::Isa isa, const kernels::KernelInfo* k,
             const kernels::W4A8KernelInfo* w4a8, const kernels::Bf16KernelInfo* bf16,
             std::string why)
      : w_(w),
        isa_(isa),
        kernel_(k),
        w4a8_(w4a8),
        bf16_(bf16),
        quantizer_(w4a8 != nullptr ? kernels::best_activation_quantizer(isa)->fn : nullptr),
        why_(std::move(why)) {}
  const kernels::PackedMatrix* w_;
  kernels::Isa isa_;
  const kernels::KernelInfo* kernel_;    // the exact kernel (every plan has one)
  const kernels::W4A8KernelInfo* w4a8_;  // set for W4A8 plans
  const kernels::Bf16KernelInfo* bf16_;  // run_bf16's kernel, or null (widen to F32)
  kernels::QuantizeActivationsFn quantizer_;
  std::string why_;
};

// How many tasks to cut n_tiles into for `threads` threads (the pool hands them out one at a time):
// every thread one task where there are that many tiles, else one per tile; more, up to four per
// thread, so a thread that is descheduled does not hold everyone up, only while each task keeps
// kMinTilesPerTask tiles, and always a whole number per thread. Each task pays its own start: a
// cold stream for the prefetcher, and in the W4A8 kernels the token's layout (one token) or the
// tokens' packing (many). Measured on the 2-core Zen 4, 2 threads, interleaved against four tasks
// per thread always: NVFP4 W4A8 4096 -> 2048 (256 tiles, now 2 tasks) at 64 tokens 424-491 ->
// 489-517 GFLOP/s, at 256 tokens 439-493 -> 497-513; one token in the VM's fast DRAM mode
// (50-62 GB/s) NVFP4 0.74 -> 0.76-0.84 of the bandwidth, MXFP4 0.82 -> 0.90, and alike in the
// slow mode; 4096 -> 14336 (1792 tiles) keeps 8 tasks.
inline constexpr int64_t kMinTilesPerTask = 128;  // 1024 rows
int64_t tile_tasks(int64_t n_tiles, int threads);

}  // namespace fp4moe::dispatch
