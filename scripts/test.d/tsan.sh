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
ctest --preset tsan -j "$(nproc)" --timeout 600 | tee "$log"
# Guard against a filter or a discovery that quietly runs nothing: count tests that really passed
# (skipped ones do not count), overall and for the pool's own stress tests. The AVX-512 and AMX
# kernel tests skip on a host without those ISAs: 58 pass on an AVX2-only host (Zen 3), 70 or more
# with AVX-512.
passed=$(grep -cE 'Test +#[0-9]+: .* Passed' "$log" || true)
pool=$(grep -cE 'Test +#[0-9]+: ThreadPool[A-Za-z]*\..* Passed' "$log" || true)
echo "tsan: $passed tests passed under ThreadSanitizer, $pool of them the thread pool's"
(( passed >= 50 && pool >= 4 ))
