// Google Benchmark over every kernel of kernel_list.inc (the exact and the W4A8 families) the host
// can run, at the shapes.
// Each benchmark streams >= 1 GiB of packed weights and reports GB/s beside the DRAM read
// bandwidth measured at start-up in the same process, and their ratio.
#include <benchmark/benchmark.h>

#include <string>
#include <string_view>

#include "core/thread_pool.h"
#include "dispatch/cpu_features.h"
#include "dispatch/measure.h"
#include "kernels/registry.h"

namespace {

using fp4moe::ThreadPool;
using fp4moe::kernels::KernelInfo;

struct Shape {
  int64_t m, k, n;
};
// 4096 x 14336 (a dense FFN), the DeepSeek-V4-Flash expert projections, and small batches.
constexpr Shape kShapes[] = {{1, 4096, 14336}, {1, 4096, 2048},  {1, 2048, 4096},  {2, 4096, 14336},
                             {4, 4096, 14336}, {8, 4096, 14336}, {16, 4096, 14336}};

void run_one(benchmark::State& state, fp4moe::kernels::WeightFormat format,
             fp4moe::kernels::Isa isa, fp4moe::dispatch::Precision precision, Shape s) {
  ThreadPool& pool = ThreadPool::global();
  for (auto _ : state) {
    auto r = fp4moe::dispatch::bench_gemm(format, isa, s.m, s.k, s.n, size_t{1} << 30, 1.0, pool,
                                          precision);
    if (!r.ok()) {
      state.SkipWithError(r.error().message.c_str());
      return;
    }
    state.SetIterationTime(r->us * 1e-6);
    state.counters["GBps"] = r->gbps;
    state.counters["DRAM_GBps"] = r->bandwidth_gbps;
    state.counters["bw_ratio"] = r->bandwidth_ratio;
    state.counters["GFLOPs"] = r->gflops;
  }
}

}  // namespace

void register_shapes(std::string_view kernel_name, fp4moe::kernels::WeightFormat format,
                     fp4moe::kernels::Isa isa, fp4moe::dispatch::Precision precision) {
  if (!fp4moe::dispatch::host_supports(isa)) return;
  if (isa == fp4moe::kernels::Isa::kScalar) return;  // minutes per GiB: test-only
  for (const Shape& s : kShapes) {
    const std::string name = std::string(kernel_name) + "/m" + std::to_string(s.m) + "_k" +
                             std::to_string(s.k) + "_n" + std::to_string(s.n);
    benchmark::RegisterBenchmark(
        name.c_str(), [=](benchmark::State& st) { run_one(st, format, isa, precision, s); })
        ->UseManualTime()
        ->Iterations(1)
        ->Unit(benchmark::kMicrosecond);
  }
}

int main(int argc, char** argv) {
  for (const KernelInfo& k : fp4moe::kernels::all_kernels()) {
    register_shapes(k.name, k.format, k.isa, fp4moe::dispatch::Precision::kExact);
  }
  // The W4A8 family (its time includes quantizing the activations, as a lone product's must).
  for (const fp4moe::kernels::W4A8KernelInfo& k : fp4moe::kernels::all_w4a8_kernels()) {
    register_shapes(k.name, k.format, k.isa, fp4moe::dispatch::Precision::kW4A8);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
