"""Python API tests: quantize_weight, QuantizedLinear, quantize_, state_dict,
repack / unpack / packed_info, stats."""
import io

import pytest
import torch
from torch import nn

import torchao_kernels
from torchao_kernels import QuantizedLinear

INFO = torchao_kernels.info()
FORMATS = [f["name"] for f in INFO["formats"]]

# Accuracy of QuantizedLinear vs the float nn.Linear it came from, as the
# relative L2 error ||y_q - y|| / ||y|| on Gaussian weights and activations
# (int8 dynamic activations included). Measured ~0.8% (8-bit) and ~7% (4-bit).
REL_TOL = {8: 0.02, 4: 0.12}


def rel_err(a, b):
    return ((a - b).norm() / b.norm()).item()


# ---------------------------------------------------------------------------
# quantize_weight / dequantize_weight


@pytest.mark.parametrize("bits", range(1, 9), ids=lambda b: f"{b}bit")
@pytest.mark.parametrize("has_zeros", [False, True], ids=["sym", "zeros"])
@pytest.mark.parametrize("group_size", [16, 32, 128, None, -1])
def test_quantize_weight_shapes_and_ranges(bits, has_zeros, group_size):
    n, k = 24, 128
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(bits)) * 0.3
    # round to nearest's own properties (the search: test/test_quantizers.py)
    q, s, z = torchao_kernels.quantize_weight(w, bits, group_size, has_zeros, method="rtn")
    g = k if group_size in (None, -1) else group_size
    qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    assert q.dtype == torch.int8 and q.shape == (n, k)
    assert s.dtype == torch.float32 and s.shape == (n, k // g)
    assert int(q.min()) >= qmin and int(q.max()) <= qmax
    assert (s > 0).all()
    if has_zeros:
        assert z is not None and z.dtype == torch.int8 and z.shape == (n, k // g)
        assert int(z.min()) >= qmin and int(z.max()) <= qmax
    else:
        assert z is None
    if bits >= 2:
        # the bit range is used (symmetric quantization maps max |w| to an end)
        assert int(q.min()) == qmin or int(q.max()) == qmax
    # reconstruction error: half a step symmetric, one step with zero points
    wd = torchao_kernels.dequantize_weight(q, s, z, g)
    err = ((w - wd).abs().reshape(n, k // g, g) / s[..., None]).max().item()
    assert err <= (1.0 if has_zeros else 0.5) + 1e-4, err
    # and it packs
    torchao_kernels.pack(q, s, z, bits=bits, group_size=g)


def test_quantize_weight_zero_and_constant_groups():
    w = torch.zeros(4, 64)
    w[1] = 2.5
    w[2, :32] = -1.0
    for has_zeros in (False, True):
        q, s, z = torchao_kernels.quantize_weight(w, 4, 32, has_zeros, method="rtn")
        assert torch.isfinite(s).all() and (s > 0).all()
        wd = torchao_kernels.dequantize_weight(q, s, z, 32)
        assert torch.isfinite(wd).all()
        assert torch.equal(wd[0], w[0]) and torch.equal(wd[2, 32:], w[2, 32:])  # all-zero groups
        step = s.repeat_interleave(32, dim=1)
        assert ((wd - w).abs() <= (1.0 if has_zeros else 0.5) * step + 1e-6).all(), has_zeros


def test_quantize_weight_errors():
    w = torch.randn(8, 64)
    with pytest.raises(ValueError, match="bits must be an int in 1..8, got 9"):
        torchao_kernels.quantize_weight(w, 9, 32)
    with pytest.raises(ValueError, match="bits must be an int in 1..8, got 0"):
        torchao_kernels.quantize_weight(w, 0, 32)
    with pytest.raises(ValueError, match="group_size must be a multiple of 16 that divides k=64, got 24"):
        torchao_kernels.quantize_weight(w, 4, 24)
    with pytest.raises(ValueError, match="divides k=64, got 48"):
        torchao_kernels.quantize_weight(w, 4, 48)
    with pytest.raises(ValueError, match="2-D floating point"):
        torchao_kernels.quantize_weight(w.to(torch.int32), 4, 32)
    with pytest.raises(ValueError, match="2-D floating point"):
        torchao_kernels.quantize_weight(w.reshape(-1), 4, 32)
    # a weight that no finite scale quantizes: an error naming where, not NaN scales
    bad = w.clone()
    bad[3, 5] = float("nan")
    with pytest.raises(ValueError, match=r"w must be finite: w\[3, 5\] = nan"):
        torchao_kernels.quantize_weight(bad, 4, 32)
    bad[3, 5] = float("-inf")
    with pytest.raises(ValueError, match=r"w must be finite: w\[3, 5\] = -inf"):
        torchao_kernels.quantize_weight(bad, 4, 32, method="rtn")
    huge = torch.full((2, 32), 3e38)
    huge[1, 0] = -3e38
    with pytest.raises(ValueError, match="the weights of row 1, group 0 span more than a torch.float32 scale"):
        torchao_kernels.quantize_weight(huge, 4, 32, True, method="rtn")
    # a layer built on the meta device has no values to quantize
    with pytest.raises(ValueError, match="w is on the meta device"):
        torchao_kernels.QuantizedLinear.from_linear(torch.nn.Linear(64, 8, device="meta"), bits=4, group_size=32)


def test_wrappers_name_a_non_integer_argument():
    q, s, _ = torchao_kernels.quantize_weight(torch.randn(32, 64), 4, 32, method="rtn")
    with pytest.raises(TypeError, match="bits must be an int, got 4.0"):
        torchao_kernels.pack(q, s, bits=4.0, group_size=32)
    with pytest.raises(TypeError, match="group_size must be an int, got '32'"):
        torchao_kernels.pack(q, s, bits=4, group_size="32")
    p = torchao_kernels.pack(q, s, bits=4, group_size=32)
    with pytest.raises(TypeError, match="n must be an int, got None"):
        torchao_kernels.linear(torch.randn(2, 64), p, 32, None, 64)
    with pytest.raises(TypeError, match="k must be an int, got True"):
        torchao_kernels.shared_embedding(p, 32, 32, True, torch.tensor([0]))


def test_dequantize_weight_errors():
    q, s, z = torchao_kernels.quantize_weight(torch.randn(8, 64), 4, 32, True, method="rtn")
    flat = torchao_kernels.dequantize_weight(q, s.reshape(-1), z.reshape(-1), 32)
    assert torch.equal(flat, torchao_kernels.dequantize_weight(q, s, z, 32))
    for g in (0, 48, -32, 32.0):
        with pytest.raises(ValueError, match=f"group_size must be a positive int that divides k=64, got {g}"):
            torchao_kernels.dequantize_weight(q, s, z, g)
    with pytest.raises(ValueError, match=r"scales must have shape \(n, k / group_size\) = \(8, 2\), got \(2, 8\)"):
        torchao_kernels.dequantize_weight(q, s.t(), z, 32)
    with pytest.raises(ValueError, match=r"zeros must have shape .* got \(2, 8\)"):
        torchao_kernels.dequantize_weight(q, s, z.t(), 32)
    with pytest.raises(ValueError, match="qvals must be a 2-D tensor"):
        torchao_kernels.dequantize_weight(q.reshape(-1), s, z, 32)


def test_quantize_warns_about_typos_and_a_second_pass():
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 32))
    with pytest.warns(UserWarning, match=r"overrides\['lm_haed'\] matches no nn.Linear or nn.Embedding"):
        torchao_kernels.quantize_(model, bits=4, group_size=32, overrides={"lm_haed": 8, "1": 8})
    assert model[1].bits == 8
    with pytest.warns(UserWarning, match=r"the model is already quantized \(2 QuantizedLinear"):
        torchao_kernels.quantize_(model, bits=4, group_size=32)


def test_quantize_names_a_calibration_of_another_model():
    small = nn.Sequential(nn.Linear(32, 32))
    cal = torchao_kernels.calibrate(small, [torch.randn(4, 32)])
    model = nn.Sequential(nn.Linear(64, 32))
    with pytest.raises(ValueError, match=r"statistics of '0' are for 32 input channels, but the layer has "
                                         r"in_features=64: was the calibration recorded on another model"):
        torchao_kernels.quantize_(model, bits=4, group_size=32, calibration=cal)


def test_load_state_dict_reports_unexpected_keys_and_keeps_the_buffer_on_failure():
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 32))
    torchao_kernels.quantize_(model, bits=8, group_size=64)
    x = torch.randn(2, 64)
    y = model(x)
    sd = model.state_dict()
    with pytest.raises(RuntimeError, match='Unexpected key\\(s\\) in state_dict: "0.weight"'):
        model.load_state_dict({**sd, "0.weight": torch.zeros(64, 64)})
    assert model.load_state_dict({**sd, "0.bias": torch.zeros(64)}, strict=False).unexpected_keys == ["0.bias"]
    other = nn.Sequential(nn.Linear(64, 128))
    torchao_kernels.quantize_(other, bits=4, group_size=32)
    with pytest.raises(RuntimeError, match=r"0.packed_weights: packed_weights are for \(out_features=128"):
        model.load_state_dict({**sd, "0.packed_weights": other.state_dict()["0.packed_weights"]})
    # the layer that refused the buffer kept its own, and still computes
    assert model[0].bits == 8 and torch.equal(model(x), y)


def test_modules_refuse_a_weights_only_table():
    # A table of torchao::_pack_embedding_{b}bit carries no scales: the
    # modules say so when they get one, not at their first forward.
    table = torchao_kernels.pack_embedding(torch.zeros(32, 64, dtype=torch.int8), 4)
    assert torchao_kernels.packed_info(table)["weights_only"]
    with pytest.raises(ValueError, match="weights-only embedding table"):
        QuantizedLinear(64, 32, table)
    ql = QuantizedLinear.from_linear(nn.Linear(64, 32), bits=4, group_size=32)
    assert not torchao_kernels.packed_info(ql.packed_weights)["weights_only"]
    with pytest.raises(RuntimeError, match="weights-only embedding table"):
        ql.load_state_dict({"packed_weights": table})
    emb = torchao_kernels.QuantizedEmbedding.from_embedding(nn.Embedding(32, 64), bits=4, group_size=32)
    with pytest.raises(RuntimeError, match="weights-only embedding table"):
        emb.load_state_dict({"packed_weights": table})


# ---------------------------------------------------------------------------
# QuantizedLinear


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("group_size", [32, None])
@pytest.mark.parametrize("has_zeros", [False, True])
def test_quantized_linear_close_to_linear(bits, group_size, has_zeros):
    torch.manual_seed(bits)
    lin = nn.Linear(256, 96)
    x = torch.randn(16, 256)
    ql = QuantizedLinear.from_linear(lin, bits=bits, group_size=group_size, has_zeros=has_zeros)
    with torch.no_grad():
        y, yq = lin(x), ql(x)
    assert yq.shape == y.shape and yq.dtype == torch.float32
    assert rel_err(yq, y) < REL_TOL[bits], rel_err(yq, y)
    assert ql.bits == bits and ql.group_size == (group_size or 256) and ql.has_zeros == has_zeros
    assert ql.has_bias
    # equals the op applied to the same quantized weights (bit exact)
    q, s, z = torchao_kernels.quantize_weight(lin.weight.detach(), bits, group_size or 256, has_zeros)
    p = torchao_kernels.pack(q, s, z, bits=bits, group_size=group_size or 256, bias=lin.bias.detach(),
                             target="n1k4")
    assert torch.equal(yq, torchao_kernels.linear(x, p, group_size or 256, 96, 256))


def test_quantized_linear_no_bias_dtypes_and_leading_dims():
    torch.manual_seed(0)
    lin = nn.Linear(64, 40, bias=False)
    ql = QuantizedLinear.from_linear(lin, bits=6, group_size=16)
    assert not ql.has_bias
    x = torch.randn(2, 3, 64)
    y = ql(x)
    assert y.shape == (2, 3, 40)
    assert rel_err(y, lin(x).detach()) < 0.05
    for dt in (torch.bfloat16, torch.float16):
        yd = ql(x.to(dt))
        assert yd.dtype == dt and torch.equal(yd, ql(x.to(dt).float()).to(dt))
    with pytest.raises(TypeError, match="nn.Linear"):
        QuantizedLinear.from_linear(nn.Conv1d(3, 3, 1))


def test_quantized_linear_rejects_mismatched_buffer():
    lin = nn.Linear(64, 40)
    p = QuantizedLinear.from_linear(lin).packed_weights
    with pytest.raises(ValueError, match=r"packed_weights are for \(out_features=40, in_features=64\)"):
        QuantizedLinear(64, 41, p)


# ---------------------------------------------------------------------------
# quantize_


class MLP(nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.up = nn.Linear(64, 128)
        self.act = nn.GELU()
        self.mid = nn.Linear(128, 40)
        self.odd = nn.Linear(40, 64)  # in_features 40: not a multiple of 32
        self.head = nn.Sequential(nn.Linear(64, 32), nn.Linear(32, 10, bias=False))

    def forward(self, x):
        x = self.act(self.up(x))
        x = self.act(self.mid(x))
        x = self.act(self.odd(x))
        return self.head(x)


def test_quantize_keeps_float64_linears_in_float():
    # The op takes float32, bfloat16 or float16 activations: a float64 layer
    # swapped in would fail at its first forward.
    model = nn.Sequential(nn.Linear(64, 32), nn.Linear(32, 32)).double()
    model[1].float()
    report = torchao_kernels.quantize_(model, bits=4, group_size=32)
    assert [f for f, _ in report["quantized"]] == ["1"]
    assert report["skipped"] == [("0", "weight dtype is torch.float64; the op takes float32, bfloat16 or "
                                        "float16 activations, so the layer's inputs could not run through it")]
    assert isinstance(model[0], nn.Linear) and isinstance(model[1], QuantizedLinear)


def test_quantize_swaps_layers_and_reports_skips(caplog):
    model = MLP()
    x = torch.randn(5, 64)
    with torch.no_grad():
        y = model(x)
    with caplog.at_level("INFO", logger="torchao_kernels"):
        report = torchao_kernels.quantize_(model, bits=8, group_size=32)
    assert [f for f, _ in report["quantized"]] == ["up", "mid", "head.0", "head.1"]
    assert report["skipped"] == [("odd", "in_features=40 is not a multiple of group_size=32")]
    assert "odd" in caplog.text
    for name in ("up", "mid"):
        assert isinstance(getattr(model, name), QuantizedLinear)
    assert isinstance(model.head[0], QuantizedLinear) and isinstance(model.head[1], QuantizedLinear)
    assert type(model.odd) is nn.Linear
    assert model.head[1].has_bias is False and model.up.has_bias is True
    with torch.no_grad():
        yq = model(x)
    assert rel_err(yq, y) < REL_TOL[8]
    text = str(model)
    assert "QuantizedLinear(in_features=64, out_features=128, bits=8, group_size=32" in text
    assert f"format={torchao_kernels.best_format(8, False, True)}" in text
    assert "has_zeros=False" in text


def test_quantize_filter_fn_per_channel_and_zeros():
    model = MLP()
    seen = []

    def only_head(mod, fqn):
        seen.append(fqn)
        return fqn.startswith("head")

    report = torchao_kernels.quantize_(model, bits=4, group_size=None, has_zeros=True, filter_fn=only_head)
    assert set(seen) == {"up", "mid", "odd", "head.0", "head.1"}
    assert [f for f, _ in report["quantized"]] == ["head.0", "head.1"]
    assert report["skipped"] == []
    assert type(model.up) is nn.Linear and type(model.odd) is nn.Linear
    assert model.head[0].group_size == 64 and model.head[1].group_size == 32  # per channel
    assert model.head[0].has_zeros and model.head[0].bits == 4
    assert "bits=4, group_size=64, has_zeros=True" in repr(model.head[0])
    # per-channel quantization can take the odd layer too (40 is not a multiple of 16 though)
    report = torchao_kernels.quantize_(model, bits=4, group_size=-1)
    assert [f for f, _ in report["skipped"]] == ["odd"]
    assert "group_size=40" in report["skipped"][0][1]


def test_quantize_target_format_and_bare_linear():
    model = MLP()
    torchao_kernels.quantize_(model, bits=3, group_size=16, target="n1k4")
    assert model.up.format == "n1k4" and "format=n1k4" in str(model)
    with pytest.raises(ValueError, match="wrap a bare nn.Linear"):
        torchao_kernels.quantize_(nn.Linear(64, 8))


# ---------------------------------------------------------------------------
# state_dict


def test_state_dict_round_trip_into_different_bits():
    src = MLP(seed=1)
    torchao_kernels.quantize_(src, bits=4, group_size=32, has_zeros=True)
    buf = io.BytesIO()
    torch.save(src.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)

    dst = MLP(seed=2)
    torchao_kernels.quantize_(dst, bits=8, group_size=16, has_zeros=False, target="n1k4")
    assert dst.up.packed_weights.numel() != src.up.packed_weights.numel()
    x = torch.randn(7, 64)
    with torch.no_grad():
        before = dst(x)
        result = dst.load_state_dict(state, strict=True)
        after = dst(x)
        want = src(x)
    assert not result.missing_keys and not result.unexpected_keys
    assert torch.equal(after, want)
    assert not torch.equal(before, want)
    assert (dst.up.bits, dst.up.group_size, dst.up.has_zeros, dst.up.format) == (
        src.up.bits, src.up.group_size, src.up.has_zeros, src.up.format)
    assert "bits=4, group_size=32, has_zeros=True" in str(dst)


def test_state_dict_load_rejects_wrong_shape():
    a = nn.Sequential(nn.Linear(64, 32))
    b = nn.Sequential(nn.Linear(64, 48))
    torchao_kernels.quantize_(a)
    torchao_kernels.quantize_(b)
    with pytest.raises(RuntimeError, match="out_features=32"):
        b.load_state_dict(a.state_dict())


# ---------------------------------------------------------------------------
# repack / unpack / packed_info


def _weights(bits, n, k, g, zeros, bias, seed=0):
    gen = torch.Generator().manual_seed(seed)
    qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    q = torch.randint(qmin, qmax + 1, (n, k), generator=gen, dtype=torch.int8)
    s = torch.rand(n, k // g, generator=gen) + 0.01
    z = torch.randint(-128, 128, (n, k // g), generator=gen, dtype=torch.int8) if zeros else None
    b = torch.randn(n, generator=gen) if bias else None
    return q, s, z, b


@pytest.mark.parametrize("bits", range(1, 9), ids=lambda b: f"{b}bit")
def test_repack_round_trip(bits):
    if not {"n1k4", "n16k4"} <= set(FORMATS):
        pytest.skip("needs formats n1k4 and n16k4")
    n, k, g = 37, 128, 32
    for zeros, bias in ((False, False), (True, True)):
        q, s, z, b = _weights(bits, n, k, g, zeros, bias, seed=bits)
        p1 = torchao_kernels.pack(q, s, z, bits=bits, group_size=g, bias=b, target="n1k4")
        p16 = torchao_kernels.repack(p1, "n16k4")
        assert torchao_kernels.packed_info(p16)["format"] == "n16k4"
        assert torch.equal(p16, torchao_kernels.pack(q, s, z, bits=bits, group_size=g, bias=b, target="n16k4"))
        back = torchao_kernels.repack(p16, "n1k4")
        assert torch.equal(back, p1)
        x = torch.randn(9, k)
        assert torch.equal(torchao_kernels.linear(x, p16, g, n, k), torchao_kernels.linear(x, p1, g, n, k))
        # default target: this CPU's best format
        best = torchao_kernels.repack(p1)
        assert torchao_kernels.packed_info(best)["format"] == torchao_kernels.best_format(bits, zeros, bias)


def test_quantized_linear_repack_():
    torch.manual_seed(0)
    lin = nn.Linear(64, 20)
    ql = QuantizedLinear.from_linear(lin, bits=5, target="n1k4")
    x = torch.randn(3, 64)
    y = ql(x)
    for fmt in FORMATS:
        ql.repack_(fmt)
        assert ql.format == fmt and f"format={fmt}" in repr(ql)
        assert torch.equal(ql(x), y)


@pytest.mark.parametrize("fmt", FORMATS)
def test_unpack_returns_original(fmt):
    for bits in (1, 4, 7, 8):
        for zeros, bias in ((False, False), (True, False), (False, True), (True, True)):
            n, k, g = 19, 96, 32 if bits % 2 else 16
            q, s, z, b = _weights(bits, n, k, g, zeros, bias, seed=bits)
            p = torchao_kernels.pack(q, s, z, bits=bits, group_size=g, bias=b, target=fmt)
            q2, s2, z2, b2 = torchao_kernels.unpack(p)
            assert torch.equal(q2, q) and torch.equal(s2, s)
            assert (z2 is None) == (z is None) and (z is None or torch.equal(z2, z))
            assert (b2 is None) == (b is None) and (b is None or torch.equal(b2, b))
            info = torchao_kernels.packed_info(p)
            assert (info["format"], info["bits"], info["n"], info["k"], info["group_size"],
                    info["has_zeros"], info["has_bias"]) == (fmt, bits, n, k, g, zeros, bias)


@pytest.mark.parametrize("fmt", FORMATS)
def test_bf16_scales_storage_round_trip(fmt):
    """Scales stored as bfloat16: from a bfloat16 tensor (a buffer 2 bytes per
    row and group smaller) or from float32 values that are all bfloat16 (the
    float32-sized buffer, its tail unused); unpacked as bfloat16, packed again
    to the same header and body, kept by repack, and computing what float32
    storage of the same values computes."""
    for bits, zeros, bias in ((4, False, False), (3, True, True), (8, True, False)):
        n, k, g = 37, 128, 32
        q, s, z, b = _weights(bits, n, k, g, zeros, bias, seed=bits)
        s16 = s.to(torch.bfloat16)
        p16 = torchao_kernels.pack(q, s16, z, bits=bits, group_size=g, bias=b, target=fmt)
        pauto = torchao_kernels.pack(q, s16.float(), z, bits=bits, group_size=g, bias=b, target=fmt)
        s32 = s16.float()
        s32.view(torch.int32)[0, 0] |= 1  # off the bfloat16 grid: float32 storage
        p32 = torchao_kernels.pack(q, s32, z, bits=bits, group_size=g, bias=b, target=fmt)
        info16, info32 = torchao_kernels.packed_info(p16), torchao_kernels.packed_info(p32)
        assert (info16["scale_dtype"], info32["scale_dtype"]) == ("bfloat16", "float32")
        assert torchao_kernels.packed_info(pauto) == info16
        rows = -(-n // info16["nr"]) * info16["nr"]
        assert p32.numel() - p16.numel() == 2 * rows * (k // g) == info32["body_bytes"] - info16["body_bytes"]
        assert pauto.numel() == p32.numel()
        assert torch.equal(pauto[: p16.numel()], p16) and not pauto[p16.numel():].any()
        q2, s2, z2, b2 = torchao_kernels.unpack(pauto)
        assert s2.dtype == torch.bfloat16 and torch.equal(s2, s16) and torch.equal(q2, q)
        assert (z is None and z2 is None) or torch.equal(z2, z)
        assert (b is None and b2 is None) or torch.equal(b2, b)
        assert torch.equal(torchao_kernels.pack(q2, s2, z2, bits=bits, group_size=g, bias=b2, target=fmt), p16)
        x = torch.randn(5, k)
        y = torchao_kernels.linear(x, p16, g, n, k)
        assert torch.equal(torchao_kernels.linear(x, pauto, g, n, k), y)
        assert torch.equal(torchao_kernels.linear(x, p32, g, n, k)[:, 1:], y[:, 1:])
        for other in FORMATS:
            r = torchao_kernels.repack(pauto, other)
            assert torchao_kernels.packed_info(r)["scale_dtype"] == "bfloat16"
            assert r.numel() == 64 + torchao_kernels.packed_info(r)["body_bytes"]  # no unused tail
            assert torch.equal(torchao_kernels.linear(x, r, g, n, k), y)


@pytest.mark.parametrize("has_zeros", [False, True], ids=["sym", "zeros"])
def test_quantize_weight_bf16_scales(has_zeros):
    torch.manual_seed(0)
    w = torch.randn(48, 256)
    q, s, z = torchao_kernels.quantize_weight(w, 4, 32, has_zeros, scale_dtype=torch.bfloat16)
    q32, s32, _ = torchao_kernels.quantize_weight(w, 4, 32, has_zeros)
    assert s.dtype == torch.bfloat16 and s32.dtype == torch.float32
    # the weights are quantized with the rounded scales: as accurate as float32 ones
    err16 = rel_err(torchao_kernels.dequantize_weight(q, s, z, 32), w)
    err32 = rel_err(torchao_kernels.dequantize_weight(q32, s32, z, 32), w)
    assert err16 < err32 * 1.05
    with pytest.raises(ValueError, match="scale_dtype must be torch.float32 or torch.bfloat16, got torch.float16"):
        torchao_kernels.quantize_weight(w, 4, 32, has_zeros, scale_dtype=torch.float16)
    lin = nn.Linear(256, 48)
    ql = QuantizedLinear.from_linear(lin, bits=4, has_zeros=has_zeros, scale_dtype=torch.bfloat16)
    assert "scales=bfloat16" in repr(ql) and ql.scale_dtype == "bfloat16"
    x = torch.randn(3, 256)
    assert rel_err(ql(x), lin(x)) < REL_TOL[4]
    # default: bfloat16 scales for bfloat16 weights (as torchao), float32 otherwise
    assert QuantizedLinear.from_linear(lin, bits=4, has_zeros=has_zeros).scale_dtype == "float32"
    lin16 = nn.Linear(256, 48).to(torch.bfloat16)
    assert QuantizedLinear.from_linear(lin16, bits=4, has_zeros=has_zeros).scale_dtype == "bfloat16"
    assert QuantizedLinear.from_linear(lin16, bits=4, has_zeros=has_zeros,
                                       scale_dtype=torch.float32).scale_dtype == "float32"
    assert torchao_kernels.quantize_weight(lin16.weight, 4, 32, has_zeros)[1].dtype == torch.bfloat16


# ---------------------------------------------------------------------------
# stats


def test_stats_count_calls_of_the_kernel_that_ran():
    n, k, g = 40, 64, 32
    q, s, z, b = _weights(4, n, k, g, False, True)
    p = torchao_kernels.pack(q, s, z, bits=4, group_size=g, bias=b)
    w1 = torchao_kernels.explain(p, m=1).winner
    w8 = torchao_kernels.explain(p, m=8).winner
    assert w1 and w8
    torchao_kernels.reset_stats()
    assert torchao_kernels.stats() == {}
    for _ in range(3):
        torchao_kernels.linear(torch.randn(1, k), p, g, n, k)
    for _ in range(2):
        torchao_kernels.linear(torch.randn(8, k), p, g, n, k)
    want = {w1: 3} if w1 != w8 else {}
    want[w8] = want.get(w8, 0) + 2
    assert torchao_kernels.stats() == want
    # a reference-format buffer runs the reference kernel
    p_ref = torchao_kernels.repack(p, "n1k4")
    ref = torchao_kernels.explain(p_ref, m=1).winner
    assert ref.endswith("__scalar")
    torchao_kernels.reset_stats()
    torchao_kernels.linear(torch.randn(2, k), p_ref, g, n, k)
    assert torchao_kernels.stats() == {ref: 1}
    torchao_kernels.reset_stats()
    assert torchao_kernels.stats() == {}
