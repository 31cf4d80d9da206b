#!/usr/bin/env bash
# Builds the libFuzzer target of the safetensors header parser under ASan+UBSan (preset "fuzz")
# and runs it for a bounded time, seeded from the adversarial corpus. Prints executions and time.
#   FP4MOE_FUZZ_SECONDS (default 60)  how long to fuzz
set -euo pipefail
cd "$(dirname "$0")/../.."

seconds="${FP4MOE_FUZZ_SECONDS:-60}"
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "$(nproc)" --target fuzz_safetensors_header

# A scratch corpus: the committed adversarial files are seeds, never overwritten by the fuzzer.
corpus="$(mktemp -d)"
trap 'rm -rf "$corpus"' EXIT
cp tests/data/adversarial/files/*.safetensors "$corpus"/
find tests/data/adversarial/dirs -name '*.safetensors' -exec sh -c \
  'for f; do cp "$f" "$0/dir_$(echo "$f" | tr / _)"; done' "$corpus" {} +

log="$corpus/fuzz.log"
start=$(date +%s)
# -max_len: the bombs are 100 KB; let mutations grow a little past them.
if ! ./build/fuzz/fuzz/fuzz_safetensors_header "$corpus" -max_total_time="$seconds" \
    -max_len=131072 -print_final_stats=1 -detect_leaks=1 >"$log" 2>&1; then
  tail -n 60 "$log"
  echo "fuzz: FAILED (crash or sanitizer report above)"
  exit 1
fi
end=$(date +%s)
# A fuzzer that exits 0 without running anything (a harness that exits early, a build without
# libFuzzer's driver) must not pass: -print_final_stats=1 ends the log with the number of
# executed inputs, and it must be there and positive.
execs=$(grep -oP '^stat::number_of_executed_units:\s*\K[0-9]+' "$log" | tail -n 1 || true)
if [[ -z "$execs" || "$execs" -eq 0 ]]; then
  tail -n 60 "$log"
  echo "fuzz: FAILED (libFuzzer reported ${execs:-no} executions; see the log above)"
  exit 1
fi
speed=$(grep -oP 'stat::average_exec_per_sec:\s*\K[0-9]+' "$log" || echo "?")
cov=$(grep -oP '#[0-9]+\s+DONE\s+cov: \K[0-9]+' "$log" || echo "?")
echo "fuzz: safetensors header parser (ASan+UBSan): $execs executions in $((end - start)) s" \
     "($speed/s), coverage $cov edges, no crashes"
