"""The wheel (dist/fp4moe-*.whl, scripts/build_wheel.sh) as a user gets it: installed into a fresh
virtual environment with nothing but numpy beside it, the `fp4moe` command, `python -m fp4moe`,
and the module: an MoE layer of a synthetic checkpoint against the FP64 reference, outputs written
in place (zero-copy) for numpy arrays and CPU torch tensors, and the installed stub against the
reviewed copy src/python/_fp4moe.pyi.

scripts/test.d/wheel.sh runs this file with FP4MOE_EXPECT_WHEEL=1 after building the wheel, in an
environment where the module is installed; elsewhere (no wheel built) these tests skip.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "data" / "corpus" / "nvidia__DeepSeek-V4-Flash-NVFP4"


def built_wheel() -> Path:
    wheels = sorted((ROOT / "dist").glob("fp4moe-*.whl"))
    if len(wheels) != 1:
        message = (f"expected one wheel in {ROOT / 'dist'}, found {[w.name for w in wheels]} "
                   "(scripts/build_wheel.sh builds it)")
        if os.environ.get("FP4MOE_EXPECT_WHEEL") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return wheels[0]


def run(*cmd, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def fresh_venv(module_tmp):
    """A new virtual environment with the wheel (the file itself, never an index's fp4moe) and its
    one dependency, numpy (from pip's cache or the index)."""
    wheel = built_wheel()
    venv = module_tmp("fresh") / "venv"
    start = time.monotonic()
    run(sys.executable, "-m", "venv", venv)
    created = time.monotonic()
    pip = run(venv / "bin" / "python", "-m", "pip", "install", "--disable-pip-version-check",
              wheel)
    done = time.monotonic()
    print(f"\nfresh venv: created in {created - start:.1f} s, `pip install {wheel.name}` "
          f"in {done - created:.1f} s\n{pip.stdout}")
    return venv


def test_version_everywhere_is_the_cmake_project_version(fresh_venv):
    cmake = (ROOT / "CMakeLists.txt").read_text()
    version = cmake.split("project(fp4moe VERSION ", 1)[1].split(" ", 1)[0]
    cli = run(fresh_venv / "bin" / "fp4moe", "--version").stdout
    as_module = run(fresh_venv / "bin" / "python", "-m", "fp4moe", "--version").stdout
    module = run(fresh_venv / "bin" / "python", "-c",
                 "import fp4moe, importlib.metadata as m; "
                 "print(fp4moe.__version__, m.version('fp4moe'))").stdout.split()
    assert version in cli and cli == as_module
    assert module == [version, version]


def test_cli_inspect_on_the_corpus(fresh_venv):
    out = run(fresh_venv / "bin" / "fp4moe", "inspect", CORPUS, "--json").stdout
    cli = json.loads(out)
    # The same manifest through the module: its fields and its JSON are the CLI's contract.
    py = run(fresh_venv / "bin" / "python", "-c", textwrap.dedent(f"""
        import json, fp4moe
        m = fp4moe.inspect({str(CORPUS)!r})
        print(json.dumps({{"json": json.loads(m.to_json()), "dialect": m.dialect,
                          "routed": m.summary["routed_experts"],
                          "modules": [[g.role, g.name, g.scheme] for g in m.modules]}}))
    """)).stdout
    module = json.loads(py)
    # The CLI's JSON adds where the checkpoint came from; every manifest field is the module's.
    assert module["json"] == {key: cli[key] for key in module["json"]}
    assert module["dialect"] == cli["dialect"] and module["routed"] == "nvfp4"
    assert module["modules"] == [[g["role"], g["name"], g["scheme"]] for g in cli["modules"]]


def test_cli_exit_status_passes_through_python_m(fresh_venv):
    # `python -m fp4moe` is the tool itself (exec): bad usage exits 2 as the binary does.
    proc = subprocess.run([fresh_venv / "bin" / "python", "-m", "fp4moe", "inspect",
                           "/nonexistent/dir"], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert "/nonexistent/dir" in proc.stderr


MOE_SCRIPT = """
import json, sys
import numpy as np
import fp4moe

path = sys.argv[1]
layer_index = fp4moe.moe_layers(path)[-1]
layer = fp4moe.MoELayer.from_checkpoint(path, layer_index, max_tokens=8)
rng = np.random.default_rng(20261129)
x = rng.standard_normal((5, layer.hidden)).astype(np.float32)
out = np.empty_like(x)
y = layer(x, out=out)
ref = layer.reference(x)
rel = float(np.linalg.norm(y.astype(np.float64) - ref) / np.linalg.norm(ref))
address = lambda a: a.__array_interface__["data"][0]
print(json.dumps({
    "layer": layer_index, "scheme": layer.expert_scheme, "hidden": layer.hidden,
    "rel_l2_error": rel, "returned_out": y is out,
    "x_address": address(x), "out_address": address(out), "y_address": address(y),
    "ids_shape": list(layer.ids.shape), "describe": layer.describe(),
}))
"""


def test_moe_layer_against_the_fp64_reference_in_the_fresh_venv(fresh_venv, tmp_path):
    ckpt = tmp_path / "dsv4"
    run(fresh_venv / "bin" / "fp4moe", "synth", "dsv4-mxfp4", ckpt, "--layers", 2,
        "--experts", 4)
    result = json.loads(run(fresh_venv / "bin" / "python", "-c", MOE_SCRIPT, ckpt).stdout)
    print("\nMoE layer in the fresh venv:", json.dumps(result, indent=1))
    # kVerifyRelTolerance of model/verify.h: both paths read the same decoded weights exactly.
    assert result["rel_l2_error"] < 1e-4
    assert result["scheme"] == "mxfp4" and result["ids_shape"][0] == 5
    # Zero-copy: the output is the caller's buffer, written in place and returned as itself.
    assert result["returned_out"] and result["y_address"] == result["out_address"]


def test_installed_stub_is_the_reviewed_one(fresh_venv):
    site = run(fresh_venv / "bin" / "python", "-c",
               "import fp4moe, os; print(os.path.dirname(fp4moe.__file__))").stdout.strip()
    installed = (Path(site) / "_fp4moe.pyi").read_text()
    reviewed = (ROOT / "src" / "python" / "_fp4moe.pyi").read_text()
    assert installed == reviewed, (
        "the API changed: review it and copy the generated stub over src/python/_fp4moe.pyi")
    assert (Path(site) / "py.typed").exists()


def test_wheel_needs_no_library_outside_it(fresh_venv):
    """Every shared library the module and the tool load comes from the system's C/C++ runtime or
    from the wheel itself (Debian's fmt and RE2, carried in fp4moe/lib)."""
    site = Path(run(fresh_venv / "bin" / "python", "-c",
                    "import fp4moe, os; print(os.path.dirname(fp4moe.__file__))").stdout.strip())
    runtime = ("linux-vdso", "libc.so", "libm.so", "libstdc++.so", "libgcc_s.so",
               "ld-linux-x86-64.so", "libpthread.so", "libdl.so")
    for elf in [site / "bin" / "fp4moe", *site.glob("_fp4moe*.so")]:
        for line in run("ldd", elf).stdout.splitlines():
            name = Path(line.split()[0]).name
            if name.startswith(runtime):
                continue
            loaded = Path(line.split("=>")[1].split("(")[0].strip()).resolve()
            assert loaded.parent == (site / "lib").resolve(), f"{elf.name} loads {line.strip()}"


# ------------------------------------------------------------------------------------------------
# In this interpreter: zero-copy with numpy arrays and torch tensors (the module must be installed
# here, as scripts/test.d/wheel.sh does).


def module():
    import fp4moe
    if not hasattr(fp4moe, "MoELayer"):
        if os.environ.get("FP4MOE_EXPECT_WHEEL") == "1":
            pytest.fail(f"`import fp4moe` gave {fp4moe.__file__}, not the installed module")
        pytest.skip("the fp4moe module is not installed here (the C ABI binding is)")
    return fp4moe


def small_linear(fp4moe, rng, n=24, k=64):
    x = rng.standard_normal((n, k)).astype(np.float32)
    packed, scales = fp4moe.quantize_mxfp4(x)
    return fp4moe.Linear(fp4moe.Weights("mxfp4", packed, scales)), k


def test_numpy_zero_copy(rng):
    fp4moe = module()
    lin, k = small_linear(fp4moe, rng)
    x = rng.standard_normal((3, k)).astype(np.float32)
    out = np.full((3, 24), np.nan, np.float32)
    y = lin(x, out=out)
    print(f"\nnumpy: out at {out.ctypes.data:#x}, returned y at {y.ctypes.data:#x}, same object: "
          f"{y is out}")
    assert y is out and y.ctypes.data == out.ctypes.data
    assert np.isfinite(out).all()
    np.testing.assert_array_equal(out, lin(x))


def test_bad_arguments_name_the_argument(rng):
    fp4moe = module()
    lin, k = small_linear(fp4moe, rng)
    x = rng.standard_normal((3, k)).astype(np.float32)
    with pytest.raises(fp4moe.Fp4moeTypeError, match=r"argument 'x': dtype float64"):
        lin(x.astype(np.float64))
    with pytest.raises(fp4moe.Fp4moeError, match=r"argument 'x': not C-contiguous"):
        lin(np.asfortranarray(x))
    with pytest.raises(fp4moe.Fp4moeError, match=r"argument 'x': shape \[3, 32\]"):
        lin(x[:, :32].copy())
    with pytest.raises(fp4moe.Fp4moeError, match=r"argument 'out': shape \[3, 23\]"):
        lin(x, out=np.empty((3, 23), np.float32))
    read_only = np.empty((3, 24), np.float32)
    read_only.flags.writeable = False
    with pytest.raises(fp4moe.Fp4moeError, match=r"argument 'out': a read-only"):
        lin(x, out=read_only)
    with pytest.raises(fp4moe.Fp4moeTypeError, match=r"argument 'x': expected a numpy array"):
        lin([[1.0] * k])
    packed, scales = fp4moe.quantize_mxfp4(x)
    with pytest.raises(fp4moe.Fp4moeError, match=r"argument 'scales': 5 bytes, the shape \[3, 64\]"
                                                  r" needs 6"):
        fp4moe.Weights("mxfp4", packed, scales.reshape(-1)[:5].copy())


def test_torch_zero_copy_round_trip(rng):
    fp4moe = module()
    torch = pytest.importorskip("torch", reason="torch is not installed here (it is optional)")
    lin, k = small_linear(fp4moe, rng)
    x = torch.from_numpy(rng.standard_normal((3, k)).astype(np.float32))
    out = torch.full((3, 24), float("nan"))
    y = lin(x, out=out)
    print(f"\ntorch: out.data_ptr() {out.data_ptr():#x}, y.data_ptr() {y.data_ptr():#x}")
    assert y is out and y.data_ptr() == out.data_ptr()
    # Without out, a torch input gives a torch output, and the values are numpy's.
    fresh = lin(x)
    assert isinstance(fresh, torch.Tensor)
    np.testing.assert_array_equal(fresh.numpy(), lin(x.numpy()))
    np.testing.assert_array_equal(out.numpy(), fresh.numpy())


def test_convert_progress_and_ctrl_c_leave_no_output(rng, tmp_path):
    """fp4moe.convert releases the GIL and reports progress; Ctrl-C (SIGINT) during it raises
    KeyboardInterrupt once the library has stopped, and the destination does not exist."""
    import signal
    import threading

    fp4moe = module()
    tool = Path(fp4moe.__file__).parent / "bin" / "fp4moe"
    src = tmp_path / "src"
    run(tool, "synth", "dsv4-mxfp4", src, "--layers", 2, "--experts", 4)

    calls = []
    summary = fp4moe.convert(str(src), str(tmp_path / "whole"), to="nvfp4",
                             progress=lambda *p: calls.append(p))
    assert summary.modules_transcoded > 0 and summary.transcode["blocks_requantized"] == 0
    assert calls and calls[-1][0] == calls[-1][1] and calls[-1][2] == calls[-1][3]
    assert fp4moe.inspect(str(tmp_path / "whole")).summary["routed_experts"] == "nvfp4"
    assert summary.dialect == "NVFP4" and summary.input_scales_default == summary.modules_converted
    # The weight-only dialect and a calibration file reach the library; a bad one names itself.
    weight_only = fp4moe.convert(str(src), str(tmp_path / "w4a16"), dialect="w4a16_nvfp4")
    assert weight_only.dialect == "W4A16_NVFP4" and weight_only.input_scales_default == 0
    amax = tmp_path / "amax.json"
    amax.write_text(json.dumps({"format": "fp4moe.activation_amax.v1",
                                "amax": [{"modules": "*", "amax": 12.0}]}))
    calibrated = fp4moe.convert(str(src), str(tmp_path / "cal"), activation_amax=str(amax))
    assert calibrated.input_scales_calibrated == calibrated.modules_converted
    with pytest.raises(fp4moe.Fp4moeError, match="dialect"):
        fp4moe.convert(str(src), str(tmp_path / "bad"), dialect="int4")
    amax.write_text("{")
    with pytest.raises(fp4moe.Fp4moeError, match="amax.json"):
        fp4moe.convert(str(src), str(tmp_path / "bad"), activation_amax=str(amax))
    assert not (tmp_path / "bad").exists()

    # Deterministic: the first progress call sends SIGINT to this process and waits until
    # Python's handler has run (on the main thread, which the binding wakes every 50 ms).
    handled = threading.Event()

    def on_sigint(signum, frame):
        handled.set()
        raise KeyboardInterrupt

    def progress(*p):
        if not handled.is_set():
            os.kill(os.getpid(), signal.SIGINT)
            assert handled.wait(10), "the binding never ran the signal handler"

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        with pytest.raises(KeyboardInterrupt):
            fp4moe.convert(str(src), str(tmp_path / "dst"), to="nvfp4", progress=progress)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert not (tmp_path / "dst").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["amax.json", "cal", "src", "w4a16", "whole"], \
        "partial output left"


def test_check_and_plan(tmp_path):
    fp4moe = module()
    tool = Path(fp4moe.__file__).parent / "bin" / "fp4moe"
    ckpt = tmp_path / "ckpt"
    run(tool, "synth", "dsv4-mxfp4", ckpt, "--layers", 2, "--experts", 4)
    report = fp4moe.check(str(ckpt))
    cli = json.loads(run(tool, "check", ckpt, "--json").stdout)
    assert json.loads(report.to_json())["findings"] == cli["findings"]
    assert report.has_error is False and report.modules_checked > 0
    manifest = fp4moe.inspect(str(ckpt))
    plan = fp4moe.plan(manifest, target="sm_120", engine="sglang")
    planned = json.loads(plan.to_json())
    assert planned["target"] == plan.target == "sm_120"
    assert [m.name for m in plan.modules] == [m["name"] for m in planned["modules"]]
    routed = [m for m in plan.modules if m.role == "routed_experts"]
    assert routed and all(m.scheme == "mxfp4" and m.kernel for m in routed)
    with pytest.raises(fp4moe.Fp4moeError, match="sm_7"):
        fp4moe.plan(manifest, target="sm_7")
