"""The 256-bit kernel files hold no AVX-512 encodings.

Kernels for CPUs without AVX-512 (kernels/x86/avx2, kernels/x86/avxvnni) are
compiled with -mavx2 (and -mavxvnni), so the compiler emits VEX code only;
their inline assembly is another matter: the assembler encodes an instruction
that exists only in EVEX form (e.g. `vpsrlw` with a memory operand) as EVEX
without a word, and it runs on every AVX-512 CPU, where the kernel tests run,
and faults on an AVX2-only one. This test reads the object files of the
build tree that `tools/install.sh` / `tools/test.sh` leave behind.
"""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# objdump marks an EVEX encoding of a VEX instruction with "{evex}"; AVX-512
# instructions name zmm, mask or upper-16 vector registers.
AVX512_RE = re.compile(r"\{evex\}|%zmm\d|%[xy]mm(1[6-9]|2\d|3[01])\b|%k[0-7]\b")


def _objects():
    objs = []
    for isa in ("avx2", "avxvnni"):
        objs += sorted(ROOT.glob(f"build/**/kernels/x86/{isa}/*.o"))
    return objs


def test_256_bit_kernel_objects_have_no_avx512_encodings():
    if not shutil.which("objdump"):
        pytest.fail("objdump (binutils) is needed to read the kernel objects")
    objs = _objects()
    assert objs, f"no kernel objects under {ROOT / 'build'}: build the extension first (bash tools/install.sh)"
    bad = {}
    for obj in objs:
        text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(obj)], capture_output=True, text=True,
                              check=True).stdout
        hits = [line.strip() for line in text.splitlines() if AVX512_RE.search(line)]
        if hits:
            bad[str(obj.relative_to(ROOT))] = hits[:5]
    assert not bad, f"AVX-512 encodings in 256-bit kernel objects: {bad}"


def test_the_pattern_sees_an_evex_encoding():
    # What the assembler makes of the form the test guards against.
    assert AVX512_RE.search("  14d53e:\t{evex} vpsrlw $0x8,(%rdx),%ymm9")
    assert AVX512_RE.search("vpdpbusd %zmm1,%zmm2,%zmm3")
    assert AVX512_RE.search("vpaddd %ymm17,%ymm1,%ymm1")
    assert not AVX512_RE.search("vpsrlw $0x8,%ymm9,%ymm9")
    assert not AVX512_RE.search("{vex} vpdpbusd %ymm1,%ymm2,%ymm3")
