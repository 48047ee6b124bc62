"""Op tests: torch.ops.torchao.linear_8bit_act_xbit_weight / pack_8bit_act_xbit_weight,
torchao's per-bit-width ops, torch.compile, torch.export, opcheck and error handling.

Kernels are bit exact, so every optimized result is compared with torch.equal
against the portable reference (weights packed with target="n1k4").
"""
import contextlib
import json
import struct
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import torchao_kernels

OPS = torch.ops.torchao
INFO = torchao_kernels.info()
REFERENCE_FORMAT = "n1k4"
FORMATS = [f["name"] for f in INFO["formats"]]
COMPAT = torchao_kernels.torchao_compat_status() == "registered"
needs_compat = pytest.mark.skipif(
    not COMPAT, reason=f"torchao's per-bit ops are served by another library: "
    f"{torchao_kernels.torchao_compat_status()}"
)
OUT_OPCHECK_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor")


@contextlib.contextmanager
def num_threads(t):
    old = torch.get_num_threads()
    torch.set_num_threads(t)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def make_weights(bits, n, k, g, zeros=False, bias=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    q = torch.randint(qmin, qmax + 1, (n, k), generator=gen, dtype=torch.int8)
    s = torch.rand(n, k // g, generator=gen) * 0.1 + 1e-3
    z = torch.randint(qmin, qmax + 1, (n, k // g), generator=gen, dtype=torch.int8) if zeros else None
    b = torch.randn(n, generator=gen) if bias else None
    return q, s, z, b


def pack(q, s, z, bits, g, b, target=None):
    return OPS.pack_8bit_act_xbit_weight(q, s, z, bits, g, b, target)


def linear(x, packed, g, n, k):
    return OPS.linear_8bit_act_xbit_weight(x, packed, g, n, k)


def rand_x(m, k, seed=1, dtype=torch.float32):
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).to(dtype)


# ---------------------------------------------------------------------------
# Eager correctness


@pytest.mark.parametrize("bits", range(1, 9), ids=lambda b: f"{b}bit")
def test_default_format_equals_reference(bits):
    for zeros in (False, True):
        for bias in (False, True):
            for n, k, g in [(37, 128, 32), (16, 64, 64), (70, 192, 16)]:
                q, s, z, b = make_weights(bits, n, k, g, zeros, bias, seed=bits)
                ref_packed = pack(q, s, z, bits, g, b, REFERENCE_FORMAT)
                packed = pack(q, s, z, bits, g, b)  # this CPU's best format
                for m in (1, 2, 4, 9, 40):
                    x = rand_x(m, k, seed=m)
                    want = linear(x, ref_packed, g, n, k)
                    got = linear(x, packed, g, n, k)
                    assert got.dtype == torch.float32 and got.shape == (m, n)
                    assert torch.equal(got, want), (bits, zeros, bias, n, k, g, m)


@pytest.mark.parametrize("fmt", FORMATS)
def test_thread_count_and_batch_invariance(fmt):
    cases = [(17, 64, 32), (300, 128, 64)]  # few column blocks (rows split) / many blocks
    for n, k, g in cases:
        q, s, z, b = make_weights(4, n, k, g, zeros=True, bias=True, seed=n)
        packed = pack(q, s, z, 4, g, b, fmt)
        ref_packed = pack(q, s, z, 4, g, b, REFERENCE_FORMAT)
        x = rand_x(70, k, seed=3)
        with num_threads(1):
            singles = torch.cat([linear(x[i:i + 1], packed, g, n, k) for i in range(70)])
            y1 = {m: linear(x[:m], packed, g, n, k) for m in (1, 2, 3, 4, 5, 8, 13, 33, 70)}
        with num_threads(2):
            y2 = {m: linear(x[:m], packed, g, n, k) for m in y1}
            singles2 = torch.cat([linear(x[i:i + 1], packed, g, n, k) for i in range(0, 70, 7)])
        assert torch.equal(singles, linear(x, ref_packed, g, n, k))
        assert torch.equal(singles2, singles[::7])
        for m in y1:
            assert torch.equal(y1[m], y2[m]), f"threads 1 vs 2 differ at m={m}"
            assert torch.equal(y1[m], singles[:m]), f"batch of {m} differs from single rows"
        # any split of the batch gives the same rows
        parts = torch.cat([linear(x[a:e], packed, g, n, k) for a, e in [(0, 5), (5, 6), (6, 39), (39, 70)]])
        assert torch.equal(parts, singles)


def test_every_runnable_kernel_through_the_op():
    """Forcing each runnable kernel (any m, 1 and 2 threads) gives the reference numbers."""
    for fmt in FORMATS:
        kernels = [k for k in INFO["kernels"] if k["format"] == fmt and k["runnable"] and k["op"] == "linear"]
        n, k, g = 45, 128, 32
        cases = {}  # bits -> (packed, want): 3-bit weights, or a row's own widest
        for kern in kernels:
            name, bits = kern["name"], 3 if 3 in kern["bits"] else kern["bits"][-1]
            if bits not in cases:
                q, s, z, b = make_weights(bits, n, k, g, zeros=True, bias=True, seed=9)
                cases[bits] = (pack(q, s, z, bits, g, b, fmt),
                               linear(rand_x(37, k), pack(q, s, z, bits, g, b, REFERENCE_FORMAT), g, n, k))
            packed, want = cases[bits]
            for t in (1, 2):
                with torchao_kernels.overrides(force=name), num_threads(t):
                    torchao_kernels.reset_stats()
                    for m in (1, 3, 4, 37):
                        got = linear(rand_x(37, k)[:m], packed, g, n, k)
                        assert torch.equal(got, want[:m]), (name, t, m)
                    assert set(torchao_kernels.stats()) == {name}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_activation_dtypes(dtype):
    n, k, g = 37, 128, 32
    q, s, z, b = make_weights(4, n, k, g, bias=True)
    packed = pack(q, s, z, 4, g, b)
    x = rand_x(5, k, dtype=dtype)
    y = linear(x, packed, g, n, k)
    assert y.dtype == dtype and y.shape == (5, n)
    assert torch.equal(y, linear(x.float(), packed, g, n, k).to(dtype))


def test_leading_dims_and_1d_and_empty():
    n, k, g = 37, 64, 16
    q, s, z, b = make_weights(5, n, k, g, zeros=True)
    packed = pack(q, s, z, 5, g, b)
    x = rand_x(24, k)
    y2 = linear(x, packed, g, n, k)
    y3 = linear(x.reshape(2, 3, 4, k), packed, g, n, k)
    assert y3.shape == (2, 3, 4, n)
    assert torch.equal(y3.reshape(24, n), y2)
    y1 = linear(x[5], packed, g, n, k)
    assert y1.shape == (n,) and torch.equal(y1, y2[5])
    # non-contiguous activations
    xt = x.t().contiguous().t()
    assert not xt.is_contiguous()
    assert torch.equal(linear(x[::2], packed, g, n, k), y2[::2])
    assert torch.equal(linear(xt, packed, g, n, k), y2)
    # empty batch
    y0 = linear(torch.empty(0, k), packed, g, n, k)
    assert y0.shape == (0, n)
    assert linear(torch.empty(2, 0, k), packed, g, n, k).shape == (2, 0, n)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_out_variant(dtype):
    n, k, g = 37, 64, 32
    q, s, z, b = make_weights(6, n, k, g, bias=True)
    packed = pack(q, s, z, 6, g, b)
    x = rand_x(2 * 3 * 5, k, dtype=dtype).reshape(2, 3, 5, k)
    want = linear(x, packed, g, n, k)
    out = torch.full((2, 3, 5, n), 123.0, dtype=dtype)
    ptr = out.data_ptr()
    ret = OPS.linear_8bit_act_xbit_weight.out(x, packed, g, n, k, out=out)
    assert ret is out or ret.data_ptr() == ptr
    assert out.data_ptr() == ptr, "out of the right shape must be written in place"
    assert torch.equal(out, want)
    # an empty out is resized
    out2 = torch.empty(0, dtype=dtype)
    OPS.linear_8bit_act_xbit_weight.out(x, packed, g, n, k, out=out2)
    assert out2.shape == want.shape and torch.equal(out2, want)
    # a non-contiguous out is written correctly
    big = torch.zeros(2, 3, 5, 2 * n, dtype=dtype)
    view = big[..., ::2]
    OPS.linear_8bit_act_xbit_weight.out(x, packed, g, n, k, out=view)
    assert torch.equal(view, want) and not big[..., 1::2].any()


def test_pack_accepts_torchao_targets_and_uint8_buffers():
    n, k, g = 20, 64, 32
    q, s, z, b = make_weights(4, n, k, g)
    want = linear(rand_x(3, k), pack(q, s, z, 4, g, b, REFERENCE_FORMAT), g, n, k)
    for target in (None, "auto", "universal", "kleidiai", "aten", *FORMATS):
        packed = pack(q, s, z, 4, g, b, target)
        assert packed.dtype == torch.int8 and packed.dim() == 1
        assert torch.equal(linear(rand_x(3, k), packed, g, n, k), want), target
        assert torch.equal(linear(rand_x(3, k), packed.view(torch.uint8), g, n, k), want), target
    assert torchao_kernels.packed_info(pack(q, s, z, 4, g, b, "aten"))["format"] == "n1k4"


# ---------------------------------------------------------------------------
# torchao's per-bit-width ops


@needs_compat
@pytest.mark.parametrize("bits", range(1, 9), ids=lambda b: f"{b}bit")
def test_torchao_compat_ops(bits):
    n, k, g = 33, 128, 32
    for zeros, bias in ((False, False), (True, True)):
        q, s, z, b = make_weights(bits, n, k, g, zeros, bias, seed=bits)
        pack_b = getattr(OPS, f"_pack_8bit_act_{bits}bit_weight")
        linear_b = getattr(OPS, f"_linear_8bit_act_{bits}bit_weight")
        for target in (None, "universal", REFERENCE_FORMAT):
            packed = pack_b(q, s, z, g, b, target)
            assert torch.equal(packed, pack(q, s, z, bits, g, b, target)), target
        packed = pack_b(q, s, z, g, b, None)
        x = rand_x(6, k).reshape(2, 3, k)
        want = linear(x, pack(q, s, z, bits, g, b, REFERENCE_FORMAT), g, n, k)
        got = linear_b(x, packed, g, n, k)
        assert torch.equal(got, want)
        out = torch.empty(2, 3, n)
        ret = linear_b.out(x, packed, g, n, k, out=out)
        assert torch.equal(out, want) and torch.equal(ret, want)


@needs_compat
def test_torchao_compat_linear_rejects_other_bit_width():
    q, s, z, b = make_weights(3, 16, 64, 32)
    packed = pack(q, s, z, 3, 32, b)
    x = rand_x(2, 64)
    with pytest.raises((ValueError, RuntimeError), match="bit width"):
        OPS._linear_8bit_act_4bit_weight(x, packed, 32, 16, 64)
    assert torch.equal(OPS._linear_8bit_act_3bit_weight(x, packed, 32, 16, 64),
                       linear(x, packed, 32, 16, 64))


@needs_compat
def test_torchao_compat_linear_out_rejects_other_bit_width():
    q, s, z, b = make_weights(3, 16, 64, 32)
    packed = pack(q, s, z, 3, 32, b)
    with pytest.raises((ValueError, RuntimeError), match="bit width"):
        OPS._linear_8bit_act_4bit_weight.out(rand_x(2, 64), packed, 32, 16, 64, out=torch.empty(2, 16))


# ---------------------------------------------------------------------------
# torch.compile / torch.export


class TinyModel(nn.Module):
    def __init__(self, bits=4, n=48, k=128, g=32):
        super().__init__()
        q, s, z, b = make_weights(bits, n, k, g, zeros=True, bias=True, seed=42)
        self.register_buffer("packed", pack(q, s, z, bits, g, b))
        self.g, self.n, self.k = g, n, k

    def forward(self, x):
        y = OPS.linear_8bit_act_xbit_weight(x, self.packed, self.g, self.n, self.k)
        return torch.relu(y) * 2.0


def quantized_mlp(bits=4, seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 32))
    report = torchao_kernels.quantize_(model, bits=bits, group_size=32)
    assert len(report["quantized"]) == 2
    return model.eval()


@pytest.mark.parametrize("which", ["tiny", "quantize_"])
def test_torch_compile_fullgraph_dynamic(which):
    torch._dynamo.reset()
    model = TinyModel() if which == "tiny" else quantized_mlp()
    k = 128 if which == "tiny" else 64
    explanation = torch._dynamo.explain(model)(rand_x(3, k))
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    with torch.no_grad():
        for m in (3, 11, 1):
            x = rand_x(m, k, seed=m)
            assert torch.equal(compiled(x), model(x)), m
        x3 = rand_x(10, k).reshape(2, 5, k)
        assert torch.equal(compiled(x3), model(x3))
        if which == "tiny":
            xb = rand_x(6, k, dtype=torch.bfloat16)
            assert torch.equal(compiled(xb), model(xb))


@pytest.mark.parametrize("which", ["tiny", "quantize_"])
def test_torch_export(which):
    model = TinyModel() if which == "tiny" else quantized_mlp()
    k = 128 if which == "tiny" else 64
    batch = torch.export.Dim("batch", min=1, max=1024)
    ep = torch.export.export(model, (rand_x(4, k),), dynamic_shapes=({0: batch},))
    code = ep.graph_module.code
    assert "torchao.linear_8bit_act_xbit_weight" in code, code
    targets = [str(nd.target) for nd in ep.graph.nodes if nd.op == "call_function"]
    assert sum("torchao.linear_8bit_act_xbit_weight" in t for t in targets) == (1 if which == "tiny" else 2)
    runner = ep.module()
    for m in (4, 7, 1):
        x = rand_x(m, k, seed=m)
        assert torch.equal(runner(x), model(x)), m


# ---------------------------------------------------------------------------
# opcheck


def test_opcheck_linear_and_pack():
    from torch.library import opcheck

    n, k, g = 20, 64, 32
    q, s, z, b = make_weights(4, n, k, g, zeros=True, bias=True)
    packed = pack(q, s, z, 4, g, b)
    for x in (rand_x(3, k), rand_x(6, k).reshape(2, 3, k), rand_x(2, k, dtype=torch.bfloat16)):
        opcheck(OPS.linear_8bit_act_xbit_weight.default, (x, packed, g, n, k))
    for target in (None, REFERENCE_FORMAT, "n16k4" if "n16k4" in FORMATS else REFERENCE_FORMAT):
        opcheck(OPS.pack_8bit_act_xbit_weight.default, (q, s, z, 4, g, b), {"target": target})
    opcheck(OPS.pack_8bit_act_xbit_weight.default, (q, s, None, 4, g, None))
    # bfloat16 scales: a smaller buffer, whose size the fake kernel knows too
    opcheck(OPS.pack_8bit_act_xbit_weight.default, (q, s.to(torch.bfloat16), z, 4, g, b))
    packed16 = pack(q, s.to(torch.bfloat16), z, 4, g, b)
    opcheck(OPS.linear_8bit_act_xbit_weight.default, (rand_x(3, k), packed16, g, n, k))


def test_opcheck_linear_out():
    # test_aot_dispatch_dynamic is left out: PyTorch cannot functionalize custom
    # ops whose output aliases an input (the torchao schema "-> Tensor(a!)").
    from torch.library import opcheck

    n, k, g = 20, 64, 32
    q, s, z, b = make_weights(4, n, k, g, zeros=True, bias=True)
    packed = pack(q, s, z, 4, g, b)
    opcheck(OPS.linear_8bit_act_xbit_weight.out, (rand_x(3, k), packed, g, n, k),
            {"out": torch.empty(3, n)}, test_utils=OUT_OPCHECK_UTILS)
    x = rand_x(3, k, dtype=torch.bfloat16)
    opcheck(OPS.linear_8bit_act_xbit_weight.out, (x, packed, g, n, k),
            {"out": torch.empty(3, n, dtype=torch.bfloat16)}, test_utils=OUT_OPCHECK_UTILS)


def test_opcheck_linear_out_resizes():
    from torch.library import opcheck

    n, k, g = 20, 64, 32
    q, s, z, b = make_weights(4, n, k, g)
    packed = pack(q, s, z, 4, g, b)
    opcheck(OPS.linear_8bit_act_xbit_weight.out, (rand_x(3, k), packed, g, n, k),
            {"out": torch.empty(0)}, test_utils=OUT_OPCHECK_UTILS)


@needs_compat
@pytest.mark.parametrize("bits", [1, 4, 8], ids=lambda b: f"{b}bit")
def test_opcheck_compat_ops(bits):
    from torch.library import opcheck

    n, k, g = 20, 64, 16
    q, s, z, b = make_weights(bits, n, k, g, zeros=True, bias=True)
    pack_b = getattr(OPS, f"_pack_8bit_act_{bits}bit_weight")
    linear_b = getattr(OPS, f"_linear_8bit_act_{bits}bit_weight")
    opcheck(pack_b.default, (q, s, z, g, b, None))
    opcheck(pack_b.default, (q, s, None, g, None, REFERENCE_FORMAT))
    packed = pack_b(q, s, z, g, b, None)
    opcheck(linear_b.default, (rand_x(3, k), packed, g, n, k))
    opcheck(linear_b.out, (rand_x(3, k), packed, g, n, k), {"out": torch.empty(3, n)},
            test_utils=OUT_OPCHECK_UTILS)


# ---------------------------------------------------------------------------
# Errors: clear messages naming the argument and value; never a crash.

ERR = (ValueError, RuntimeError)


@pytest.fixture(scope="module")
def w4():
    n, k, g = 16, 64, 32
    q, s, z, b = make_weights(4, n, k, g, zeros=True, bias=True)
    return dict(q=q, s=s, z=z, b=b, n=n, k=k, g=g, packed=pack(q, s, z, 4, g, b))


@pytest.mark.parametrize("nbit", [0, 9, -1])
def test_error_weight_nbit(w4, nbit):
    with pytest.raises(ValueError, match=f"weight_nbit must be in 1..8, got {nbit}"):
        pack(w4["q"], w4["s"], w4["z"], nbit, w4["g"], w4["b"])


def test_error_group_size(w4):
    q, s = w4["q"], w4["s"]
    with pytest.raises(ValueError, match="group_size must be a positive multiple of 16, got 24"):
        pack(q, torch.ones(16, 64 // 8), None, 4, 24, None)
    with pytest.raises(ValueError, match="group_size must be a positive multiple of 16, got 0"):
        pack(q, s, None, 4, 0, None)
    with pytest.raises(ValueError, match="group_size must divide k: group_size=48, k=64"):
        pack(q, torch.ones(16, 1), None, 4, 48, None)


def test_error_qvals(w4):
    q = w4["q"].clone()
    q[3, 5] = 8
    with pytest.raises(ValueError, match=r"weight_qvals\[3, 5\] = 8 is outside the 4-bit range \[-8, 7\]"):
        pack(q, w4["s"], None, 4, 32, None)
    q[3, 5] = -3
    with pytest.raises(ValueError, match=r"weight_qvals\[3, 5\] = -3 is outside the 1-bit range \[-1, 0\]"):
        pack(q.clamp(-1, 0).index_put_((torch.tensor(3), torch.tensor(5)), torch.tensor(-3, dtype=torch.int8)),
             w4["s"], None, 1, 32, None)
    with pytest.raises(ValueError, match="weight_qvals must be int8, got Int"):
        pack(w4["q"].int(), w4["s"], None, 4, 32, None)
    with pytest.raises(ValueError, match="weight_qvals must be 2-D"):
        pack(w4["q"].reshape(-1), w4["s"], None, 4, 32, None)


def test_error_scales_zeros_bias(w4):
    q, s, z, b = w4["q"], w4["s"], w4["z"], w4["b"]
    with pytest.raises(ValueError, match=r"weight_scales must have shape \(n, k / group_size\) = \(16, 2\) or "
                                         r"\(32,\), got \[16, 1\]"):
        pack(q, s[:, :1], None, 4, 32, None)
    with pytest.raises(ValueError, match=r"weight_scales must have shape \(n, k / group_size\) = \(16, 4\)"):
        pack(q, s, None, 4, 16, None)
    # the right number of scales in the wrong order: (k / group_size, n) is not (n, k / group_size)
    with pytest.raises(ValueError, match=r"weight_scales must have shape .* got \[2, 16\]"):
        pack(q, s.t().contiguous(), None, 4, 32, None)
    pack(q, s.reshape(-1), None, 4, 32, None)  # flat, as torchao passes them
    with pytest.raises(ValueError, match="weight_scales must be floating point"):
        pack(q, z, None, 4, 32, None)
    with pytest.raises(ValueError, match=r"weight_zeros must have shape \(n, k / group_size\) = \(16, 2\)"):
        pack(q, s, z[:8], 4, 32, None)
    with pytest.raises(ValueError, match=r"weight_zeros must have shape .* got \[2, 16\]"):
        pack(q, s, z.t().contiguous(), 4, 32, None)
    with pytest.raises(ValueError, match="weight_zeros must be integer"):
        pack(q, s, s, 4, 32, None)
    with pytest.raises(ValueError, match="weight_zeros must be integer"):
        pack(q, s, z != 0, 4, 32, None)
    with pytest.raises(ValueError, match=r"weight_zeros must fit in int8, got values in \[0, 300\]"):
        pack(q, s, torch.full((16, 2), 300, dtype=torch.int32).index_fill_(0, torch.tensor(0), 0), 4, 32, None)
    with pytest.raises(ValueError, match=r"bias must have shape \(n,\) = \(16,\), got \[5\]"):
        pack(q, s, z, 4, 32, b[:5])
    with pytest.raises(ValueError, match=r"bias must have shape \(n,\) = \(16,\), got \[2, 8\]"):
        pack(q, s, z, 4, 32, b.reshape(2, 8))
    with pytest.raises(ValueError, match="bias must be floating point, got Long"):
        pack(q, s, z, 4, 32, torch.arange(16))
    # the Meta kernel checks the same (tracing fails where eager would)
    with pytest.raises(ValueError, match="weight_qvals must be int8, got Int"):
        pack(q.int().to("meta"), s.to("meta"), None, 4, 32, None)
    with pytest.raises(ValueError, match=r"weight_scales must have shape .* got \[2, 16\]"):
        pack(q.to("meta"), s.t().to("meta"), None, 4, 32, None)


def test_error_devices_never_mix(w4):
    # A buffer on the meta device with CPU activations reaches the Meta kernel:
    # an error, not an uninitialized CPU result (or an `out` left untouched).
    p, g, n, k = w4["packed"], w4["g"], w4["n"], w4["k"]
    x = rand_x(2, k)
    with pytest.raises(ValueError, match="packed_weights is on meta but activations is on cpu"):
        linear(x, p.to("meta"), g, n, k)
    with pytest.raises(ValueError, match="packed_weights is on meta but activations is on cpu"):
        OPS.linear_8bit_act_xbit_weight.out(x, p.to("meta"), g, n, k, out=torch.empty(2, n))
    with pytest.raises(ValueError, match="weight_scales is on meta but weight_qvals is on cpu"):
        pack(w4["q"], w4["s"].to("meta"), None, 4, g, None)
    # all on meta: shapes only
    assert linear(x.to("meta"), p.to("meta"), g, n, k).shape == (2, n)
    # explain() of a buffer that is not on the CPU: an error, not a read of nothing
    with pytest.raises(ValueError, match="packed_weights must be a CPU tensor, got meta"):
        torchao_kernels.explain(p.to("meta"))
    with pytest.raises(ValueError, match="threads must be >= 1, got 0"):
        torchao_kernels.explain(p, 1, 0)


def test_error_sizes_no_buffer_holds_are_rejected_before_allocating(w4):
    p, g, k = w4["packed"], w4["g"], w4["k"]
    x = rand_x(2, k)
    for n in (-1, 2 ** 40):
        with pytest.raises(ValueError, match=f"n={n} does not match packed_weights"):
            linear(x, p, g, n, k)


def test_error_linear_mismatch(w4):
    p, g, n, k = w4["packed"], w4["g"], w4["n"], w4["k"]
    x = rand_x(2, k)
    with pytest.raises(ValueError, match=r"n=17 does not match packed_weights \(packed with n=16\)"):
        linear(x, p, g, 17, k)
    with pytest.raises(ValueError, match=r"group_size=64 does not match packed_weights \(packed with group_size=32\)"):
        linear(x, p, 64, n, k)
    with pytest.raises(ValueError, match="activations have last dimension 64 but k=128"):
        linear(x, p, g, n, 128)
    with pytest.raises(ValueError, match="activations have k=128 .*packed with k=64"):
        linear(rand_x(2, 128), p, g, n, 128)
    with pytest.raises(ValueError, match="activations must be float32, bfloat16 or float16, got Int"):
        linear(x.int(), p, g, n, k)
    with pytest.raises(ValueError, match="activations must be float32, bfloat16 or float16, got Double"):
        linear(x.double(), p, g, n, k)
    with pytest.raises(ValueError, match="activations must have at least 1 dimension"):
        linear(torch.tensor(1.0), p, g, n, k)
    with pytest.raises(ValueError, match="out must have the activations' dtype"):
        OPS.linear_8bit_act_xbit_weight.out(x, p, g, n, k, out=torch.empty(2, n, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="packed_weights must be int8 or uint8, got Float"):
        linear(x, p.float(), g, n, k)
    with pytest.raises(ValueError, match="packed_weights must be a contiguous 1-D tensor"):
        linear(x, p.reshape(2, -1), g, n, k)


def test_error_packed_garbage(w4):
    g, n, k, p = w4["g"], w4["n"], w4["k"], w4["packed"]
    x = rand_x(2, k)
    gen = torch.Generator().manual_seed(0)
    for size in (0, 1, 63, 64, p.numel(), 4096):
        junk = torch.randint(-128, 128, (size,), generator=gen, dtype=torch.int8)
        with pytest.raises(ValueError, match="packed_weights is not a torchao_kernels packed buffer"):
            linear(x, junk, g, n, k)
    with pytest.raises(ValueError, match="shorter than the 64-byte header"):
        linear(x, p[:40].clone(), g, n, k)
    for cut in (1, 100, p.numel() - 64):
        with pytest.raises(ValueError, match="packed_weights is truncated"):
            linear(x, p[:-cut].clone(), g, n, k)
    # header byte flipped without fixing the checksum
    bad = p.clone()
    bad[12] += 1  # n
    with pytest.raises(ValueError, match="header is corrupt"):
        linear(x, bad, g, n, k)
    # every public entry point validates
    for fn in (torchao_kernels.packed_info, torchao_kernels.unpack, torchao_kernels.repack):
        with pytest.raises(ValueError, match="truncated"):
            fn(p[:-1].clone())


def test_error_abi_version_bumped(w4):
    g, n, k, p = w4["g"], w4["n"], w4["k"], w4["packed"]
    bad = p.clone()
    abi = struct.unpack_from("<H", bad.numpy().tobytes(), 4)[0]
    bad.view(torch.uint8)[4:6] = torch.tensor(list(struct.pack("<H", abi + 1)), dtype=torch.uint8)
    with pytest.raises(ValueError, match=rf"header is corrupt|ABI version {abi + 1}"):
        linear(rand_x(2, k), bad, g, n, k)
    # with the checksum recomputed the version check itself must fire
    fixed = _with_checksum(bad)
    with pytest.raises(ValueError, match=rf"ABI version {abi + 1} \(newer than this build\)"):
        linear(rand_x(2, k), fixed, g, n, k)


def test_error_unknown_scale_type(w4):
    g, n, k, p = w4["g"], w4["n"], w4["k"], w4["packed"]
    bad = p.clone()
    bad.view(torch.uint8)[28] = 2  # scale_type
    with pytest.raises(ValueError, match=r"scale type 2, unknown to this build \(0 = float32, 1 = bfloat16\)"):
        linear(rand_x(2, k), _with_checksum(bad), g, n, k)
    # scale type 1 on a float32 body: the layout no longer matches the size
    bad.view(torch.uint8)[28] = 1
    with pytest.raises(ValueError, match="truncated or inconsistent"):
        linear(rand_x(2, k), _with_checksum(bad), g, n, k)


def test_error_unknown_target(w4):
    with pytest.raises(ValueError, match=r"target must be .*got 'bogus'"):
        pack(w4["q"], w4["s"], None, 4, 32, None, "bogus")
    with pytest.raises(ValueError, match=r"got 'bogus'"):
        torchao_kernels.repack(w4["packed"], "bogus")


def _fnv1a(data: bytes) -> int:
    x = 2166136261
    for byte in data:
        x = ((x ^ byte) * 16777619) & 0xFFFFFFFF
    return x


def _with_checksum(packed: torch.Tensor) -> torch.Tensor:
    raw = bytearray(packed.view(torch.uint8).numpy().tobytes())
    struct.pack_into("<I", raw, 40, _fnv1a(bytes(raw[:40])))
    return torch.frombuffer(raw, dtype=torch.int8).clone()


def test_checksum_model_matches_library(w4):
    assert torch.equal(_with_checksum(w4["packed"]), w4["packed"])


FUZZ_SCRIPT = textwrap.dedent(
    r"""
    import json, random, struct, torch, torchao_kernels
    OPS = torch.ops.torchao

    def fnv(b):
        x = 2166136261
        for c in b:
            x = ((x ^ c) * 16777619) & 0xFFFFFFFF
        return x

    def fix(raw):
        struct.pack_into("<I", raw, 40, fnv(bytes(raw[:40])))
        return torch.frombuffer(bytearray(raw), dtype=torch.int8).clone()

    rng = random.Random(0)
    q = torch.randint(-8, 8, (40, 64), dtype=torch.int8)
    s = torch.rand(40, 2)
    z = torch.randint(-8, 8, (40, 2), dtype=torch.int8)
    base = {f: bytes(OPS.pack_8bit_act_xbit_weight(q, s, z, 4, 32, torch.randn(40), f).view(torch.uint8).numpy())
            for f in FORMATS}
    # (offset, struct format) of each header field
    fields = [(0, "<I"), (4, "<H"), (6, "<H"), (8, "<H"), (10, "<B"), (11, "<B"), (12, "<i"), (16, "<i"),
              (20, "<i"), (24, "<H"), (26, "<B"), (27, "<B"), (28, "<B"), (32, "<Q")]
    values = [0, 1, 2, 3, 4, 7, 8, 9, 15, 16, 17, 31, 32, 33, 48, 64, 127, 128, 255, 256, 65535,
              2**30, 2**31 - 1, -1, -(2**31), 2**32 - 1, 2**40, 2**63]
    # Counts per kind of corruption: "field" (one header field the loader
    # validates set to another value), "truncated" (bytes cut off the end),
    # "multi" (several random fields), "body" (random body bytes), "same_layout"
    # (n changed within the last block of nr rows: a consistent header for the
    # same body, which only the op's own n check can tell apart).
    counts = {kind: {"rejected": 0, "accepted": 0}
              for kind in ("field", "truncated", "multi", "body", "same_layout")}
    accepted_fields = []  # validated-field corruptions some call accepted
    for fmt, good in base.items():
        cases = []
        for off, f in fields:
            for v in values:
                try:
                    b = bytearray(good)
                    struct.pack_into(f, b, off, v)
                except struct.error:
                    continue
                if b != bytearray(good):
                    nr = struct.unpack_from("<H", good, 24)[0]
                    same = off == 12 and 0 < v <= 2**30 and -(-v // nr) == -(-40 // nr)
                    cases.append(("same_layout" if same else "field", (off, v), b))
        for _ in range(300):  # random multi-field and random-body corruptions
            b = bytearray(good)
            for _ in range(rng.randint(1, 4)):
                off, f = rng.choice(fields)
                try:
                    struct.pack_into(f, b, off, rng.choice(values))
                except struct.error:
                    pass
            cases.append(("multi", None, b))
        for _ in range(50):
            b = bytearray(good)
            for _ in range(20):
                b[rng.randrange(64, len(b))] = rng.randrange(256)
            cases.append(("body", None, b))
        for kind, what, raw in cases:
            for cut in (0, rng.randrange(1, len(raw) - 60)):
                p = fix(raw[: len(raw) - cut])
                k = "truncated" if cut else kind
                for call in (
                    lambda: OPS.linear_8bit_act_xbit_weight(torch.randn(3, 64), p, 32, 40, 64),
                    lambda: torchao_kernels.packed_info(p),
                    lambda: torchao_kernels.unpack(p),
                    lambda: torchao_kernels.repack(p, "n1k4"),
                ):
                    try:
                        call()
                        counts[k]["accepted"] += 1
                        if k in ("field", "truncated"):
                            accepted_fields.append([fmt, k, what, cut])
                    except (ValueError, RuntimeError) as e:
                        assert str(e).strip(), "empty error message"
                        counts[k]["rejected"] += 1
    print("RESULT " + json.dumps({"counts": counts, "accepted_fields": accepted_fields[:20]}))
    """
)


def test_corrupt_headers_never_crash():
    """Header fields set to odd values (checksum recomputed), truncation and body
    corruption give an error or a result, never a crash (run in a child process);
    every change to a header field the loader validates (magic, ABI version, header
    size, format, bits, flags, n, k, group size, tile, scale type, body size)
    and every truncation is rejected with a message."""
    script = f"FORMATS = {FORMATS!r}\n" + FUZZ_SCRIPT
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (
        f"child exited with {proc.returncode}\nstdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-4000:]}"
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout[-2000:]
    result = json.loads(lines[0][len("RESULT "):])
    counts = result["counts"]
    assert not result["accepted_fields"], f"corrupt headers accepted: {result['accepted_fields']}"
    for kind in ("field", "truncated"):
        assert counts[kind]["rejected"] > 0 and counts[kind]["accepted"] == 0, (kind, counts)
    # 14 fields x several values x 4 calls per format: the grid was really exercised
    assert counts["field"]["rejected"] >= 14 * 4 * len(FORMATS), counts
    assert sum(c["rejected"] for c in counts.values()) > 0, counts
    # body bytes are not validated (they are the weights): corrupting them still gives results
    assert counts["body"]["accepted"] > 0, counts
    # an n within the last row block passes the loader, but never the linear op (n=40 given)
    assert counts["same_layout"]["rejected"] >= counts["same_layout"]["accepted"] // 3, counts


# torchao's schemas, which the op list (ops/impl/op_list.h) must keep exactly.
_LINEAR_ARGS = "Tensor activations, Tensor packed_weights, int group_size, int n, int k"
_EXPECTED_SCHEMAS = {
    "pack_8bit_act_xbit_weight": "(Tensor weight_qvals, Tensor weight_scales, Tensor? weight_zeros, "
    "int weight_nbit, int group_size, Tensor? bias, str? target=None) -> Tensor",
    "_pack_8bit_act_{b}bit_weight": "(Tensor weight_qvals, Tensor weight_scales, Tensor? weight_zeros, "
    "int group_size, Tensor? bias, str? target) -> Tensor",
    "linear_8bit_act_xbit_weight": f"({_LINEAR_ARGS}) -> Tensor",
    "linear_8bit_act_xbit_weight.out": f"({_LINEAR_ARGS}, *, Tensor(a!) out) -> Tensor(a!)",
    "_linear_8bit_act_{b}bit_weight": f"({_LINEAR_ARGS}) -> Tensor",
    "_linear_8bit_act_{b}bit_weight.out": f"({_LINEAR_ARGS}, *, Tensor(a!) out) -> Tensor(a!)",
    "pack_embedding_xbit": "(Tensor weight_qvals, int weight_nbit) -> Tensor",
    "_pack_embedding_{b}bit": "(Tensor weight_qvals) -> Tensor",
    "embedding_xbit": "(Tensor packed_weight_qvals, int num_embeddings, int embedding_dim, "
    "Tensor weight_scales, Tensor? weight_zeros, Tensor indices) -> Tensor",
    "embedding_xbit.out": "(Tensor packed_weight_qvals, int num_embeddings, int embedding_dim, "
    "Tensor weight_scales, Tensor? weight_zeros, Tensor indices, *, Tensor(a!) out) -> Tensor(a!)",
    "_embedding_{b}bit": "(Tensor packed_weight_qvals, int num_embeddings, int embedding_dim, "
    "Tensor weight_scales, Tensor weight_zeros, Tensor indices) -> Tensor",
    "_embedding_{b}bit.out": "(Tensor packed_weight_qvals, int num_embeddings, int embedding_dim, "
    "Tensor weight_scales, Tensor weight_zeros, Tensor indices, *, Tensor(a!) out) -> Tensor(a!)",
    "shared_embedding_xbit": "(Tensor packed_weights, int group_size, int n, int k, Tensor indices) -> Tensor",
    "shared_embedding_xbit.out": "(Tensor packed_weights, int group_size, int n, int k, Tensor indices, *, "
    "Tensor(a!) out) -> Tensor(a!)",
    "_shared_embedding_{b}bit": "(Tensor packed_weights, int group_size, int n, int k, Tensor indices) -> Tensor",
    "_shared_embedding_{b}bit.out": "(Tensor packed_weights, int group_size, int n, int k, Tensor indices, *, "
    "Tensor(a!) out) -> Tensor(a!)",
}


def test_op_list_registers_torchaos_schemas():
    """Every op of the extension's op list is registered with torchao's schema, and the
    Python side's lists (executorch.OPS, the autograd registrations) come from it."""
    from torchao_kernels import _compat

    ops = _compat.op_list()
    families = {f["family"]: f for f in ops["families"]}
    assert set(families) == {"pack_linear", "linear", "pack_embedding", "embedding", "shared_embedding"}
    seen = set()
    for fam in families.values():
        assert len(fam["per_bit"]) == 8
        compat = torchao_kernels.torchao_compat_status("embedding" if "embedding" in fam["family"] else "linear")
        names = [(fam["name"], fam["name"])]
        if compat == "registered":
            names += [(name, fam["per_bit"][0].replace("1bit", "{b}bit")) for name in fam["per_bit"]]
        for name, key in names:
            for overload in (["default", "out"] if fam["out"] else ["default"]):
                schema = str(getattr(getattr(OPS, name), overload)._schema)
                suffix = "" if overload == "default" else ".out"
                assert schema == f"torchao::{name}{suffix}" + _EXPECTED_SCHEMAS[key + suffix], schema
                seen.add(key + suffix)
    if torchao_kernels.torchao_compat_status() == "registered" and torchao_kernels.torchao_compat_status("embedding") == "registered":
        assert seen == set(_EXPECTED_SCHEMAS)
    want_et = [f"torchao::{n}.out" for f in ops["families"] if f["out"] for n in [f["name"], *f["per_bit"]]]
    assert ops["executorch"] == want_et


def test_inspection_json_escapes_control_characters():
    """One JSON writer: strings with quotes, backslashes and control characters come back intact."""
    # a glob that matches kernels (names starting with q), with the odd characters in its bracket
    odd = '[q\t"quoted\\\x01\x1f\n]*'
    try:
        torchao_kernels.set_overrides(exclude=odd)
        assert torchao_kernels.get_overrides()["exclude"] == odd
        assert torchao_kernels.info()["overrides"]["exclude"] == odd
    finally:
        torchao_kernels.set_overrides()
