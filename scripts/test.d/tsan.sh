#!/usr/bin/env bash
# The thread pool's stress tests and the kernel/dispatch and MoE tests under ThreadSanitizer
# (preset "tsan"). The latter run the pool from several threads (ThreadPool(3) in dispatch,
# ThreadPool::global() in the MoE layer), so a data race there, in the pool or in a kernel
# writing another task's rows, is a report. The test preset sets TSAN_OPTIONS
# (halt_on_error=1:second_deadlock_stack=1:exitcode=66): any report fails its test.
set -euo pipefail
cd "$(dirname "$0")/../.."

# GCC's TSan runtime ships with g++ (package libtsan2); without it the link fails obscurely.
cxx="${CXX:-c++}"
libtsan="$("$cxx" -print-file-name=libtsan.so)"
if [[ "$libtsan" != /* || ! -e "$libtsan" ]]; then
  echo "tsan: $cxx has no libtsan.so (Debian: apt-get install libtsan2)"
  exit 1
fi

cmake --preset tsan >/dev/null
cmake --build --preset tsan -j "$(nproc)" --target test_core test_kernels test_moe
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
expected=$(ctest --preset tsan -N | grep -oP '^Total Tests: \K[0-9]+')
ctest --preset tsan -j "$(nproc)" --timeout 600 | tee "$log"
# Guard against a filter or a discovery that quietly runs nothing: every test listed must have run.
ran=$(grep -oP 'tests passed, [0-9]+ tests failed out of \K[0-9]+' "$log" || echo 0)
echo "tsan: $ran of $expected tests ran under ThreadSanitizer"
(( ran == expected && ran >= 70 ))
