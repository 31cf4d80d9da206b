#!/usr/bin/env bash
# The Python tests of the C ABI (bounds, format and kernel oracles, transcoding) against
# libfp4moe.so built under ASan+UBSan, so a buffer the C ABI reads or writes past its end is a
# heap-buffer-overflow report, not silent corruption. test_capi_bounds.py allocates every short
# buffer at exactly its size to make that so. Python leaks by design: leak checks off.
# The library is the one of the ASan+UBSan build avx512_emulated.sh made (preset
# "avx512-emulated": one sanitizer build of the library for both, not two): its kernels are the
# host's native ones plus the AVX-512 ones compiled against SIMDe, whose loads and stores are the
# same source's, so a C ABI bounds error in either is reported here. (Preset "asan", the native
# kernels only, remains for by-hand runs.)
set -euo pipefail
cd "$(dirname "$0")/../.."

start=$(date +%s)
cmake --preset avx512-emulated >/dev/null
cmake --build --preset avx512-emulated -j "$(nproc)" --target fp4moe_c
build="$PWD/build/avx512-emulated"
# The library must really be instrumented (the preset could have been reconfigured without it).
if ! readelf -d "$build/libfp4moe.so" | grep -q 'NEEDED.*libasan'; then
  echo "capi_asan: $build/libfp4moe.so is not linked against libasan"
  exit 1
fi

# ASan must be the first library loaded, before the interpreter's own allocations; libubsan comes
# in as a dependency of libfp4moe.so. The runtime of the compiler the preset builds with (GCC's).
cxx="${CXX:-c++}"
libasan="$("$cxx" -print-file-name=libasan.so)"
if [[ "$libasan" != /* || ! -e "$libasan" ]]; then
  echo "capi_asan: $cxx has no libasan.so"
  exit 1
fi
export LD_PRELOAD="$libasan"
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export FP4MOE_BUILD_DIR="$build"
asan_loaded='import ctypes, sys; sys.exit(not hasattr(ctypes.CDLL(None), "__asan_init"))'
if ! .venv/bin/python -c "$asan_loaded"; then
  echo "capi_asan: __asan_init does not resolve in the Python process (LD_PRELOAD=$LD_PRELOAD)"
  exit 1
fi
# Inside pytest, test_runs_under_asan_when_asked checks the same and that the library came from
# $build; it skips unless FP4MOE_EXPECT_ASAN=1, so any skip fails this script.
export FP4MOE_EXPECT_ASAN=1
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
# --capture=sys: pytest must not swallow fd 2, where ASan and UBSan write their reports.
.venv/bin/python -m pytest -p no:cacheprovider -q -rs --capture=sys \
  tests/python/test_capi_bounds.py tests/python/test_formats_oracle.py \
  tests/python/test_kernels_oracle.py tests/python/test_transcode_oracle.py | tee "$log"
if grep -qE "[0-9]+ (skipped|deselected)" "$log"; then
  echo "capi_asan: some tests did not run"
  exit 1
fi
echo "capi_asan: passed under ASan+UBSan in $(( $(date +%s) - start )) s"
