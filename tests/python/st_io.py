"""safetensors files (TensorSpec takes torch-style dtype names, which are numpy/ml_dtypes names) through the Python safetensors package's dtype-agnostic API (serialize_file /
deserialize), which, unlike safetensors.numpy, handles BF16 and the F8 dtypes via ml_dtypes."""
import ml_dtypes
import numpy as np
import safetensors

_NAMES = {
    np.dtype(np.int8): "I8", np.dtype(np.uint8): "U8", np.dtype(np.float32): "F32",
    np.dtype(np.float16): "F16", np.dtype(np.int32): "I32", np.dtype(np.int64): "I64",
    np.dtype(ml_dtypes.bfloat16): "BF16", np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3",
    np.dtype(ml_dtypes.float8_e8m0fnu): "F8_E8M0", np.dtype(ml_dtypes.float8_e5m2): "F8_E5M2",
}
_DTYPES = {v: k for k, v in _NAMES.items()}


def save(tensors: dict, path, metadata=None):
    arrays = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    specs = {k: safetensors.TensorSpec(dtype=a.dtype.name, shape=list(a.shape),
                                       data_ptr=a.ctypes.data, data_len=a.nbytes)
             for k, a in arrays.items()}
    safetensors.serialize_file(specs, str(path), metadata or {"format": "pt"})


def load(path) -> dict:
    with open(path, "rb") as f:
        entries = safetensors.deserialize(f.read())
    by_name = {d.name: d for d in _NAMES}
    return {name: np.frombuffer(bytes(e["data"]),
                                dtype=_DTYPES.get(e["dtype"]) or by_name[e["dtype"]]).reshape(e["shape"])
            for name, e in entries}
