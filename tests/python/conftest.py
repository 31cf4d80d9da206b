"""pytest setup: picks the binding the oracle tests call, and prints each test's random seed.

The oracle tests (test_formats_oracle, test_kernels_oracle, test_transcode_oracle) and the
fixtures of the CLI tests `import fp4moe`, and run on either of two bindings with the same
functions:
- the `fp4moe` Python module (src/python, installed from the wheel: scripts/test.d/wheel.sh runs
  them in a virtual environment that has it);
- the tests' ctypes binding of the C ABI (fp4moe_capi.py over libfp4moe.so in $FP4MOE_BUILD_DIR,
  else build/release; scripts/test.d/capi_asan.sh runs them so under ASan).
FP4MOE_TEST_BINDING=module|capi picks one; unset: the module when it is installed, else the C ABI.
"""
import os
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
os.environ.setdefault("FP4MOE_BUILD_DIR", str(ROOT / "build" / "release"))

BASE_SEED = int(os.environ.get("FP4MOE_TEST_SEED", "20261129"))

BINDING = os.environ.get("FP4MOE_TEST_BINDING", "")
if BINDING not in ("", "module", "capi"):
    raise pytest.UsageError(f"FP4MOE_TEST_BINDING={BINDING!r}: expected 'module' or 'capi'")
if BINDING != "capi":
    try:
        import fp4moe  # noqa: F401  (the installed module)
        BINDING = "module"
    except ImportError:
        if BINDING == "module":
            raise
        BINDING = "capi"
if BINDING == "capi":
    import fp4moe_capi

    sys.modules["fp4moe"] = fp4moe_capi


def pytest_report_header(config):
    where = sys.modules["fp4moe"].__file__
    return f"fp4moe binding: {BINDING} ({where})"


@pytest.fixture
def rng(request):
    """A seeded generator; the seed is in the test's report so a failure can be replayed with
    FP4MOE_TEST_SEED=<seed>."""
    seed = BASE_SEED
    request.node.user_properties.append(("seed", seed))
    print(f"[seed {seed}] replay with FP4MOE_TEST_SEED={seed}")
    return np.random.default_rng(seed)


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    """synth_dir(layout): a small `fp4moe synth` checkpoint (1 MoE layer, 8 experts) of that
    layout, made once per test module."""
    import subprocess

    binary = Path(os.environ["FP4MOE_BUILD_DIR"]) / "fp4moe"
    made = {}

    def make(layout):
        if layout not in made:
            d = tmp_path_factory.mktemp("synth") / layout
            out = subprocess.run([str(binary), "synth", layout, str(d), "--layers", "1",
                                  "--experts", "8"], capture_output=True, text=True, timeout=600)
            assert out.returncode == 0, out.stderr
            made[layout] = d
        return made[layout]
    return make
