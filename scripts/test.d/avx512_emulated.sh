#!/usr/bin/env bash
# The kernel and MoE tests again with the AVX-512 and AVX-512 VNNI kernels run through SIMDe's
# portable AVX-512 (preset "avx512-emulated"), so hosts without AVX-512 still test those kernels'
# logic: bit-exactness against the scalar kernels, the FP64 oracles, the MoE reference. The build
# is under ASan+UBSan, so every kernel's loads and stores (SIMDe's emulated ones and the host's
# native AVX2 ones) are also bounds-checked. On a host with AVX-512 the release build's ctest has
# already run them natively. Says nothing about speed.
set -euo pipefail
cd "$(dirname "$0")/../.."

cmake --preset avx512-emulated >/dev/null
# fp4moe_c too: capi_asan.sh runs the C ABI tests on this build's libfp4moe.so.
cmake --build --preset avx512-emulated -j "$(nproc)" --target test_kernels test_moe fp4moe_c
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
ctest --preset avx512-emulated -j "$(nproc)" | tee "$log"
# The emulated build must really have run the AVX-512 kernels, not skipped them for the host.
ran=$(grep -cE 'Test +#[0-9]+: .*avx512.* Passed' "$log" || true)
echo "avx512-emulated: $ran tests of AVX-512 kernels passed under emulation"
(( ran >= 10 ))
