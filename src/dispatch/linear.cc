// Kernel choice per linear layer and the threaded product (see linear.h).
#include "dispatch/linear.h"

#include <algorithm>
#include <cstdlib>

#include "dispatch/cpu_features.h"
#include "formats/scalar.h"

namespace fp4moe::dispatch {

Result<LinearPlan> LinearPlan::create(const kernels::PackedMatrix& w,
                                      std::optional<kernels::Isa> isa) {
  std::string why;
  kernels::Isa chosen;
  if (isa) {
    chosen = *isa;
    why = "requested by the caller";
  } else if (auto forced = forced_isa()) {
    chosen = *forced;
    why = "forced (test hook or FP4MOE_ISA)";
  } else {
    if (const char* env = std::getenv("FP4MOE_ISA"); env != nullptr && *env != '\0') {
      auto parsed = parse_isa(env);
      if (!parsed.ok()) return Error{"FP4MOE_ISA: " + parsed.error().message};
    }
    chosen = best_host_isa();
    why = "best ISA of this host";
  }
  if (!host_supports(chosen)) {
    return Error{"ISA " + std::string(kernels::isa_name(chosen)) +
                 " is not supported by this host (" + cpu_features().summary() + ")"};
  }
  const kernels::KernelInfo* k = kernels::find_kernel(w.format, chosen);
  if (k == nullptr) {
    return Error{"no " + std::string(kernels::weight_format_name(w.format)) + " kernel for ISA " +
                 std::string(kernels::isa_name(chosen))};
  }
  return LinearPlan(&w, k, std::move(why));
}

int64_t tile_tasks(int64_t n_tiles, int threads) {
  return std::max<int64_t>(1, std::min<int64_t>(n_tiles, int64_t{threads} * 4));
}

void LinearPlan::run(const float* x, int64_t ldx, int64_t m, float* y, int64_t ldy,
                     ThreadPool& pool) const {
  const int64_t tiles = w_->n_tiles;
  const int64_t tasks = tile_tasks(tiles, pool.size());
  pool.run(tasks, [&](int64_t task, int) {
    const int64_t begin = tiles * task / tasks;
    const int64_t end = tiles * (task + 1) / tasks;
    kernel_->fn(*w_, x, ldx, m, y, ldy, begin, end);
  });
}

void LinearPlan::run_bf16(const uint16_t* x, int64_t m, float* y, int64_t ldy,
                          std::span<float> scratch, ThreadPool& pool) const {
  const int64_t count = m * w_->k;
  FP4MOE_CHECK(static_cast<int64_t>(scratch.size()) >= count);
  for (int64_t i = 0; i < count; ++i) scratch[i] = formats::decode_bf16(x[i]);
  run(scratch.data(), w_->k, m, y, ldy, pool);
}

std::string LinearPlan::describe() const {
  return std::string(kernels::weight_format_name(w_->format)) + " [N=" + std::to_string(w_->n) +
         ", K=" + std::to_string(w_->k) + "] -> " + std::string(kernel_->name) + " (" +
         std::string(kernels::isa_name(kernel_->isa)) + ": " + why_ +
         "; host: " + cpu_features().summary() + ")";
}

}  // namespace fp4moe::dispatch
