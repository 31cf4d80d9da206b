#!/usr/bin/env python3
"""Throughput model of the one-token (decode) kernel loops, by llvm-mca.

Compiles the SIMD kernel files with the build's own flags (build/release/compile_commands.json)
plus -DFP4MOE_MCA -S, which turns on the region markers of src/kernels/cpu/mca.h around one
iteration of each kernel's K-block loop at one token, and runs llvm-mca on every region for the
CPU models given. Per region and CPU it prints the cycles per iteration, the weight bytes that
iteration consumes (codes + block scales of 8 rows (AVX2) or 16 rows (AVX-512) x one K block),
bytes per cycle, and the most loaded execution resource: the compute ceiling of the decode loop
on one core. `fp4moe bench --gemv --json` on L2-resident weights measures the same loop; the
DRAM bandwidth it is compared with comes from the same bench run.

    python3 scripts/kernel_mca.py [--build build/release] [--cpus haswell,znver3,...] [--json]

Needs llvm-mca (Debian's llvm-14 package ships llvm-mca-14). Standard library only.
"""
from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Kernel file -> (ISA of its vectors, rows per vector, CPU models that have that ISA).
FILES = {
    "src/kernels/cpu/avx2/gemm_avx2.cc": ("avx2", 8),
    "src/kernels/cpu/avx2/w4a8_avx2.cc": ("avx2", 8),
    "src/kernels/cpu/avx512/gemm_avx512.cc": ("avx512", 16),
    "src/kernels/cpu/avx512_vnni/w4a8_avx512_vnni.cc": ("avx512_vnni", 16),
    "src/kernels/cpu/avx512_bf16/gemm_bf16_avx512.cc": ("avx512_bf16", 16),
}
AVX512_CPUS = {"skylake-avx512", "icelake-server", "cooperlake", "sapphirerapids", "znver4"}
BF16_CPUS = {"cooperlake", "sapphirerapids", "znver4"}  # AVX512-BF16 (vdpbf16ps)
DEFAULT_CPUS = "haswell,skylake,znver3,icelake-server,sapphirerapids"
BLOCK_K = {"nvfp4": 16, "mxfp4": 32}  # weights per block scale along K


def llvm_mca() -> str:
    for name in ("llvm-mca", "llvm-mca-14", "llvm-mca-15", "llvm-mca-16"):
        if shutil.which(name):
            return name
    sys.exit("kernel_mca: llvm-mca not found (apt-get install llvm-14)")


def compile_to_asm(build: Path, source: str, out: Path) -> None:
    db = json.loads((build / "compile_commands.json").read_text())
    entry = next((e for e in db if e["file"].endswith(source)), None)
    if entry is None:
        sys.exit(f"kernel_mca: {source} is not in {build}/compile_commands.json")
    args = shlex.split(entry["command"])
    if "-o" in args:  # drop the object output and -c; compile to assembly instead
        i = args.index("-o")
        del args[i:i + 2]
    args = [a for a in args if a != "-c"] + ["-DFP4MOE_MCA", "-S", "-o", str(out)]
    subprocess.run(args, check=True, cwd=entry["directory"])


def straight_line(asm: str) -> dict:
    """Region name -> whether llvm-mca can model it: it models the instructions between the
    markers in text order, so every jump inside must go forward to a label inside the region (the
    prefetch helper's null check skips one prefetch: modeled as run, which is what happens). A
    loop body that GCC laid out with jumps out and back (blocks of other code in between) cannot
    be modeled this way."""
    out, name, body = {}, None, []
    for line in asm.splitlines():
        m = re.search(r"LLVM-MCA-BEGIN (\S+)", line)
        if m:
            name, body = m.group(1), []
        elif "LLVM-MCA-END" in line and name is not None:
            labels = {}
            for i, b in enumerate(body):
                lm = re.match(r"(\.L\w+):", b.strip())
                if lm:
                    labels[lm.group(1)] = i
            ok = True
            for i, b in enumerate(body):
                jm = re.match(r"\s*j[a-z]+\s+(\S+)", b)
                if jm and labels.get(jm.group(1), -1) <= i:
                    ok = False
            out[name] = ok
            name = None
        elif name is not None:
            body.append(line)
    return out


def regions(report: str) -> list[dict]:
    """Parses llvm-mca's text report: per code region its name, cycles per iteration and the
    resource with the highest pressure per iteration."""
    out = []
    for part in re.split(r"\n\[\d+\] Code Region - ", "\n" + report)[1:]:
        name = part.split("\n", 1)[0].strip()
        iters = int(re.search(r"Iterations:\s+(\d+)", part).group(1))
        cycles = int(re.search(r"Total Cycles:\s+(\d+)", part).group(1))
        rthr = float(re.search(r"Block RThroughput:\s+([\d.]+)", part).group(1))
        res_names = dict(re.findall(r"\[(\d+(?:\.\d+)?)\]\s+-\s+(\S+)", part.split(
            "Resource pressure per iteration:")[0].split("Resources:")[-1]))
        press = part.split("Resource pressure per iteration:")[1].strip().split("\n")
        cols = re.findall(r"\[(\d+(?:\.\d+)?)\]", press[0])
        vals = press[1].split()
        pairs = [(float(v), res_names.get(c, c)) for c, v in zip(cols, vals) if v != "-"]
        top = max(pairs) if pairs else (0.0, "?")
        out.append({"region": name, "cycles_per_iter": cycles / iters,
                    "block_rthroughput": rthr, "busiest": f"{top[1]} {top[0]:.1f}"})
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", type=Path, default=ROOT / "build" / "release")
    ap.add_argument("--cpus", default=DEFAULT_CPUS, help="llvm-mca -mcpu models, comma-separated")
    ap.add_argument("--iterations", type=int, default=400)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    mca = llvm_mca()
    rows = []
    with tempfile.TemporaryDirectory(prefix="fp4moe-mca.") as tmp:
        for source, (isa, rows_per_vec) in FILES.items():
            asm = Path(tmp) / (Path(source).stem + ".s")
            compile_to_asm(a.build, source, asm)
            linear = straight_line(asm.read_text())
            for cpu in a.cpus.split(","):
                if isa.startswith("avx512") and cpu not in AVX512_CPUS:
                    continue
                if isa == "avx512_bf16" and cpu not in BF16_CPUS:
                    continue
                run = subprocess.run([mca, f"-mcpu={cpu}", f"-iterations={a.iterations}",
                                      str(asm)], capture_output=True, text=True)
                if run.returncode != 0:
                    # e.g. GCC placed a region's end marker before its begin (a loop rotated
                    # around the markers): the whole file is refused, so say which and why.
                    why = next((ln.split("error:", 1)[1].strip() for ln in run.stderr.splitlines()
                                if "error:" in ln), run.stderr.strip()[:200])
                    rows.append({"cpu": cpu, "region": f"{Path(source).name} (all regions)",
                                 "cycles_per_iter": None,
                                 "busiest": f"not modeled: llvm-mca refused the file: {why}"})
                    continue
                for r in regions(run.stdout):
                    if not linear.get(r["region"], False):
                        rows.append({"cpu": cpu, "region": r["region"], "cycles_per_iter": None,
                                     "busiest": "not modeled: GCC laid the loop body out around "
                                                "jumps out of the region"})
                        continue
                    fmt = r["region"].split("_", 1)[0]
                    nbytes = rows_per_vec * (BLOCK_K[fmt] // 2 + 1)  # codes + one scale per row
                    rows.append({"cpu": cpu, **r, "bytes_per_iter": nbytes,
                                 "bytes_per_cycle": nbytes / r["cycles_per_iter"]})
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("| region (one token, one K block) | llvm-mca CPU | cycles / iter | weight bytes / iter "
          "| bytes / cycle / core | busiest resource (cycles / iter) |")
    print("|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (r["region"], r["cpu"])):
        if r["cycles_per_iter"] is None:
            print(f"| {r['region']} | {r['cpu']} | - | - | - | {r['busiest']} |")
            continue
        print(f"| {r['region']} | {r['cpu']} | {r['cycles_per_iter']:.1f} | {r['bytes_per_iter']} "
              f"| {r['bytes_per_cycle']:.2f} | {r['busiest']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
