// Bandwidth and GEMM measurements (see measure.h).
#include "dispatch/measure.h"

#include <emmintrin.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "core/streamed_memory.h"
#include "dispatch/linear.h"
#include "kernels/registry.h"
#include "pack/pack.h"

namespace fp4moe::dispatch {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// SSE2 loads (baseline x86-64, so no dispatch needed): 16 bytes per load is far beyond what DRAM
// delivers per core, so the figure is the memory system's, not the loop's.
uint64_t read_slice(const uint8_t* p, size_t bytes) {
  const __m128i* v = reinterpret_cast<const __m128i*>(p);
  __m128i a = _mm_setzero_si128(), b = a, c = a, d = a;
  const size_t n = bytes / 64;
  for (size_t i = 0; i < n; ++i) {
    a = _mm_xor_si128(a, _mm_load_si128(v + 4 * i));
    b = _mm_xor_si128(b, _mm_load_si128(v + 4 * i + 1));
    c = _mm_xor_si128(c, _mm_load_si128(v + 4 * i + 2));
    d = _mm_xor_si128(d, _mm_load_si128(v + 4 * i + 3));
  }
  const __m128i x = _mm_xor_si128(_mm_xor_si128(a, b), _mm_xor_si128(c, d));
  return static_cast<uint64_t>(_mm_cvtsi128_si64(x));
}

}  // namespace

double measure_read_bandwidth_gbps(ThreadPool& pool, size_t bytes, int repeats,
                                   double* huge_fraction) {
  bytes = bytes / 4096 * 4096;
  // Allocated as the packed weights are (core/streamed_memory.h), so the kernels' fractions of
  // this figure compare reads made under the same page conditions.
  const StreamedBuffer buf = allocate_streamed(bytes);
  FP4MOE_CHECK(buf != nullptr);
  std::memset(buf.get(), 1, bytes);  // fault every page in before timing
  if (huge_fraction != nullptr) *huge_fraction = huge_page_fraction(buf.get(), bytes);
  const int threads = pool.size();
  std::vector<uint64_t> sink(threads);
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    pool.run(threads, [&](int64_t task, int) {
      const size_t slice = bytes / threads / 64 * 64;
      sink[task] = read_slice(buf.get() + slice * task, slice);
    });
    const double s = seconds_since(t0);
    best = std::max(best, static_cast<double>(bytes) / s / 1e9);
  }
  // The xor result is data-dependent output: the compiler cannot drop the reads.
  volatile uint64_t keep = 0;
  for (uint64_t v : sink) keep = keep ^ v;
  return best;
}

RandomMatrix::RandomMatrix(kernels::WeightFormat f, int64_t rows, int64_t cols,
                           std::mt19937_64& rng)
    : format(f), n(rows), k(cols) {
  auto fill = [&rng](std::vector<uint8_t>& v, int lo, int hi) {
    std::uniform_int_distribution<int> d(lo, hi);
    for (uint8_t& b : v) b = static_cast<uint8_t>(d(rng));
  };
  switch (f) {
    case kernels::WeightFormat::kNvfp4:
      codes.resize(static_cast<size_t>(n * k / 2));
      scales.resize(static_cast<size_t>(n * k / 16));
      fill(codes, 0, 255);
      fill(scales, 0x30, 0x40);
      break;
    case kernels::WeightFormat::kMxfp4:
      codes.resize(static_cast<size_t>(n * k / 2));
      scales.resize(static_cast<size_t>(n * k / 32));
      fill(codes, 0, 255);
      fill(scales, 118, 122);
      break;
    case kernels::WeightFormat::kFp8Block128:
      codes.resize(static_cast<size_t>(n * k));
      fill(codes, 0, 0x5F);  // magnitudes up to 2^4, never the NaN code 0x7F
      for (size_t i = 0; i < codes.size(); i += 2) codes[i] |= 0x80;  // half of them negative
      fp8_scales.assign(static_cast<size_t>((n + 127) / 128 * ((k + 127) / 128)), 1.0f / 1024.0f);
      break;
  }
}

Result<pack::PackedWeights> RandomMatrix::pack() const {
  switch (format) {
    case kernels::WeightFormat::kNvfp4:
      return pack::pack_nvfp4("bench", codes, scales, 0.05f, n, k);
    case kernels::WeightFormat::kMxfp4:
      return pack::pack_mxfp4("bench", codes, scales, n, k);
    case kernels::WeightFormat::kFp8Block128:
      return pack::pack_fp8_block128("bench", codes, fp8_scales, n, k);
  }
  return Error{"bench: unknown format"};
}

Result<GemmBenchResult> bench_gemm(kernels::WeightFormat format, std::optional<kernels::Isa> isa,
                                   int64_t m, int64_t k, int64_t n, size_t min_bytes,
                                   double min_seconds, ThreadPool& pool, Precision precision) {
  if (m < 1 || k < 1 || n < 1) return Error{"bench: m, k and n must be positive"};
  if (k % kernels::weight_format_k_block(format) != 0) {
    return Error{"bench: K = " + std::to_string(k) + " is not a multiple of the " +
                 std::string(kernels::weight_format_name(format)) + " block"};
  }
  std::mt19937_64 rng(1234);
  const RandomMatrix source(format, n, k, rng);
  auto pack_one = [&source] { return source.pack(); };

  GemmBenchResult r;
  r.format = kernels::weight_format_name(format);
  r.m = m;
  r.k = k;
  r.n = n;
  r.threads = pool.size();
  std::vector<pack::PackedWeights> set;
  const auto pack_t0 = Clock::now();
  {
    auto first = pack_one();
    if (!first.ok()) return first.error();
    set.push_back(std::move(first).value());
  }
  const double pack_s = seconds_since(pack_t0);
  r.weight_bytes = set[0].streamed_bytes();
  const size_t checkpoint_bytes = source.bytes();
  r.pack_s_per_gb = pack_s / (static_cast<double>(checkpoint_bytes) / 1e9);
  r.copies = static_cast<int>((min_bytes + r.weight_bytes - 1) / r.weight_bytes);
  if (r.copies < 1) r.copies = 1;
  for (int c = 1; c < r.copies; ++c) {
    auto more = pack_one();
    if (!more.ok()) return more.error();
    set.push_back(std::move(more).value());
  }
  std::vector<LinearPlan> plans;
  for (const pack::PackedWeights& w : set) {
    auto plan = LinearPlan::create(w.view(), isa, precision);
    if (!plan.ok()) return plan.error();
    plans.push_back(std::move(plan).value());
  }
  r.isa = kernels::isa_name(plans[0].isa());
  r.kernel = plans[0].kernel_name();
  r.precision = precision_name(precision);

  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(m * k), y(m * n);
  for (float& v : x) v = normal(rng);

  const size_t bandwidth_bytes = std::max<size_t>(min_bytes, size_t{1} << 30);
  const double bandwidth_before = measure_read_bandwidth_gbps(pool, bandwidth_bytes);
  QuantizedActivationBuffer quantized;  // W4A8 only
  if (precision == Precision::kW4A8) {
    quantized = QuantizedActivationBuffer(m, k, kernels::weight_format_k_block(format));
  }
  auto product = [&](const LinearPlan& p) {
    if (precision == Precision::kW4A8) {
      p.run_quantizing(x.data(), k, m, y.data(), n, quantized, pool);
    } else {
      p.run(x.data(), k, m, y.data(), n, pool);
    }
  };
  // One warm-up pass over the set, then whole passes until min_seconds.
  for (const LinearPlan& p : plans) product(p);
  int64_t products = 0;
  const auto t0 = Clock::now();
  double elapsed = 0;
  do {
    for (const LinearPlan& p : plans) product(p);
    products += static_cast<int64_t>(plans.size());
    elapsed = seconds_since(t0);
  } while (elapsed < min_seconds);
  // This machine's bandwidth drifts by +-15% between runs (a shared host): measured before and
  // after the timed loop, the better figure is the reference, so a ratio errs on the low side.
  r.bandwidth_gbps = std::max(bandwidth_before, measure_read_bandwidth_gbps(pool, bandwidth_bytes));
  const double s = elapsed / static_cast<double>(products);
  r.us = s * 1e6;
  r.gbps = static_cast<double>(r.weight_bytes) / s / 1e9;
  r.bandwidth_ratio = r.gbps / r.bandwidth_gbps;
  r.gflops = 2.0 * static_cast<double>(m * n * k) / s / 1e9;
  return r;
}

}  // namespace fp4moe::dispatch
