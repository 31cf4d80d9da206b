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
import shutil
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


def synth_layouts():
    """The layout names `fp4moe synth --list-layouts` prints, in its order: the C++ table
    (src/synth/synth.cc kLayouts) is the only list, so a test parametrized over it cannot drift
    from it. Read once per session; an unbuilt binary is a collection error naming it."""
    global _SYNTH_LAYOUTS
    if _SYNTH_LAYOUTS is None:
        import subprocess

        binary = Path(os.environ["FP4MOE_BUILD_DIR"]) / "fp4moe"
        if not binary.exists():
            raise pytest.UsageError(f"{binary} not built (build target fp4moe)")
        out = subprocess.run([str(binary), "synth", "--list-layouts"], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        _SYNTH_LAYOUTS = out.stdout.split()
    return list(_SYNTH_LAYOUTS)


_SYNTH_LAYOUTS = None

# What each synthetic layout holds, as verify and `bench --checkpoint` must report it: (routed
# expert scheme, shared expert scheme); None where no kernel runs it (BF16 experts). A layout that
# `fp4moe synth --list-layouts` names and this table lacks fails the tests (KeyError), and
# test_synth.py checks that the two lists are the same.
SYNTH_SCHEMES = {
    "dsv4-mxfp4": ("mxfp4", "fp8_block"),      # DeepSeek-V4 stock names and semantics
    "dsv4-nvfp4": ("nvfp4", "fp8_block"),      # NVIDIA's ModelOpt NVFP4 experts
    "gpt-oss-mxfp4": ("mxfp4", "none"),        # fused [E, 2I, K/32, 16] blocks, biases, clamp
    "dsv3-fp8": ("fp8_block", "fp8_block"),    # DeepSeek-V3 names (Kimi-K2, GLM-5 share them)
    "ct-nvfp4": ("nvfp4", "nvfp4"),            # compressed-tensors NVFP4, V4 in HF names
    "modelopt-nvfp4": ("nvfp4", "none"),       # Qwen3-MoE, softmax + norm_topk_prob
    "bf16": None,                              # Qwen3-MoE unquantized: no kernel path
    "minimax-nvfp4": ("nvfp4", "none"),        # MiniMax-M2 block_sparse_moe, sigmoid + bias
    "minimax-fp8": ("fp8_block", "none"),      # MiniMax-M2.5 as released
}


# The corpus directory (tests/data/corpus) whose real configs each layout starts from
# (src/synth/CMakeLists.txt): what inspect says of those configs is what the layout may repeat.
SYNTH_CORPUS = {
    "dsv4-mxfp4": "deepseek-ai__DeepSeek-V4-Flash",
    "dsv4-nvfp4": "nvidia__DeepSeek-V4-Flash-NVFP4",
    "gpt-oss-mxfp4": "openai__gpt-oss-20b",
    "dsv3-fp8": "deepseek-ai__DeepSeek-V3",
    "ct-nvfp4": "RedHatAI__DeepSeek-V4-Flash-NVFP4-FP8",
    "modelopt-nvfp4": "nvidia__Qwen3-235B-A22B-NVFP4",
    "bf16": "Qwen__Qwen3-30B-A3B-FP8",
    "minimax-nvfp4": "nvidia__MiniMax-M2.5-NVFP4",
    "minimax-fp8": "MiniMaxAI__MiniMax-M2.5",
}


def quantized_synth_layouts():
    """The layouts verify and bench run (every one with a kernel path)."""
    return [name for name in synth_layouts() if SYNTH_SCHEMES[name] is not None]


@pytest.fixture
def rng(request):
    """A seeded generator; the seed is in the test's report so a failure can be replayed with
    FP4MOE_TEST_SEED=<seed>."""
    seed = BASE_SEED
    request.node.user_properties.append(("seed", seed))
    print(f"[seed {seed}] replay with FP4MOE_TEST_SEED={seed}")
    return np.random.default_rng(seed)


@pytest.fixture(scope="module")
def module_tmp(tmp_path_factory):
    """module_tmp(name): a new directory, as tmp_path_factory.mktemp(name), for a module-scoped
    fixture; every directory made through it is removed when the module's tests end (the
    full-size checkpoints the fixtures make would otherwise stay until the session's end: see
    [tool.pytest.ini_options] in pyproject.toml)."""
    made = []

    def mktemp(name):
        made.append(tmp_path_factory.mktemp(name))
        return made[-1]
    yield mktemp
    for d in made:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def synth_dir(module_tmp):
    """synth_dir(layout): a small `fp4moe synth` checkpoint (1 MoE layer, 8 experts) of that
    layout, made once per test module."""
    import subprocess

    binary = Path(os.environ["FP4MOE_BUILD_DIR"]) / "fp4moe"
    made = {}

    def make(layout):
        if layout not in made:
            d = module_tmp("synth") / layout
            out = subprocess.run([str(binary), "synth", layout, str(d), "--layers", "1",
                                  "--experts", "8"], capture_output=True, text=True, timeout=600)
            assert out.returncode == 0, out.stderr
            made[layout] = d
        return made[layout]
    return make
