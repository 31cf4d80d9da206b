// Bandwidth and GEMM measurements (see measure.h).
#include "dispatch/measure.h"

#include <emmintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "core/streamed_memory.h"
#include "dispatch/linear.h"
#include "formats/scalar.h"
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

ReadProbe::ReadProbe(ThreadPool& pool, size_t bytes)
    : pool_(&pool),
      bytes_(bytes / 4096 * 4096),
      buf_(allocate_streamed(bytes_)),
      sink_(static_cast<size_t>(pool.size())) {
  FP4MOE_CHECK(buf_ != nullptr);
  std::memset(buf_.get(), 1, bytes_);  // fault every page in before timing
}

double ReadProbe::huge_fraction() const { return huge_page_fraction(buf_.get(), bytes_); }

double ReadProbe::gbps(int repeats) {
  const int threads = pool_->size();
  const size_t slice = bytes_ / static_cast<size_t>(threads) / 64 * 64;
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    pool_->run(threads, [&](int64_t task, int) {
      sink_[task] = read_slice(buf_.get() + slice * task, slice);
    });
    const double s = seconds_since(t0);
    best = std::max(best, static_cast<double>(slice * threads) / s / 1e9);
  }
  // The xor result is data-dependent output: the compiler cannot drop the reads.
  volatile uint64_t keep = 0;
  for (uint64_t v : sink_) keep = keep ^ v;
  return best;
}

double measure_read_bandwidth_gbps(ThreadPool& pool, size_t bytes, int repeats,
                                   double* huge_fraction) {
  ReadProbe probe(pool, bytes);
  if (huge_fraction != nullptr) *huge_fraction = probe.huge_fraction();
  return probe.gbps(repeats);
}

void RoundBound::add(double round_bytes, double round_seconds, double probe_gbps) {
  bytes += round_bytes;
  seconds += round_seconds;
  bound_seconds += round_bytes / (probe_gbps * 1e9);
  min_gbps = rounds == 0 ? probe_gbps : std::min(min_gbps, probe_gbps);
  max_gbps = std::max(max_gbps, probe_gbps);
  ++rounds;
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
                                   double min_seconds, ThreadPool& pool, Precision precision,
                                   bool bf16_activations) {
  if (m < 1 || k < 1 || n < 1) return Error{"bench: m, k and n must be positive"};
  if (bf16_activations && precision == Precision::kW4A8) {
    return Error{
        "bench: BF16 activations go with the exact (w4a16) precision; W4A8 quantizes "
        "F32 activations"};
  }
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
  if (bf16_activations) {
    r.activations = "bf16";
    if (plans[0].bf16_kernel() != nullptr) r.kernel = plans[0].bf16_kernel()->name;
  }

  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(m * k), y(m * n);
  for (float& v : x) v = normal(rng);
  std::vector<uint16_t> x16;  // BF16 activations only
  std::vector<float> widened;
  if (bf16_activations) {
    x16.resize(x.size());
    for (size_t i = 0; i < x.size(); ++i) x16[i] = formats::encode_bf16(x[i]);
    widened.resize(x.size());
  }

  ReadProbe probe(pool, std::max<size_t>(min_bytes, size_t{1} << 30));
  QuantizedActivationBuffer quantized;  // W4A8 only
  if (precision == Precision::kW4A8) {
    quantized = QuantizedActivationBuffer(m, k, kernels::weight_format_k_block(format));
  }
  auto product = [&](const LinearPlan& p) {
    if (precision == Precision::kW4A8) {
      p.run_quantizing(x.data(), k, m, y.data(), n, quantized, pool);
    } else if (bf16_activations) {
      p.run_bf16(x16.data(), m, y.data(), n, widened, pool);
    } else {
      p.run(x.data(), k, m, y.data(), n, pool);
    }
  };
  // One warm-up pass over the set, then timed passes in rounds (run_rounds).
  for (const LinearPlan& p : plans) product(p);
  const double pass_bytes = static_cast<double>(r.weight_bytes) * static_cast<double>(plans.size());
  int64_t products = 0;
  auto timed = run_rounds(probe, min_seconds, 1, [&]() -> Result<StepCost> {
    const auto t0 = Clock::now();
    for (const LinearPlan& p : plans) product(p);
    products += static_cast<int64_t>(plans.size());
    return StepCost{pass_bytes, seconds_since(t0)};
  });
  if (!timed.ok()) return timed.error();
  const RoundBound& bound = *timed;
  const double s = bound.seconds / static_cast<double>(products);
  r.us = s * 1e6;
  r.gbps = bound.gbps();
  r.bandwidth_gbps = bound.bandwidth();
  r.bandwidth_ratio = 1.0 / bound.ratio();
  r.bandwidth_min_gbps = bound.min_gbps;
  r.bandwidth_max_gbps = bound.max_gbps;
  r.bandwidth_rounds = bound.rounds;
  r.gflops = 2.0 * static_cast<double>(m * n * k) / s / 1e9;
  return r;
}

}  // namespace fp4moe::dispatch
