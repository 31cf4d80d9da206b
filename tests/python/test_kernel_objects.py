"""The machine code of the SIMD kernels holds what their sources ask for.

GCC 12 deleted every software prefetch of the AVX-512 W4A8 kernels: their helper held nothing but
prefetches, so GCC marked it `const` and dropped its calls as dead code (src/kernels/cpu/prefetch.h).
Nothing else noticed: the results stay right, only the decode bandwidth falls. This test
disassembles the built kernel library (binutils' objdump) and requires, in every object file of
a streaming SIMD kernel, the prefetch instructions and the ISA's signature instructions.
"""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

BUILD = Path(os.environ["FP4MOE_BUILD_DIR"])
LIBRARY = BUILD / "src" / "kernels" / "libfp4moe_kernels.a"

# object file -> instructions its code must contain (mnemonics as objdump prints them)
EXPECTED = {
    "gemm_avx2.cc.o": ["prefetcht0", "vfmadd231ps", "vpshufb"],
    "w4a8_avx2.cc.o": ["prefetcht0", "vpmaddubsw", "vpshufb"],
    "gemm_avx512.cc.o": ["prefetcht0", "vfmadd231ps"],
    "w4a8_avx512_vnni.cc.o": ["prefetcht0", "vpdpbusd"],
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
