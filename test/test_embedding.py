"""Embedding lookups: the registry's lookup rows against the reference and the
dequantized weight (exact equality), the ops (torchao's schemas and ours),
QuantizedEmbedding and quantize_'s embeddings (tied heads share one buffer),
compile / export / ExecuTorch, and torchao's own embedding quantizers."""
import copy
import io
import re
import zlib

import pytest
import torch
from torch import nn

import torchao_kernels as tk
from torchao_kernels import QuantizedEmbedding, QuantizedLinear

OPS = torch.ops.torchao
K = torch.ops.torchao_kernels

INFO = tk.info()
CPU_ISA = set(INFO["cpu"]["isa"])
LOOKUPS = [k for k in INFO["kernels"] if k["op"] == "embedding"]
LOOKUP_BY_NAME = {k["name"]: k for k in LOOKUPS}
REFERENCE = {k["format"]: k["name"] for k in LOOKUPS if k["isa"] == "scalar"}
NAME_RE = re.compile(r"^qbw(n(\d+)k(\d+))_f32_embedding_(\d+)x(\d+)__(scalar|avx2|avx512|neon)$")

# (n, k, group_size): odd n (partial 16-row blocks), k with 16-value
# superblocks (k = 48, 80: not multiples of 32), several groups per row and
# one group per row, group 16 (two groups in a 32-value superblock).
SHAPES = [(1, 16, 16), (17, 48, 16), (37, 64, 32), (70, 80, 80), (33, 256, 64), (129, 192, 192),
          (20, 96, 48)]


def _weights(gen, bits, n, k, g, zeros, bf16):
    qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    q = torch.randint(qmin, qmax + 1, (n, k), generator=gen, dtype=torch.int8)
    q.view(-1)[0] = qmin
    q.view(-1)[-1] = qmax
    s = torch.rand(n, k // g, generator=gen) * 2.0 + 1e-3
    s[torch.rand(n, k // g, generator=gen) < 0.2] *= -1.0
    if bf16:
        s = s.to(torch.bfloat16)
    z = None
    if zeros:
        z = torch.randint(-128, 128, (n, k // g), generator=gen, dtype=torch.int8)
        z.view(-1)[0] = -128
        z.view(-1)[-1] = 127
    return q, s, z


def _indices(gen, n, count=45):
    idx = torch.randint(0, n, (count,), generator=gen)
    idx[0], idx[-1] = 0, n - 1  # first and last rows (last block, partial when n % 16)
    return idx


def _require_runnable(kinfo):
    if not kinfo["runnable"]:
        missing = sorted(set(kinfo["required_isa"]) - CPU_ISA)
        pytest.skip(f"{kinfo['name']} needs ISA {'+'.join(missing)}, which this CPU lacks")


# ---------------------------------------------------------------------------
# Registry rows


def test_registry_has_lookup_rows_for_every_format():
    formats = {f["name"] for f in INFO["formats"]}
    assert set(REFERENCE) == formats
    for name in REFERENCE.values():
        assert LOOKUP_BY_NAME[name]["runnable"] and LOOKUP_BY_NAME[name]["bits"] == list(range(1, 9))
    # a SIMD row for every format on each SIMD architecture
    for isa in ("avx2", "avx512", "neon"):
        assert {k["format"] for k in LOOKUPS if k["isa"] == isa} == formats, isa


@pytest.mark.parametrize("kernel", [k["name"] for k in LOOKUPS])
def test_lookup_kernel_name_grammar(kernel):
    kinfo = LOOKUP_BY_NAME[kernel]
    mt = NAME_RE.match(kernel)
    assert mt, f"{kernel!r} does not match {NAME_RE.pattern}"
    fmt, fmt_n, fmt_kr, mr, nr, isa = mt.groups()
    assert fmt == kinfo["format"], (kernel, kinfo["format"])
    assert int(mr) == kinfo["mr"] == 1
    fmt_nr = {f["name"]: f["nr"] for f in INFO["formats"]}[kinfo["format"]]
    assert int(nr) == kinfo["nr"] == fmt_nr == int(fmt_n), (kernel, kinfo["format"])
    assert int(fmt_kr) == kinfo["kr"]
    assert isa == kinfo["isa"]


@pytest.mark.parametrize("bf16", [False, True], ids=["f32scales", "bf16scales"])
@pytest.mark.parametrize("zeros", [False, True], ids=["nozeros", "zeros"])
@pytest.mark.parametrize("bits", range(1, 9), ids=lambda b: f"{b}bit")
@pytest.mark.parametrize("kernel", [k["name"] for k in LOOKUPS])
def test_lookup_kernel_matches_reference_and_dequantized_weight(kernel, bits, zeros, bf16):
    kinfo = LOOKUP_BY_NAME[kernel]
    _require_runnable(kinfo)
    fmt = kinfo["format"]
    gen = torch.Generator().manual_seed(100 * bits + 10 * zeros + bf16 + zlib.crc32(kernel.encode()) % 997)
    for n, k, g in SHAPES:
        q, s, z = _weights(gen, bits, n, k, g, zeros, bf16)
        expected = tk.dequantize_weight(q, s.float(), z, g)
        idx = _indices(gen, n)
        packed = tk.pack(q, s, z, bits=bits, group_size=g, target=fmt)
        assert tk.packed_info(packed)["scale_dtype"] == ("bfloat16" if bf16 else "float32")
        y = K._run_embedding_kernel(packed, idx, kernel)
        assert torch.equal(y, expected[idx]), (kernel, n, k, g)
        assert torch.equal(y, K._run_embedding_kernel(packed, idx, REFERENCE[fmt]))
        if fmt == "n1k4":
            # weights-only tables (torchao's _pack_embedding layout): scales per call
            table = tk.pack_embedding(q, bits)
            y = K._run_embedding_kernel(table, idx, kernel, s.float(), z)
            assert torch.equal(y, expected[idx]), (kernel, n, k, g, "weights-only")
            if z is not None:
                # rows whose zero points are all 0 (torchao passes such for
                # symmetric weights) take their own conversion: mixed with
                # rows that are not, and rows whose only nonzero zero point is
                # the first or the last group
                z0 = z.clone()
                z0[::2] = 0
                z0[1::6] = 0
                z0[1::6, 0] = 5
                z0[3::6] = 0
                z0[3::6, -1] = -7
                y = K._run_embedding_kernel(table, idx, kernel, s.float(), z0)
                assert torch.equal(y, tk.dequantize_weight(q, s.float(), z0, g)[idx]), (kernel, n, k, g)


# ---------------------------------------------------------------------------
# Ops


@pytest.mark.parametrize("bits", [1, 3, 4, 8])
def test_ops_equal_dequantized_rows_any_index_shape(bits):
    gen = torch.Generator().manual_seed(bits)
    n, k, g = 70, 96, 32
    q, s, z = _weights(gen, bits, n, k, g, True, False)
    w = tk.dequantize_weight(q, s, z, g)
    idx = torch.randint(0, n, (3, 4, 5), generator=gen)
    for target in ("n1k4", "n16k4"):
        packed = tk.pack(q, s, z, bits=bits, group_size=g, target=target)
        y = tk.shared_embedding(packed, g, n, k, idx)
        assert y.shape == (3, 4, 5, k) and y.dtype == torch.float32
        assert torch.equal(y, w[idx])
        assert torch.equal(getattr(OPS, f"_shared_embedding_{bits}bit")(packed, g, n, k, idx.reshape(-1)),
                           w[idx.reshape(-1)])
        assert torch.equal(tk.shared_embedding(packed, g, n, k, idx.int()), w[idx])  # int32 indices
        out = torch.empty(0)
        OPS.shared_embedding_xbit.out(packed, g, n, k, idx, out=out)
        assert torch.equal(out, w[idx])
    table = getattr(OPS, f"_pack_embedding_{bits}bit")(q)
    assert torch.equal(table, tk.pack_embedding(q, bits))
    assert torch.equal(getattr(OPS, f"_embedding_{bits}bit")(table, n, k, s, z, idx.reshape(-1)),
                       w[idx.reshape(-1)])
    assert torch.equal(tk.embedding(table, n, k, s, z, idx), w[idx])
    assert torch.equal(tk.embedding(table, n, k, s, None, idx),
                       tk.dequantize_weight(q, s, None, g)[idx])
    out = torch.empty(2, 2)
    getattr(OPS, f"_embedding_{bits}bit").out(table, n, k, s, z, idx.reshape(-1), out=out)
    assert torch.equal(out, w[idx.reshape(-1)])
    # empty lookups
    assert tk.shared_embedding(packed, g, n, k, torch.zeros(0, dtype=torch.long)).shape == (0, k)


def test_lookups_are_the_same_with_1_and_2_threads():
    gen = torch.Generator().manual_seed(7)
    n, k, g = 300, 576, 32
    q, s, z = _weights(gen, 4, n, k, g, True, False)
    packed = tk.pack(q, s, z, bits=4, group_size=g)
    idx = torch.randint(0, n, (700,), generator=gen)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        y1 = tk.shared_embedding(packed, g, n, k, idx)
        torch.set_num_threads(2)
        y2 = tk.shared_embedding(packed, g, n, k, idx)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(y1, y2)
    assert torch.equal(y1, tk.dequantize_weight(q, s, z, g)[idx])


def test_out_of_range_indices_are_an_index_error_naming_the_index():
    gen = torch.Generator().manual_seed(1)
    q, s, z = _weights(gen, 4, 20, 64, 32, True, False)
    packed = tk.pack(q, s, z, bits=4, group_size=32)
    table = tk.pack_embedding(q, 4)
    for bad, pos in ((20, 2), (-1, 2), (10**12, 2)):
        idx = torch.tensor([0, 5, bad, 3])
        with pytest.raises(IndexError, match=rf"indices\[{pos}\] = {bad} is out of range for an embedding of 20 rows"):
            tk.shared_embedding(packed, 32, 20, 64, idx)
        with pytest.raises(IndexError, match=rf"indices\[{pos}\] = {bad}"):
            OPS._embedding_4bit(table, 20, 64, s, z, idx)
    m = QuantizedEmbedding.from_embedding(nn.Embedding(20, 64))
    with pytest.raises(IndexError, match="out of range"):
        m(torch.tensor([[1, 25]]))


def test_bad_arguments_are_value_errors_naming_them():
    gen = torch.Generator().manual_seed(2)
    q, s, z = _weights(gen, 4, 20, 64, 32, True, False)
    packed = tk.pack(q, s, z, bits=4, group_size=32)
    table = tk.pack_embedding(q, 4)
    idx = torch.tensor([1, 2])
    with pytest.raises(ValueError, match="bit width mismatch"):
        OPS._shared_embedding_3bit(packed, 32, 20, 64, idx)
    with pytest.raises(ValueError, match="bit width mismatch"):
        OPS._embedding_8bit(table, 20, 64, s, z, idx)
    with pytest.raises(ValueError, match="group_size=64 does not match packed_weights"):
        tk.shared_embedding(packed, 64, 20, 64, idx)
    with pytest.raises(ValueError, match=r"n=21, k=64 do not match packed_weights"):
        tk.shared_embedding(packed, 32, 21, 64, idx)
    with pytest.raises(ValueError, match="weights-only embedding table"):
        tk.shared_embedding(table, 64, 20, 64, idx)
    with pytest.raises(ValueError, match="weights-only embedding table"):
        tk.linear(torch.randn(2, 64), table, 64, 20, 64)
    with pytest.raises(ValueError, match="buffer of the linear pack op"):
        OPS._embedding_4bit(packed, 20, 64, s, z, idx)
    with pytest.raises(ValueError, match=r"num_embeddings=20, embedding_dim=32 do not match"):
        OPS._embedding_4bit(table, 20, 32, s, z, idx)
    with pytest.raises(ValueError, match="weight_scales must have shape"):
        OPS._embedding_4bit(table, 20, 64, s.reshape(-1), z, idx)
    with pytest.raises(ValueError, match="multiple of 16"):
        OPS._embedding_4bit(table, 20, 64, torch.ones(20, 8), torch.zeros(20, 8, dtype=torch.int8), idx)
    with pytest.raises(ValueError, match="indices must be an integer tensor"):
        tk.shared_embedding(packed, 32, 20, 64, torch.tensor([1.0]))
    with pytest.raises(ValueError, match="embedding_dim must be a positive multiple of 16"):
        tk.pack_embedding(torch.zeros(4, 40, dtype=torch.int8), 4)
    with pytest.raises(ValueError, match=r"weight_qvals\[0, 1\] = 9 is outside the 4-bit range"):
        tk.pack_embedding(torch.tensor([[0, 9] + [0] * 14], dtype=torch.int8), 4)
    with pytest.raises(ValueError, match="not a torchao_kernels packed buffer"):
        tk.shared_embedding(torch.zeros(100, dtype=torch.int8), 32, 20, 64, idx)
    with pytest.raises(ValueError, match="carry no scales"):
        tk.unpack(table)
    # `out` must hold float32 rows: an integer or narrower one would round them silently
    for dtype in (torch.int64, torch.int32, torch.bool, torch.bfloat16):
        with pytest.raises(ValueError, match="out must be float32"):
            OPS._shared_embedding_4bit.out(packed, 32, 20, 64, idx, out=torch.empty(2, 64, dtype=dtype))
        with pytest.raises(ValueError, match="out must be float32"):
            OPS._embedding_4bit.out(table, 20, 64, s, z, idx, out=torch.empty(2, 64, dtype=dtype))
    # sizes no buffer can hold: rejected before an output of that size is allocated
    for k in (-64, 2 ** 40):
        with pytest.raises(ValueError, match=f"k={k} does not match packed_weights"):
            tk.shared_embedding(packed, 32, 20, k, idx)
        with pytest.raises(ValueError, match=f"embedding_dim={k} does not match packed_weight_qvals"):
            OPS._embedding_4bit(table, 20, k, s, z, idx)
    # every tensor argument on one device: a meta buffer is not looked up into a CPU tensor
    with pytest.raises(ValueError, match="indices is on cpu but packed_weights is on meta"):
        tk.shared_embedding(packed.to("meta"), 32, 20, 64, idx)
    with pytest.raises(ValueError, match="out is on cpu but packed_weights is on meta"):
        OPS._shared_embedding_4bit.out(packed.to("meta"), 32, 20, 64, idx.to("meta"), out=torch.empty(2, 64))
    with pytest.raises(ValueError, match="on meta"):
        OPS._embedding_4bit.out(table.to("meta"), 20, 64, s, z, idx, out=torch.empty(2, 64))


def test_kernel_entry_point_checks_a_tables_scales_and_zeros():
    # The per-kernel entry point of the tests and benchmarks reads the rows'
    # scales and zero points: they must be the table's (an error, never a read
    # past them).
    gen = torch.Generator().manual_seed(4)
    q, s, z = _weights(gen, 4, 20, 64, 32, True, False)
    table = tk.pack_embedding(q, 4)
    idx = torch.tensor([19])
    run = torch.ops.torchao_kernels._run_embedding_kernel
    kernel = "qbwn1k4_f32_embedding_1x1__scalar"
    assert torch.equal(run(table, idx, kernel, s, z), tk.dequantize_weight(q, s, z, 32)[19:])
    with pytest.raises(ValueError, match=r"weight_scales must have shape \(num_embeddings=20, groups\)"):
        run(table, idx, kernel, s[:1], None)
    with pytest.raises(ValueError, match="weight_zeros must have the shape of weight_scales"):
        run(table, idx, kernel, s, z[:1])
    with pytest.raises(ValueError, match=r"weight_zeros must fit in int8, got values in \[0, 1000\]"):
        run(table, idx, kernel, s, torch.full_like(z, 1000, dtype=torch.int32).index_fill_(0, torch.tensor(0), 0))
    with pytest.raises(ValueError, match="a weights-only table needs weight_scales"):
        run(table, idx, kernel, None, None)


def test_opcheck_and_fake_shapes():
    gen = torch.Generator().manual_seed(3)
    q, s, z = _weights(gen, 4, 40, 64, 32, True, False)
    packed = tk.pack(q, s, z, bits=4, group_size=32)
    table = tk.pack_embedding(q, 4)
    idx = torch.randint(0, 40, (9,), generator=gen)
    torch.library.opcheck(OPS.shared_embedding_xbit.default, (packed, 32, 40, 64, idx.reshape(3, 3)))
    torch.library.opcheck(OPS._shared_embedding_4bit.default, (packed, 32, 40, 64, idx))
    torch.library.opcheck(OPS._embedding_4bit.default, (table, 40, 64, s, z, idx))
    torch.library.opcheck(OPS.embedding_xbit.default, (table, 40, 64, s, None, idx.reshape(9, 1)))
    torch.library.opcheck(OPS._pack_embedding_4bit, (q,))
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        fq = torch.empty(40, 64, dtype=torch.int8)
        assert OPS._pack_embedding_4bit(fq).shape == table.shape


# ---------------------------------------------------------------------------
# Selection


def _vm_flags(address):
    """VmFlags of the mapping of this process that holds address (Linux)."""
    with open("/proc/self/smaps") as f:
        lines = f.read().splitlines()
    inside = False
    for line in lines:
        head = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if head:
            inside = int(head.group(1), 16) <= address < int(head.group(2), 16)
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    return None


def test_large_packed_buffers_are_advised_into_huge_pages():
    # The pack ops advise the 2 MiB-aligned interior of a new buffer into
    # transparent huge pages (random row lookups, docs/embeddings.md): the
    # mapping that holds it carries the "hg" (MADV_HUGEPAGE) flag; results are
    # the same as from a copy in ordinary memory.
    import os

    if not os.path.exists("/proc/self/smaps") or not os.path.exists("/sys/kernel/mm/transparent_hugepage"):
        pytest.skip("needs Linux with transparent huge pages")
    n, k = 16384, 576  # 4-bit: 4.7 MiB or more, so a whole aligned 2 MiB page inside
    q, s, z = tk.quantize_weight(torch.randn(n, k), 4, 32, False, method="rtn")
    for packed in (tk.pack(q, s, z, bits=4, group_size=32, target="n1k4"),
                   torch.ops.torchao._pack_embedding_4bit(q)):
        p, huge = packed.data_ptr(), 2 << 20
        begin = (p + huge - 1) & ~(huge - 1)
        assert begin + huge <= p + packed.numel(), packed.numel()
        flags = _vm_flags(begin)
        assert flags is not None and "hg" in flags, flags
    small = tk.pack(q[:64], s[:64], None, bits=4, group_size=32, target="n1k4")  # no whole huge page inside
    assert small.numel() < 2 << 20
    idx = torch.randint(0, n, (300,))
    packed = tk.pack(q, s, z, bits=4, group_size=32, target="n1k4")
    assert torch.equal(tk.shared_embedding(packed, 32, n, k, idx),
                       tk.shared_embedding(packed.clone(), 32, n, k, idx))


def test_loaded_packed_buffers_are_advised_into_huge_pages():
    # A module loading a state_dict copies the saved buffer into memory
    # allocated as the pack ops allocate theirs (ops.copy_packed): a clone
    # would land in ordinary pages. The copy owns its memory and holds the
    # same bytes; a buffer that is not a packed buffer is still reported.
    import os

    if not os.path.exists("/proc/self/smaps") or not os.path.exists("/sys/kernel/mm/transparent_hugepage"):
        pytest.skip("needs Linux with transparent huge pages")
    n, k = 16384, 576
    gen = torch.Generator().manual_seed(11)
    emb = nn.Embedding(n, k)
    with torch.no_grad():
        emb.weight.copy_(torch.randn(n, k, generator=gen))
    lin = nn.Linear(k, n, bias=False)
    with torch.no_grad():
        lin.weight.copy_(emb.weight)
    for module in (QuantizedEmbedding.from_embedding(emb, bits=4, group_size=32),
                   QuantizedLinear.from_linear(lin, bits=4, group_size=32)):
        buf = io.BytesIO()
        torch.save(module.state_dict(), buf)
        buf.seek(0)
        sd = torch.load(buf)
        fresh = copy.deepcopy(module)
        fresh.load_state_dict(sd)
        loaded = fresh.packed_weights
        assert torch.equal(loaded, module.packed_weights)
        assert loaded.data_ptr() != sd["packed_weights"].data_ptr()
        p, huge = loaded.data_ptr(), 2 << 20
        begin = (p + huge - 1) & ~(huge - 1)
        assert begin + huge <= p + loaded.numel(), loaded.numel()
        flags = _vm_flags(begin)
        assert flags is not None and "hg" in flags, flags
        sd["packed_weights"][:1000] = 0  # the module's copy is its own
        assert torch.equal(loaded, module.packed_weights)
    idx = torch.randint(0, n, (300,), generator=gen)
    e = QuantizedEmbedding.from_embedding(emb, bits=4, group_size=32)
    e2 = copy.deepcopy(e)
    e2.load_state_dict(e.state_dict())
    assert torch.equal(e2(idx), e(idx))
    with pytest.raises(RuntimeError, match="packed_weights"):
        e2.load_state_dict({"packed_weights": torch.zeros(100, dtype=torch.float32)})


def test_selection_explains_lookups_and_counts_them():
    gen = torch.Generator().manual_seed(4)
    q, s, z = _weights(gen, 4, 40, 64, 32, True, False)
    packed = tk.pack(q, s, z, bits=4, group_size=32, target="n16k4")
    e = tk.explain(packed, op="embedding")
    assert e["op"] == "embedding"
    names = [c["name"] for c in e["clusters"][0]["candidates"] if not c["op_mismatch"]]
    assert set(names) == set(LOOKUP_BY_NAME)
    winner = e.winner
    assert LOOKUP_BY_NAME[winner]["format"] == "n16k4" and LOOKUP_BY_NAME[winner]["runnable"]
    assert "embedding lookup" in str(e) and "qd8_f32" not in str(e)
    tk.reset_stats()
    tk.shared_embedding(packed, 32, 40, 64, torch.tensor([1, 2]))
    assert tk.stats() == {winner: 1}
    with tk.overrides(max_isa="reference"):
        assert tk.explain(packed, op="embedding").winner == REFERENCE["n16k4"]
        y = tk.shared_embedding(packed, 32, 40, 64, torch.tensor([1, 2]))
        assert tk.stats()[REFERENCE["n16k4"]] == 1
    assert torch.equal(y, tk.dequantize_weight(q, s, z, 32)[[1, 2]])


def test_forcing_a_linear_kernel_leaves_lookups_alone_and_vice_versa():
    gen = torch.Generator().manual_seed(5)
    q, s, z = _weights(gen, 4, 40, 64, 32, False, False)
    packed = tk.pack(q, s, z, bits=4, group_size=32, target="n16k4")
    w = tk.dequantize_weight(q, s, z, 32)
    x = torch.randn(3, 64)
    y = tk.linear(x, packed, 32, 40, 64)
    with tk.overrides(force="qd8_f32_qbwn16k4_gemm_1x16__scalar"):
        assert torch.equal(tk.shared_embedding(packed, 32, 40, 64, torch.tensor([3])), w[[3]])
        assert torch.equal(tk.linear(x, packed, 32, 40, 64), y)
    tk.reset_stats()
    with tk.overrides(force="qbwn16k4_f32_embedding_1x16__scalar"):
        assert torch.equal(tk.shared_embedding(packed, 32, 40, 64, torch.tensor([3])), w[[3]])
        assert torch.equal(tk.linear(x, packed, 32, 40, 64), y)
    assert tk.stats().get("qbwn16k4_f32_embedding_1x16__scalar") == 1
    # a force pattern for no kernel of the other op: the lookup says so at the call
    with tk.overrides(force="qd8_f32_qbwn16k4_gemm_1x16__scalar,qd8_f32_qbwn1k4_gemm_1x1__scalar"):
        assert torch.equal(tk.shared_embedding(packed, 32, 40, 64, torch.tensor([3])), w[[3]])
    with tk.overrides(force="qbwn1k4_f32_embedding_1x1__scalar"):
        with pytest.raises(RuntimeError, match="matches no kernel"):
            tk.shared_embedding(packed, 32, 40, 64, torch.tensor([3]))


def test_lookup_out_variants_refuse_tensors_that_require_grad():
    gen = torch.Generator().manual_seed(5)
    q, s, z = _weights(gen, 4, 40, 64, 32, False, False)
    packed = tk.pack(q, s, z, bits=4, group_size=32, target="n16k4")
    table = tk.pack_embedding(q, 4)
    rows = tk.dequantize_weight(q, s, z, 32)[[1, 7]]
    idx = torch.tensor([1, 7])
    zz = torch.zeros_like(s, dtype=torch.int8)
    calls = {
        "shared_embedding_xbit": lambda out, sc: torch.ops.torchao.shared_embedding_xbit.out(
            packed, 32, 40, 64, idx, out=out),
        "embedding_xbit": lambda out, sc: torch.ops.torchao.embedding_xbit.out(table, 40, 64, sc, None, idx, out=out),
    }
    if tk.torchao_compat_status("embedding") == "registered":
        calls["_shared_embedding_4bit"] = lambda out, sc: torch.ops.torchao._shared_embedding_4bit.out(
            packed, 32, 40, 64, idx, out=out)
        calls["_embedding_4bit"] = lambda out, sc: torch.ops.torchao._embedding_4bit.out(
            table, 40, 64, sc, zz, idx, out=out)
    for name, call in calls.items():
        # out requiring grad: the result would silently have no gradient
        with pytest.raises(RuntimeError, match=rf"torchao::{name}\.out does not record gradients"):
            call(torch.empty(2, 64, requires_grad=True), s)
        if name.endswith("embedding_xbit") and not name.startswith("shared") or name == "_embedding_4bit":
            with pytest.raises(RuntimeError, match="requires grad"):
                call(torch.empty(2, 64), s.clone().requires_grad_())
        out = torch.empty(2, 64, requires_grad=True)
        with torch.no_grad():
            assert call(out, s) is out or torch.equal(out, rows)
        assert torch.equal(out.detach(), rows), name
        plain = torch.empty(2, 64)
        assert torch.equal(call(plain, s), rows) and torch.equal(plain, rows), name


# ---------------------------------------------------------------------------
# Modules and quantize_


class TiedLM(nn.Module):
    """A tiny decoder-like model: tied input embedding / output head, a learned
    position table, one hidden layer."""

    def __init__(self, vocab=300, dim=128):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(32, dim)
        self.mlp = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        h = self.embed(ids) + self.pos(torch.arange(ids.shape[-1]))
        return self.head(torch.relu(self.mlp(h)))


def _tied_model():
    torch.manual_seed(0)
    m = TiedLM()
    report = tk.quantize_(m, bits=4, group_size=32, has_zeros=True)
    return m, report


def test_quantize_shares_one_buffer_between_a_tied_embedding_and_head():
    m, report = _tied_model()
    assert isinstance(m.embed, QuantizedEmbedding) and m.embed.is_tied
    assert isinstance(m.pos, QuantizedEmbedding) and not m.pos.is_tied and m.pos.format == "n1k4"
    assert isinstance(m.head, QuantizedLinear)
    assert m.embed.weight_source is m.head.packed_weights
    descs = dict(report["quantized"])
    assert "one packed buffer" in descs["head"] and "tied to head" in descs["embed"]
    ids = torch.randint(0, 300, (2, 9))
    q, s, z, _ = tk.unpack(m.head.packed_weights)
    assert torch.equal(m.embed(ids), tk.dequantize_weight(q, s, z, 32)[ids])
    # no float copy of the table is left in the model
    assert not any(p.numel() == 300 * 128 for p in m.parameters())
    assert sum(1 for _ in m.named_buffers()) == 3  # mlp, head (shared), pos


def test_state_dict_round_trip_keeps_the_tie_and_saves_the_buffer_once():
    m, _ = _tied_model()
    ids = torch.randint(0, 300, (2, 9))
    y = m(ids)
    sd = m.state_dict()
    assert sorted(sd) == ["head.packed_weights", "mlp.packed_weights", "pos.packed_weights"]
    buf = io.BytesIO()
    torch.save(sd, buf)
    table_bytes = m.head.packed_weights.numel()
    assert buf.tell() < 1.5 * table_bytes + sd["mlp.packed_weights"].numel() + sd["pos.packed_weights"].numel()
    m2, _ = _tied_model()
    buf.seek(0)
    m2.load_state_dict(torch.load(buf))
    assert m2.embed.weight_source is m2.head.packed_weights
    assert torch.equal(m2(ids), y)
    m3 = copy.deepcopy(m)
    assert m3.embed.weight_source is m3.head.packed_weights and m3.head is not m.head
    assert torch.equal(m3(ids), y)


def test_compile_and_export_keep_the_tied_buffer_once():
    m, _ = _tied_model()
    ids = torch.randint(0, 300, (2, 9))
    y = m(ids)
    compiled = torch.compile(m, fullgraph=True)
    assert torch.equal(compiled(ids), y)
    ep = torch.export.export(m, (ids,))
    assert [n for n, _ in ep.named_buffers()].count("head.packed_weights") == 1
    assert len(list(ep.named_buffers())) == 3
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert "torchao.shared_embedding_xbit.default" in targets
    assert torch.equal(ep.module()(ids), y)


def test_quantize_embeddings_options_and_skips():
    torch.manual_seed(0)
    m = TiedLM()
    tk.quantize_(m, bits=4, group_size=32, embeddings=False)
    assert type(m.embed) is nn.Embedding and type(m.pos) is nn.Embedding
    # lm_head=False: the head stays float; the tied embedding gets its own copy
    m = TiedLM()
    report = tk.quantize_(m, bits=4, group_size=32, lm_head=False)
    assert type(m.head) is nn.Linear and isinstance(m.embed, QuantizedEmbedding) and not m.embed.is_tied
    assert "stays in float: own packed copy" in dict(report["quantized"])["embed"]
    ids = torch.randint(0, 300, (4,))
    assert torch.equal(m.embed(ids), m.embed.dequantize()[ids])
    # an override by name applies to embeddings too
    m = TiedLM()
    tk.quantize_(m, bits=4, group_size=32, overrides={"pos": 8})
    assert m.pos.bits == 8 and m.embed.bits == 4
    m = TiedLM()
    report = tk.quantize_(m, bits=4, group_size=32, overrides={"pos": None})
    assert type(m.pos) is nn.Embedding
    assert any(f == "pos" and "keeps it in float" in r for f, r in report["skipped"])

    class Norm(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Embedding(10, 32, max_norm=1.0)
            self.b = nn.Embedding(10, 40)
            self.c = nn.Embedding(10, 32, padding_idx=0)

    m = Norm()
    report = tk.quantize_(m, bits=4, group_size=32)
    skipped = dict(report["skipped"])
    assert "max_norm" in skipped["a"] and "embedding_dim=40 is not a multiple of group_size=32" in skipped["b"]
    assert isinstance(m.c, QuantizedEmbedding) and m.c.padding_idx == 0


def test_bfloat16_embedding_returns_bfloat16():
    e = nn.Embedding(50, 64).to(torch.bfloat16)
    q = QuantizedEmbedding.from_embedding(e, bits=8, group_size=32)
    assert q.scale_dtype == "bfloat16"
    ids = torch.tensor([0, 7, 49])
    y = q(ids)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, q.dequantize()[ids].to(torch.bfloat16))
    assert (y.float() - e.weight[ids].float()).abs().max() < 0.05


def test_model_dtype_casts_reach_the_embeddings_output():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.ln, self.fc = nn.Embedding(50, 64), nn.LayerNorm(64), nn.Linear(64, 32)

        def forward(self, i):
            return self.fc(self.ln(self.emb(i)))

    ids = torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    m = M()
    tk.quantize_(m, bits=4, group_size=32)
    rows = m.emb(ids)
    assert rows.dtype == torch.float32
    m.to(torch.bfloat16)  # LayerNorm now bfloat16: the rows must follow, as nn.Embedding's would
    assert m.emb(ids).dtype == torch.bfloat16 and m(ids).dtype == torch.bfloat16
    assert torch.equal(m.emb(ids), rows.to(torch.bfloat16))
    m.half()
    assert m.emb(ids).dtype == torch.float16
    m.to("cpu")  # no dtype: unchanged
    assert m.emb(ids).dtype == torch.float16
    m.float()
    assert torch.equal(m.emb(ids), rows)


def test_a_transposed_weight_is_not_a_tie():
    class M(nn.Module):
        def __init__(self, d=64):
            super().__init__()
            self.emb, self.head = nn.Embedding(d, d), nn.Linear(d, d, bias=False)
            self.head.weight = nn.Parameter(self.emb.weight.t())  # the same memory, another matrix

    torch.manual_seed(0)
    m = M()
    ids = torch.arange(8)
    ref = m.emb(ids).detach().clone()
    report = tk.quantize_(m, bits=8, group_size=32, has_zeros=True)
    assert not m.emb.is_tied and "tied" not in dict(report["quantized"])["emb"]
    assert (m.emb(ids) - ref).abs().max() < 0.05


def test_executorch_program_holds_the_tied_buffer_once():
    pytest.importorskip("executorch")
    from torchao_kernels import executorch as tke

    m, _ = _tied_model()
    ids = torch.randint(0, 300, (2, 9))
    program = tke.export(m, (ids,))
    ops = set(tke.operators(program))
    assert "torchao::shared_embedding_xbit.out" in ops
    size = len(program.buffer)
    table = m.head.packed_weights.numel()
    others = m.mlp.packed_weights.numel() + m.pos.packed_weights.numel()
    assert table + others <= size < 2 * table + others  # once, not twice
    y = tke.load(program.buffer).execute([ids])[0]
    assert torch.equal(y, m(ids))
    # dynamic sequence length: lookups of every planned size, bit for bit
    seq = torch.export.Dim("seq", min=2, max=32)
    method = tke.load(tke.export(m, (ids,), dynamic_shapes=({1: seq},)).buffer)
    for t in (2, 5, 32):
        x = torch.randint(0, 300, (2, t))
        assert torch.equal(method.execute([x])[0], m(x)), t


# ---------------------------------------------------------------------------
# torchao's own flow


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_torchao_embedding_quantizers_run_on_these_ops(bits):
    pytest.importorskip("torchao")
    from torchao.prototype.quantization.embedding.api import EmbeddingQuantizer, TiedEmbeddingQuantizer
    from torchao.quantization import IntxWeightOnlyConfig, MappingType, quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup

    if tk.torchao_compat_status("embedding") != "registered":
        pytest.skip(tk.torchao_compat_status("embedding"))
    dtype = getattr(torch, f"int{bits}")
    ids = torch.randint(0, 100, (3, 5))
    for gran in (PerGroup(32), PerAxis(0)):
        for mapping in (MappingType.ASYMMETRIC, MappingType.SYMMETRIC):
            torch.manual_seed(bits)
            m = nn.Sequential(nn.Embedding(100, 256))
            ref = copy.deepcopy(m)
            EmbeddingQuantizer(dtype, gran, mapping).quantize(m)
            quantize_(ref, IntxWeightOnlyConfig(weight_dtype=dtype, granularity=gran, mapping_type=mapping),
                      lambda mod, fqn: isinstance(mod, nn.Embedding))
            assert torch.equal(m(ids), ref(ids)), (gran, mapping)
    torch.manual_seed(0)
    t = TiedLM(100, 256)
    ref = copy.deepcopy(t)
    tk.reset_stats()
    TiedEmbeddingQuantizer(dtype, PerGroup(32), MappingType.ASYMMETRIC).quantize(t)
    quantize_(ref, IntxWeightOnlyConfig(weight_dtype=dtype, granularity=PerGroup(32),
                                        mapping_type=MappingType.ASYMMETRIC),
              lambda mod, fqn: isinstance(mod, nn.Embedding))
    assert torch.equal(t.embed(ids), ref.embed(ids))
    assert any("_f32_embedding_" in name for name in tk.stats())


def test_time_lookups_times_the_op_body_and_checks_its_arguments():
    gen = torch.Generator().manual_seed(7)
    q, s, z = _weights(gen, 4, 40, 64, 32, True, False)
    linear = tk.pack(q, s, z, bits=4, group_size=32, target="n1k4")
    table = tk.pack_embedding(q, 4)
    pool = torch.randint(0, 40, (3, 5), generator=gen)
    t = K._time_lookups(linear, None, None, pool, 7)
    assert t.dtype == torch.float64 and t.shape == (7,) and bool((t > 0).all())
    t = K._time_lookups(table, s, z, pool, 4)
    assert t.shape == (4,) and bool((t > 0).all())
    with pytest.raises(ValueError, match="weights-only table needs its scales"):
        K._time_lookups(table, None, None, pool, 1)
    with pytest.raises(ValueError, match="index_pool"):
        K._time_lookups(linear, None, None, pool.to(torch.int32), 1)
    with pytest.raises(ValueError, match="weight_scales"):
        K._time_lookups(table, s[:3], z, pool, 1)
    with pytest.raises(ValueError, match="at least one row"):
        K._time_lookups(linear, None, None, pool[:0], 1)
    assert K._time_lookups(linear, None, None, pool[:, :0], 2).shape == (2,)
    with pytest.raises(ValueError, match="calls"):
        K._time_lookups(linear, None, None, pool, 0)
    with pytest.raises(IndexError, match=r"indices\[1\] = 40"):
        K._time_lookups(linear, None, None, torch.tensor([[0, 40]]), 1)


def test_bench_embedding_reports_call_and_lookup_times_against_the_roofline(tmp_path, capsys):
    from torchao_kernels import bench_embedding

    out = tmp_path / "emb.json"
    assert bench_embedding.run(["--shape", "256x64", "--count", "8", "--min-time", "0.02",
                                "--json", str(out)]) == 0
    import json

    res = json.loads(out.read_text())["results"]
    assert [r["variant"].split(" ")[0] for r in res] == ["ours", "ours", "torchao::_embedding_4bit", "float32"]
    for r in res[:3]:
        assert r["kernel_us"] > 0 and r["median_us"] > 0
        assert r["kernel_of_roofline"] == pytest.approx(r["roofline_us"] / r["kernel_us"])
    assert res[3]["kernel_us"] is None and res[3]["vs_float32"] == 1.0
    text = capsys.readouterr().out
    assert "lookup alone µs" in text
    # The machine line gives the caches in MiB with a decimal: a 512 KiB L2
    # (Zen 3) read "L2 0 MiB" when the bytes were shifted to whole MiB.
    from torchao_kernels.bench import _mib, machine_info

    m = machine_info()
    assert f"L2 {_mib(m['l2_bytes'])}, L3 {_mib(m['l3_bytes'])}" in text
    assert _mib(512 << 10) == "0.5 MiB"
