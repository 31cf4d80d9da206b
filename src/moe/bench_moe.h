// The MoE-layer benchmark behind `fp4moe bench --moe`: one DeepSeek-V4-Flash layer (256 routed
// experts, top-6, one shared FP8 expert, hidden 4096, expert width 2048) timed against the
// bytes-read / measured-bandwidth bound of each call, in the same run.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "core/status.h"
#include "core/thread_pool.h"
#include "dispatch/linear.h"
#include "kernels/types.h"
#include "moe/moe_layer.h"

namespace fp4moe::moe {

struct MoeBenchResult {
  std::string format, isa, layer, precision;
  int64_t batch = 0;
  int64_t calls = 0;
  double us = 0;  // mean microseconds per layer call
  double bytes_per_call =
      0;  // mean weight bytes read per call (distinct experts + shared + router)
  // DRAM read bandwidth measured between the timed rounds: the run's bytes over the sum of each
  // round's bytes / the figure read just before it (dispatch::RoundBound).
  double bandwidth_gbps = 0;
  double bandwidth_min_gbps = 0, bandwidth_max_gbps = 0;  // the probe's range over the rounds
  int bandwidth_rounds = 0;                               // timed rounds, each after one probe read
  double bound_us = 0;                                    // bytes_per_call / bandwidth
  double ratio_to_bound = 0;  // us / bound_us (1.0 = at the memory bound)
  double pack_s_per_gb = 0;
  int threads = 0;
  // Mean microseconds per call of each phase (MoePhase order), and the thread hand-offs: the pool
  // jobs a call starts times the latency of an empty job on this pool, measured in the same run.
  double phase_us[kMoePhases] = {};
  int pool_jobs_per_call = 0;
  double empty_job_us = 0;
  double handoff_us() const { return pool_jobs_per_call * empty_job_us; }
  nlohmann::ordered_json to_json() const;
  nlohmann::ordered_json phases_json() const;
  std::string summary() const;
  // One line per phase: microseconds per call and share of the call.
  std::string phase_table() const;
};

Result<MoeBenchResult> bench_moe_layer(kernels::WeightFormat routed_format,
                                       std::optional<kernels::Isa> isa, int64_t batch,
                                       size_t min_bandwidth_bytes, double min_seconds,
                                       ThreadPool& pool,
                                       dispatch::Precision precision = dispatch::Precision::kExact);

}  // namespace fp4moe::moe
