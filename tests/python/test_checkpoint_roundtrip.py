"""Round trips between fp4moe's safetensors reader/writer and the reference `safetensors` package.

Files the reference writes, we read (tests/tools/st_tool dump); files we write, the reference reads
(`deserialize`, and `safe_open` for numpy dtypes); both with identical bytes, shapes and dtypes.
Also checks that the committed adversarial corpus is what its generator makes, and compares our
verdicts on it with the reference reader's.
"""
import ctypes
import filecmp
import json
import os
import pathlib
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
import safetensors
from safetensors import _safetensors_rust as st_rust
from safetensors import safe_open
from safetensors.numpy import save_file

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("FP4MOE_BUILD_DIR", ROOT / "build" / "release"))
TOOL = BUILD / "tests" / "tools" / "st_tool"
ADVERSARIAL = ROOT / "tests" / "data" / "adversarial"
SEED = int(os.environ.get("FP4MOE_TEST_SEED", "20240611"))


def run_tool(*args, ok=True):
    if not TOOL.exists():
        pytest.fail(f"{TOOL} not built (build target fp4moe_st_tool, or set FP4MOE_BUILD_DIR)")
    proc = subprocess.run([str(TOOL), *map(str, args)], capture_output=True, text=True)
    if ok:
        assert proc.returncode == 0, proc.stderr
    return proc


def rng():
    print(f"seed {SEED} (set FP4MOE_TEST_SEED to replay)")
    return np.random.default_rng(SEED)


# numpy dtypes save_file handles, with their safetensors names.
NUMPY_DTYPES = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16,
                "U16": np.uint16, "F16": np.float16, "I32": np.int32, "U32": np.uint32,
                "F32": np.float32, "F64": np.float64, "I64": np.int64, "U64": np.uint64,
                "C64": np.complex64}
# Dtypes only the binding's TensorSpec writes: binding name, safetensors name, storage numpy type.
SPEC_DTYPES = [("bfloat16", "BF16", ml_dtypes.bfloat16), ("float8_e4m3fn", "F8_E4M3", np.uint8),
               ("float8_e5m2", "F8_E5M2", np.uint8), ("float8_e8m0fnu", "F8_E8M0", np.uint8),
               ("float4_e2m1fn_x2", "F4", np.uint8)]
SHAPES = [(), (0,), (1,), (3, 5), (2, 3, 4)]


def random_array(gen, dtype, shape):
    raw = gen.integers(0, 256, size=int(np.prod(shape)) * np.dtype(dtype).itemsize, dtype=np.uint8)
    if dtype is np.bool_:
        raw &= 1  # BOOL bytes must be 0 or 1
    return raw.view(dtype).reshape(shape)


def test_reference_writes_we_read(tmp_path):
    gen = rng()
    tensors = {}
    for name, dtype in NUMPY_DTYPES.items():
        for i, shape in enumerate(SHAPES):
            tensors[f"{name.lower()}.{i}"] = random_array(gen, dtype, shape)
    path = tmp_path / "np.safetensors"
    save_file(tensors, str(path), metadata={"format": "np", "note": "é ünïcode"})
    dump = json.loads(run_tool("dump", path).stdout)
    assert dump["metadata"] == {"format": "np", "note": "é ünïcode"}
    got = {t["name"]: t for t in dump["tensors"]}
    assert set(got) == set(tensors)
    for name, arr in tensors.items():
        t = got[name]
        assert t["dtype"] == name.split(".")[0].upper(), name
        assert tuple(t["shape"]) == arr.shape, name
        assert bytes.fromhex(t["hex"]) == arr.tobytes(), name
    print(f"round trip reference -> fp4moe: {len(tensors)} tensors")


def test_reference_spec_dtypes_we_read(tmp_path):
    """FP8, E8M0, BF16 and packed FP4 through the binding's raw TensorSpec API."""
    gen = rng()
    buffers, specs, expected = [], {}, {}
    for binding_name, st_name, storage in SPEC_DTYPES:
        for i, shape in enumerate([(4,), (3, 8), (2, 2, 6)]):
            storage_shape = shape[:-1] + (shape[-1] // 2,) if st_name == "F4" else shape
            data = random_array(gen, storage, storage_shape).tobytes()
            buf = ctypes.create_string_buffer(data, len(data))
            buffers.append(buf)
            name = f"{st_name.lower()}.{i}"
            specs[name] = st_rust.TensorSpec(dtype=binding_name, shape=list(storage_shape),
                                             data_ptr=ctypes.addressof(buf), data_len=len(data))
            expected[name] = (st_name, list(shape), data)  # F4: header holds the element shape
    path = tmp_path / "spec.safetensors"
    st_rust.serialize_file(specs, str(path), {"format": "pt"})
    got = {t["name"]: t for t in json.loads(run_tool("dump", path).stdout)["tensors"]}
    assert set(got) == set(expected)
    for name, (dtype, shape, data) in expected.items():
        assert got[name]["dtype"] == dtype, name
        assert got[name]["shape"] == shape, name
        assert bytes.fromhex(got[name]["hex"]) == data, name
    print(f"round trip reference -> fp4moe (spec dtypes): {len(expected)} tensors")


ALL_DTYPE_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
                  "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
                  "F64": 64, "I64": 64, "U64": 64, "C64": 64, "F4": 4, "F6_E2M3": 6,
                  "F6_E3M2": 6}


@pytest.mark.parametrize("max_shard_bytes", [1 << 30, 200])
def test_we_write_reference_reads(tmp_path, max_shard_bytes):
    gen = rng()
    spec, expected = [], {}
    for dtype, bits in ALL_DTYPE_BITS.items():
        for i, shape in enumerate([[4], [2, 8], [0, 3], []]):
            if bits < 8 and shape == []:
                continue  # a single sub-byte element ends mid-byte
            nbytes = int(np.prod(shape)) * bits // 8
            data = gen.integers(0, 256, size=nbytes, dtype=np.uint8).tobytes()
            if dtype == "BOOL":
                data = bytes(b & 1 for b in data)
            name = f"model.layers.{i}.{dtype.lower()}"
            spec.append({"name": name, "dtype": dtype, "shape": shape, "hex": data.hex()})
            expected[name] = (dtype, shape, data)
    src = tmp_path / "src"
    src.mkdir()
    (src / "tokenizer_config.json").write_text('{"chat_template": "{{x}}"}')
    (src / "generation_config.json").write_text('{"temperature": 0.6}')
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps({"tensors": spec, "max_shard_bytes": max_shard_bytes,
                                     "metadata": {"format": "pt"}, "source_dir": str(src),
                                     "files": {"config.json": '{"model_type": "x"}'}}))
    out = tmp_path / "out"
    run_tool("write", out, spec_path)

    shards = sorted(out.glob("*.safetensors"))
    if max_shard_bytes > 1000:
        assert [s.name for s in shards] == ["model.safetensors"]
        weight_map = {name: "model.safetensors" for name in expected}
    else:
        assert len(shards) > 1
        index = json.loads((out / "model.safetensors.index.json").read_text())
        weight_map = index["weight_map"]
        assert index["metadata"]["total_size"] == sum(len(d) for _, _, d in expected.values())
    assert set(weight_map) == set(expected)
    seen = {}
    for shard in shards:
        for name, info in st_rust.deserialize(shard.read_bytes()):
            assert weight_map[name] == shard.name
            seen[name] = info
        with safe_open(str(shard), framework="np") as f:
            assert f.metadata() == {"format": "pt"}
            for name in f.keys():
                dtype, shape, data = expected[name]
                if dtype in NUMPY_DTYPES:
                    arr = f.get_tensor(name)
                    assert list(arr.shape) == shape and arr.tobytes() == data, name
    assert set(seen) == set(expected)
    for name, (dtype, shape, data) in expected.items():
        assert seen[name]["dtype"] == dtype, name
        assert list(seen[name]["shape"]) == shape, name
        assert bytes(seen[name]["data"]) == data, name
    assert (out / "tokenizer_config.json").read_text() == '{"chat_template": "{{x}}"}'
    assert (out / "generation_config.json").read_text() == '{"temperature": 0.6}'
    assert json.loads((out / "config.json").read_text()) == {"model_type": "x"}
    # And we read back what we wrote, across shards.
    back = {t["name"]: t for t in json.loads(run_tool("dumpdir", out).stdout)["tensors"]}
    assert {n: bytes.fromhex(t["hex"]) for n, t in back.items()} == \
        {n: d for n, (_, _, d) in expected.items()}
    print(f"round trip fp4moe -> reference: {len(expected)} tensors in {len(shards)} shards")


def test_adversarial_corpus_is_generated(tmp_path):
    """The committed folder is exactly what tests/tools/make_adversarial.py writes."""
    out = tmp_path / "adversarial"
    subprocess.run([sys.executable, str(ROOT / "tests/tools/make_adversarial.py"), str(out)],
                   check=True, capture_output=True)
    mismatch = []

    def compare(a, b):
        cmp = filecmp.dircmp(a, b)
        mismatch.extend(cmp.left_only + cmp.right_only + cmp.funny_files)
        mismatch.extend(f for f in cmp.common_files
                        if not filecmp.cmp(os.path.join(a, f), os.path.join(b, f), shallow=False))
        for sub in cmp.common_dirs:
            compare(os.path.join(a, sub), os.path.join(b, sub))

    compare(out, ADVERSARIAL)
    assert not mismatch, f"regenerate with tests/tools/make_adversarial.py: {mismatch}"


# The hostile files that the reference reader (safetensors' Rust `deserialize`, 0.8 in .venv)
# accepts and our reader rejects on purpose (src/checkpoint/safetensors.cc), each with why. Every
# other hostile file is broken by the reference's rules too.
STRICTER_THAN_REFERENCE = {
    "duplicate_metadata_key.safetensors": "a repeated metadata key: serde keeps the last silently",
    "empty_name.safetensors": "an empty tensor name cannot be named by an index's weight_map",
    "leading_space.safetensors": "the header must start with '{'; the reference skips whitespace",
    "metadata_null.safetensors": "'__metadata__' must be an object; the reference reads null as none",
    "unknown_field.safetensors": "an entry field we do not know could change what the entry means",
}


def test_adversarial_verdicts_against_reference():
    """Every hostile file is rejected by us; every file the reference rejects, we reject; the
    reference accepts exactly the files where we are stricter on purpose; the valid controls are
    accepted by both (so the controls are valid by the reference's rules)."""
    manifest = json.loads((ADVERSARIAL / "expected.json").read_text())
    reference_accepts = []
    for name, expect in manifest["files"].items():
        proc = run_tool("check", ADVERSARIAL / "files" / name, ok=False)
        assert proc.returncode == 1, name
        assert expect["reason"] in proc.stderr, (name, proc.stderr)
        try:
            st_rust.deserialize((ADVERSARIAL / "files" / name).read_bytes())
            reference_accepts.append(name)
        except Exception:  # the reference raises several exception types for bad files
            pass
    assert set(STRICTER_THAN_REFERENCE) <= set(manifest["files"]), "a listed file is gone"
    assert sorted(reference_accepts) == sorted(STRICTER_THAN_REFERENCE), (
        f"safetensors {safetensors.__version__} accepts {sorted(reference_accepts)}: a file not "
        "in STRICTER_THAN_REFERENCE is malformed only by our rules (or the generator is wrong); "
        "one missing from it no longer needs its entry")
    for name in manifest["valid_files"]:
        data = (ADVERSARIAL / "files" / name).read_bytes()
        assert run_tool("check", ADVERSARIAL / "files" / name).stdout == "ok\n"
        st_rust.deserialize(data)
    print(f"{len(manifest['files'])} hostile files rejected; the reference accepts "
          f"{len(reference_accepts)} of them: {reference_accepts}")
