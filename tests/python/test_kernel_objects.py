"""The machine code of the SIMD kernels holds what their sources ask for.

GCC 12 deleted every software prefetch of the AVX-512 W4A8 kernels: their helper held nothing but
prefetches, so GCC marked it `const` and dropped its calls as dead code (src/kernels/cpu/prefetch.h).
Nothing else noticed: the results stay right, only the decode bandwidth falls. This test
disassembles the built kernel library (binutils' objdump) and requires, in every object file of
a streaming SIMD kernel, the prefetch instructions and the ISA's signature instructions.

bench_peaks' throughput loops (bench/peers/peaks*.cc) are the yardstick the peer benchmark divides
by; GCC 12 once compiled the AVX2 vpmaddubsw loop with 7 stack stores per iteration, which measured
the stores and reported an int8 peak 1.56x too low. Their hot loops must hold the 12 measured
instructions and nothing but loop control.
"""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

BUILD = Path(os.environ["FP4MOE_BUILD_DIR"])
LIBRARY = BUILD / "src" / "kernels" / "libfp4moe_kernels.a"

# object file -> instructions its code must contain (mnemonics as objdump prints them):
# prefetcht1 is the streaming prefetch into L2 (prefetch_ahead, src/kernels/cpu/prefetch.h),
# prefetcht0 the many-token kernels' prefetch of the next tile set into L1 (prefetch_pair_block)
# and the one-tile paths' prefetch of their scale stream (prefetch_tile_scales): in the BF16
# object the latter is the only prefetcht0; in the VNNI one both appear, so there a lost scale
# prefetch would not show.
EXPECTED = {
    "gemm_avx2.cc.o": ["prefetcht1", "vfmadd231ps", "vpshufb"],
    "w4a8_avx2.cc.o": ["prefetcht1", "vpmaddubsw", "vpshufb"],
    "gemm_avx512.cc.o": ["prefetcht1", "vfmadd231ps", "vpermps"],
    "w4a8_avx512_vnni.cc.o": ["prefetcht1", "prefetcht0", "vpdpbusd", "vpermb"],
    "gemm_bf16_avx512.cc.o": ["prefetcht1", "prefetcht0", "vdpbf16ps", "vpermw"],
    "w4a8_amx.cc.o": ["ldtilecfg", "tdpbssd", "tilestored", "tilerelease", "prefetcht0"],
}


def disassembly_by_member():
    if shutil.which("objdump") is None:
        pytest.fail("objdump (binutils) is not installed; scripts/setup.sh installs g++, which needs it")
    assert LIBRARY.exists(), f"{LIBRARY} is not built"
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(LIBRARY)], check=True,
                         capture_output=True, text=True).stdout
    members = {}
    current = None
    for line in out.splitlines():
        m = re.match(r"^(\S+\.o):\s+file format", line)
        if m:
            current = m.group(1)
            members[current] = []
            continue
        # an instruction line: "  addr:<TAB>mnemonic operands"
        if current is not None and "\t" in line:
            fields = line.split("\t", 1)[1].split()
            if fields:
                members[current].append(fields[0])
    return members


@pytest.fixture(scope="module")
def members():
    return disassembly_by_member()


@pytest.mark.parametrize("member", sorted(EXPECTED))
def test_simd_kernel_object_holds_its_instructions(members, member):
    assert member in members, f"{member} not in {LIBRARY.name}: {sorted(members)}"
    mnemonics = members[member]
    counts = {m: sum(1 for x in mnemonics if x == m) for m in EXPECTED[member]}
    missing = [m for m, c in counts.items() if c == 0]
    assert not missing, f"{member}: no {missing} in its machine code ({len(mnemonics)} instructions)"


PEAKS = BUILD / "bench_peaks"
# throughput function (symbol prefix) -> (the instruction its loop measures, in any of its operand
# orders, 12 per iteration; the other instructions the loop is made of, exactly)
FMA = ("vfmadd132ps", "vfmadd213ps", "vfmadd231ps")
PEAK_LOOPS = {
    "fp4moe::bench::fma_f32_avx2": (FMA, {}),
    "fp4moe::bench::fma_f32_avx512": (FMA, {}),
    "fp4moe::bench::maddubs_i8_avx2": (("vpmaddubsw",), {}),
    "fp4moe::bench::dpbusd_i8_avx512": (("vpdpbusd",), {}),
    # 3 groups of the W4A8 block dot: 4 vpmaddubsw + 3 vpaddw + vpmaddwd + vpaddd
    "fp4moe::bench::w4a8_mix_avx2": (("vpmaddubsw",), {"vpaddw": 9, "vpmaddwd": 3, "vpaddd": 3}),
    # the one-token decode loops' bodies: 3 chunk pairs of bf16_tile, 6 chunks of w4a8_tile
    "fp4moe::bench::bf16_tile_mix_avx512": (("vdpbf16ps",), {"vpermb": 6, "vpsrlw": 6, "vpermw": 12}),
    "fp4moe::bench::w4a8_tile_mix_avx512": (("vpdpbusd",), {"vpermb": 12, "vpsrlw": 6}),
}
LOOP_CONTROL = {"add", "sub", "inc", "dec", "cmp", "test", "jne", "jnz", "jb", "jl", "jg", "ja",
                "nop", "xchg"}


def function_lines(disassembly, name):
    """The instruction lines (address, mnemonic, text) of the function whose demangled name
    starts with `name`."""
    lines, inside = [], False
    for line in disassembly.splitlines():
        header = re.match(r"^[0-9a-f]+ <(.+)>:$", line)
        if header:
            inside = header.group(1).startswith(name + "(")
            continue
        m = re.match(r"^\s+([0-9a-f]+):\t(\S+)\s*(.*)$", line)
        if inside and m:
            lines.append((int(m.group(1), 16), m.group(2), m.group(3)))
    return lines


def hot_loop(lines, mnemonics):
    """The body of the backward branch whose body holds the most of `mnemonics`."""
    addresses = [a for a, _, _ in lines]
    best = []
    for i, (_, op, text) in enumerate(lines):
        target = re.match(r"([0-9a-f]+) <", text)
        if not op.startswith("j") or target is None:
            continue
        t = int(target.group(1), 16)
        if t in addresses and t <= lines[i][0]:
            body = lines[addresses.index(t):i + 1]
            if (sum(op2 in mnemonics for _, op2, _ in body) >
                    sum(op2 in mnemonics for _, op2, _ in best)):
                best = body
    return best


@pytest.fixture(scope="module")
def peaks_disassembly():
    if shutil.which("objdump") is None:
        pytest.fail("objdump (binutils) is not installed; scripts/setup.sh installs g++, which needs it")
    assert PEAKS.exists(), f"{PEAKS} is not built"
    return subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", str(PEAKS)], check=True,
                          capture_output=True, text=True).stdout


@pytest.mark.parametrize("function", sorted(PEAK_LOOPS))
def test_peak_loop_is_the_measured_instruction_and_loop_control(peaks_disassembly, function):
    mnemonics, parts = PEAK_LOOPS[function]
    lines = function_lines(peaks_disassembly, function)
    assert lines, f"{function} not found in {PEAKS}"
    body = hot_loop(lines, mnemonics)
    ops = [op for _, op, _ in body]
    measured = sum(op in mnemonics for op in ops)
    assert measured == 12, f"{function}: its loop holds {measured} of {mnemonics}: {ops}"
    for op, count in parts.items():
        assert ops.count(op) == count, f"{function}: its loop holds {ops.count(op)} {op}: {ops}"
    other = [f"{op} {text}" for _, op, text in body
             if op not in mnemonics and op not in parts and op not in LOOP_CONTROL]
    assert not other, f"{function}: its loop also holds {other}, which the peak would measure"
