#!/usr/bin/env python3
"""Peer benchmark: fp4moe's CPU kernels and MoE layer side by side with ggml and kt-kernel.

Run by scripts/bench_peers.sh inside the peers' cached virtual environment:
  - ggml (the shared libraries llama-cpp-python builds and ships) through its public C API via
    ctypes: MUL_MAT and MUL_MAT_ID graphs for mxfp4, nvfp4 and q4_0, in the plain CPU buffer and
    in the CPU "extra" (repack) buffer type, computed by the CPU backend with all cores;
  - kt-kernel's MoE through its public Python API (KTMoEWrapper), in a child process so its
    worker threads never share the cores with another measurement;
  - fp4moe through its own binary (`fp4moe bench ... --json`).
Same shapes, weights streamed from >= 1 GiB (distinct copies, so the caches never hold them),
peer and fp4moe runs interleaved, and the machine's DRAM read bandwidth, FP32 FMA peak and int8
dot-product peak measured in the same run by bench_peaks. One table; --json for one object.

`--self-test` checks this script's own logic (rows, ratios, table, JSON) on a fake peer and the
fp4moe binary at tiny sizes; it needs neither ggml nor kt-kernel (CI runs it).
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
import time

# --- the rows -------------------------------------------------------------------------------

GEMM_SHAPES = [(4096, 14336), (4096, 2048), (2048, 4096)]  # (K, N): Y[M, N] = X[M, K] W[N, K]^T
GEMM_TOKENS = [1, 2, 4, 8, 16, 64, 256]
MOE_BATCHES = [1, 4, 16, 64, 256, 512]
QUICK_GEMM_SHAPES = [(4096, 2048)]
QUICK_GEMM_TOKENS = [1, 16]
QUICK_MOE_BATCHES = [1]

# DeepSeek-V4-Flash MoE layer (MOE_SEMANTICS.md): 256 routed experts, top-6, one shared expert.
MOE_EXPERTS, MOE_TOP_K, MOE_HIDDEN, MOE_INTER = 256, 6, 4096, 2048

# Each peer variant is measured right after (interleaved with) one of our configurations, and
# compared with ours of the same weight format: q4_0 has NVFP4's 4.5 bits per weight.
OURS = [("mxfp4", "w4a16"), ("mxfp4", "w4a8"), ("nvfp4", "w4a16"), ("nvfp4", "w4a8")]
GGML_VARIANTS = [  # (name, ggml type, repack, our format compared with)
    ("ggml mxfp4", "mxfp4", False, "mxfp4"),
    ("ggml mxfp4 repack", "mxfp4", True, "mxfp4"),
    ("ggml nvfp4", "nvfp4", False, "nvfp4"),
    ("ggml q4_0", "q4_0", False, "nvfp4"),
    ("ggml q4_0 repack", "q4_0", True, "nvfp4"),
]
# (name, method, our format compared with, environment): kt-kernel picks its FP4 backend itself
# (AMXFP4_KGroup_MOE where AVX512-BF16 is; KT_MXFP4_BACKEND=avx2 selects AVX2MXFP4_MOE). Its
# NVFP4 (group 16) runs only on the AVX2 one: on the default backend its
# NativeMoEWrapper.load_weights refuses NVFP4, and that row says so.
KT_VARIANTS = [
    ("kt-kernel MXFP4", "MXFP4", "mxfp4", {}),
    ("kt-kernel MXFP4 avx2", "MXFP4", "mxfp4", {"KT_MXFP4_BACKEND": "avx2"}),
    ("kt-kernel NVFP4", "NVFP4", "nvfp4", {}),
    ("kt-kernel NVFP4 avx2", "NVFP4", "nvfp4", {"KT_MXFP4_BACKEND": "avx2"}),
]
# kt-kernel's output is compared with a float reference of the same MoE on this many tokens of
# each batch (the first ones); a relative error (L2 over those tokens) above the bound is an error.
KT_CHECK_TOKENS = 2
KT_CHECK_MAX_REL_ERR = 0.05

GIB = 1 << 30


def log(msg: str) -> None:
    print(f"[peers {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- fp4moe through its binary --------------------------------------------------------------


class Ours:
    def __init__(self, binary: str, peaks_binary: str, min_gib: float, seconds: float):
        self.binary, self.peaks_binary = binary, peaks_binary
        self.min_gib, self.seconds = min_gib, seconds

    def _run(self, args: list[str]) -> dict:
        out = subprocess.run([self.binary, "bench", *args, "--json"], check=True,
                             stdout=subprocess.PIPE, text=True).stdout
        return json.loads(out.strip().splitlines()[-1])

    def gemm(self, fmt: str, precision: str, m: int, k: int, n: int) -> dict:
        """w4a16 runs with BF16 activations (a model's hidden states; kt-kernel's input too): the
        BF16-activation kernels where the host has them (exact products either way)."""
        acts = ["--activations", "bf16"] if precision == "w4a16" else []
        j = self._run(["--gemv", "--format", fmt, "--precision", precision, "--m", str(m),
                       "--k", str(k), "--n", str(n), "--min-gib", str(self.min_gib),
                       "--seconds", str(self.seconds), *acts])
        return {"us": j["us"], "gbps": j["gbps"], "gflops": j["gflops"],
                "bandwidth_gbps": j["bandwidth_gbps"], "bandwidth_ratio": j["bandwidth_ratio"],
                "kernel": j["kernel"], "isa": j["isa"], "activations": j["activations"]}

    def moe(self, fmt: str, precision: str, batch: int) -> dict:
        j = self._run(["--moe", "--format", fmt, "--precision", precision, "--batch", str(batch),
                       "--min-gib", str(self.min_gib), "--seconds", str(self.seconds)])
        return {"us": j["us"], "bytes_per_call": j["bytes_per_call"],
                "bandwidth_gbps": j["bandwidth_gbps"], "ratio_to_bound": j["ratio_to_bound"],
                "isa": j["isa"]}

    def peaks(self, min_gib: float | None = None, seconds: float = 0.6) -> dict:
        out = subprocess.run([self.peaks_binary, "--json", "--min-gib",
                              str(self.min_gib if min_gib is None else min_gib),
                              "--seconds", str(seconds)],
                             check=True, stdout=subprocess.PIPE, text=True).stdout
        return json.loads(out.strip().splitlines()[-1])


# --- ggml through its public C API ----------------------------------------------------------

GGML_TYPES = {"f32": 0, "q4_0": 2, "q8_0": 8, "i32": 26, "mxfp4": 39, "nvfp4": 40}


class GgmlInitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p),
                ("no_alloc", ctypes.c_bool)]


class Ggml:
    """ctypes declarations of the part of ggml's public API used here (ggml.h, ggml-backend.h,
    ggml-alloc.h, ggml-cpu.h), over the libraries llama-cpp-python installs."""

    def __init__(self, lib_dir: str):
        self.lib_dir = lib_dir
        load = lambda name: ctypes.CDLL(os.path.join(lib_dir, name), mode=ctypes.RTLD_GLOBAL)
        self.base = load("libggml-base.so")
        self.cpu = load("libggml-cpu.so")
        self.ggml = load("libggml.so")
        P, I64, SZ, I = ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t, ctypes.c_int
        decl = [
            (self.base, "ggml_init", P, [GgmlInitParams]),
            (self.base, "ggml_free", None, [P]),
            (self.base, "ggml_tensor_overhead", SZ, []),
            (self.base, "ggml_graph_overhead_custom", SZ, [SZ, ctypes.c_bool]),
            (self.base, "ggml_new_tensor_2d", P, [P, I, I64, I64]),
            (self.base, "ggml_new_tensor_3d", P, [P, I, I64, I64, I64]),
            (self.base, "ggml_nbytes", SZ, [P]),
            (self.base, "ggml_row_size", SZ, [I, I64]),
            (self.base, "ggml_set_output", None, [P]),
            (self.base, "ggml_mul_mat", P, [P, P, P]),
            (self.base, "ggml_mul_mat_id", P, [P, P, P, P]),
            (self.base, "ggml_sigmoid", P, [P, P]),
            (self.base, "ggml_top_k", P, [P, P, I]),
            (self.base, "ggml_get_rows", P, [P, P, P]),
            (self.base, "ggml_reshape_3d", P, [P, P, I64, I64, I64]),
            (self.base, "ggml_view_2d", P, [P, P, I64, I64, SZ, SZ]),
            (self.base, "ggml_sum_rows", P, [P, P]),
            (self.base, "ggml_div", P, [P, P, P]),
            (self.base, "ggml_mul", P, [P, P, P]),
            (self.base, "ggml_add", P, [P, P, P]),
            (self.base, "ggml_swiglu_split", P, [P, P, P]),
            (self.base, "ggml_new_graph_custom", P, [P, SZ, ctypes.c_bool]),
            (self.base, "ggml_build_forward_expand", None, [P, P]),
            (self.base, "ggml_backend_buffer_free", None, [P]),
            (self.base, "ggml_backend_buffer_get_base", P, [P]),
            (self.base, "ggml_backend_buft_name", ctypes.c_char_p, [P]),
            (self.base, "ggml_backend_tensor_set", None, [P, P, SZ, SZ]),
            (self.base, "ggml_backend_tensor_get", None, [P, P, SZ, SZ]),
            (self.base, "ggml_backend_tensor_alloc", I, [P, P, P]),
            (self.base, "ggml_backend_graph_compute", I, [P, P]),
            (self.base, "ggml_backend_free", None, [P]),
            (self.base, "ggml_backend_cpu_buffer_type", P, []),
            (self.base, "ggml_backend_alloc_ctx_tensors_from_buft", P, [P, P]),
            (self.base, "ggml_backend_dev_backend_reg", P, [P]),
            (self.base, "ggml_backend_reg_get_proc_address", P, [P, ctypes.c_char_p]),
            (self.base, "ggml_gallocr_new", P, [P]),
            (self.base, "ggml_gallocr_free", None, [P]),
            (self.base, "ggml_gallocr_alloc_graph", ctypes.c_bool, [P, P]),
            (self.ggml, "ggml_backend_dev_by_type", P, [I]),
            (self.cpu, "ggml_backend_cpu_init", P, []),
            (self.cpu, "ggml_backend_cpu_set_n_threads", None, [P, I]),
        ]
        for lib, name, res, args in decl:
            f = getattr(lib, name)
            f.restype, f.argtypes = res, args
            setattr(self, name.removeprefix("ggml_"), f)
        self.threads = os.cpu_count() or 1
        self.backend = self.backend_cpu_init()
        self.backend_cpu_set_n_threads(self.backend, self.threads)
        self.cpu_buft = self.backend_cpu_buffer_type()
        self.repack_buft = self._repack_buft()

    def _repack_buft(self):
        """The CPU device's extra buffer type that repacks weights (None if this build has none)."""
        dev = self.backend_dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU
        reg = self.backend_dev_backend_reg(dev)
        fn = self.backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts")
        if not fn:
            return None
        get = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(fn)
        bufts = get(dev)
        i = 0
        while bufts and bufts[i]:
            if b"REPACK" in self.backend_buft_name(bufts[i]).upper():
                return bufts[i]
            i += 1
        return None

    def context(self, tensors: int, graph_size: int = 0, graphs: int = 1):
        """A metadata-only context (no_alloc): tensors are placed in backend buffers."""
        size = self.tensor_overhead() * tensors + 1024
        if graph_size:
            size += graphs * (self.graph_overhead_custom(graph_size, False) + 64)
        ctx = self.init(GgmlInitParams(size, None, True))
        assert ctx, "ggml_init failed"
        return ctx

    def compute(self, graph) -> None:
        status = self.backend_graph_compute(self.backend, graph)
        assert status == 0, f"ggml_backend_graph_compute: status {status}"


def valid_blocks(np, ggml_type: str, count: int, rng):
    """`count` random blocks of `ggml_type` with valid, modest scales (no NaN/Inf), as bytes."""
    if ggml_type == "mxfp4":  # 1 byte E8M0 + 16 bytes of E2M1 pairs per 32 weights
        b = rng.integers(0, 256, size=(count, 17), dtype=np.uint8)
        b[:, 0] = rng.integers(118, 124, size=count)  # 2^-9 .. 2^-4
    elif ggml_type == "nvfp4":  # 4 UE4M3 sub-block scales + 32 bytes per 64 weights
        b = rng.integers(0, 256, size=(count, 36), dtype=np.uint8)
        b[:, :4] = rng.integers(0x08, 0x38, size=(count, 4))  # positive, finite, normal-ish
    elif ggml_type == "q4_0":  # F16 scale + 16 bytes of nibbles per 32 weights
        b = rng.integers(0, 256, size=(count, 18), dtype=np.uint8)
        b[:, :2] = (rng.uniform(1e-3, 1e-2, size=count).astype(np.float16)
                    .view(np.uint8).reshape(count, 2))
    elif ggml_type == "q8_0":  # F16 scale + 32 int8 per 32 weights
        b = rng.integers(0, 256, size=(count, 34), dtype=np.uint8)
        b[:, :2] = (rng.uniform(1e-4, 1e-3, size=count).astype(np.float16)
                    .view(np.uint8).reshape(count, 2))
    else:
        raise ValueError(ggml_type)
    return b.reshape(-1)


def fill_tensor(g: Ggml, np, tensor, ggml_type: str, rng, pattern_bytes: int) -> None:
    """Valid random blocks: one random pattern of about `pattern_bytes`, repeated over the tensor
    (the values do not matter for speed; every byte is still a separate address in DRAM)."""
    nbytes = g.nbytes(tensor)
    block = {"mxfp4": 17, "nvfp4": 36, "q4_0": 18, "q8_0": 34}[ggml_type]
    pattern = valid_blocks(np, ggml_type, max(1, min(nbytes, pattern_bytes) // block), rng)
    buf = np.resize(pattern, nbytes)  # repeats whole blocks: nbytes is a multiple of block
    g.backend_tensor_set(tensor, buf.ctypes.data, 0, nbytes)


class GgmlGemm:
    """`copies` weight matrices [N, K] of one type in one buffer (plain or repack), each product
    Y = X W^T one MUL_MAT node; nodes are grouped into graphs of about 50 ms and the graphs run
    in turn, so every product reads its own copy from DRAM."""

    def __init__(self, g: Ggml, np, ggml_type: str, repack: bool, k: int, n: int, min_bytes: int):
        self.g, self.np, self.type, self.k, self.n = g, np, ggml_type, k, n
        t = GGML_TYPES[ggml_type]
        self.weight_bytes = g.row_size(t, k) * n
        self.copies = max(1, math.ceil(min_bytes / self.weight_bytes))
        self.wctx = g.context(self.copies)
        self.weights = [g.new_tensor_2d(self.wctx, t, k, n) for _ in range(self.copies)]
        buft = g.repack_buft if repack else g.cpu_buft
        if repack and buft is None:
            raise RuntimeError("this ggml build has no CPU repack buffer type")
        self.wbuf = g.backend_alloc_ctx_tensors_from_buft(self.wctx, buft)
        assert self.wbuf, "weight buffer allocation failed"
        rng = np.random.default_rng(7)
        for w in self.weights:
            fill_tensor(g, np, w, ggml_type, rng, 1 << 20)
        self.buft_name = g.backend_buft_name(buft).decode()

    def bench(self, m: int, seconds: float) -> dict:
        g, np = self.g, self.np
        # X and one output buffer that every node writes (the outputs alias: only time matters).
        xctx = g.context(1)
        x = g.new_tensor_2d(xctx, GGML_TYPES["f32"], self.k, m)
        xbuf = g.backend_alloc_ctx_tensors_from_buft(xctx, g.cpu_buft)
        xs = np.random.default_rng(m).standard_normal(self.k * m).astype(np.float32)
        g.backend_tensor_set(x, xs.ctypes.data, 0, xs.nbytes)
        gctx = g.context(2 * self.copies + 8, graph_size=2 * self.copies + 8,
                         graphs=self.copies + 3)
        ybytes = 4 * self.n * m
        ybuf_ctx = g.context(1)
        g.new_tensor_2d(ybuf_ctx, GGML_TYPES["f32"], self.n, m)
        ybuf = g.backend_alloc_ctx_tensors_from_buft(ybuf_ctx, g.cpu_buft)
        ybase = g.backend_buffer_get_base(ybuf)
        nodes = []
        for w in self.weights:
            y = g.mul_mat(gctx, w, x)
            assert g.nbytes(y) == ybytes
            assert g.backend_tensor_alloc(ybuf, y, ybase) == 0
            nodes.append(y)

        def graph_of(ys):
            gr = g.new_graph_custom(gctx, 2 * len(ys) + 8, False)
            for y in ys:
                g.build_forward_expand(gr, y)
            return gr

        one = graph_of(nodes[:1])
        g.compute(one)  # warm-up (first-touch of the work buffer)
        t0 = time.perf_counter()
        g.compute(graph_of(nodes[1:2] or nodes[:1]))
        t1 = max(time.perf_counter() - t0, 1e-6)
        per = max(1, min(self.copies, round(0.05 / t1)))
        graphs = [(graph_of(nodes[i:i + per]), len(nodes[i:i + per]))
                  for i in range(0, self.copies, per)]
        done, total = 0, 0.0
        i = 0
        while total < seconds or done == 0:
            gr, count = graphs[i % len(graphs)]
            t0 = time.perf_counter()
            g.compute(gr)
            total += time.perf_counter() - t0
            done += count
            i += 1
        us = total / done * 1e6
        g.backend_buffer_free(xbuf)
        g.backend_buffer_free(ybuf)
        for c in (xctx, gctx, ybuf_ctx):
            g.free(c)
        return {"us": us, "gbps": self.weight_bytes / us / 1e3,
                "gflops": 2.0 * m * self.k * self.n / us / 1e3, "products": done,
                "copies": self.copies, "buffer": self.buft_name}

    def close(self) -> None:
        self.g.backend_buffer_free(self.wbuf)
        self.g.free(self.wctx)


class GgmlMoe:
    """The DeepSeek-V4-Flash MoE layer as llama.cpp builds it (build_moe_ffn): router MUL_MAT,
    sigmoid, top-k, weights normalized; MUL_MAT_ID for the 256 experts' gate, up and down
    (3D tensors, plain or repack buffer); SwiGLU; weighted sum; plus the shared expert (Q8_0:
    ggml has no FP8 block-128 type; 8.5 bits per weight against FP8's ~8). Fresh random tokens
    every call; the experts each call reads are counted from the routing it computed."""

    def __init__(self, g: Ggml, np, ggml_type: str, repack: bool):
        self.g, self.np = g, np
        t = GGML_TYPES[ggml_type]
        E, H, I = MOE_EXPERTS, MOE_HIDDEN, MOE_INTER
        self.ectx = g.context(3)
        self.up = g.new_tensor_3d(self.ectx, t, H, I, E)
        self.gate = g.new_tensor_3d(self.ectx, t, H, I, E)
        self.down = g.new_tensor_3d(self.ectx, t, I, H, E)
        buft = g.repack_buft if repack else g.cpu_buft
        if repack and buft is None:
            raise RuntimeError("this ggml build has no CPU repack buffer type")
        self.buft_name = g.backend_buft_name(buft).decode()
        self.ebuf = g.backend_alloc_ctx_tensors_from_buft(self.ectx, buft)
        assert self.ebuf, "expert buffer allocation failed"
        rng = np.random.default_rng(11)
        for w in (self.up, self.gate, self.down):
            fill_tensor(g, np, w, ggml_type, rng, 8 << 20)
        self.expert_bytes = 3 * g.row_size(t, H) * I  # gate + up + down of one expert
        q8 = GGML_TYPES["q8_0"]
        self.sctx = g.context(4)
        self.router = g.new_tensor_2d(self.sctx, GGML_TYPES["f32"], H, E)
        self.sh_up = g.new_tensor_2d(self.sctx, q8, H, I)
        self.sh_gate = g.new_tensor_2d(self.sctx, q8, H, I)
        self.sh_down = g.new_tensor_2d(self.sctx, q8, I, H)
        self.sbuf = g.backend_alloc_ctx_tensors_from_buft(self.sctx, g.cpu_buft)
        r = (rng.standard_normal(H * E) * 0.02).astype(np.float32)
        g.backend_tensor_set(self.router, r.ctypes.data, 0, r.nbytes)
        for w in (self.sh_up, self.sh_gate, self.sh_down):
            fill_tensor(g, np, w, "q8_0", rng, 8 << 20)
        self.fixed_bytes = r.nbytes + 3 * g.row_size(q8, H) * I  # router + shared expert

    def bench(self, batch: int, seconds: float) -> dict:
        g, np = self.g, self.np
        E, K, H, I = MOE_EXPERTS, MOE_TOP_K, MOE_HIDDEN, MOE_INTER
        f32 = GGML_TYPES["f32"]
        xctx = g.context(1)
        x = g.new_tensor_2d(xctx, f32, H, batch)
        xbuf = g.backend_alloc_ctx_tensors_from_buft(xctx, g.cpu_buft)
        gctx = g.context(64, graph_size=128)
        logits = g.mul_mat(gctx, self.router, x)              # [E, B]
        probs = g.sigmoid(gctx, logits)
        sel = g.top_k(gctx, probs, K)                         # [K, B] i32
        g.set_output(sel)
        w = g.get_rows(gctx, g.reshape_3d(gctx, probs, 1, E, batch), sel)  # [1, K, B]
        w = g.reshape_3d(gctx, w, K, 1, batch)
        w = g.div(gctx, w, g.sum_rows(gctx, w))
        w = g.reshape_3d(gctx, w, 1, K, batch)
        xr = g.reshape_3d(gctx, x, H, 1, batch)
        up = g.mul_mat_id(gctx, self.up, xr, sel)             # [I, K, B]
        gate = g.mul_mat_id(gctx, self.gate, xr, sel)
        h = g.swiglu_split(gctx, gate, up)
        down = g.mul_mat_id(gctx, self.down, h, sel)          # [H, K, B]
        down = g.mul(gctx, down, w)
        out = None
        row = 4 * H  # bytes of one [H] F32 row; down is contiguous [H, K, B]
        for e in range(K):
            v = g.view_2d(gctx, down, H, batch, row * K, row * e)
            out = v if out is None else g.add(gctx, out, v)
        sh = g.swiglu_split(gctx, g.mul_mat(gctx, self.sh_gate, x), g.mul_mat(gctx, self.sh_up, x))
        out = g.add(gctx, out, g.mul_mat(gctx, self.sh_down, sh))
        g.set_output(out)
        gr = g.new_graph_custom(gctx, 128, False)
        g.build_forward_expand(gr, out)
        galloc = g.gallocr_new(g.cpu_buft)
        assert g.gallocr_alloc_graph(galloc, gr), "ggml_gallocr_alloc_graph failed"
        rng = np.random.default_rng(batch)
        ids = np.empty(K * batch, dtype=np.int32)

        def call() -> tuple[float, int]:
            xs = rng.standard_normal(H * batch).astype(np.float32)
            g.backend_tensor_set(x, xs.ctypes.data, 0, xs.nbytes)
            t0 = time.perf_counter()
            g.compute(gr)
            s = time.perf_counter() - t0
            g.backend_tensor_get(sel, ids.ctypes.data, 0, ids.nbytes)
            return s, len(np.unique(ids))

        call()  # warm-up
        total, calls, experts = 0.0, 0, 0
        while total < seconds or calls == 0:
            s, distinct = call()
            total += s
            calls += 1
            experts += distinct
        g.gallocr_free(galloc)
        g.backend_buffer_free(xbuf)
        g.free(gctx)
        g.free(xctx)
        us = total / calls * 1e6
        bytes_per_call = self.fixed_bytes + experts / calls * self.expert_bytes
        return {"us": us, "calls": calls, "bytes_per_call": bytes_per_call,
                "gbps": bytes_per_call / us / 1e3, "buffer": self.buft_name}

    def close(self) -> None:
        g = self.g
        g.backend_buffer_free(self.ebuf)
        g.backend_buffer_free(self.sbuf)
        g.free(self.ectx)
        g.free(self.sctx)


def ggml_lib_dir() -> str:
    import llama_cpp  # noqa: F401  (only to find its directory)
    lib = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    if not glob.glob(os.path.join(lib, "libggml-cpu*.so")):
        raise RuntimeError(f"no libggml-cpu*.so in {lib}")
    return lib


# --- kt-kernel through its public Python API (in a child process) ---------------------------

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def kt_expert_keys(method: str, expert: int) -> tuple:
    """The (gate, up, down) tensor prefixes of one expert in the checkpoints kt_write_checkpoint
    writes: DeepSeek-V4-Flash's stock MXFP4 names (ffn.experts.{i}.w1/w3/w2), ModelOpt NVFP4
    names (mlp.experts.{i}.gate/up/down_proj), and the FP8 shared expert as expert 0 of layer 1
    (its own one-expert layer)."""
    if method == "MXFP4":
        return tuple(f"model.layers.0.ffn.experts.{expert}.{p}" for p in ("w1", "w3", "w2"))
    layer = 1 if method == "FP8" else 0
    return tuple(f"model.layers.{layer}.mlp.experts.{expert}.{p}"
                 for p in ("gate_proj", "up_proj", "down_proj"))


def kt_write_checkpoint(method: str, path: str) -> None:
    """A one-layer checkpoint in the layout kt-kernel's loaders read: MXFP4 (.weight E2M1 codes +
    ue8m0 .scale per 32), NVFP4 (.weight + e4m3 .weight_scale per 16 + .weight_scale_2), or the
    FP8 block-128 shared expert (.weight_scale_inv). The routed experts are distinct (the codes
    XOR the expert's index, at the cost of the copy each needs anyway), so a token computed with
    the wrong expert shows in the reference check."""
    import numpy as np
    import torch
    from safetensors.torch import save_file

    rng = np.random.default_rng(3)
    H, I = MOE_HIDDEN, MOE_INTER
    shapes = ((I, H), (I, H), (H, I))  # gate, up, down: [N, K]
    t = {}
    if method in ("MXFP4", "NVFP4"):
        pats = []
        for n, k in shapes:
            w = torch.from_numpy(rng.integers(0, 256, size=(n, k // 2), dtype=np.uint8))
            if method == "MXFP4":
                s = torch.from_numpy(rng.integers(118, 124, size=(n, k // 32), dtype=np.uint8))
            else:
                s = torch.from_numpy(rng.uniform(0.01, 0.2, size=(n, k // 16)).astype(np.float32))
                s = s.to(torch.float8_e4m3fn)
            pats.append((w, s))
        for e in range(MOE_EXPERTS):
            for key, (w, s) in zip(kt_expert_keys(method, e), pats):
                t[f"{key}.weight"] = torch.bitwise_xor(w, e & 0xFF)
                if method == "MXFP4":
                    t[f"{key}.scale"] = s.clone()
                else:
                    t[f"{key}.weight_scale"] = s.clone()
                    t[f"{key}.weight_scale_2"] = torch.tensor(0.01, dtype=torch.float32)
    elif method == "FP8":
        for key, (n, k) in zip(kt_expert_keys(method, 0), shapes):
            w = rng.standard_normal((n, k)).astype(np.float32) * 0.05
            t[f"{key}.weight"] = torch.from_numpy(w).to(torch.float8_e4m3fn)
            t[f"{key}.weight_scale_inv"] = torch.full((n // 128, k // 128), 0.01,
                                                      dtype=torch.float32)
    else:
        raise ValueError(method)
    os.makedirs(path, exist_ok=True)
    save_file(t, os.path.join(path, "model.safetensors"))


def kt_dequantize(method: str, get, key: str):
    """One projection of a checkpoint as float32 [N, K]; get(name) reads a tensor. MXFP4: E2M1
    codes (low nibble first) times 2^(e8m0 - 127) per 32; NVFP4: the same codes times the e4m3
    weight_scale per 16 times weight_scale_2; FP8: e4m3 times weight_scale_inv per 128x128."""
    import torch

    if method == "FP8":
        w = get(f"{key}.weight").to(torch.float32)
        s = get(f"{key}.weight_scale_inv").to(torch.float32)
        return w * s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:w.shape[0], :w.shape[1]]
    codes = get(f"{key}.weight").view(torch.uint8)
    lut = torch.tensor(E2M1, dtype=torch.float32)
    w = torch.stack((lut[(codes & 15).long()], lut[(codes >> 4).long()]), dim=-1).flatten(1)
    if method == "MXFP4":
        s = torch.exp2(get(f"{key}.scale").view(torch.uint8).to(torch.float32) - 127)
        return w * s.repeat_interleave(32, 1)
    s = get(f"{key}.weight_scale").to(torch.float32) * get(f"{key}.weight_scale_2").float()
    return w * s.repeat_interleave(16, 1)


def kt_reference(method: str, path: str, x, ids, weights):
    """The MoE in float32 from the checkpoint at path, for a few tokens: out[t] = sum over j of
    weights[t, j] * down(silu(gate(x[t])) * up(x[t])) with expert ids[t, j]; x [T, hidden]."""
    import torch
    from safetensors import safe_open

    out = torch.zeros((x.shape[0], MOE_HIDDEN), dtype=torch.float32)
    with safe_open(os.path.join(path, "model.safetensors"), framework="pt") as f:
        for e in sorted(set(ids.flatten().tolist())):
            gate, up, down = (kt_dequantize(method, f.get_tensor, k)
                              for k in kt_expert_keys(method, e))
            y = (torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ down.T
            for t, j in torch.nonzero(ids == e).tolist():
                out[t] += float(weights[t, j]) * y[t]
    return out


def rel_err(y, ref) -> float:
    """||y - ref|| / ||ref|| (L2 over all elements); NaN when y is not finite."""
    d = y.float() - ref
    return float(d.norm() / ref.norm())


def unpin_torch(torch) -> None:
    """KTMoEWrapper allocates its host buffers with pin_memory=True, which torch refuses without
    an NVIDIA driver; on such a host the pin (a DMA nicety for the GPU copies) is dropped so the
    CPU MoE can run. Nothing of kt-kernel is changed."""
    def drop_pin(fn):
        def call(*args, **kwargs):
            kwargs.pop("pin_memory", None)
            return fn(*args, **kwargs)
        return call

    for name in ("zeros", "empty", "ones", "full", "tensor", "empty_like", "zeros_like"):
        setattr(torch, name, drop_pin(getattr(torch, name)))
    torch.Tensor.pin_memory = lambda self, *a, **k: self


def kt_worker(method: str, batches: list[int], seconds: float, workdir: str) -> dict:
    """Runs in a child process: kt-kernel's routed-expert MoE (method MXFP4 or NVFP4) plus the
    shared expert (method FP8, one expert, top-1, weight 1), both through KTMoEWrapper; routing is
    the caller's in kt-kernel (its GPU side computes it), so random top-6 ids and weights are
    given. The first call of each batch (untimed) is checked on its first KT_CHECK_TOKENS tokens
    against kt_reference; a batch whose output is wrong is an error, not a time."""
    import numpy as np
    import torch

    if not torch.cuda.is_available():
        unpin_torch(torch)
    # Without it a CPU tensor's forward is queued on a CUDA stream (stream 0 here) and never runs
    # on a host without CUDA: the documented synchronous submit/sync path of kt-kernel.
    os.environ.setdefault("KT_FORCE_SYNC_SUBMIT", "1")
    import kt_kernel
    from kt_kernel import KTMoEWrapper

    try:
        from kt_kernel.experts_base import KExpertsCPUBuffer
    except ImportError:
        KExpertsCPUBuffer = None
    info = {"cpu_variant": getattr(kt_kernel, "__cpu_variant__", "?"),
            "version": getattr(kt_kernel, "__version__", "?"),
            "pinned_memory_dropped": not torch.cuda.is_available(),
            "KT_FORCE_SYNC_SUBMIT": os.environ.get("KT_FORCE_SYNC_SUBMIT"),
            "KT_MXFP4_BACKEND": os.environ.get("KT_MXFP4_BACKEND"),
            "check": f"first {KT_CHECK_TOKENS} tokens of each batch vs a float32 reference, "
                     f"relative error <= {KT_CHECK_MAX_REL_ERR}"}
    out = {"info": info, "results": {}}
    threads = os.cpu_count() or 1
    layers, paths = {}, {}
    # Distinct layer indices: kt-kernel keys its host buffers' slot by layer.
    for layer, (name, m, experts) in enumerate((("routed", method, MOE_EXPERTS),
                                                ("shared", "FP8", 1))):
        path = paths[name] = os.path.join(workdir, f"{name}-{m}")
        if not os.path.exists(os.path.join(path, "model.safetensors")):
            kt_write_checkpoint(m, path)
        try:
            w = KTMoEWrapper(layer_idx=layer, num_experts=experts,
                             num_experts_per_tok=MOE_TOP_K if experts > 1 else 1,
                             hidden_size=MOE_HIDDEN, moe_intermediate_size=MOE_INTER,
                             gpu_experts_mask=None, cpuinfer_threads=threads, threadpool_count=1,
                             weight_path=path, chunked_prefill_size=max(batches), method=m)
            w.load_weights(torch.arange(experts, dtype=torch.int64))
        except Exception as e:  # e.g. NVFP4 on its AMX backend: a row with kt-kernel's reason
            return {"info": info, "error": f"kt-kernel refuses the {name} layer ({m}): "
                                           f"{type(e).__name__}: {e}"}
        # The native loader is a process-wide singleton bound to the first weight_path.
        if hasattr(type(w), "force_release_loader"):
            type(w).force_release_loader()
        layers[name] = w
        info[f"{name}_backend"] = type(getattr(w, "moe", None)).__name__

    # kt-kernel caches the host buffers of a forward (input, expert ids, weights, output) in
    # KExpertsCPUBuffer keyed by the batch size alone, shaped by the top-k of the layer that
    # allocated them. The shared layer (top-1) would be handed the routed layer's top-6 buffers:
    # its (b, 1) ids broadcast into (b, 6) (expert 0 six times, weight 1 each) and its forward
    # task told k = 6, which its native scratch (rows: max_len x top-1, plus one M_STEP) does not
    # hold: a near-zero output at batch 1, six times the expert's output above, NaN once 6 x
    # batch is well past chunked_prefill_size. So each layer keeps its own buffers here
    # (installed as the cache's current entry before its forward), or the cache is cleared before
    # each forward where this kt-kernel has no such cache.
    own: dict = {}

    def forward(name, x, ids, wts):
        key = (name, x.shape[0])
        if KExpertsCPUBuffer is not None and key in own:
            KExpertsCPUBuffer.temp_bs, KExpertsCPUBuffer.temp_buffer = x.shape[0], own[key]
        else:
            KTMoEWrapper.clear_buffer_cache()
        y = layers[name].forward(x, ids, wts, 0)
        if KExpertsCPUBuffer is not None:
            own[key] = KExpertsCPUBuffer.temp_buffer
        return y

    rng = np.random.default_rng(5)
    K = MOE_TOP_K

    def route(b: int):
        ids = np.stack([rng.choice(MOE_EXPERTS, K, replace=False) for _ in range(b)])
        wts = rng.uniform(0.05, 1.0, size=(b, K)).astype(np.float32)
        return ids, wts / wts.sum(1, keepdims=True)

    # The checked tokens: the same inputs and routing at every batch, so the reference (which
    # dequantizes each expert they use) is computed once.
    c_x = torch.from_numpy(rng.standard_normal((KT_CHECK_TOKENS, MOE_HIDDEN)).astype(np.float32))
    c_x = c_x.to(torch.bfloat16)
    c_ids, c_w = route(KT_CHECK_TOKENS)
    ref = {"routed": kt_reference(method, paths["routed"], c_x.float(), torch.from_numpy(c_ids),
                                  torch.from_numpy(c_w)),
           "shared": kt_reference("FP8", paths["shared"], c_x.float(),
                                  torch.zeros((KT_CHECK_TOKENS, 1), dtype=torch.int64),
                                  torch.ones((KT_CHECK_TOKENS, 1)))}

    for b in batches:
        def call(check: dict | None = None) -> tuple[float, int]:
            x = torch.from_numpy(rng.standard_normal((b, MOE_HIDDEN)).astype(np.float32))
            x = x.to(torch.bfloat16)
            ids, wts = route(b)
            c = min(b, KT_CHECK_TOKENS)
            if check is not None:
                x[:c], ids[:c], wts[:c] = c_x[:c], c_ids[:c], c_w[:c]
            ids_t = torch.from_numpy(ids.astype(np.int64))
            wts_t = torch.from_numpy(wts)
            sh_ids = torch.zeros((b, 1), dtype=torch.int64)
            sh_w = torch.ones((b, 1), dtype=torch.float32)
            t0 = time.perf_counter()
            y = forward("routed", x, ids_t, wts_t)
            ys = forward("shared", x, sh_ids, sh_w)
            s = time.perf_counter() - t0
            if check is not None:
                check["routed"] = rel_err(y[:c], ref["routed"][:c])
                check["shared"] = rel_err(ys[:c], ref["shared"][:c])
            return s, len(np.unique(ids))

        check: dict = {}
        try:
            call(check)
        except Exception as e:
            out["results"][str(b)] = {"error": f"kt-kernel forward failed: {type(e).__name__}: {e}"}
            continue
        if not all(v <= KT_CHECK_MAX_REL_ERR for v in check.values()):  # NaN fails too
            out["results"][str(b)] = {
                "error": f"kt-kernel output wrong: relative error {check['routed']:.3g} (routed), "
                         f"{check['shared']:.3g} (shared) vs a float32 reference of the same MoE "
                         f"on {min(b, KT_CHECK_TOKENS)} tokens", "rel_err": check}
            continue
        total, calls, experts = 0.0, 0, 0
        while total < seconds or calls == 0:
            s, distinct = call()
            total += s
            calls += 1
            experts += distinct
        fp4_expert = 3 * MOE_HIDDEN * MOE_INTER * (0.5 + (1 / 32 if method == "MXFP4" else 1 / 16))
        shared_bytes = 3 * MOE_HIDDEN * MOE_INTER * (1 + 4 / (128 * 128))
        bytes_per_call = shared_bytes + experts / calls * fp4_expert
        us = total / calls * 1e6
        out["results"][str(b)] = {"us": us, "calls": calls, "bytes_per_call": bytes_per_call,
                                  "gbps": bytes_per_call / us / 1e3, "rel_err": check}
    return out


_KT_WORKDIR: list = []


def run_kt(method: str, env: dict, batches: list[int], seconds: float) -> dict:
    """kt-kernel in a child process; returns its results or {"error": why}. The checkpoints it
    writes are kept for the next variant and removed when this process exits."""
    if not _KT_WORKDIR:
        _KT_WORKDIR.append(tempfile.TemporaryDirectory(prefix="fp4moe-kt-"))
    out = os.path.join(_KT_WORKDIR[0].name, "result.json")
    if os.path.exists(out):
        os.remove(out)
    # Its own output (the extension prints) goes to a file, the result to `out`.
    cmd = [sys.executable, os.path.abspath(__file__), "--kt-worker", method, "--batches",
           ",".join(map(str, batches)), "--seconds", str(seconds), "--workdir",
           _KT_WORKDIR[0].name, "--out", out]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env={**os.environ, **env})
    if p.returncode != 0 or not os.path.exists(out):
        tail = " | ".join(p.stdout.strip().splitlines()[-4:])
        return {"error": f"exit {p.returncode}: {tail}"}
    with open(out) as f:
        return json.load(f)


# --- rows, ratios, table --------------------------------------------------------------------


def make_row(kind: str, label: str, tokens: int, peer: str, peer_fmt: str, peer_result: dict | None,
             ours: dict, machine: dict, flops: float) -> dict:
    """One table row: a peer's figure beside ours (w4a16 and w4a8) of the same weight format.
    ratio_* = peer time / our time (> 1: ours is faster). Our fraction of the bandwidth is our
    bench's own: its GB/s over the bandwidth it read between its timed rounds, in its process
    (a VM's bandwidth changes within seconds: bench_peaks' figure, from another process at another
    moment, can be the other mode); our GFLOP/s is divided by the FP32 FMA peak (w4a16) and by the
    int8 dot-product peak (w4a8) bench_peaks measured."""
    row = {"kind": kind, "shape": label, "tokens": tokens, "peer": peer, "format": peer_fmt,
           "flops": flops}
    if peer_result and "rel_err" in peer_result:  # kt-kernel: its output vs a float reference
        row["peer_rel_err"] = peer_result["rel_err"]
    if peer_result is None or "error" in peer_result:
        row["peer_error"] = (peer_result or {}).get("error", "not run")
        row["peer_us"] = None
    else:
        row["peer_us"] = peer_result["us"]
        row["peer_gbps"] = peer_result.get("gbps")
        row["peer_gflops"] = flops / peer_result["us"] / 1e3
        beside = peer_result.get("ours_w4a16_beside")
        if beside:  # decode: our exact path run right after this peer
            row["w4a16_beside_us"] = beside["us"]
            row["w4a16_beside_bandwidth_gbps"] = beside["bandwidth_gbps"]
            row["ratio_w4a16_beside"] = peer_result["us"] / beside["us"]
    fma, i8 = machine["fp32_fma_gflops"], machine["int8_gops"]
    for prec in ("w4a16", "w4a8"):
        o = ours.get((peer_fmt, prec))
        if o is None:
            row[f"{prec}_us"] = None
            continue
        us = o["us"]
        gbps = o["gbps"] if "gbps" in o else o["bytes_per_call"] / us / 1e3
        gflops = flops / us / 1e3
        peak = fma if prec == "w4a16" else i8
        row[f"{prec}_us"] = us
        row[f"{prec}_gbps"] = gbps
        row[f"{prec}_bw_gbps"] = o["bandwidth_gbps"]
        # GEMM: the bench's own ratio (its rounds' bound); MoE: bytes / time over that bandwidth.
        row[f"{prec}_of_bw"] = o.get("bandwidth_ratio", gbps / o["bandwidth_gbps"])
        row[f"{prec}_gflops"] = gflops
        row[f"{prec}_of_peak"] = gflops / peak if peak else None
        row[f"ratio_{prec}"] = row["peer_us"] / us if row["peer_us"] else None
        if "kernel" in o:  # GEMM: which kernel ran, on which activations
            row[f"{prec}_kernel"], row[f"{prec}_activations"] = o["kernel"], o["activations"]
        if "ratio_to_bound" in o:  # MoE: fp4moe's own bytes/bandwidth bound, same process
            row[f"{prec}_ratio_to_bound"] = o["ratio_to_bound"]
    return row


def fmt(v, spec: str, none: str = "-") -> str:
    return none if v is None else format(v, spec)


def render_table(rows: list[dict], machine: dict) -> str:
    amx = machine.get("amx_int8_all") or {}
    beside_peaks = "".join(f"; AMX tile peak {gops:.0f} GOP/s ({name}; the xpk columns are of the "
                       "vector int8 peak)" if i == 0 else f", {gops:.0f} ({name})"
                       for i, (name, gops) in enumerate(amx.items()))
    mix = machine.get("int8_mix_all") or {}
    beside_peaks += "".join(f"; int8 block dot {gops:.0f} GOP/s = {gops / machine['int8_gops']:.2f} "
                        f"of the int8 peak ({name}, in registers: the integer pipes' ceiling for "
                        "the AVX2 W4A8 kernels; the xpk columns are of the peak)"
                        for name, gops in mix.items() if machine.get("int8_gops"))
    decode = machine.get("decode_mix_gbps") or {}
    beside_peaks += "".join(f"; one-token decode loop body in registers {gbps:.1f} GB/s of codes = "
                        f"{gbps / machine['bandwidth_gbps']:.2f} of the DRAM figure ({name}; loads, "
                        "scales and block ends aside: the ceiling of that loop's reads)"
                        for name, gbps in decode.items() if machine.get("bandwidth_gbps"))
    trips = [t for t in machine.get("core_round_trip_ns", []) if t and t > 0]
    if trips:
        beside_peaks += ("; core-to-core round trip " + " / ".join(f"{t:.0f}" for t in trips) +
                         " ns (before / after the rows: how the 2 CPUs share a cache; on the "
                         "2-core Zen 4 VM ~300 ns came with its ~60 GB/s DRAM mode, two dies "
                         "with a memory link each, ~55 ns with the ~35 GB/s one)")
    lines = [
        f"machine (measured in this run by bench_peaks, {machine['threads']} threads): "
        f"DRAM read {machine['bandwidth_gbps']:.2f} GB/s; FP32 FMA peak "
        f"{machine['fp32_fma_gflops']:.1f} GFLOP/s ({machine['fp32_fma_instr']}); int8 dot peak "
        f"{machine['int8_gops']:.1f} GOP/s ({machine['int8_instr']}){beside_peaks}",
        "times in us per product (GEMM) or per layer call (MoE); ratio = peer us / our us "
        "(>1: fp4moe faster); GB/s and GFLOP/s are fp4moe's; xBW: of the bandwidth each fp4moe "
        "run read between its own timed rounds (the DRAM figure above is bench_peaks', another "
        "process at another moment); xpk: of the peak above (w4a16 vs FP32 FMA, w4a8 vs int8); "
        "w4a16: exact products, of BF16 activations in the GEMM rows, of F32 ones in the MoE rows",
    ]
    head = (f"{'shape':<12} {'tok':>4} {'peer':<19} {'peer us':>9} {'w4a16 us':>9} "
            f"{'w4a8 us':>9} {'r16':>5} {'r8':>5} | {'a16 GB/s':>8} {'xBW':>4} {'GFLOP/s':>7} "
            f"{'xpk':>4} | {'a8 GB/s':>8} {'xBW':>4} {'GFLOP/s':>7} {'xpk':>4}")
    lines += [head, "-" * len(head)]
    for r in rows:
        peer = fmt(r["peer_us"], ".0f", "n/a")
        lines.append(
            f"{r['shape']:<12} {r['tokens']:>4} {r['peer']:<19} {peer:>9} "
            f"{fmt(r.get('w4a16_us'), '.0f'):>9} {fmt(r.get('w4a8_us'), '.0f'):>9} "
            f"{fmt(r.get('ratio_w4a16'), '.2f'):>5} {fmt(r.get('ratio_w4a8'), '.2f'):>5} | "
            f"{fmt(r.get('w4a16_gbps'), '.1f'):>8} {fmt(r.get('w4a16_of_bw'), '.2f'):>4} "
            f"{fmt(r.get('w4a16_gflops'), '.0f'):>7} {fmt(r.get('w4a16_of_peak'), '.2f'):>4} | "
            f"{fmt(r.get('w4a8_gbps'), '.1f'):>8} {fmt(r.get('w4a8_of_bw'), '.2f'):>4} "
            f"{fmt(r.get('w4a8_gflops'), '.0f'):>7} {fmt(r.get('w4a8_of_peak'), '.2f'):>4}")
    beside = [r for r in rows if r.get("ratio_w4a16_beside")]
    if beside:
        lines.append("one token, each ggml against our w4a16 run right after it (same DRAM mode): "
                     "peer us / ours us = ratio (the bandwidth our run read between its rounds)")
        for r in beside:
            lines.append(f"  {r['shape']:<12} {r['peer']:<19} {r['peer_us']:>7.0f} / "
                         f"{r['w4a16_beside_us']:>7.0f} = {r['ratio_w4a16_beside']:.2f} "
                         f"({r['w4a16_beside_bandwidth_gbps']:.1f} GB/s)")
    errors = sorted({(r["peer"], r["peer_error"]) for r in rows if r.get("peer_error")})
    for peer, why in errors:
        lines.append(f"{peer}: not measured: {why}")
    return "\n".join(lines)


def targets(rows: list[dict]) -> list[dict]:
    """Issue 16's targets, judged on this run's rows (each: the figure, the bar, met or not; a
    target with no rows measured is reported as such)."""
    gemm = [r for r in rows if r["kind"] == "gemm"]
    moe = [r for r in rows if r["kind"] == "moe"]
    out = []

    def add(name: str, values: list[float], bar: float, higher: bool, worst=min) -> None:
        values = [v for v in values if v is not None]
        if not values:
            out.append({"target": name, "value": None, "bar": bar, "met": None})
            return
        v = worst(values)
        met = v >= bar if higher else v <= bar
        out.append({"target": name, "value": v, "bar": bar, "met": met})

    add("decode: w4a8 GEMV at 1 token, fraction of DRAM bandwidth (worst shape/format)",
        [r.get("w4a8_of_bw") for r in gemm if r["tokens"] == 1], 0.85, True)
    add("decode: MoE batch 1, w4a8 time / (bytes / bandwidth) (worst format)",
        [r.get("w4a8_ratio_to_bound") for r in moe if r["tokens"] == 1], 1.15, False, max)
    # Each ggml variant against our exact path run right after it (same DRAM mode); the worst
    # over variants, shapes and formats is the worst against the best ggml.
    add("decode: w4a16 at 1 token vs every ggml of its format, each against ours run right after "
        "it, speed ratio (worst)",
        [r["ratio_w4a16_beside"] for r in gemm
         if r["tokens"] == 1 and r["peer"].startswith("ggml") and r.get("ratio_w4a16_beside")],
        1.0, True)
    add("prefill: w4a8 GEMM at 64+ tokens, fraction of the int8 peak (worst)",
        [r.get("w4a8_of_peak") for r in gemm if r["tokens"] >= 64], 0.5, True)
    add("prefill: w4a16 GEMM at 64+ tokens, fraction of the FP32 FMA peak (worst)",
        [r.get("w4a16_of_peak") for r in gemm if r["tokens"] >= 64], 0.5, True)
    ratios = []
    for b in sorted({r["tokens"] for r in moe if r["tokens"] >= 256}):
        at = [r for r in moe if r["tokens"] == b]
        peer = [r["peer_us"] for r in at if r["peer_us"]]
        mine = [r.get(f"{p}_us") for r in at for p in ("w4a16", "w4a8") if r.get(f"{p}_us")]
        if peer and mine:
            ratios.append(min(peer) / min(mine))
    add("prefill: MoE at 256-512 tokens, best peer time / fp4moe's best time (worst batch)",
        ratios, 2.0, True)
    return out


def render_targets(ts: list[dict]) -> str:
    lines = ["targets (issue 16), judged on this run:"]
    for t in ts:
        state = "not measured" if t["met"] is None else ("met" if t["met"] else "NOT met")
        lines.append(f"  {state:<12} {fmt(t['value'], '.3f'):>7} (bar {t['bar']}) {t['target']}")
    return "\n".join(lines)


def gemm_flops(m: int, k: int, n: int) -> float:
    return 2.0 * m * k * n


def moe_flops(batch: int) -> float:
    # Per token: top-6 routed experts + the shared one, each gate + up (H -> I) and down (I -> H).
    return 2.0 * batch * (MOE_TOP_K + 1) * 3 * MOE_HIDDEN * MOE_INTER


# --- the run ----------------------------------------------------------------------------------


def run_all(args, ours: Ours, ggml_factory, kt_runner) -> dict:
    """Measures everything, interleaved: for each peer variant, each of its sizes is followed by
    one of our configurations at the same size. ggml_factory(kind, type, repack, *shape) builds
    a loaded peer (None: ggml unavailable); kt_runner(method, batches) measures kt-kernel."""
    shapes = QUICK_GEMM_SHAPES if args.quick else GEMM_SHAPES
    tokens = QUICK_GEMM_TOKENS if args.quick else GEMM_TOKENS
    batches = QUICK_MOE_BATCHES if args.quick else MOE_BATCHES
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    if args.tokens:
        tokens = [int(v) for v in args.tokens.split(",")]
    if args.batches:
        batches = [int(v) for v in args.batches.split(",")]
    min_bytes = int(args.min_gib * GIB)
    load_before = os.getloadavg()
    log(f"machine peaks (bandwidth, FP32 FMA, int8); load average {load_before}")
    peaks_before = ours.peaks()
    rows, peer_runs = [], {}

    def pair(i: int):
        return OURS[i] if i < len(OURS) else None

    if not args.no_gemm:
        for k, n in shapes:
            label = f"{k}->{n}"
            our_gemm: dict = {}
            for vi, (peer, gtype, repack, pfmt) in enumerate(GGML_VARIANTS):
                try:
                    p = ggml_factory("gemm", gtype, repack, k, n, min_bytes)
                except Exception as e:  # a peer that cannot run here is a row, not a crash
                    p, err = None, str(e)
                for m in tokens:
                    if p is None:
                        peer_runs[(label, m, peer)] = {"error": err}
                    else:
                        log(f"{peer} {label} m={m}")
                        peer_runs[(label, m, peer)] = p.bench(m, args.seconds)
                        if m == 1:
                            # The decode comparison: our exact path of the peer's format right
                            # after the peer, so both ran in the same DRAM mode (the VM's
                            # bandwidth switches between ~35 and ~60 GB/s within a run).
                            log(f"fp4moe {pfmt} w4a16 {label} m=1 beside {peer}")
                            peer_runs[(label, m, peer)]["ours_w4a16_beside"] = ours.gemm(
                                pfmt, "w4a16", 1, k, n)
                    ours_cfg = pair(vi)
                    if ours_cfg:
                        log(f"fp4moe {ours_cfg[0]} {ours_cfg[1]} {label} m={m}")
                        our_gemm[(m, *ours_cfg)] = ours.gemm(ours_cfg[0], ours_cfg[1], m, k, n)
                if p is not None:
                    p.close()
            for m in tokens:
                mine = {(f, pr): our_gemm[(m, f, pr)] for f, pr in OURS if (m, f, pr) in our_gemm}
                for peer, _, _, pfmt in GGML_VARIANTS:
                    rows.append(make_row("gemm", label, m, peer, pfmt, peer_runs[(label, m, peer)],
                                         mine, peaks_before, gemm_flops(m, k, n)))
    if not args.no_moe:
        our_moe: dict = {}
        moe_peer: dict = {}
        for vi, (peer, gtype, repack, _) in enumerate(GGML_VARIANTS):
            try:
                p = ggml_factory("moe", gtype, repack)
            except Exception as e:
                p, err = None, str(e)
            for b in batches:
                if p is None:
                    moe_peer[(b, peer)] = {"error": err}
                else:
                    log(f"{peer} MoE batch {b}")
                    moe_peer[(b, peer)] = p.bench(b, args.seconds)
                ours_cfg = pair(vi)
                if ours_cfg:
                    log(f"fp4moe {ours_cfg[0]} {ours_cfg[1]} MoE batch {b}")
                    our_moe[(b, *ours_cfg)] = ours.moe(ours_cfg[0], ours_cfg[1], b)
            if p is not None:
                p.close()
        kt_info = {}
        kt_variants = [v for v in KT_VARIANTS
                       if not args.kt_variants or v[0] in args.kt_variants.split(",")]
        if not args.no_kt:
            for peer, method, _, env in kt_variants:
                log(f"{peer} MoE batches {batches}")
                r = kt_runner(method, env, batches, args.seconds)
                kt_info[peer] = dict(r.get("info", {}))
                if "error" in r:
                    kt_info[peer]["error"] = r["error"]
                for b in batches:
                    moe_peer[(b, peer)] = (r["results"].get(str(b), {"error": "no result"})
                                           if "results" in r else {"error": r["error"]})
        for b in batches:
            mine = {(f, pr): our_moe[(b, f, pr)] for f, pr in OURS if (b, f, pr) in our_moe}
            variants = [(v[0], v[3]) for v in GGML_VARIANTS]
            if not args.no_kt:
                variants += [(v[0], v[2]) for v in kt_variants]
            for peer, pfmt in variants:
                rows.append(make_row("moe", "DSV4F MoE", b, peer, pfmt, moe_peer[(b, peer)], mine,
                                     peaks_before, moe_flops(b)))
    else:
        kt_info = {}
    log("machine peaks again")
    peaks_after = ours.peaks()
    machine = dict(peaks_before)
    # The better bandwidth of the two (a shared host's bandwidth drifts), as fp4moe bench does.
    machine["bandwidth_gbps"] = max(peaks_before["bandwidth_gbps"], peaks_after["bandwidth_gbps"])
    machine["fp32_fma_gflops"] = max(peaks_before["fp32_fma_gflops"],
                                     peaks_after["fp32_fma_gflops"])
    machine["int8_gops"] = max(peaks_before["int8_gops"], peaks_after["int8_gops"])
    before_amx, after_amx = peaks_before.get("amx_int8_all", {}), peaks_after.get("amx_int8_all", {})
    machine["amx_int8_all"] = {k: max(v, after_amx.get(k, 0)) for k, v in before_amx.items()}
    before_mix, after_mix = peaks_before.get("int8_mix_all", {}), peaks_after.get("int8_mix_all", {})
    machine["int8_mix_all"] = {k: max(v, after_mix.get(k, 0)) for k, v in before_mix.items()}
    before_dec, after_dec = (peaks_before.get("decode_mix_gbps", {}),
                             peaks_after.get("decode_mix_gbps", {}))
    machine["decode_mix_gbps"] = {k: max(v, after_dec.get(k, 0)) for k, v in before_dec.items()}
    # Both round trips: the CPUs' placement may change during the run, as the bandwidth does.
    machine["core_round_trip_ns"] = [peaks_before.get("core_round_trip_ns"),
                                     peaks_after.get("core_round_trip_ns")]
    # Recompute the fractions against the final machine figures.
    rows = [rebase(r, machine) for r in rows]
    return {"machine": machine, "peaks_before": peaks_before, "peaks_after": peaks_after,
            "kt_kernel": kt_info, "rows": rows, "targets": targets(rows),
            "settings": {"min_gib": args.min_gib, "seconds": args.seconds, "quick": args.quick,
                         "threads": os.cpu_count(), "load_average_before": load_before,
                         "load_average_after": os.getloadavg()}}


def rebase(row: dict, machine: dict) -> dict:
    r = dict(row)
    for prec, peak in (("w4a16", machine["fp32_fma_gflops"]), ("w4a8", machine["int8_gops"])):
        if r.get(f"{prec}_us"):
            r[f"{prec}_of_peak"] = r[f"{prec}_gflops"] / peak if peak else None
    return r


# --- self-test (CI: no peers installed) -------------------------------------------------------


class FakeGemmPeer:
    """A peer whose product takes a fixed time per token (`us` x tokens): the expected ratios are
    known without ggml."""

    def __init__(self, k: int, n: int, us: float):
        self.k, self.n, self.us = k, n, us

    def bench(self, m: int, seconds: float) -> dict:
        return {"us": self.us * m, "gbps": self.k * self.n * 0.5 / (self.us * m) / 1e3}

    def close(self) -> None:
        pass


def cpu_flags() -> set[str]:
    """This host's CPU flags as /proc/cpuinfo names them (Linux; empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    m = re.search(r"^flags\s*:\s*(.*)$", text, re.M)
    return set(m.group(1).split()) if m else set()


def self_test(binary: str, peaks_binary: str) -> int:
    ours = Ours(binary, peaks_binary, min_gib=0.01, seconds=0.02)
    failures = []

    def check(cond: bool, what: str) -> None:
        if not cond:
            failures.append(what)

    peaks = ours.peaks(min_gib=0.01, seconds=0.03)
    for key in ("bandwidth_gbps", "fp32_fma_gflops", "int8_gops", "threads", "amx_int8_all",
                "int8_mix_all", "decode_mix_gbps", "core_round_trip_ns"):
        check(key in peaks, f"bench_peaks JSON has {key}")
    check(peaks.get("bandwidth_gbps", 0) > 0, "bandwidth > 0")
    check(peaks.get("fp32_fma_gflops", 0) > 0, "FP32 FMA peak > 0")
    check(peaks.get("core_round_trip_ns", 0) > 0 or (os.cpu_count() or 1) < 2,
          "a core-to-core round trip where there are two CPUs")

    def factory(kind, gtype, repack, *shape):
        if kind != "gemm":
            raise RuntimeError("fake peer: no MoE")
        if gtype == "nvfp4":
            raise RuntimeError("fake peer: no nvfp4")
        return FakeGemmPeer(shape[0], shape[1], 100.0 if not repack else 50.0)

    def kt(method, env, batches, seconds):
        return {"error": "fake kt-kernel: not installed"}

    ns = argparse.Namespace(quick=True, shapes="256x128", tokens="1,3", batches=None,
                            min_gib=0.01, seconds=0.02, no_gemm=False, no_moe=True, no_kt=True,
                            kt_variants=None)
    result = run_all(ns, ours, factory, kt)
    rows = result["rows"]
    check(len(rows) == 2 * len(GGML_VARIANTS), f"rows: {len(rows)}")
    for r in rows:
        if r["peer"] == "ggml nvfp4":
            check(r["peer_us"] is None and "no nvfp4" in r.get("peer_error", ""),
                  "a peer that cannot run is a row with its reason")
            continue
        for prec in ("w4a16", "w4a8"):
            us = r.get(f"{prec}_us")
            check(us is not None and us > 0, f"{r['peer']} m={r['tokens']}: our {prec} time")
            if us:
                want = r["peer_us"] / us
                check(abs(r[f"ratio_{prec}"] - want) < 1e-9 * want, "ratio = peer us / our us")
                check(abs(r[f"{prec}_gflops"] - r["flops"] / us / 1e3) < 1e-6, "GFLOP/s")
                # The bench's ratio (C++, from its rounds) against its own GB/s and bandwidth.
                check(abs(r[f"{prec}_of_bw"] * r[f"{prec}_bw_gbps"] - r[f"{prec}_gbps"])
                      < 1e-6 * r[f"{prec}_gbps"], "fraction of our own run's bandwidth")
        check(r.get("w4a16_activations") == "bf16" and r.get("w4a8_activations") == "f32",
              "GEMM rows: w4a16 of BF16 activations, w4a8 of F32 ones")
        check(("_bf16_" in r.get("w4a16_kernel", "")) ==
              ("avx512_bf16" in cpu_flags() and not os.environ.get("FP4MOE_ISA")),
              f"m={r['tokens']}: the BF16-activation kernel exactly where the host has it")
        check(r["format"] == ("mxfp4" if "mxfp4" in r["peer"] else "nvfp4"),
              "a peer is compared with ours of its format")
    repack = [r for r in rows if r["peer"] == "ggml mxfp4 repack" and r["tokens"] == 3]
    plain = [r for r in rows if r["peer"] == "ggml mxfp4" and r["tokens"] == 3]
    check(bool(repack and plain) and
          abs(repack[0]["ratio_w4a16"] * 2 - plain[0]["ratio_w4a16"]) < 1e-9,
          "ratios scale with the peer's time")
    one = [r for r in rows if r["tokens"] == 1 and r["peer"].startswith("ggml") and r["peer_us"]]
    check(bool(one) and all(abs(r["ratio_w4a16_beside"] - r["peer_us"] / r["w4a16_beside_us"])
                            < 1e-9 for r in one),
          "every measured one-token ggml row has our w4a16 run beside it, and its ratio")
    table = render_table(rows, result["machine"])
    check("ggml nvfp4: not measured: fake peer: no nvfp4" in table, "table lists the reason")
    check(("core-to-core round trip" in table) == (peaks.get("core_round_trip_ns", 0) > 0),
          "the machine line says the round trip where it was measured")
    check(table.count("\n") >= len(rows) + 3, "one table line per row")
    back = json.loads(json.dumps(result))
    check(back["rows"] == rows, "JSON round trip")
    ts = targets(rows)
    check(len(ts) == 6, "six targets")
    check(ts[1]["met"] is None and ts[5]["met"] is None, "targets without MoE rows: not measured")
    check(ts[0]["value"] == min(r["w4a8_of_bw"] for r in rows if r["tokens"] == 1),
          "decode target is the worst row")
    print(table)
    print(render_targets(ts))
    for f in failures:
        print(f"FAIL: {f}", file=sys.stderr)
    print(f"peers.py self-test: {len(failures)} failed")
    return 1 if failures else 0


# --- main -------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fp4moe", help="the fp4moe binary")
    ap.add_argument("--peaks", help="the bench_peaks binary")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    ap.add_argument("--quick", action="store_true",
                    help="a tiny subset (one shape, tokens 1 and 16, MoE batch 1)")
    ap.add_argument("--self-test", action="store_true",
                    help="check this script's logic on a fake peer (no peers needed)")
    ap.add_argument("--min-gib", type=float, default=1.0, help="weights streamed, GiB")
    ap.add_argument("--seconds", type=float, default=1.0, help="minimum timed seconds per figure")
    ap.add_argument("--shapes", help="KxN,... instead of the default GEMM shapes")
    ap.add_argument("--tokens", help="GEMM token counts, comma-separated")
    ap.add_argument("--batches", help="MoE batch sizes, comma-separated")
    ap.add_argument("--no-gemm", action="store_true")
    ap.add_argument("--no-moe", action="store_true")
    ap.add_argument("--no-kt", action="store_true", help="skip kt-kernel")
    ap.add_argument("--kt-variants", help="kt-kernel variants to run, by name, comma-separated "
                    f"(default all: {', '.join(v[0] for v in KT_VARIANTS)})")
    ap.add_argument("--out", help="also write the JSON here")
    ap.add_argument("--ggml-lib", help="directory of libggml*.so to use instead of llama_cpp's")
    ap.add_argument("--kt-worker", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.kt_worker:
        batches = [int(v) for v in args.batches.split(",")]
        result = kt_worker(args.kt_worker, batches, args.seconds, args.workdir)
        with open(args.out, "w") as f:
            json.dump(result, f)
        return 0
    if not args.fp4moe or not args.peaks:
        ap.error("--fp4moe and --peaks are required")
    if args.self_test:
        return self_test(args.fp4moe, args.peaks)

    import numpy as np
    ours = Ours(args.fp4moe, args.peaks, args.min_gib, args.seconds)
    g_holder: dict = {}

    def ggml_factory(kind, gtype, repack, *shape):
        if "g" not in g_holder:
            g_holder["g"] = Ggml(args.ggml_lib or ggml_lib_dir())
        g = g_holder["g"]
        log(f"loading ggml {gtype}{' repack' if repack else ''} {kind} {shape}")
        if kind == "gemm":
            k, n, min_bytes = shape
            return GgmlGemm(g, np, gtype, repack, k, n, min_bytes)
        return GgmlMoe(g, np, gtype, repack)

    result = run_all(args, ours, ggml_factory, run_kt)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    if args.json:
        print(json.dumps(result))
    else:
        print(render_table(result["rows"], result["machine"]))
        print(render_targets(result["targets"]))
        st = result["settings"]
        print(f"load average (1, 5, 15 min) before {st['load_average_before']}, after "
              f"{st['load_average_after']} on {st['threads']} cores (other work beside this "
              "run makes its figures noise)")
        for peer, info in result["kt_kernel"].items():
            print(f"{peer}: {info}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
