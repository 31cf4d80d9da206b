#!/usr/bin/env bash
# The pip-installable package: builds the wheel (scripts/build_wheel.sh), then, in a virtual
# environment with the wheel and the test oracles, runs the oracle tests on the installed module
# (FP4MOE_TEST_BINDING=module) and tests/python/test_wheel.py, which installs the wheel once more
# into a fresh environment of its own. Only the torch test may skip (torch is optional).
set -euo pipefail
cd "$(dirname "$0")/../.."

start=$(date +%s)
./scripts/build_wheel.sh
built=$(date +%s)

env_dir="$(mktemp -d)"
log="$env_dir/pytest.log"
trap 'rm -rf "$env_dir"' EXIT
python3 -m venv "$env_dir/venv"
"$env_dir/venv/bin/python" -m pip install -q --disable-pip-version-check dist/fp4moe-*.whl \
  -r tests/python/requirements.txt
export FP4MOE_TEST_BINDING=module FP4MOE_EXPECT_WHEEL=1
"$env_dir/venv/bin/python" -m pytest -p no:cacheprovider -q -rs -s tests/python/test_wheel.py \
  tests/python/test_formats_oracle.py tests/python/test_kernels_oracle.py \
  tests/python/test_transcode_oracle.py | tee "$log"
# pytest's exit status is the pipeline's (pipefail); any skip but torch's fails this script.
if grep -E "^SKIPPED" "$log" | grep -vq "torch is not installed"; then
  echo "wheel: some tests did not run"
  exit 1
fi
echo "wheel: built in $(( built - start )) s, tested in $(( $(date +%s) - built )) s"
