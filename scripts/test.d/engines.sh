#!/usr/bin/env bash
# Engine-oracle tests against the real engines: creates (cached, outside the clone, see
# scripts/engines/env.sh) the newest pinned SGLang and vLLM environments, then runs
# tests/engines/test_engine_oracle.py: the recorded verdicts (tests/engines/verdicts.json) are
# well-formed and complete, and both engines' own config resolution, run now on the fixtures and
# on a checkpoint `fp4moe convert` writes now, equals the recorded verdicts (and, for a few corpus
# configs and convert's plain ModelOpt NVFP4 output, tests/engines/corpus_verdicts.json: about a
# minute more); and the CPU engine
# rules (llama.cpp, kt-kernel) against the sources they cite (tests/python/test_cpu_engine_sources.py).
#
# First run on a fresh machine downloads torch (CUDA build, ~2.7 GB with its CUDA libraries) twice
# and installs both environments: measured ~17 min on a loaded 2-core VM (SGLang 0.5.23 403 s,
# vLLM 0.34.0 624 s); later runs reuse the cache (seconds). FP4MOE_SKIP_ENGINES=1 skips this step.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ -n "${FP4MOE_SKIP_ENGINES:-}" ]]; then
  echo "engines.sh: skipped (FP4MOE_SKIP_ENGINES is set)"
  exit 0
fi
newest() { scripts/engines/newest.sh "$1"; }
t0=$SECONDS
FP4MOE_ENGINE_SGLANG_PY=$(scripts/engines/env.sh sglang "$(newest sglang)" | tail -n1)
FP4MOE_ENGINE_VLLM_PY=$(scripts/engines/env.sh vllm "$(newest vllm)" | tail -n1)
export FP4MOE_ENGINE_SGLANG_PY FP4MOE_ENGINE_VLLM_PY
echo "engines.sh: environments ready in $((SECONDS - t0)) s"
# The recorded and live verdicts, and `fp4moe doctor` on the real installed engines (its own
# resolution of NVIDIA's checkpoint must equal what the rules predict).
FP4MOE_BUILD_DIR="${FP4MOE_BUILD_DIR:-$PWD/build/release}" \
  .venv/bin/python -m pytest tests/engines \
  "tests/python/test_doctor_cli.py::test_real_engine_agrees_with_the_verdicts" -q -rs \
  -p no:cacheprovider
# The CPU engines' rules against the sources they cite (llama-cpp-python's sdist with its vendored
# llama.cpp, the kt-kernel wheel; cached outside the clone by scripts/engines/cpu_sources.sh,
# ~180 MB, about 20 s once).
FP4MOE_CPU_ENGINE_SRC=$(scripts/engines/cpu_sources.sh | tail -n1) \
  FP4MOE_BUILD_DIR="${FP4MOE_BUILD_DIR:-$PWD/build/release}" \
  .venv/bin/python -m pytest tests/python/test_cpu_engine_sources.py -q -rs -p no:cacheprovider
