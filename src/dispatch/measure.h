// Same-run measurements for benchmarks: the DRAM read bandwidth of this machine with the pool's
// threads, and a GEMM benchmark over a weight set too large for the caches, reported as ratios.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "dispatch/linear.h"
#include "kernels/types.h"
#include "pack/pack.h"

namespace fp4moe::dispatch {

// Best of `repeats` streaming reads of a `bytes` buffer (>= 1 GiB for a DRAM figure), all
// threads of `pool` reading disjoint slices, in GB/s (1e9 bytes per second). The buffer is
// allocated as packed weights are (core/streamed_memory.h); `huge_fraction`, where given, gets
// the fraction of it in huge pages (-1: unknown).
double measure_read_bandwidth_gbps(ThreadPool& pool, size_t bytes, int repeats = 3,
                                   double* huge_fraction = nullptr);

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
  int64_t m = 0, k = 0, n = 0;
  size_t weight_bytes = 0;    // one matrix, codes + scales
  int copies = 0;             // matrices streamed in turn (copies * weight_bytes >= min_bytes)
  double us = 0;              // mean microseconds per product
  double gbps = 0;            // weight bytes per second
  double bandwidth_gbps = 0;  // DRAM read bandwidth measured in the same run
  double bandwidth_ratio = 0;
  double gflops = 0;
  double pack_s_per_gb = 0;  // load-time repack cost (checkpoint layout -> kernel layout)
  int threads = 0;
};

// Packs `copies` matrices of random codes and valid scales, measures the read bandwidth, then
// runs Y = X . W^T over the copies in turn for at least `min_seconds`. A W4A8 product's time
// includes quantizing its activations (as a lone product must).
Result<GemmBenchResult> bench_gemm(kernels::WeightFormat format, std::optional<kernels::Isa> isa,
                                   int64_t m, int64_t k, int64_t n, size_t min_bytes,
                                   double min_seconds, ThreadPool& pool,
                                   Precision precision = Precision::kExact);

}  // namespace fp4moe::dispatch
