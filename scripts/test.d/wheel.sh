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
# torch is optional for users, but the zero-copy torch round trip must run in CI: the newest SGLang
# environment of the engine oracles (scripts/engines/env.sh, built by engines.sh before this script
# and cached) has the PyPI torch; its site-packages go at the end of this venv's path (a .pth
# file), so the wheel and this venv's numpy come first.
if [[ -z "${FP4MOE_SKIP_ENGINES:-}" ]]; then
  newest=$(scripts/engines/newest.sh sglang)
  engine_py=$(scripts/engines/env.sh sglang "$newest" | tail -n1)
  engine_site=$("$engine_py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  venv_site=$("$env_dir/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$engine_site" > "$venv_site/zz_engine_torch.pth"
  export FP4MOE_EXPECT_TORCH=1
fi
export FP4MOE_TEST_BINDING=module FP4MOE_EXPECT_WHEEL=1
"$env_dir/venv/bin/python" -m pytest -p no:cacheprovider -q -rs -s tests/python/test_wheel.py \
  tests/python/test_formats_oracle.py tests/python/test_kernels_oracle.py \
  tests/python/test_transcode_oracle.py | tee "$log"
# pytest's exit status is the pipeline's (pipefail); any skip fails this script, torch's too when
# the engine environment provides torch.
if grep -E "^SKIPPED" "$log" | { [[ -n "${FP4MOE_EXPECT_TORCH:-}" ]] && cat || grep -v "torch is not installed"; } | grep -q .; then
  echo "wheel: some tests did not run"
  exit 1
fi
echo "wheel: built in $(( built - start )) s, tested in $(( $(date +%s) - built )) s"
