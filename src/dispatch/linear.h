// One linear layer's kernel choice, made once when the layer is planned (never inside a loop),
// and the products it runs on the thread pool. describe() says what was chosen and why.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "core/status.h"
#include "core/thread_pool.h"
#include "kernels/registry.h"
#include "kernels/types.h"

namespace fp4moe::dispatch {

class LinearPlan {
 public:
  // Chooses the kernel for `w` (which must outlive the plan): `isa` if given, else the forced ISA
  // (test hook / FP4MOE_ISA), else the best the host supports. An ISA the host lacks, or one the
  // kernel list has no kernel for, is an Error.
  static Result<LinearPlan> create(const kernels::PackedMatrix& w,
                                   std::optional<kernels::Isa> isa = std::nullopt);

  // y[m, n] = x[m, k] . W^T in F32, split over the pool's threads by tile ranges.
  void run(const float* x, int64_t ldx, int64_t m, float* y, int64_t ldy, ThreadPool& pool) const;
  // BF16 activations: widened to F32 (exactly) into `scratch` (>= m * k floats), then as above.
  void run_bf16(const uint16_t* x, int64_t m, float* y, int64_t ldy, std::span<float> scratch,
                ThreadPool& pool) const;
  // Tiles [tile_begin, tile_end) on the calling thread, for callers that build their own tasks.
  void run_tiles(const float* x, int64_t ldx, int64_t m, float* y, int64_t ldy, int64_t tile_begin,
                 int64_t tile_end) const {
    kernel_->fn(*w_, x, ldx, m, y, ldy, tile_begin, tile_end);
  }

  const kernels::KernelInfo& kernel() const { return *kernel_; }
  const kernels::PackedMatrix& weights() const { return *w_; }
  int64_t n_tiles() const { return w_->n_tiles; }
  std::string describe() const;

 private:
  LinearPlan(const kernels::PackedMatrix* w, const kernels::KernelInfo* k, std::string why)
      : w_(w), kernel_(k), why_(std::move(why)) {}
  const kernels::PackedMatrix* w_;
  const kernels::KernelInfo* kernel_;
  std::string why_;
};

// How many tasks to cut n_tiles into for `threads` threads: a few per thread so a thread that is
// descheduled does not hold everyone up, but each task a long contiguous stream for the prefetcher.
int64_t tile_tasks(int64_t n_tiles, int threads);

}  // namespace fp4moe::dispatch
