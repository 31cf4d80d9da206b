#!/usr/bin/env bash
# Builds the libFuzzer targets under ASan+UBSan (preset "fuzz") and runs each for a bounded
# time: the safetensors header parser (seeded from the adversarial files) and config detection
# (seeded from the real configs of the corpus). Prints executions and time.
#   FP4MOE_FUZZ_SECONDS (default 60)  how long to fuzz
set -euo pipefail
cd "$(dirname "$0")/../.."

seconds="${FP4MOE_FUZZ_SECONDS:-60}"
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "$(nproc)" --target fuzz_safetensors_header fuzz_config_detect

# Scratch corpora: the committed files are seeds, never overwritten by the fuzzer.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir "$work/safetensors" "$work/config"
cp tests/data/adversarial/files/*.safetensors "$work/safetensors"/
find tests/data/adversarial/dirs -name '*.safetensors' -exec sh -c \
  'for f; do cp "$f" "$0/dir_$(echo "$f" | tr / _)"; done' "$work/safetensors" {} +
# Every real config of the corpus (config.json, hf_quant_config.json) seeds the config target.
find tests/data/corpus -name '*.json' -exec sh -c \
  'for f; do cp "$f" "$0/$(echo "$f" | tr / _)"; done' "$work/config" {} +

# run_fuzzer TARGET CORPUS MAX_LEN WHAT
run_fuzzer() {
  local target="$1" corpus="$2" max_len="$3" what="$4"
  local log="$work/$target.log"
  local start end execs speed cov
  start=$(date +%s)
  # -timeout: one input taking over 10 s is a hang (a super-linear pattern, say), reported.
  if ! "./build/fuzz/fuzz/$target" "$corpus" -max_total_time="$seconds" -timeout=10 \
      -max_len="$max_len" -print_final_stats=1 -detect_leaks=1 >"$log" 2>&1; then
    tail -n 60 "$log"
    echo "fuzz: $target FAILED (crash, hang or sanitizer report above)"
    exit 1
  fi
  end=$(date +%s)
  # A fuzzer that exits 0 without running anything (a harness that exits early, a build without
  # libFuzzer's driver) must not pass: -print_final_stats=1 ends the log with the number of
  # executed inputs, and it must be there and positive.
  execs=$(grep -oP '^stat::number_of_executed_units:\s*\K[0-9]+' "$log" | tail -n 1 || true)
  if [[ -z "$execs" || "$execs" -eq 0 ]]; then
    tail -n 60 "$log"
    echo "fuzz: $target FAILED (libFuzzer reported ${execs:-no} executions; see the log above)"
    exit 1
  fi
  speed=$(grep -oP 'stat::average_exec_per_sec:\s*\K[0-9]+' "$log" || echo "?")
  cov=$(grep -oP '#[0-9]+\s+DONE\s+cov: \K[0-9]+' "$log" || echo "?")
  echo "fuzz: $what (ASan+UBSan): $execs executions in $((end - start)) s ($speed/s)," \
       "coverage $cov edges, no crashes"
}

# The two targets fuzz at once, one per core (each libFuzzer run is one thread); each reports in
# its own subshell, and this script fails if either does.
# -max_len: the header bombs are 100 KB; let mutations grow a little past them.
run_fuzzer fuzz_safetensors_header "$work/safetensors" 131072 "safetensors header parser" &
header_pid=$!
# The largest corpus configs are a few hundred KB; detection must stay linear on all of them.
run_fuzzer fuzz_config_detect "$work/config" 262144 "config detection" &
config_pid=$!
status=0
wait "$header_pid" || status=1
wait "$config_pid" || status=1
exit "$status"
