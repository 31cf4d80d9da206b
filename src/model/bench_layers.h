// Benchmark of a checkpoint's own MoE layers on this CPU: microseconds per layer call against the
// bytes-read / bandwidth bound, the bandwidth measured in the same run.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/status.h"
#include "dispatch/linear.h"

namespace fp4moe::model {

struct LayerBench {
  int layer = 0;
  std::string expert_scheme;
  std::string precision;  // "w4a16" (exact) or "w4a8"
  int64_t batch = 0;
  int64_t calls = 0;
  double us = 0;              // mean per layer call
  double bytes_per_call = 0;  // weight bytes the layer streamed per call (mean)
  double bandwidth_gbps = 0;  // DRAM read bandwidth, all threads, read between the rounds
  double bound_us = 0;        // bytes_per_call / bandwidth
  double ratio_to_bound = 0;  // us / bound_us
};

struct LayerBenchOptions {
  std::vector<int> layers;  // empty: every MoE layer
  int64_t batch = 1;
  double min_seconds = 0.5;
  uint32_t seed = 7;
  dispatch::Precision precision = dispatch::Precision::kExact;
};

Result<std::vector<LayerBench>> bench_checkpoint_layers(const std::filesystem::path& dir,
                                                        const LayerBenchOptions& options);

}  // namespace fp4moe::model
