// Same-run measurements for benchmarks: the DRAM read bandwidth of this machine with the pool's
// threads, and a GEMM benchmark over a weight set too large for the caches, reported as ratios.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/streamed_memory.h"
#include "core/thread_pool.h"
#include "dispatch/linear.h"
#include "kernels/types.h"
#include "pack/pack.h"

namespace fp4moe::dispatch {

// A buffer (>= 1 GiB for a DRAM figure) that all threads of a pool read in disjoint slices, on
// demand, in GB/s (1e9 bytes per second). Allocated as packed weights are
// (core/streamed_memory.h). A VM's DRAM bandwidth can change within seconds: on the 2-core Zen 4
// host of stop 27, two threads read one such buffer at 34-37 GB/s for tens of seconds, then at
// 60-68 GB/s, and back, in one process, while one thread read 30-34 GB/s throughout and a
// two-thread FMA loop ran at one rate (the two vCPUs sharing one memory link, or not). So the
// benchmarks read it between their timed rounds and judge each round by the figure measured beside
// it (RoundBound), not by one figure from before or after the run.
class ReadProbe {
 public:
  ReadProbe(ThreadPool& pool, size_t bytes);
  // Best of `repeats` whole reads of the buffer.
  double gbps(int repeats = 1);
  // The fraction of the buffer in huge pages (-1: unknown).
  double huge_fraction() const;
  size_t bytes() const { return bytes_; }

 private:
  ThreadPool* pool_;
  size_t bytes_;
  StreamedBuffer buf_;
  std::vector<uint64_t> sink_;
};

// Best of `repeats` reads by a fresh ReadProbe of `bytes`; `huge_fraction`, where given, gets the
// fraction of it in huge pages (-1: unknown).
double measure_read_bandwidth_gbps(ThreadPool& pool, size_t bytes, int repeats = 3,
                                   double* huge_fraction = nullptr);

// Timed rounds, each judged by the bandwidth read just before it: the round's bytes at that
// bandwidth is its bound. bandwidth() is the figure the whole run's bytes had (bytes over the sum
// of the bounds), ratio() the run's time over the sum of the bounds (1.0 = at the bandwidth), so
// gbps() / bandwidth() = 1 / ratio() exactly.
struct RoundBound {
  double bytes = 0, seconds = 0, bound_seconds = 0;
  double min_gbps = 0, max_gbps = 0;  // the probe's figures over the rounds
  int rounds = 0;
  void add(double round_bytes, double round_seconds, double probe_gbps);
  double gbps() const { return bytes / seconds / 1e9; }
  double bandwidth() const { return bytes / bound_seconds / 1e9; }
  double ratio() const { return seconds / bound_seconds; }
};

// One timed step of a benchmark: the weight bytes it read and the seconds it took.
struct StepCost {
  double bytes = 0, seconds = 0;
};

// The timing loop of every benchmark that divides by the bandwidth: rounds of steps lasting at
// least kRoundSeconds, each round after one read of `probe` and judged by it, until the steps took
// min_seconds in all and ran at least min_steps times. `step()` returns Result<StepCost>; its
// first error ends the run.
inline constexpr double kRoundSeconds = 0.05;

template <class Step>
Result<RoundBound> run_rounds(ReadProbe& probe, double min_seconds, int64_t min_steps,
                              Step&& step) {
  RoundBound bound;
  int64_t steps = 0;
  do {
    const double probe_gbps = probe.gbps();
    StepCost round;
    do {
      auto cost = step();
      if (!cost.ok()) return cost.error();
      round.bytes += cost->bytes;
      round.seconds += cost->seconds;
      ++steps;
    } while (round.seconds < kRoundSeconds);
    bound.add(round.bytes, round.seconds, probe_gbps);
  } while (bound.seconds < min_seconds || steps < min_steps);
  return bound;
}

// Random checkpoint-layout data for one [n, k] matrix of `format`: uniform codes (no NaN) and
// scales that keep weights small (~2^-7 .. 2^-3), so benchmarks of whole layers stay finite.
// Shared by the GEMM and MoE-layer benchmarks.
struct RandomMatrix {
  kernels::WeightFormat format;
  int64_t n, k;
  std::vector<uint8_t> codes, scales;  // FP4 codes + block scales, or FP8 codes
  std::vector<float> fp8_scales;       // FP8 block-128 only

  RandomMatrix(kernels::WeightFormat format, int64_t n, int64_t k, std::mt19937_64& rng);
  size_t bytes() const { return codes.size() + scales.size() + sizeof(float) * fp8_scales.size(); }
  Result<pack::PackedWeights> pack() const;
};

struct GemmBenchResult {
  std::string format, isa, kernel, precision;
  std::string activations = "f32";  // "bf16": run_bf16 (BF16 activations, converted once)
  int64_t m = 0, k = 0, n = 0;
  size_t weight_bytes = 0;     // one matrix, codes + scales
  int copies = 0;              // matrices streamed in turn (copies * weight_bytes >= min_bytes)
  double us = 0;               // mean microseconds per product
  double gbps = 0;             // weight bytes per second
  double bandwidth_gbps = 0;   // DRAM read bandwidth measured between the timed rounds (RoundBound)
  double bandwidth_ratio = 0;  // gbps / bandwidth_gbps
  double bandwidth_min_gbps = 0, bandwidth_max_gbps = 0;  // the probe's range over the rounds
  int bandwidth_rounds = 0;  // timed rounds, each after one probe read (run_rounds)
  double gflops = 0;
  double pack_s_per_gb = 0;  // load-time repack cost (checkpoint layout -> kernel layout)
  int threads = 0;
};

// Packs `copies` matrices of random codes and valid scales, then runs Y = X . W^T over the copies
// in turn for at least `min_seconds`, in rounds of one pass over the copies, each after a read of
// a ReadProbe of max(min_bytes, 1 GiB) (RoundBound). A W4A8 product's time
// includes quantizing its activations (as a lone product must). `bf16_activations` (exact plans
// only): the activations are BF16 and each product is LinearPlan::run_bf16, its time including a
// widening to F32 where the plan does that.
Result<GemmBenchResult> bench_gemm(kernels::WeightFormat format, std::optional<kernels::Isa> isa,
                                   int64_t m, int64_t k, int64_t n, size_t min_bytes,
                                   double min_seconds, ThreadPool& pool,
                                   Precision precision = Precision::kExact,
                                   bool bf16_activations = false);

}  // namespace fp4moe::dispatch
