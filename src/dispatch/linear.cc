// Kernel choice per linear layer and the threaded product (see linear.h).
#include "dispatch/linear.h"

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "dispatch/cpu_features.h"
#include "formats/scalar.h"

namespace fp4moe::dispatch {

namespace {

// Calls fn(begin, end) on the pool for tile_tasks() contiguous ranges covering [0, tiles).
template <class Fn>
void for_tile_ranges(int64_t tiles, ThreadPool& pool, Fn&& fn) {
  const int64_t tasks = tile_tasks(tiles, pool.size());
  pool.run(tasks, [&](int64_t task, int) { fn(tiles * task / tasks, tiles * (task + 1) / tasks); });
}

}  // namespace

std::string_view precision_name(Precision p) { return p == Precision::kW4A8 ? "w4a8" : "w4a16"; }

Result<Precision> parse_precision(std::string_view name) {
  if (name == "w4a16" || name == "exact") return Precision::kExact;
  if (name == "w4a8") return Precision::kW4A8;
  return Error{"unknown precision '" + std::string(name) + "' (w4a16 | w4a8)"};
}

QuantizedActivationBuffer::QuantizedActivationBuffer(int64_t max_rows, int64_t max_k, int block)
    : max_rows_(max_rows),
      max_k_(max_k),
      block_(block),
      q_(static_cast<size_t>(max_rows * max_k)),
      scales_(static_cast<size_t>(max_rows * (max_k / block))),
      offsets_(scales_.size()) {
  // The SIMD quantizers work 8 lanes at a time within a block.
  FP4MOE_CHECK(block >= 8 && block % 8 == 0);
}

void QuantizedActivationBuffer::quantize_rows(const float* x, int64_t ldx, int64_t row0,
                                              int64_t rows, int64_t k,
                                              kernels::QuantizeActivationsFn quantizer) {
  FP4MOE_CHECK(row0 >= 0 && row0 + rows <= max_rows_ && k <= max_k_ && k % block_ == 0);
  const int64_t lds = max_k_ / block_;
  for (int64_t r = row0; r < row0 + rows; ++r) {
    quantizer(x + (r - row0) * ldx, ldx, 1, k, block_, q_.data() + r * max_k_,
              scales_.data() + r * lds, offsets_.data() + r * lds);
  }
}

kernels::QuantizedActivations QuantizedActivationBuffer::view(int64_t row0) const {
  const int64_t lds = max_k_ / block_;
  return kernels::QuantizedActivations{q_.data() + row0 * max_k_, scales_.data() + row0 * lds,
                                       offsets_.data() + row0 * lds, max_k_, lds};
}

kernels::QuantizedActivations QuantizedActivationBuffer::quantize(
    const float* x, int64_t ldx, int64_t m, int64_t k, kernels::QuantizeActivationsFn quantizer,
    ThreadPool& pool) {
  // A few tasks per thread; a single row is one task (cheap next to its product).
  const int64_t tasks = std::max<int64_t>(1, std::min<int64_t>(m, int64_t{pool.size()} * 2));
  pool.run(tasks, [&](int64_t task, int) {
    const int64_t r0 = m * task / tasks, r1 = m * (task + 1) / tasks;
    quantize_rows(x + r0 * ldx, ldx, r0, r1 - r0, k, quantizer);
  });
  return view(0);
}

Result<LinearPlan> LinearPlan::create(const kernels::PackedMatrix& w,
                                      std::optional<kernels::Isa> isa, Precision precision) {
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
  // Each family runs its kernel of the highest ISA level at or below the chosen one (types.h):
  // e.g. the exact family has no avx512_vnni kernel, the W4A8 family no plain avx512 one.
  auto fell_back = [&why, chosen](std::string_view family, kernels::Isa used) {
    if (used != chosen) {
      why += "; no " + std::string(family) + " kernel for " +
             std::string(kernels::isa_name(chosen)) + ", so " +
             std::string(kernels::isa_name(used));
    }
  };
  const kernels::KernelInfo* k = kernels::best_kernel(w.format, chosen);
  if (k == nullptr) {
    return Error{"no " + std::string(kernels::weight_format_name(w.format)) + " kernel for ISA " +
                 std::string(kernels::isa_name(chosen))};
  }
  const kernels::W4A8KernelInfo* w4a8 = nullptr;
  if (precision == Precision::kW4A8) {
    w4a8 = kernels::best_w4a8_kernel(w.format, chosen);
    if (w4a8 == nullptr) {
      return Error{"no W4A8 " + std::string(kernels::weight_format_name(w.format)) +
                   " kernel (W4A8 covers the FP4 formats)"};
    }
    fell_back("W4A8", w4a8->isa);
  } else {
    fell_back("exact", k->isa);
  }
  const kernels::Bf16KernelInfo* bf16 = nullptr;
  if (w4a8 == nullptr) {
    bf16 = kernels::best_bf16_kernel(w.format, chosen);
    if (bf16 != nullptr && bf16->isa < k->isa) bf16 = nullptr;
  }
  // The plan's ISA is that of the kernel its products run on.
  const kernels::Isa used = w4a8 != nullptr ? w4a8->isa : k->isa;
  return LinearPlan(&w, used, k, w4a8, bf16, std::move(why));
}

int64_t tile_tasks(int64_t n_tiles, int threads) {
  if (n_tiles <= threads) return std::max<int64_t>(1, n_tiles);
  // A whole number of tasks per thread (the pool hands tasks out one at a time, so a count just
  // past a multiple of the threads leaves one thread a task longer than the rest): 1 to 4 each.
  const int64_t per_thread = n_tiles / (kMinTilesPerTask * threads);
  return int64_t{threads} * std::clamp<int64_t>(per_thread, 1, 4);
}

void LinearPlan::run_w4a8(const kernels::QuantizedActivations& x, int64_t m, float* y, int64_t ldy,
                          ThreadPool& pool) const {
  FP4MOE_CHECK(w4a8_ != nullptr);
  for_tile_ranges(w_->n_tiles, pool,
                  [&](int64_t begin, int64_t end) { w4a8_->fn(*w_, x, m, y, ldy, begin, end); });
}

void LinearPlan::run_quantizing(const float* x, int64_t ldx, int64_t m, float* y, int64_t ldy,
                                QuantizedActivationBuffer& buffer, ThreadPool& pool) const {
  FP4MOE_CHECK(buffer.block() == activation_block());
  run_w4a8(buffer.quantize(x, ldx, m, w_->k, activation_quantizer(), pool), m, y, ldy, pool);
}

void LinearPlan::run(const float* x, int64_t ldx, int64_t m, float* y, int64_t ldy,
                     ThreadPool& pool) const {
  for_tile_ranges(w_->n_tiles, pool, [&](int64_t begin, int64_t end) {
    kernel_->fn(*w_, x, ldx, m, y, ldy, begin, end);
  });
}

void LinearPlan::run_bf16(const uint16_t* x, int64_t m, float* y, int64_t ldy,
                          std::span<float> scratch, ThreadPool& pool) const {
  if (bf16_ != nullptr) {
    for_tile_ranges(w_->n_tiles, pool, [&](int64_t begin, int64_t end) {
      bf16_->fn(*w_, x, w_->k, m, y, ldy, begin, end);
    });
    return;
  }
  const int64_t count = m * w_->k;
  FP4MOE_CHECK(static_cast<int64_t>(scratch.size()) >= count);
  for (int64_t i = 0; i < count; ++i) scratch[i] = formats::decode_bf16(x[i]);
  run(scratch.data(), w_->k, m, y, ldy, pool);
}

void LinearPlan::run_tiles_bf16(const uint16_t* x, int64_t ldx, int64_t m, float* y, int64_t ldy,
                                int64_t tile_begin, int64_t tile_end) const {
  if (bf16_ != nullptr) {
    bf16_->fn(*w_, x, ldx, m, y, ldy, tile_begin, tile_end);
    return;
  }
  thread_local std::vector<float> widened;
  widened.resize(static_cast<size_t>(m * w_->k));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < w_->k; ++j)
      widened[i * w_->k + j] = formats::decode_bf16(x[i * ldx + j]);
  }
  kernel_->fn(*w_, widened.data(), w_->k, m, y, ldy, tile_begin, tile_end);
}

std::string LinearPlan::describe() const {
  return std::string(kernels::weight_format_name(w_->format)) + " [N=" + std::to_string(w_->n) +
         ", K=" + std::to_string(w_->k) + "] -> " + std::string(kernel_name()) + " (" +
         std::string(kernels::isa_name(isa_)) + ": " + why_ +
         (w4a8_ != nullptr ? "; W4A8: int8 activations per " + std::to_string(activation_block()) +
                                 "-element block"
                           : "") +
         (bf16_ != nullptr ? "; BF16 activations: " + std::string(bf16_->name) : "") +
         "; host: " + cpu_features().summary() + ")";
}

}  // namespace fp4moe::dispatch
