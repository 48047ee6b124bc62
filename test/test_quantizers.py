"""The weight quantizers (method="rtn" / "search", importance weights),
calibrate(), QuantConfig (with torchao_kernels.quantize_ and torchao's own
quantize_), per-layer overrides, and quantize_'s argument checks."""
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchao_kernels as tk
from torchao_kernels.evaluate import fake_quantize_activations
from torchao_kernels.quant import weight_error

INFO = tk.info()


def _rtn_reference(w, bits, g, has_zeros, scale_dtype=torch.float32):
    """Round to nearest as this package has always computed it, written out
    independently of torchao_kernels.quant."""
    n, k = w.shape
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    x = w.float().reshape(n, k // g, g)
    tiny = torch.finfo(torch.float32).tiny

    def stored(s):
        if scale_dtype == torch.float32:
            return s
        return s.to(torch.bfloat16).float().clamp(min=torch.finfo(torch.bfloat16).tiny)

    if has_zeros:
        lo, hi = x.amin(-1).clamp(max=0), x.amax(-1).clamp(min=0)
        s = stored(((hi - lo) / (qmax - qmin)).clamp(min=tiny))
        z = (qmin - torch.round(lo / s)).clamp(qmin, qmax)
        q = (torch.round(x / s[..., None]) + z[..., None]).clamp(qmin, qmax)
        return q.to(torch.int8).reshape(n, k), s, z.to(torch.int8)
    s = stored((x.abs().amax(-1) / ((qmax - qmin) / 2)).clamp(min=tiny))
    q = torch.round(x / s[..., None]).clamp(qmin, qmax)
    return q.to(torch.int8).reshape(n, k), s, None


def _weights(n=64, k=256, seed=0, kind="gauss"):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * 0.05
    if kind == "heavy":  # a few outliers per row, as real layers have
        w = w * (1 + 10 * (torch.rand(n, k, generator=gen) < 0.01))
    return w


# ---------------------------------------------------------------------------
# quantize_weight: methods


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("has_zeros", [False, True], ids=["sym", "zeros"])
@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_rtn_is_round_to_nearest_bit_for_bit(bits, has_zeros, scale_dtype):
    w = _weights(kind="heavy", seed=bits)
    q, s, z = tk.quantize_weight(w, bits, 32, has_zeros, scale_dtype=scale_dtype, method="rtn")
    rq, rs, rz = _rtn_reference(w, bits, 32, has_zeros, scale_dtype)
    assert torch.equal(q, rq) and torch.equal(s.float(), rs)
    assert (z is None and rz is None) or torch.equal(z, rz)


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("has_zeros", [False, True], ids=["sym", "zeros"])
@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("kind", ["gauss", "heavy"])
def test_search_never_worse_than_rtn_per_group(bits, has_zeros, scale_dtype, kind):
    w = _weights(kind=kind, seed=bits)
    g = 32
    q, s, z = tk.quantize_weight(w, bits, g, has_zeros, scale_dtype=scale_dtype)
    qr, sr, zr = tk.quantize_weight(w, bits, g, has_zeros, scale_dtype=scale_dtype, method="rtn")
    assert q.dtype == torch.int8 and s.dtype == scale_dtype and s.shape == sr.shape
    qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    assert int(q.min()) >= qmin and int(q.max()) <= qmax
    assert torch.isfinite(s.float()).all() and (s != 0).all()
    assert (z is None) == (not has_zeros)
    # the error of what the kernels will compute with (the returned, stored scales)
    err = weight_error(w, q, s, z, g)
    err_r = weight_error(w, qr, sr, zr, g)
    assert (err <= err_r).all(), int((err > err_r).sum())
    ratio = float(err.sum() / err_r.sum())
    # and better overall at every bit width (measured 0.25 .. 0.95 of round to nearest's error)
    assert ratio < 0.97, ratio


def test_search_result_does_not_depend_on_threads():
    w = _weights(n=6000, k=256, kind="heavy")    # several chunks of rows
    imp = torch.rand(256) + 0.1
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = tk.quantize_weight(w, 4, 32, True, importance=imp)
        torch.set_num_threads(2)
        two = tk.quantize_weight(w, 4, 32, True, importance=imp)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(old)
    assert all(torch.equal(a, b) for a, b in zip(one, two))


def test_search_matches_the_kernel_dequantization():
    """The search's numbers run through the op as any others: every runnable
    kernel gives the same bits, close to the float matmul of the dequantized
    weights (negative scales and zero points outside the bit range included)."""
    w = _weights(n=40, k=128, kind="heavy")
    w[3] = w[3].abs() + 0.2          # a row that never straddles 0
    x = torch.randn(9, 128)
    for bits, zeros in ((4, False), (3, True), (4, True), (8, True)):
        q, s, z = tk.quantize_weight(w, bits, 32, zeros)
        if not zeros:
            assert (s < 0).any()      # the longer side of the range holds the largest weight
        else:
            qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
            if bits < 8:
                assert ((z < qmin) | (z > qmax))[3].all()   # a window away from 0
        packed = tk.pack(q, s, z, bits=bits, group_size=32, target="n1k4")
        ref = tk.linear(x, packed, 32, 40, 128)
        want = F.linear(fake_quantize_activations(x), tk.dequantize_weight(q, s, z, 32))
        assert (ref - want).abs().max() <= 1e-4 * want.abs().max()
        for fmt in [f["name"] for f in INFO["formats"]]:
            p = tk.pack(q, s, z, bits=bits, group_size=32, target=fmt)
            for kern in INFO["kernels"]:
                if kern["format"] != fmt or not kern["runnable"] or kern.get("op", "linear") != "linear":
                    continue
                if bits not in kern["bits"]:
                    continue
                with tk.overrides(force=kern["name"]):
                    for m in (1, 4, 9):
                        assert torch.equal(tk.linear(x[:m], p, 32, 40, 128), ref[:m]), (kern["name"], m)


def test_search_groups_that_do_not_straddle_zero():
    w = torch.linspace(0.5, 1.0, 32).repeat(4, 1)
    q, s, z = tk.quantize_weight(w, 4, 32, True)
    qr, sr, zr = tk.quantize_weight(w, 4, 32, True, method="rtn")
    err, err_r = weight_error(w, q, s, z, 32), weight_error(w, qr, sr, zr, 32)
    # round to nearest spans [0, 1] with 16 levels, the search only [0.5, 1]
    assert float(err.sum()) < 0.3 * float(err_r.sum())
    assert int(z.min()) < -8


def test_search_degenerate_groups():
    w = torch.zeros(6, 64)
    w[1] = 2.5                      # constant
    w[2, :32] = -1.0
    w[3, 5] = 1e-30                 # a lone tiny value
    w[4] = torch.randn(64) * 1e-20  # tiny but not zero
    w[5, ::2] = 3.0                 # two values only
    for bits in (1, 2, 4, 8):
        for zeros in (False, True):
            for sd in (torch.float32, torch.bfloat16):
                q, s, z = tk.quantize_weight(w, bits, 32, zeros, scale_dtype=sd)
                assert torch.isfinite(s.float()).all() and (s != 0).all()
                wd = tk.dequantize_weight(q, s.float(), z, 32)
                assert torch.isfinite(wd).all()
                assert torch.equal(wd[0], w[0])
                qr, sr, zr = tk.quantize_weight(w, bits, 32, zeros, scale_dtype=sd, method="rtn")
                assert (weight_error(w, q, s, z, 32) <= weight_error(w, qr, sr, zr, 32)).all()
    # a constant group is exact with zero points
    q, s, z = tk.quantize_weight(w, 4, 32, True)
    assert torch.equal(tk.dequantize_weight(q, s, z, 32)[1], w[1])


def test_search_per_channel_and_bf16_weights():
    w = _weights(n=16, k=256).to(torch.bfloat16)
    q, s, z = tk.quantize_weight(w, 4, None, True)
    assert s.dtype == torch.bfloat16 and s.shape == (16, 1) and z.shape == (16, 1)
    qr, sr, zr = tk.quantize_weight(w, 4, -1, True, method="rtn")
    assert (weight_error(w, q, s, z, 256) <= weight_error(w, qr, sr, zr, 256)).all()


def test_importance_weights_the_error():
    w = _weights(n=64, k=256, seed=3, kind="heavy")
    gen = torch.Generator().manual_seed(1)
    imp = torch.rand(256, generator=gen) ** 6 * 10   # a few channels matter a lot
    for zeros in (False, True):
        q, s, z = tk.quantize_weight(w, 3, 32, zeros)
        qi, si, zi = tk.quantize_weight(w, 3, 32, zeros, importance=imp)
        qr, sr, zr = tk.quantize_weight(w, 3, 32, zeros, method="rtn")
        e_plain = weight_error(w, q, s, z, 32, imp)
        e_imp = weight_error(w, qi, si, zi, 32, imp)
        e_rtn = weight_error(w, qr, sr, zr, 32, imp)
        assert (e_imp <= e_rtn).all()                     # never worse, in the weighted error too
        assert float(e_imp.sum()) < 0.9 * float(e_plain.sum())
    # uniform importance is the unweighted search
    q1, s1, z1 = tk.quantize_weight(w, 4, 32, True, importance=torch.full((256,), 2.0))
    q2, s2, z2 = tk.quantize_weight(w, 4, 32, True)
    assert float(weight_error(w, q1, s1, z1, 32).sum()) == pytest.approx(
        float(weight_error(w, q2, s2, z2, 32).sum()), rel=1e-3)


def test_quantize_weight_argument_errors():
    w = torch.randn(8, 64)
    with pytest.raises(ValueError, match="method must be one of 'search', 'rtn', 'gptq', got 'awq'"):
        tk.quantize_weight(w, 4, 32, method="awq")
    with pytest.raises(ValueError, match=r"importance must be a float tensor of shape \(k,\) = \(64,\)"):
        tk.quantize_weight(w, 4, 32, importance=torch.ones(32))
    with pytest.raises(ValueError, match="importance must be finite and >= 0"):
        tk.quantize_weight(w, 4, 32, importance=-torch.ones(64))
    with pytest.raises(ValueError, match="method='rtn' does not use them"):
        tk.quantize_weight(w, 4, 32, method="rtn", importance=torch.ones(64))
    with pytest.raises(ValueError, match="bits must be an int in 1..8, got True"):
        tk.quantize_weight(w, True, 32)


# ---------------------------------------------------------------------------
# calibrate


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(64, 96)
        self.b = nn.Linear(96, 32)
        self.shared = self.b

    def forward(self, x, scale=1.0):
        return self.b(torch.relu(self.a(x * scale)))


def test_calibrate_records_mean_squared_inputs():
    net = Net()
    xs = [torch.randn(5, 64), torch.randn(2, 3, 64)]
    cal = tk.calibrate(net, [xs[0], (xs[1], 2.0)])
    assert set(cal.layers()) == {"a", "b", "shared"}
    inputs = torch.cat([xs[0], (xs[1] * 2.0).reshape(-1, 64)])
    assert cal.rows["a"] == 11 and cal.rows["b"] == 11
    assert torch.allclose(cal.mean_sq("a"), (inputs.double() ** 2).mean(0).float())
    hidden = torch.relu(net.a(inputs)).detach()
    assert torch.allclose(cal.mean_sq("b"), (hidden ** 2).mean(0), rtol=1e-5, atol=1e-6)
    assert torch.equal(cal.mean_sq("shared"), cal.mean_sq("b"))
    imp = cal.importance("a")
    assert imp.shape == (64,) and (imp > 0).all()
    assert cal.importance("nope") is None and cal.importance(None, net.a) is not None
    assert "3 layers" in repr(cal)
    # dict batches (a tokenizer's output) and filter_fn
    cal2 = tk.calibrate(net, [{"x": xs[0]}], filter_fn=lambda m, n: n == "a")
    assert cal2.layers() == ["a"] and cal2.rows["a"] == 5
    # round trip through a state dict
    again = tk.Calibration.from_state_dict(cal.state_dict())
    assert torch.equal(again.importance("b"), cal.importance("b"))


def test_calibrate_errors():
    with pytest.raises(ValueError, match="batches was empty"):
        tk.calibrate(Net(), [])
    with pytest.raises(ValueError, match="no nn.Linear"):
        tk.calibrate(nn.Sequential(nn.ReLU()), [torch.randn(2, 3)])
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        tk.calibrate(lambda x: x, [torch.randn(2, 3)])


def test_quantize_with_calibration_uses_each_layers_statistics():
    net = Net()
    x = torch.randn(64, 64) * torch.linspace(0.01, 3.0, 64)   # channels of very different size
    cal = tk.calibrate(net, [x])
    want = {}
    for name in ("a", "b"):
        lin = getattr(net, name)
        want[name] = tk.quantize_weight(lin.weight.detach(), 3, 32, True, importance=cal.importance(name))
    ref = Net()
    with torch.no_grad():
        y_float = ref(x)
    tk.quantize_(net, bits=3, group_size=32, has_zeros=True, calibration=cal)
    for name in ("a", "b"):
        q, s, z, _ = tk.unpack(getattr(net, name).packed_weights)
        assert torch.equal(q, want[name][0]) and torch.equal(s, want[name][1]) and torch.equal(z, want[name][2])
    plain = Net()
    tk.quantize_(plain, bits=3, group_size=32, has_zeros=True)
    with torch.no_grad():
        err_cal = (net(x) - y_float).norm()
        err_plain = (plain(x) - y_float).norm()
    assert err_cal < err_plain
    with pytest.raises(ValueError, match="method='rtn' does not use it"):
        tk.quantize_(Net(), method="rtn", calibration=cal)


# ---------------------------------------------------------------------------
# QuantConfig, overrides, quantize_'s checks


class Tiny(nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.l0 = nn.Linear(64, 64)
        self.l1 = nn.Linear(64, 64)
        self.lm_head = nn.Linear(64, 50, bias=False)

    def forward(self, x):
        return self.lm_head(self.l1(torch.relu(self.l0(x))))


def _packed(model):
    return {n: m.packed_weights.clone() for n, m in model.named_modules() if isinstance(m, tk.QuantizedLinear)}


def test_config_equals_keyword_form():
    cfg = tk.QuantConfig(bits=3, group_size=32, has_zeros=True, overrides={"lm_head": 8})
    a, b = Tiny(), Tiny()
    ra = tk.quantize_(a, cfg)
    rb = tk.quantize_(b, bits=3, group_size=32, has_zeros=True, overrides={"lm_head": 8})
    assert ra == rb
    pa, pb = _packed(a), _packed(b)
    assert pa.keys() == {"l0", "l1", "lm_head"} and all(torch.equal(pa[k], pb[k]) for k in pa)
    assert a.lm_head.bits == 8 and a.l0.bits == 3
    with pytest.raises(TypeError, match="has_zeros belong in the QuantConfig"):
        tk.quantize_(Tiny(), cfg, has_zeros=True)
    # torchao's argument order: quantize_(model, config, filter_fn)
    c = Tiny()
    r = tk.quantize_(c, cfg, lambda m, fqn: fqn != "l1")
    assert [f for f, _ in r["quantized"]] == ["l0", "lm_head"]


def test_overrides_patterns_and_float():
    m = Tiny()
    tk.quantize_(m, bits=4, overrides={"re:l[01]": {"bits": 8, "group_size": 16}, "lm_head": 2, "l*": None})
    assert (m.l0.bits, m.l0.group_size, m.l1.bits, m.lm_head.bits) == (8, 16, 8, 2)
    m = Tiny()
    with pytest.warns(UserWarning, match="converted no layer"):
        r = tk.quantize_(m, bits=4, overrides={"l*": None, "lm_head": 2})    # first match wins
    assert type(m.l0) is nn.Linear and type(m.lm_head) is nn.Linear
    assert ("l0", "overrides['l*'] keeps it in float") in r["skipped"]
    with pytest.raises(ValueError, match=r"overrides\['lm_head'\]: bits must be an int in 1..8, got 9"):
        tk.quantize_(Tiny(), overrides={"lm_head": 9})
    with pytest.raises(ValueError, match=r"overrides\['x'\]: unknown key\(s\) \['bit'\]"):
        tk.quantize_(Tiny(), overrides={"x": {"bit": 8}})
    with pytest.raises(ValueError, match="not a valid regular expression"):
        tk.quantize_(Tiny(), overrides={"re:(": 8})


@pytest.mark.parametrize("kwargs, message", [
    ({"group_size": 0}, "group_size must be a multiple of 16 .* got 0"),
    ({"group_size": 24}, "group_size must be a multiple of 16 .* got 24"),
    ({"group_size": 32.0}, "group_size must be a multiple of 16 .* got 32.0"),
    ({"bits": 9}, "bits must be an int in 1..8, got 9"),
    ({"bits": "4"}, "bits must be an int in 1..8, got '4'"),
    ({"has_zeros": 1}, "has_zeros must be True or False, got 1"),
    ({"method": "awq"}, "method must be one of 'search', 'rtn', 'gptq', got 'awq'"),
    ({"scale_dtype": torch.float16}, "scale_dtype must be torch.float32, torch.bfloat16 or None, got torch.float16"),
    ({"lm_head": "yes"}, "lm_head must be True or False, got 'yes'"),
    ({"target": 3}, "target must be a format name"),
    ({"calibration": {"a": 1}}, "calibration must be a torchao_kernels.Calibration"),
    ({"overrides": [("lm_head", 8)]}, "overrides must be a mapping"),
    ({"filter_fn": "l0"}, "filter_fn must be a callable"),
    ({"progress": "on"}, "progress must be True, False or None, got 'on'"),
])
def test_quantize_checks_arguments_up_front(kwargs, message):
    m = Tiny()
    with pytest.raises(ValueError, match=message):
        tk.quantize_(m, **kwargs)
    assert not _packed(m)     # nothing was converted


def test_quantize_warns_when_nothing_is_converted():
    with pytest.warns(UserWarning, match=r"converted no layer: all 3 were skipped, 2 of them because "
                                         r"in_features=40 is not a multiple of group_size=32"):
        tk.quantize_(nn.Sequential(nn.Linear(40, 8), nn.Linear(40, 8), nn.Linear(8, 40)), lm_head=True)
    with pytest.warns(UserWarning, match="filter_fn accepted none of the model's 3 nn.Linear"):
        tk.quantize_(Tiny(), filter_fn=lambda m, n: False)
    with pytest.warns(UserWarning, match="the model has no nn.Linear"):
        tk.quantize_(nn.Sequential(nn.ReLU()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tk.quantize_(Tiny())


def test_torchao_quantize_with_config():
    from torchao.quantization import quantize_ as ao_quantize_

    cfg = tk.QuantConfig(bits=4, group_size=32, has_zeros=True)
    a, b = Tiny(), Tiny()
    ao_quantize_(a, cfg)
    tk.quantize_(b, cfg)
    pa, pb = _packed(a), _packed(b)
    assert pa.keys() == pb.keys() == {"l0", "l1", "lm_head"}
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    x = torch.randn(2, 7, 64)
    assert torch.equal(a(x), b(x))
    # calibration: torchao passes only the module; the calibration knows its name
    batch = torch.randn(4, 16, 64)
    c, d = Tiny(), Tiny()
    ao_quantize_(c, tk.QuantConfig(bits=3, has_zeros=True, calibration=tk.calibrate(c, [batch])))
    tk.quantize_(d, bits=3, has_zeros=True, calibration=tk.calibrate(d, [batch]))
    assert _packed(c).keys() == {"l0", "l1", "lm_head"}
    assert all(torch.equal(x, y) for x, y in zip(_packed(c).values(), _packed(d).values()))
    with pytest.raises(ValueError, match="overrides match layer names"):
        ao_quantize_(Tiny(), tk.QuantConfig(overrides={"lm_head": 8}))


def test_torchao_registration_either_import_order():
    code = (
        "import torch, {first}, {second}\n"
        "import torchao_kernels as tk\n"
        "from torchao.quantization import quantize_\n"
        "m = torch.nn.Sequential(torch.nn.Linear(64, 16))\n"
        "quantize_(m, tk.QuantConfig(bits=4))\n"
        "assert isinstance(m[0], tk.QuantizedLinear), m\n"
        "print('ok')\n"
    )
    for first, second in (("torchao_kernels", "torchao"), ("torchao", "torchao_kernels")):
        out = subprocess.run([sys.executable, "-c", code.format(first=first, second=second)],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0 and out.stdout.strip().endswith("ok"), (first, out.stderr[-2000:])
