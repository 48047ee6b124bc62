"""Kernel tests generated from the kernel registry (torchao_kernels.info()["kernels"]).

Every kernel is run through torch.ops.torchao_kernels._run_kernel on weights
packed in the kernel's format and compared, with exact equality, against the
reference ("scalar") kernel of the same format. Kernels this CPU cannot run are
skipped, naming the missing ISA extensions.
"""
import re
import tomllib
import zlib
from pathlib import Path

import pytest
import torch

import torchao_kernels

OPS = torch.ops.torchao
K = torch.ops.torchao_kernels

INFO = torchao_kernels.info()
# Linear (matmul) kernels; the embedding-lookup rows are tested in test/test_embedding.py.
KERNELS = [k for k in INFO["kernels"] if k["op"] == "linear"]
KERNEL_BY_NAME = {k["name"]: k for k in KERNELS}
CPU_ISA = set(INFO["cpu"]["isa"])
REFERENCE = {k["format"]: k["name"] for k in KERNELS if k["isa"] == "scalar"}
PORTABLE_REFERENCE = REFERENCE.get("n1k4")
KERNEL_IDS = [k["name"] for k in KERNELS]

# docs/selection.md "Kernel names": activation panel, weight format, op, tile,
# variant and ISA each have their own part.
NAME_RE = re.compile(
    r"^qd8(?:p(\d+)x(\d+)(i16)?)?_f32_qbw(n\d+k\d+)_(gemv|gemm)_(\d+)x(\d+)(_shared|_prefetch|_stream|_asm)?"
    r"__(scalar|avx2|avxvnni|avx512vnni|neon|dotprod|i8mm)$"
)

# (n, k, group_size): covers every n in {1, 15, 17, 37, 70, 129}, every k in
# {64, 192, 256} and every group size in {16, 32, 64, 128, k (per channel)}.
SHAPES = [
    (1, 64, 16),
    (15, 64, 64),
    (17, 192, 32),
    (37, 256, 128),
    (70, 192, 192),
    (129, 256, 256),
    (70, 256, 16),
    (129, 192, 64),
]


def _require_runnable(kinfo):
    if not kinfo["runnable"]:
        missing = sorted(set(kinfo["required_isa"]) - CPU_ISA)
        pytest.skip(f"{kinfo['name']} needs ISA {'+'.join(missing) or kinfo['required_isa']}, "
                    f"which this CPU lacks")


def _weights(gen, bits, n, k, g, zeros, bias):
    qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    q = torch.randint(qmin, qmax + 1, (n, k), generator=gen, dtype=torch.int8)
    # make sure the extremes of the bit range occur
    q.view(-1)[0] = qmin
    q.view(-1)[-1] = qmax
    if n * k > 4:
        q.view(-1)[1] = qmax
        q.view(-1)[2] = qmin
    s = torch.rand(n, k // g, generator=gen) * 2.0 + 1e-3
    s[torch.rand(n, k // g, generator=gen) < 0.2] *= -1.0  # a few negative scales
    z = None
    if zeros:
        # zero points anywhere in int8, extremes included
        z = torch.randint(-128, 128, (n, k // g), generator=gen, dtype=torch.int8)
        z.view(-1)[0] = -128
        z.view(-1)[-1] = 127
    b = torch.randn(n, generator=gen) * 3.0 if bias else None
    return q, s, z, b


def _activations(gen, m, k):
    x = torch.randn(m, k, generator=gen)
    for r in range(m):
        kind = r % 6
        if kind == 1:
            x[r] = x[r].abs() * 100.0  # positive only, large
        elif kind == 2:
            x[r] = -x[r].abs() * 1e-3  # negative only, small
        elif kind == 3:
            x[r, r % k] = 1e4  # one outlier
        elif kind == 4 and r > 0:
            x[r] = 0.0  # all zeros
        elif kind == 5:
            x[r] = torch.randint(-3, 4, (k,), generator=gen).float()  # few distinct values
    return x


def _pack(q, s, z, bits, g, b, fmt):
    return OPS.pack_8bit_act_xbit_weight(q, s, z, bits, g, b, target=fmt)


# ---------------------------------------------------------------------------
# Every kernel == the reference kernel of its format, bit for bit, on cases
# derived from the row's declared parameters (as XNNPACK derives its cases
# from mr / nr / kr): the shapes that reach each of its code paths, not a
# fixed list that reaches them by chance. kernels/tests/test_kernels.cpp
# derives the same cases (derive_cases there); keep the two in step.

# Constants of the x86 shared-unpack GEMMs (ymm_gemm_impl.h and
# avx512vnni/qd8_f32_qbw_gemm_avx512vnni.cpp): a pass covers up to
# PASS_ROWS rows, k is unpacked in chunks of CHUNK_BYTES, and groups over
# MAX_CHUNK_GROUP are unpacked chunk by chunk with int32 sums carried across
# chunks (256-bit tiles) or run the in-register tiles (512-bit tiles).
# Read from kernels/manifest.toml ([shared_unpack]), where they are declared.
with open(Path(__file__).resolve().parent.parent / "kernels" / "manifest.toml", "rb") as _f:
    _SHARED_UNPACK = tomllib.load(_f)["shared_unpack"]
PASS_ROWS = _SHARED_UNPACK["pass_rows"]
PASS_ROWS_256 = _SHARED_UNPACK["pass_rows_256"]  # the 256-bit tiles' passes
CHUNK_BYTES = _SHARED_UNPACK["chunk_bytes"]
MAX_CHUNK_GROUP = _SHARED_UNPACK["max_chunk_group_size"]
# The op splits rows across threads only below this many column steps per thread.
OP_STEPS_PER_THREAD = 4

# (k, group_size) by superblock structure (kb = 32 if group_size % 32 == 0
# else 16): kb 32 and kb 16 with one and several superblocks per group, and
# per-channel groups (group_size = k) of both kinds.
DEPTHS = [(64, 32), (48, 16), (192, 48), (160, 80), (256, 128), (96, 96), (80, 80)]
# Several unpack chunks per column step (k = 1024, groups of 64: 2-3 chunks
# on every x86 shared path), the largest group one chunk holds, a group past
# it, and two such groups per row of kb 16 (49 superblocks each).
CHUNKS = [(1024, 64), (1024, MAX_CHUNK_GROUP), (1024, 2 * MAX_CHUNK_GROUP), (1568, 784)]

# Weight variants rotate over the cases of a row instead of multiplying
# them: bits cycle with period 8, (zeros, bias) with period 4 shifted once
# per bits cycle (so every width meets every pair), bfloat16 scale storage
# every third case (coprime with both).
BITS_ORDER = [4, 1, 8, 3, 2, 5, 7, 6]


def _combo(i, kinfo):
    """(bits, zeros, bias, bf16) of a row's i-th case, within what the row supports."""
    bits = BITS_ORDER[i % len(BITS_ORDER)]
    j = 0
    while bits not in kinfo["bits"]:
        j += 1
        bits = BITS_ORDER[(i + j) % len(BITS_ORDER)]
    zb = (i + i // len(BITS_ORDER)) % 4
    return bits, bool(zb & 1) and kinfo["zeros"], bool(zb & 2) and kinfo["bias"], i % 3 == 1


def derive_cases(kinfo):
    """The (m, n, k, group_size, threads, bits, zeros, bias, bf16) cases of a
    registry row, from its declared parameters."""
    name, mr, nr = kinfo["name"], kinfo["mr"], kinfo["nr"]
    block = int(kinfo["format"][1:].split("k")[0])  # format rows per block: n16k4 -> 16
    step = max(1, nr // block)  # blocks per column step
    panel = kinfo["lhs_panel_rows"]
    gemv = "_gemv_" in name
    m_min, m_max = kinfo["m_min"], kinfo["m_max"] or 0
    # Rows whose m-tiles share unpacked weights: the _shared rows, and the
    # panel tiles (their run takes the same unpacked passes once m > mr).
    shared = "_shared__" in name or panel > 0

    # m: every full tile and a partial one (tails of 1, 2 and mr - 1 rows: the
    # int16-panel 4x16 tile has a loop per tail length), panel boundaries,
    # the declared range.
    ms = {1, mr - 1, mr, mr + 1, mr + 2, 2 * mr + 1, m_min}
    if panel:
        ms |= {panel - 1, panel, panel + 1, 2 * panel + 1}
    if m_max:
        ms.add(m_max)
    elif gemv:
        ms.add(5)  # a GEMV meant for any m: rows past the first few
    if gemv:
        ms |= {2, 3}
    ms = sorted(m for m in ms if m >= 1)
    # the row's typical m: one full tile plus a row (past mr: the shared path)
    m_rep = 1 if mr == 1 else (2 * mr + 1 if shared else mr + 1)
    # n: one partial block, a partial 8-column half, exactly one column step,
    # a step plus one single block, a step plus a tail of step - 1 blocks
    # (the last one partial), a 2-block tail where steps hold more than 2.
    if block == 1:
        ns = [1, 7, 37]
        n_rep = 37
    else:
        ns = {1, block // 2 + 1, nr, nr + block, 2 * nr - 1}
        if step > 2:
            ns.add(nr + 2 * block + 5)
        ns = sorted(ns)
        n_rep = nr + block - 1  # a full step and a partial block
    rows_kg = [(64, 32), (96, 16), (128, 64)]

    cases = []  # (section, m, n, k, g, threads, combos)
    for i, m in enumerate(ms):
        cases.append(("rows", m, n_rep, *rows_kg[i % len(rows_kg)], 1, 1))
    for i, n in enumerate(ns):
        cases.append(("cols", m_rep, n, *rows_kg[i % len(rows_kg)], 1, 1))
    for k, g in DEPTHS:  # superblock structure matters per bit width: two variants each
        cases.append(("depth", m_rep, n_rep, k, g, 1, 2))
    for k, g in CHUNKS:
        cases.append(("chunk", m_rep, n_rep, k, g, 1, 1))
    if shared:
        # one full pass, a second pass of one row, three passes (with chunks),
        # for the pass length of either tile width
        for rows in sorted({PASS_ROWS, PASS_ROWS_256}):
            cases.append(("pass", rows, nr + block, 256, 64, 1, 1))
            cases.append(("pass", rows + 1, nr + block, 192, 48, 1, 1))
            cases.append(("pass", 2 * rows + 1, nr + block, 1024, 64, 1, 1))
            cases.append(("pass", rows + 1, nr + block, 1536, 768, 1, 1))  # long groups over two passes
    # Two threads through the op: few column steps split the rows (tasks
    # start on tile boundaries; past one tile each for shared rows), many
    # split the columns (the last task a partial step).
    m_split = 3 if mr == 1 else (PASS_ROWS + 1 if shared else 4 * mr + 3)
    cases.append(("split-rows", m_split, n_rep, 128, 32, 2, 1))
    cases.append(("split-cols", m_rep, 2 * OP_STEPS_PER_THREAD * nr + block + 3, 128, 32, 2, 1))

    out, seen, i = [], set(), 0
    for _section, m, n, k, g, threads, variants in cases:
        for _ in range(variants):
            bits, zeros, bias, bf16 = _combo(i, kinfo)
            i += 1
            key = (m, n, k, g, threads, bits, zeros, bias, bf16)
            if key not in seen:
                seen.add(key)
                out.append(key)
    return out


def _case_id(name, case):
    m, n, k, g, threads, bits, zeros, bias, bf16 = case
    return (f"{name}-m{m}-n{n}-k{k}-g{g}-b{bits}" + ("-z" if zeros else "") + ("-bias" if bias else "")
            + ("-bf16" if bf16 else "") + (f"-t{threads}" if threads > 1 else ""))


DERIVED = [(k["name"], c) for k in KERNELS for c in derive_cases(k)]


def _run_op(x, packed, g, n, k, kernel, threads):
    """The public op with `kernel` forced and `threads` threads: the row
    and column splits of ops/impl/linear_8bit_act_xbit_weight.cpp."""
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torchao_kernels.overrides(force=kernel):
            return OPS.linear_8bit_act_xbit_weight(x, packed, g, n, k)
    finally:
        torch.set_num_threads(saved)


@pytest.mark.parametrize("kernel,case", DERIVED, ids=[_case_id(n, c) for n, c in DERIVED])
def test_kernel_matches_reference(kernel, case):
    kinfo = KERNEL_BY_NAME[kernel]
    _require_runnable(kinfo)
    m, n, k, g, threads, bits, zeros, bias, bf16 = case
    fmt = kinfo["format"]
    ref = REFERENCE[fmt]
    if ref == kernel:  # a reference row: against the reference of another format
        others = [f for f in REFERENCE if f != fmt]
        if not others:
            pytest.skip("only one format in this build: nothing to compare the reference with")
        ref_fmt, ref = others[0], REFERENCE[others[0]]
    else:
        ref_fmt = fmt
    gen = torch.Generator().manual_seed(zlib.crc32(_case_id(kernel, case).encode()))
    q, s, z, b = _weights(gen, bits, n, k, g, zeros, bias)
    if bf16:
        s = s.to(torch.bfloat16)
    packed = _pack(q, s, z, bits, g, b, fmt)
    assert torchao_kernels.packed_info(packed)["scale_dtype"] == ("bfloat16" if bf16 else "float32")
    ref_packed = packed if ref_fmt == fmt else _pack(q, s, z, bits, g, b, ref_fmt)
    x = _activations(gen, m, k)
    expected = K._run_kernel(x, ref_packed, ref)
    if threads > 1:
        got = _run_op(x, packed, g, n, k, kernel, threads)
    else:
        got = K._run_kernel(x, packed, kernel)
    assert got.shape == (m, n)
    if not torch.equal(got, expected):
        diff = (got - expected).abs()
        idx = torch.nonzero(diff != 0)[:5].tolist()
        pytest.fail(f"{kernel} != {ref} for {_case_id(kernel, case)}: max |diff|={diff.max().item()} "
                    f"({int((diff != 0).sum())} of {m * n} differ) first mismatches at {idx}")


def test_derived_cases_reach_parameter_paths():
    """The derivation itself: per row, the cases reach what its parameters
    promise (so a change of derive_cases cannot quietly drop a path)."""
    for kinfo in KERNELS:
        cases = derive_cases(kinfo)
        name, mr, nr = kinfo["name"], kinfo["mr"], kinfo["nr"]
        ms = {c[0] for c in cases}
        assert {mr, mr + 1} <= ms, name
        kbs = {32 if g % 32 == 0 else 16 for _, _, k, g, *_ in cases}
        assert kbs == {16, 32}, name
        assert any(k // g > 1 and g % 32 and (g // 16) > 1 for _, _, k, g, *_ in cases), name  # kb 16, several superblocks
        assert any(k == g for _, _, k, g, *_ in cases), name  # per channel
        assert any(g > MAX_CHUNK_GROUP for _, _, k, g, *_ in cases), name
        assert {c[4] for c in cases} == {1, 2}, name
        for bits in (1, 2, 3, 4, 5, 8):
            assert any(c[5] == bits for c in cases) or bits not in kinfo["bits"], (name, bits)
        assert any(c[8] and c[7] for c in cases) or not kinfo["bias"], name  # bf16 scales with bias
        assert {c[6] for c in cases} == ({False, True} if kinfo["zeros"] else {False}), name
        if "_shared__" in name or kinfo["lhs_panel_rows"]:
            for rows in (PASS_ROWS, PASS_ROWS_256):
                assert {rows, rows + 1, 2 * rows + 1} <= ms, name
        ids = [_case_id(name, c) for c in cases]
        assert len(ids) == len(set(ids)), name


@pytest.mark.parametrize("kernel", KERNEL_IDS)
def test_kernel_extreme_operands_match_reference(kernel):
    """Saturation check: every weight at the top (or bottom) of its range
    against activation rows that quantize to 127 or -128 everywhere (constant
    +1 / -1 rows), alternating signs, and a whole group of one sign. Kernels
    that keep int16 pair sums (AVX2) or split operands in nibbles reach their
    accumulators' limits here and nowhere else."""
    kinfo = KERNEL_BY_NAME[kernel]
    _require_runnable(kinfo)
    fmt = kinfo["format"]
    ref = REFERENCE[fmt]
    n, k, g = 37, 256, 64
    x = torch.ones(6, k)
    x[1] = -1.0
    x[2, 1::2] = -1.0  # alternating
    x[3, :g] = -1.0  # one group negative, the rest positive
    x[4] = torch.linspace(-1.0, 1.0, k)
    x[5, ::2] = 0.0
    for bits in kinfo["bits"]:
        qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        for qv in (qmax, qmin):
            q = torch.full((n, k), qv, dtype=torch.int8)
            s = torch.full((n, k // g), 0.01)
            for zeros in (False, True):
                z = torch.full((n, k // g), qmin if qv == qmax else qmax, dtype=torch.int8) if zeros else None
                packed = _pack(q, s, z, bits, g, None, fmt)
                for m in sorted({1, kinfo["mr"], 6}):
                    xm = x[:m].contiguous()
                    expected = K._run_kernel(xm, packed, ref)
                    got = K._run_kernel(xm, packed, kernel)
                    assert torch.equal(got, expected), (kernel, bits, qv, zeros, m)


def _not_bf16(s: torch.Tensor) -> torch.Tensor:
    """s (bfloat16 values as float32) with scale [0, 0] moved off the bfloat16
    grid (lowest mantissa bit set), so the packer keeps float32 storage."""
    s = s.clone()
    s.view(torch.int32)[0, 0] |= 1
    return s


@pytest.mark.parametrize("kernel", KERNEL_IDS)
def test_kernel_bf16_scales_match_float32_storage(kernel):
    """Scales stored as bfloat16 (scales and zero points then sit in per-block
    arrays) give the results of float32 storage: every kernel against the
    reference on the same buffer, and against the reference on a float32-stored
    buffer of the same values (one scale nudged off the bfloat16 grid to force
    float32 storage: its output column is left out), bits 1..8, with and
    without zero points and bias."""
    kinfo = KERNEL_BY_NAME[kernel]
    _require_runnable(kinfo)
    fmt = kinfo["format"]
    ref = REFERENCE[fmt]
    gen = torch.Generator().manual_seed(zlib.crc32(kernel.encode()) % 997)
    for bits in kinfo["bits"]:
        for zeros, bias in ((False, False), (True, True), (True, False)):
            if (zeros and not kinfo["zeros"]) or (bias and not kinfo["bias"]):
                continue
            for n, k, g in SHAPES[1:6]:
                q, s, z, b = _weights(gen, bits, n, k, g, zeros, bias)
                s16 = s.to(torch.bfloat16)
                p16 = _pack(q, s16, z, bits, g, b, fmt)
                p32 = _pack(q, _not_bf16(s16.float()), z, bits, g, b, fmt)
                assert torchao_kernels.packed_info(p16)["scale_dtype"] == "bfloat16"
                assert torchao_kernels.packed_info(p32)["scale_dtype"] == "float32"
                x = _activations(gen, 33, k)
                for m in (1, 2, 5, 8, 33):
                    xm = x[:m].contiguous()
                    got = K._run_kernel(xm, p16, kernel)
                    assert torch.equal(got, K._run_kernel(xm, p16, ref)), (kernel, bits, zeros, bias, m, n, k, g)
                    want = K._run_kernel(xm, p32, ref)
                    assert torch.equal(got[:, 1:], want[:, 1:]), (kernel, bits, zeros, bias, m, n, k, g)


EXTREME_SHAPES = [(17, 2048, 2048), (33, 4096, 256), (5, 32768, 32768)]


@pytest.mark.parametrize("kernel", KERNEL_IDS)
def test_kernel_extreme_values(kernel):
    """Largest integer products and sums (8-bit weights at the ends of the range,
    zero points at the other end, activations quantized to -128 / 127, the
    largest group size): the int32 group sums must stay exact, with no
    saturating shortcuts."""
    kinfo = KERNEL_BY_NAME[kernel]
    _require_runnable(kinfo)
    fmt = kinfo["format"]
    for bits in [b for b in (8, 7, 4, 1) if b in kinfo["bits"]]:
        qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        for n, k, g in EXTREME_SHAPES:
            q = torch.full((n, k), qmax, dtype=torch.int8)
            q[1::2] = qmin  # odd rows at the other end
            q[2, ::3] = qmin  # a mixed row
            z = torch.full((n, k // g), -128, dtype=torch.int8)
            z[1::2] = 127
            z[2] = 0
            s = torch.ones(n, k // g)
            x = torch.empty(4, k)
            x[0] = 1.0  # all q = 127
            x[1] = -1.0  # all q = -128
            x[2] = torch.where(torch.arange(k) % 2 == 0, torch.tensor(1.0), torch.tensor(-1.0))
            x[3] = torch.where(torch.arange(k) % 4 < 2, torch.tensor(255.0), torch.tensor(-0.0))
            for zeros in (None, z):
                packed = _pack(q, s, zeros, bits, g, None, fmt)
                want = K._run_kernel(x, packed, REFERENCE[fmt])
                got = K._run_kernel(x, packed, kernel)
                assert torch.equal(got, want), (bits, n, k, g, zeros is not None)
                if kernel == REFERENCE[fmt]:  # the reference itself against the float64 model
                    model = _model_linear(x, q, s, zeros, None, g)
                    tol = 1e-5 * model.abs().max().item()
                    assert (want.double() - model).abs().max().item() <= tol, (bits, n, k, g)


@pytest.mark.parametrize("kernel", KERNEL_IDS)
def test_kernel_rejects_other_format(kernel):
    kinfo = KERNEL_BY_NAME[kernel]
    _require_runnable(kinfo)
    others = [f["name"] for f in INFO["formats"] if f["name"] != kinfo["format"]]
    if not others:
        pytest.skip("only one format in this build")
    q, s, z, b = _weights(torch.Generator().manual_seed(0), 4, 16, 64, 32, False, False)
    packed = _pack(q, s, z, 4, 32, b, others[0])
    with pytest.raises(ValueError, match="format"):
        K._run_kernel(torch.randn(2, 64), packed, kernel)


def test_reference_kernels_of_all_formats_agree():
    """The format is a storage detail: the reference kernels of every format give the same numbers."""
    gen = torch.Generator().manual_seed(7)
    for bits in range(1, 9):
        for zeros in (False, True):
            for n, k, g in SHAPES[::2]:
                q, s, z, b = _weights(gen, bits, n, k, g, zeros, True)
                x = _activations(gen, 9, k)
                outs = {
                    fmt: K._run_kernel(x, _pack(q, s, z, bits, g, b, fmt), name)
                    for fmt, name in REFERENCE.items()
                }
                first = next(iter(outs.values()))
                for fmt, out in outs.items():
                    assert torch.equal(out, first), (fmt, bits, zeros, n, k, g)


# ---------------------------------------------------------------------------
# (a) the reference kernel agrees with an independent float64 model.


def _model_quantize_activations(x):
    """The documented per-row asymmetric int8 quantization (float32 arithmetic
    as documented: scale = (hi - lo) / 255, q = nearbyint(x * (1 / scale)) + zero)."""
    x = x.to(torch.float32)
    lo = torch.clamp(x.amin(dim=1), max=0.0)
    hi = torch.clamp(x.amax(dim=1), min=0.0)
    scale = (hi - lo) / torch.tensor(255.0)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    inv = torch.tensor(1.0) / scale
    zero = torch.clamp(-128.0 - torch.round(lo / scale), -128, 127)
    q = torch.clamp(torch.round(x * inv[:, None]) + zero[:, None], -128, 127)
    return q, scale, zero


def _model_linear(x, q, s, z, b, g):
    """float64: y = (xq - xzero) * xscale @ (wscale * (wq - wzero))^T + bias."""
    xq, xs, xz = _model_quantize_activations(x)
    xd = (xq.double() - xz.double()[:, None]) * xs.double()[:, None]
    n, k = q.shape
    w = q.double().reshape(n, k // g, g)
    if z is not None:
        w = w - z.double().reshape(n, -1, 1)
    w = (w * s.double().reshape(n, -1, 1)).reshape(n, k)
    y = xd @ w.T
    if b is not None:
        y = y + b.double()
    return y


@pytest.mark.parametrize("fmt", sorted(REFERENCE))
@pytest.mark.parametrize("bits", range(1, 9), ids=lambda b: f"{b}bit")
def test_reference_matches_float64_model(fmt, bits):
    ref = REFERENCE[fmt]
    gen = torch.Generator().manual_seed(bits)
    for zeros in (False, True):
        for bias in (False, True):
            for n, k, g in SHAPES[:6]:
                q, s, z, b = _weights(gen, bits, n, k, g, zeros, bias)
                x = _activations(gen, 13, k)
                got = K._run_kernel(x, _pack(q, s, z, bits, g, b, fmt), ref).double()
                want = _model_linear(x, q, s, z, b, g)
                tol = 1e-4 * want.abs().max().item() + 1e-30
                err = (got - want).abs().max().item()
                assert err <= tol, (
                    f"{ref}: max |y - model| = {err} > {tol} "
                    f"(bits={bits} zeros={zeros} bias={bias} n={n} k={k} g={g})"
                )


def test_scalar_quantizer_matches_documented_definition():
    gen = torch.Generator().manual_seed(3)
    x = _activations(gen, 17, 256)
    x[0] = torch.arange(256, dtype=torch.float32) / 2.0  # scale 0.5: many exact ties
    x[1] = torch.arange(256, dtype=torch.float32) - 127.5
    q, sums, scale, zero = K._quantize_activations(x, 32, PORTABLE_REFERENCE)
    mq, mscale, mzero = _model_quantize_activations(x)
    assert torch.equal(scale, mscale)
    assert torch.equal(zero, mzero.to(torch.int32))
    assert torch.equal(q, mq.to(torch.int8))
    assert torch.equal(sums, mq.reshape(17, 8, 32).sum(-1).to(torch.int32))


# ---------------------------------------------------------------------------
# (b) every activation quantizer produces identical bytes.


def _special_rows(k):
    inf, nan = float("inf"), float("nan")
    ar = torch.arange(k, dtype=torch.float32)
    rows = {
        "zeros": torch.zeros(k),
        "neg_zeros": -torch.zeros(k),
        "const_pos": torch.full((k,), 3.25),
        "const_neg": torch.full((k,), -7.0),
        "ramp": ar - k / 3,
        "ties": (ar % 256) / 2.0,  # scale 0.5 when the row spans [0, 127.5]
        "ties_neg": -(ar % 256) + 0.5,
        "huge": torch.where(ar % 2 == 0, torch.tensor(1.5e38), torch.tensor(-1.0e38)),
        "huge_pos": torch.full((k,), 3.4e38),
        "overflow_range": torch.where(ar % 2 == 0, torch.tensor(3.4e38), torch.tensor(-3.4e38)),
        "tiny": torch.where(ar % 3 == 0, torch.tensor(1e-38), torch.tensor(-2e-38)),
        "denormal": torch.where(ar % 2 == 0, torch.tensor(1e-45), torch.tensor(-3e-44)),
        "one_outlier": torch.where(ar == k - 1, torch.tensor(1e6), torch.tensor(1.0)),
        "random": torch.randn(k, generator=torch.Generator().manual_seed(k)),
    }
    nonfinite = {
        "nan_first": torch.where(ar == 0, torch.tensor(nan), torch.tensor(1.0)),
        "nan_last": torch.where(ar == k - 1, torch.tensor(nan), torch.tensor(1.0)),
        "inf_mid": torch.where(ar == k // 2, torch.tensor(inf), torch.tensor(-2.0)),
        "neg_inf_last": torch.where(ar == k - 1, torch.tensor(-inf), torch.tensor(0.5)),
        "all_nan": torch.full((k,), nan),
        "inf_and_nan": torch.where(ar % 2 == 0, torch.tensor(inf), torch.tensor(nan)),
        "all_inf": torch.full((k,), inf),
    }
    return rows, nonfinite


QUANT_KS = [(16, 16), (48, 16), (64, 32), (96, 32), (256, 64), (272, 16), (1024, 1024)]


@pytest.mark.parametrize("kernel", KERNEL_IDS)
def test_activation_quantizer_identical_bytes(kernel):
    kinfo = KERNEL_BY_NAME[kernel]
    _require_runnable(kinfo)
    gen = torch.Generator().manual_seed(11)
    for k, g in QUANT_KS:
        rows, nonfinite = _special_rows(k)
        names = list(rows) + list(nonfinite)
        x = torch.stack([rows.get(nm, nonfinite.get(nm)) for nm in names])
        x = torch.cat([x, _activations(gen, 9, k)])
        want = K._quantize_activations(x, g, PORTABLE_REFERENCE)
        got = K._quantize_activations(x, g, kernel)
        for label, w, o in zip(("q", "group_sums", "scale", "zero"), want, got):
            assert o.dtype == w.dtype and o.shape == w.shape, label
            if o.dtype == torch.float32:  # compare bytes (NaN payloads included)
                o, w = o.view(torch.int32), w.view(torch.int32)
            if not torch.equal(o, w):
                bad = [names[i] if i < len(names) else f"random{i - len(names)}"
                       for i in range(x.shape[0]) if not torch.equal(o[i], w[i])]
                pytest.fail(f"{kernel}: {label} differs from {PORTABLE_REFERENCE} (k={k}, "
                            f"group_size={g}) in rows {bad}")
        q, sums, scale, zero = got
        for i, nm in enumerate(names):
            if nm in nonfinite:
                assert torch.isnan(scale[i]), (nm, scale[i])
                assert zero[i] == 0 and not q[i].any() and not sums[i].any(), nm
            else:
                # finite rows get a finite scale, unless hi - lo itself overflows float32
                assert torch.isfinite(scale[i]) or nm == "overflow_range", (nm, scale[i])


PANEL_KERNELS = [k["name"] for k in KERNELS if k["lhs_panel_rows"] > 0]


@pytest.mark.parametrize("kernel", PANEL_KERNELS)
def test_activation_panels_layout(kernel):
    """The panels a GEMM tile reads (built as the op builds them, in one pass
    where the kernel has a panel quantizer) hold the reference quantizer's
    bytes in the documented layout (quantized_activations.h): k-chunks of kr
    bytes of the panel's rows interleaved, zero rows past m, sums per group
    (as floats too for kr = 4; negated, scaled by the weight offset and
    duplicated per row pair for kr = 8)."""
    kinfo = KERNEL_BY_NAME[kernel]
    _require_runnable(kinfo)
    P, kr = kinfo["lhs_panel_rows"], kinfo["lhs_panel_kr"]
    gen = torch.Generator().manual_seed(5)
    k, g = 192, 32
    for m in (1, P - 1, P, P + 1, 2 * P + 3):
        if m < 1:
            continue
        x = _activations(gen, m, k)
        if m > 2:
            x[2, 7] = float("nan")
        for bits in (2, 4, 8):
            q, sums, _, _ = K._quantize_activations(x, g, PORTABLE_REFERENCE)
            panels, psums, pfsums = K._activation_panels(x, g, bits, kernel)
            npan = (m + P - 1) // P
            qp = torch.zeros(npan * P, k, dtype=torch.int8)
            qp[:m] = q
            want = qp.view(npan, P, k // kr, kr).permute(0, 2, 1, 3)
            if kinfo["lhs_panel_int16"]:  # int16 values, each chunk as (k0, k2, k1, k3)
                want = want[..., [0, 2, 1, 3]].to(torch.int16)
            want = want.reshape(-1)
            assert panels.dtype == want.dtype and torch.equal(panels, want), (kernel, m, bits)
            sp = torch.zeros(npan * P, k // g, dtype=torch.int32)
            sp[:m] = sums
            if kr == 4:
                want_s = sp.view(npan, P, k // g).permute(0, 2, 1).reshape(-1)
                assert torch.equal(psums, want_s), (kernel, m, bits)
                if kinfo["one_pass_panels"] or pfsums.numel():
                    assert torch.equal(pfsums, want_s.float()), (kernel, m, bits)
            else:
                shift = bits - 1 if bits < 8 else 0
                neg = (-sp.to(torch.int64)) << shift
                neg = ((neg + 2**31) % 2**32 - 2**31).to(torch.int32)  # wrapping int32
                pairs = neg.view(npan, P // 2, 2, k // g).permute(0, 3, 1, 2)  # [npan, g, pair, 2]
                want_s = pairs.repeat_interleave(2, dim=3).reshape(-1)
                assert torch.equal(psums, want_s), (kernel, m, bits)


@pytest.mark.parametrize("kernel", KERNEL_IDS)
def test_nonfinite_rows_give_nan_outputs(kernel):
    kinfo = KERNEL_BY_NAME[kernel]
    _require_runnable(kinfo)
    k, g, n = 64, 32, 37
    rows, nonfinite = _special_rows(k)
    finite_names = ["random", "zeros", "ramp", "const_pos"]
    names = []
    xs = []
    for nm in nonfinite:  # interleave finite and non-finite rows
        names += [finite_names[len(names) // 2 % len(finite_names)], nm]
        xs += [rows[names[-2]], nonfinite[nm]]
    x = torch.stack(xs)
    bits = 4 if 4 in kinfo["bits"] else kinfo["bits"][-1]
    for zeros in (False, True):
        q, s, z, b = _weights(torch.Generator().manual_seed(5), bits, n, k, g, zeros, True)
        packed = _pack(q, s, z, bits, g, b, kinfo["format"])
        y = K._run_kernel(x, packed, kernel)
        y_ref = K._run_kernel(x, packed, REFERENCE[kinfo["format"]])
        for i, nm in enumerate(names):
            if nm in nonfinite:
                assert torch.isnan(y[i]).all(), f"{kernel}: row {nm} should give NaN outputs"
            else:
                assert torch.isfinite(y[i]).all(), f"{kernel}: finite row {nm} gave {y[i]}"
                assert torch.equal(y[i], y_ref[i]), nm
        # the public op does the same
        if kinfo["isa"] == "scalar":
            yo = OPS.linear_8bit_act_xbit_weight(x, packed, g, n, k)
            assert torch.equal(torch.isnan(yo), torch.isnan(y))


# ---------------------------------------------------------------------------
# (c) the kernel name grammar matches the registry fields.


@pytest.mark.parametrize("kernel", KERNEL_IDS)
def test_kernel_name_grammar(kernel):
    kinfo = KERNEL_BY_NAME[kernel]
    mt = NAME_RE.match(kernel)
    assert mt, f"{kernel!r} does not match {NAME_RE.pattern}"
    panel_rows, panel_kr, int16, fmt, kind, mr, nr, variant, isa = mt.groups()
    assert int(panel_rows or 0) == kinfo["lhs_panel_rows"], (kernel, kinfo["lhs_panel_rows"])
    assert bool(int16) == kinfo["lhs_panel_int16"], (kernel, kinfo["lhs_panel_int16"])
    if panel_rows:
        assert int(panel_kr) == kinfo["lhs_panel_kr"], (kernel, kinfo["lhs_panel_kr"])
    assert fmt == kinfo["format"], (kernel, kinfo["format"])
    fmt_kr = int(fmt.split("k")[1])
    assert fmt_kr == kinfo["kr"], (kernel, kinfo["kr"])  # kr is the format's interleave
    assert int(mr) == kinfo["mr"], (kernel, kinfo["mr"])
    assert int(nr) == kinfo["nr"], (kernel, kinfo["nr"])
    assert isa == kinfo["isa"], (kernel, kinfo["isa"])
    if variant == "_shared":  # shared unpacking feeds m-tiles from activation panels
        assert kinfo["lhs_panel_rows"] == kinfo["mr"], (kernel, kinfo["lhs_panel_rows"])
    if variant == "_asm":  # hand-scheduled loops: the SMMLA tiles
        assert isa == "i8mm" and kinfo["lhs_panel_kr"] == 8, kernel
    assert (isa == "scalar") == (kinfo["required_isa"] == []), kinfo["required_isa"]
    assert kinfo["format"] in {f["name"] for f in INFO["formats"]}


def test_registry_is_consistent():
    names = [k["name"] for k in KERNELS]
    assert len(names) == len(set(names)), "duplicate kernel names"
    formats = {f["name"] for f in INFO["formats"]}
    # every format has a reference kernel, runnable on any CPU
    assert set(REFERENCE) == formats
    for fmt, name in REFERENCE.items():
        assert KERNEL_BY_NAME[name]["runnable"], name
        assert KERNEL_BY_NAME[name]["bits"] == list(range(1, 9))
    # info()["runnable"]: the kernels this CPU executes, less those the
    # overrides rule out (TORCHAO_KERNELS_MAX_ISA may cap the whole run).
    with torchao_kernels.overrides(max_isa="", force="", exclude=""):
        free = torchao_kernels.info()
    assert set(free["runnable"]) == {k["name"] for k in free["kernels"] if k["runnable"]}
    assert set(INFO["runnable"]) <= set(free["runnable"])
    if not INFO["overrides"]["max_isa"] and not INFO["overrides"]["exclude"]:
        assert set(INFO["runnable"]) == set(free["runnable"])
    for k in INFO["kernels"]:
        assert k["runnable"] == set(k["required_isa"]).issubset(CPU_ISA), k["name"]
        assert k["m_min"] >= 1
        assert k["m_max"] is None or k["m_max"] >= k["m_min"]
