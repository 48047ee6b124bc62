"""method="gptq" (error feedback through the inputs' second moment) and the
second moments calibrate() records for it."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchao_kernels as tk
from torchao_kernels.evaluate import fake_quantize_activations
from torchao_kernels import gptq
from torchao_kernels.gptq import gptq_quantize, output_error
from torchao_kernels.quant import weight_error


def _layer(n=96, k=128, seed=0, rows=512):
    """A weight with a few outliers and inputs whose channels are correlated and
    of very different sizes, as real layers' are: (w, x, H = x^T x / rows)."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * 0.05
    w = w * (1 + 8 * (torch.rand(n, k, generator=gen) < 0.01))
    mix = torch.randn(k, k, generator=gen) * 0.15 + torch.eye(k)
    x = (torch.randn(rows, k, generator=gen) @ mix) * (0.1 + 3 * torch.rand(k, generator=gen))
    return w, x, x.T @ x / rows


def _deq(q, s, z, g=32):
    return tk.dequantize_weight(q, s.float(), z, g)


# ---------------------------------------------------------------------------
# calibrate: second moments


class Attn(nn.Module):
    """q / k / v see the same tensor, o another: q, k, v share one accumulator."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k, self.v = nn.Linear(32, 32), nn.Linear(32, 16), nn.Linear(32, 16)
        self.o = nn.Linear(32, 32)
        self.skip_v = False

    def forward(self, x, diverge=False):
        q, k = self.q(x), self.k(x)
        v = self.v(x * 2 if diverge else x) if not self.skip_v else k
        return self.o(q * torch.cat([k, v], -1))


def _shrunk_moment(inputs):
    """E[x x^T] of the rows of inputs, shrunk towards its diagonal by k / (k + rows)."""
    rows, k = inputs.shape
    h = inputs.T @ inputs / rows
    alpha = k / (k + rows)
    return (1 - alpha) * h + alpha * torch.diag(torch.diagonal(h))


def test_calibrate_records_the_input_second_moment():
    net = Attn()
    xs = [torch.randn(3, 5, 32), torch.randn(7, 32), torch.randn(2, 32)]
    cal = tk.calibrate(net, xs[:2])
    assert cal.has_second_moment
    inputs = torch.cat([xs[0].reshape(-1, 32), xs[1]])
    want = _shrunk_moment(inputs)
    for name in ("q", "k", "v"):
        assert torch.allclose(cal.hessian(name), want, rtol=1e-5, atol=1e-6)
    # the same tensors in every batch: one accumulator for the three
    assert cal.sum_xxt["q"] is cal.sum_xxt["k"] is cal.sum_xxt["v"]
    assert cal.sum_xxt["o"] is not cal.sum_xxt["q"]
    hid = []
    h = net.o.register_forward_pre_hook(lambda m, a: hid.append(a[0].reshape(-1, 32)))
    with torch.no_grad():
        for x in xs[:2]:
            net(x)
    h.remove()
    hid = torch.cat(hid)
    assert torch.allclose(cal.hessian("o"), _shrunk_moment(hid), rtol=1e-4, atol=1e-6)
    # 22 rows of 32 channels: the sample moment is singular, the shrunk one is not
    assert torch.linalg.matrix_rank(hid.T @ hid) < 32
    assert torch.linalg.eigvalsh(cal.hessian("o").double()).min() > 0
    # the diagonal is the per-channel statistic
    assert torch.allclose(torch.diagonal(cal.hessian("q")), cal.mean_sq("q"), rtol=1e-5)
    assert cal.hessian("nope") is None and cal.hessian(None, net.q) is not None
    again = tk.Calibration.from_state_dict(cal.state_dict())
    assert torch.equal(again.hessian("o"), cal.hessian("o"))
    assert not tk.calibrate(net, xs[:1], second_moment=False).has_second_moment


def test_calibrate_second_moment_when_a_layer_leaves_its_group():
    net = Attn()
    x0, x1, x2 = torch.randn(6, 32), torch.randn(4, 32), torch.randn(5, 32)

    def batches():
        yield x0                   # q, k, v see x0
        yield (x1, True)           # v sees 2 * x1: it leaves the group
        net.skip_v = True
        yield x2                   # v is not called
        net.skip_v = False

    cal = tk.calibrate(net, batches())
    qk = torch.cat([x0, x1, x2])
    v = torch.cat([x0, 2 * x1])
    assert torch.allclose(cal.hessian("q"), _shrunk_moment(qk), rtol=1e-4, atol=1e-5)
    assert torch.allclose(cal.hessian("k"), cal.hessian("q"))
    assert cal.rows["v"] == 10
    assert torch.allclose(cal.hessian("v"), _shrunk_moment(v), rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------
# quantize_weight(method="gptq")


@pytest.mark.parametrize("bits, has_zeros, scale_dtype", [
    (4, True, torch.float32), (4, False, torch.float32), (3, True, torch.bfloat16), (2, True, torch.float32),
    (8, True, torch.float32), (8, False, torch.bfloat16),
])
def test_gptq_output_is_valid_and_never_worse_per_row(bits, has_zeros, scale_dtype):
    w, _, h = _layer(seed=bits)
    q, s, z = tk.quantize_weight(w, bits, 32, has_zeros, scale_dtype=scale_dtype, method="gptq", hessian=h)
    qr, sr, zr = tk.quantize_weight(w, bits, 32, has_zeros, scale_dtype=scale_dtype, method="rtn")
    assert q.dtype == torch.int8 and q.shape == w.shape and s.dtype == scale_dtype and s.shape == sr.shape
    qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    assert int(q.min()) >= qmin and int(q.max()) <= qmax
    assert torch.isfinite(s.float()).all() and (s != 0).all()
    assert (z is None) == (not has_zeros)
    e = output_error(w, _deq(q, s, z), h)
    e_rtn = output_error(w, _deq(qr, sr, zr), h)
    imp = torch.diagonal(h) + 1e-3 * torch.diagonal(h).mean()
    qs, ss, zs = tk.quantize_weight(w, bits, 32, has_zeros, scale_dtype=scale_dtype, importance=imp)
    e_search = output_error(w, _deq(qs, ss, zs), h)
    assert (e <= e_rtn).all() and (e <= e_search).all()
    # error feedback pays on correlated inputs (measured 0.35 .. 0.55 of the weighted search's error)
    assert float(e.sum()) < 0.75 * float(e_search.sum()), float(e.sum() / e_search.sum())


def test_gptq_matches_the_kernels_and_is_deterministic(monkeypatch):
    w, x, h = _layer(n=48, k=128)
    q, s, z = tk.quantize_weight(w, 4, 32, True, method="gptq", hessian=h)
    packed = tk.pack(q, s, z, bits=4, group_size=32)
    y = tk.linear(x[:9], packed, 32, 48, 128)
    want = F.linear(fake_quantize_activations(x[:9]), _deq(q, s, z))
    assert (y - want).abs().max() <= 1e-4 * want.abs().max()
    assert all(torch.equal(a, b) for a, b in zip(tk.unpack(packed)[:3], (q, s, z)))
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = tk.quantize_weight(w, 4, 32, True, method="gptq", hessian=h)
        torch.set_num_threads(2)
        two = tk.quantize_weight(w, 4, 32, True, method="gptq", hessian=h)
        monkeypatch.setattr(gptq, "ROWS_PER_WORKER", 16)     # rows split over two worker threads
        split = tk.quantize_weight(w, 4, 32, True, method="gptq", hessian=h)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(old)
    assert all(torch.equal(a, b) for a, b in zip(one, two)) and torch.equal(one[0], q)
    assert all(torch.equal(a, b) for a, b in zip(one, split))


def test_gptq_search_span_and_degenerate_inputs():
    w, _, h = _layer(n=32, k=128, seed=5)
    wg = w.reshape(32, 4, 32)
    errs = {}
    for span in (1, 4, None):   # searched group by group, in fours, all up front
        q, s, z = gptq_quantize(wg, h, 4, True, torch.float32, search_groups=span)
        errs[span] = float(output_error(w, (s[..., None] * (q - z[..., None])).reshape(32, 128), h).sum())
    assert errs[1] <= errs[None] * 1.02 and errs[4] <= errs[None] * 1.02
    # no usable second moment: gptq_quantize declines, quantize_weight still answers (rtn / search rows)
    assert gptq_quantize(wg, torch.zeros(128, 128), 4, True, torch.float32) is None
    q, s, z = tk.quantize_weight(w, 4, 32, True, method="gptq", hessian=torch.zeros(128, 128))
    assert torch.isfinite(_deq(q, s, z)).all()
    # dead input channels (never fired) and a rank-deficient H still factor
    x = torch.randn(8, 128)
    x[:, :40] = 0
    q, s, z = tk.quantize_weight(w, 3, 32, True, method="gptq", hessian=x.T @ x / 8)
    assert torch.isfinite(_deq(q, s, z)).all()
    assert (weight_error(w, q, s, z, 32) >= 0).all()


def test_gptq_argument_errors():
    w = torch.randn(8, 64)
    with pytest.raises(ValueError, match="method='gptq' needs hessian="):
        tk.quantize_weight(w, 4, 32, method="gptq")
    with pytest.raises(ValueError, match=r"hessian must be a float tensor of shape \(k, k\) = \(64, 64\)"):
        tk.quantize_weight(w, 4, 32, method="gptq", hessian=torch.eye(32))
    with pytest.raises(ValueError, match="hessian must be finite"):
        tk.quantize_weight(w, 4, 32, method="gptq", hessian=torch.full((64, 64), float("nan")))
    with pytest.raises(ValueError, match="hessian is used by method='gptq' only"):
        tk.quantize_weight(w, 4, 32, hessian=torch.eye(64))


# ---------------------------------------------------------------------------
# quantize_ / QuantConfig


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.up = nn.Linear(128, 192)
        self.down = nn.Linear(192, 64)
        self.head = nn.Linear(64, 40)

    def forward(self, x):
        return self.head(self.down(F.gelu(self.up(x))))


def test_quantize_with_gptq():
    _, x, _ = _layer(k=128, rows=256, seed=2)
    ref = Mlp()
    with torch.no_grad():
        y = ref(x)
    out = {}
    for method in ("calibrated", "gptq"):
        m = Mlp()
        cal = tk.calibrate(m, [x[:128], x[128:]])
        kw = {"method": "search" if method == "calibrated" else method}
        report = tk.quantize_(m, bits=3, group_size=32, has_zeros=True, calibration=cal, **kw)
        assert len(report["quantized"]) == 3
        with torch.no_grad():
            out[method] = float((m(x) - y).norm())
    assert out["gptq"] < out["calibrated"]
    # the layers are what quantize_weight gives with the calibration's statistics
    m = Mlp()
    cal = tk.calibrate(m, [x])
    want = tk.quantize_weight(m.up.weight.detach(), 4, 32, False, method="gptq", hessian=cal.hessian("up"),
                              importance=cal.importance("up"))
    tk.quantize_(m, tk.QuantConfig(bits=4, method="gptq", calibration=cal, overrides={"head": 8}))
    got = tk.unpack(m.up.packed_weights)
    assert all(torch.equal(a, b) for a, b in zip(got[:2], want[:2])) and m.head.bits == 8


def test_quantize_gptq_errors_and_uncalibrated_layers():
    m = Mlp()
    with pytest.raises(ValueError, match="method='gptq' needs calibration="):
        tk.quantize_(m, method="gptq")
    with pytest.raises(ValueError, match="needs calibration="):
        tk.QuantConfig(overrides={"head": {"method": "gptq"}})
    cal = tk.calibrate(m, [torch.randn(4, 128)], second_moment=False)
    with pytest.raises(ValueError, match="needs a calibration with second moments"):
        tk.quantize_(m, method="gptq", calibration=cal)
    # a layer the calibration did not see gets the search
    cal = tk.calibrate(m, [torch.randn(16, 128)], filter_fn=lambda mod, fqn: fqn != "head")
    tk.quantize_(m, bits=4, method="gptq", calibration=cal)
    want = tk.quantize_weight(Mlp().head.weight.detach(), 4, 32, False)
    assert torch.equal(tk.unpack(m.head.packed_weights)[0], want[0])
