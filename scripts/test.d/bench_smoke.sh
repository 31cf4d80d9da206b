#!/usr/bin/env bash
# Smoke runs of the benchmarks (small sizes, short minimum times): they must run and print their
# ratios; the full sweeps are run by hand (see README "Benchmarks").
set -euo pipefail
cd "$(dirname "$0")/../.."
FP4MOE_BENCH_SMOKE=1 ./build/release/bench_formats --benchmark_min_time=0.05
FP4MOE_BENCH_SMOKE=1 ./build/release/bench_check
.venv/bin/python bench/peers/peers.py --self-test --fp4moe build/release/fp4moe --peaks build/release/bench_peaks
