"""quantize_weight does not depend on the absolute scale of importance or of
the hessian (only their relative sizes count), and checks that the hessian is
symmetric positive semi-definite."""
import pytest
import torch

import torchao_kernels as tk
from torchao_kernels.gptq import output_error
from torchao_kernels.quant import weight_error


def _layer(n=48, k=128, seed=0, rows=512):
    """w, H = x^T x / rows of correlated inputs of very different sizes, importance."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * 0.05
    w = w * (1 + 8 * (torch.rand(n, k, generator=gen) < 0.01))
    mix = torch.randn(k, k, generator=gen) * 0.15 + torch.eye(k)
    x = (torch.randn(rows, k, generator=gen) @ mix) * (0.1 + 3 * torch.rand(k, generator=gen))
    imp = torch.rand(k, generator=gen) ** 4 * 7
    return w, x.T @ x / rows, imp


def _same(a, b):
    return all((x is None and y is None) or (x.dtype == y.dtype and torch.equal(x, y)) for x, y in zip(a, b))


def _deq(q, s, z, g=32):
    return tk.dequantize_weight(q, s.float(), z, g)


# 4^-50 ~ 7.9e-31 .. 4^50 ~ 1.3e30: scaling by a power of four is exact in float32, so the scaled
# input is exactly c times the original and the results must be bit for bit the same
FACTORS = [4.0 ** e for e in (-50, -40, -25, -9, -1, 1, 3, 15, 33, 50)]
# other factors: fl32(c * x) is not exactly c * x, the results may differ in the last bits of a
# scale (as for c = 3 at any scale), never in quality
DECIMAL = (1e-30, 1e-12, 1e20, 1e30)

CASES = [(4, True, torch.float32), (3, False, torch.float32), (2, True, torch.bfloat16), (8, False, torch.float32)]


@pytest.mark.parametrize("bits, has_zeros, scale_dtype", CASES)
def test_search_does_not_depend_on_the_scale_of_importance(bits, has_zeros, scale_dtype):
    w, _, imp = _layer(seed=bits)
    ref = tk.quantize_weight(w, bits, 32, has_zeros, scale_dtype, importance=imp)
    plain = tk.quantize_weight(w, bits, 32, has_zeros, scale_dtype)
    for c in FACTORS + [2.0, 0.5, 2.0 ** 99, 2.0 ** -99]:        # any power of two, for the search
        assert _same(tk.quantize_weight(w, bits, 32, has_zeros, scale_dtype, importance=imp * c), ref), c
    e_ref = weight_error(w, *ref, 32, imp)
    for c in DECIMAL:
        got = tk.quantize_weight(w, bits, 32, has_zeros, scale_dtype, importance=imp * c)
        e = weight_error(w, *got, 32, imp)
        assert float(e.sum()) == pytest.approx(float(e_ref.sum()), rel=1e-3), c
    # uniform importance at any scale is the unweighted search, bit for bit
    for c in (1e-30, 1e-10, 0.3, 1.0, 3.0, 1e20, 1e30):
        assert _same(tk.quantize_weight(w, bits, 32, has_zeros, scale_dtype, importance=torch.full((128,), c)),
                     plain), c


def test_the_review_example():
    torch.manual_seed(0)
    w = torch.randn(32, 64)
    plain = tk.quantize_weight(w, 4, 32)
    rtn = tk.quantize_weight(w, 4, 32, method="rtn")
    assert float(weight_error(w, *plain, 32).sum()) < 0.9 * float(weight_error(w, *rtn, 32).sum())
    for c in (1e20, 1e-30, 1e38, 1e-38):
        assert _same(tk.quantize_weight(w, 4, 32, importance=torch.full((64,), c)), plain), c


def test_zero_importance_keeps_round_to_nearest():
    # every candidate has weighted error 0: no group is strictly better than round to nearest
    w = torch.randn(16, 64)
    rtn = tk.quantize_weight(w, 4, 32, True, method="rtn")
    assert _same(tk.quantize_weight(w, 4, 32, True, importance=torch.zeros(64)), rtn)
    imp = torch.rand(64) + 0.5
    imp[:32] = 0                                               # the first group costs nothing
    for c in (1.0, 1e-30, 1e30):
        q, s, z = tk.quantize_weight(w, 4, 32, True, importance=imp * c)
        assert torch.equal(q[:, :32], rtn[0][:, :32]) and torch.equal(s[:, 0], rtn[1][:, 0])


@pytest.mark.parametrize("bits, has_zeros, scale_dtype", CASES)
def test_gptq_does_not_depend_on_the_scale_of_the_hessian(bits, has_zeros, scale_dtype):
    w, h, imp = _layer(seed=10 + bits)
    kw = dict(scale_dtype=scale_dtype, method="gptq")
    ref = tk.quantize_weight(w, bits, 32, has_zeros, hessian=h, **kw)
    ref_imp = tk.quantize_weight(w, bits, 32, has_zeros, hessian=h, importance=imp, **kw)
    for c in FACTORS:
        assert _same(tk.quantize_weight(w, bits, 32, has_zeros, hessian=h * c, **kw), ref), c
        assert _same(tk.quantize_weight(w, bits, 32, has_zeros, hessian=h * c, importance=imp / c, **kw),
                     ref_imp), c
    assert _same(tk.quantize_weight(w, bits, 32, has_zeros, hessian=h.double() * 4.0 ** -60, **kw), ref)
    e_ref = output_error(w, _deq(*ref), h)
    rtn = tk.quantize_weight(w, bits, 32, has_zeros, scale_dtype, method="rtn")
    e_rtn = output_error(w, _deq(*rtn), h)
    for c in DECIMAL:
        got = tk.quantize_weight(w, bits, 32, has_zeros, hessian=h * c, **kw)
        e = output_error(w, _deq(*got), h)
        # the error feedback's rounding cascade moves with the last bit of H: factors 3, 5, 1/3 of
        # this H at moderate scale move the error by up to 2.5% (here and before the normalisation)
        assert float(e.sum()) == pytest.approx(float(e_ref.sum()), rel=0.05), c
        assert (e <= e_rtn * (1 + 1e-5)).all()
    if bits < 8:
        # the error feedback is used at every scale (before, the candidates' errors overflowed or
        # underflowed to ties and every row kept round to nearest)
        assert float(e_ref.sum()) < 0.8 * float(e_rtn.sum())


def test_gptq_scaled_identity_and_zero_hessian():
    w = torch.randn(16, 64)
    ref = tk.quantize_weight(w, 4, 32, True, method="gptq", hessian=torch.eye(64))
    for c in FACTORS + [1e-30, 1e20, 1e30]:
        got = tk.quantize_weight(w, 4, 32, True, method="gptq", hessian=torch.eye(64) * c)
        assert torch.equal(got[0], ref[0]) and torch.equal(got[2], ref[2]), c
        assert torch.allclose(got[1], ref[1], rtol=1e-6, atol=0), c
    # a zero H (no input seen): every candidate's output error is 0, every row keeps round to nearest
    rtn = tk.quantize_weight(w, 4, 32, True, method="rtn")
    assert _same(tk.quantize_weight(w, 4, 32, True, method="gptq", hessian=torch.zeros(64, 64)), rtn)


# ---------------------------------------------------------------------------
# hessian: symmetric positive semi-definite


def test_hessian_must_be_symmetric():
    w, h, _ = _layer(n=16, k=64, seed=3)
    bad = torch.eye(64)
    bad[0, 1] = 100.0
    with pytest.raises(ValueError, match=r"hessian must be symmetric .*hessian\[0, 1\] = 100 but hessian\[1, 0\] = 0"):
        tk.quantize_weight(w, 4, 32, method="gptq", hessian=bad)
    bad = h.clone()
    bad[5, 9] += 0.01 * float((h[5, 5] * h[9, 9]).sqrt())
    with pytest.raises(ValueError, match="hessian must be symmetric"):
        tk.quantize_weight(w, 4, 32, method="gptq", hessian=bad)
    # rounding-level asymmetry (sums of float products) is averaged away
    gen = torch.Generator().manual_seed(0)
    noisy = h * (1 + 1e-6 * torch.randn(64, 64, generator=gen))
    assert not torch.equal(noisy, noisy.T)
    want = tk.quantize_weight(w, 4, 32, True, method="gptq", hessian=0.5 * (noisy + noisy.T))
    assert _same(tk.quantize_weight(w, 4, 32, True, method="gptq", hessian=noisy), want)
    assert _same(tk.quantize_weight(w, 4, 32, True, method="gptq", hessian=noisy * 4.0 ** 40), want)


def test_hessian_must_be_positive_semi_definite():
    w = torch.randn(16, 64)
    k = 64
    # positive diagonal, eigenvalues 2k - 1 and -1
    bad = 2 * torch.ones(k, k) - torch.eye(k)
    assert float(torch.linalg.eigvalsh(bad.double()).min()) < -0.99
    with pytest.raises(ValueError, match=r"hessian must be positive semi-definite .*\|hessian\[0, 1\]\| = 2 "
                                         r"exceeds sqrt\(hessian\[0, 0\] \* hessian\[1, 1\]\) = 1"):
        tk.quantize_weight(w, 4, 32, method="gptq", hessian=bad)
    # a channel that never fired (zero diagonal) cannot correlate with another
    bad = torch.eye(k)
    bad[3, 3] = 0.0
    bad[3, 7] = bad[7, 3] = 0.5
    with pytest.raises(ValueError, match="hessian must be positive semi-definite"):
        tk.quantize_weight(w, 4, 32, method="gptq", hessian=bad)
    # every 2 x 2 minor fine, one eigenvalue -0.5: the Cholesky factor of the dampened H fails
    gen = torch.Generator().manual_seed(1)
    qm, _ = torch.linalg.qr(torch.randn(k, k, generator=gen, dtype=torch.float64))
    lam = torch.ones(k, dtype=torch.float64)
    lam[0] = -0.5
    bad = ((qm * lam) @ qm.T).float()
    bad = 0.5 * (bad + bad.T)
    d = torch.diagonal(bad)
    assert (d > 0).all() and ((bad.abs() <= (d[:, None] * d[None, :]).sqrt() + 1e-6)).all()
    for c in (1.0, 1e-30, 1e30):
        with pytest.raises(ValueError, match=r"hessian must be positive semi-definite .*no Cholesky factor"):
            tk.quantize_weight(w, 4, 32, method="gptq", hessian=bad * c)
    with pytest.raises(ValueError, match="hessian must be finite with a diagonal >= 0"):
        tk.quantize_weight(w, 4, 32, method="gptq", hessian=-torch.eye(k))


def test_singular_and_ill_conditioned_hessians_are_accepted():
    w, h, _ = _layer(n=16, k=64, seed=4)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(8, 64, generator=gen)
    x[:, :20] = 0                                      # dead channels, rank 8
    dup = torch.randn(256, 64, generator=gen)
    dup[:, 1] = dup[:, 0]                              # a duplicated channel: |H_01| = sqrt(H_00 H_11)
    v = torch.randn(64, generator=gen)
    diag = torch.diag(torch.logspace(-12, 6, 64))     # condition 1e18
    for hs in (x.T @ x / 8, dup.T @ dup / 256, torch.outer(v, v), torch.ones(64, 64), diag,
               h.double(), torch.zeros(64, 64)):
        for c in (1.0, 1e-30, 1e30):
            q, s, z = tk.quantize_weight(w, 3, 32, True, method="gptq", hessian=hs * c)
            assert torch.isfinite(_deq(q, s, z)).all()
            rtn = tk.quantize_weight(w, 3, 32, True, method="rtn")
            hh = hs.float()
            assert (output_error(w, _deq(q, s, z), hh) <= output_error(w, _deq(*rtn), hh) * (1 + 1e-5) + 1e-12).all()


def test_calibrated_hessian_is_accepted():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(96, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
    xs = [torch.randn(40, 96) * (0.01 + 5 * torch.rand(96)) for _ in range(3)]
    cal = tk.calibrate(net, xs)
    for name, lin in (("0", net[0]), ("2", net[2])):
        h = cal.hessian(name)
        q, s, z = tk.quantize_weight(lin.weight.detach(), 4, 32, True, method="gptq", hessian=h)
        assert torch.isfinite(_deq(q, s, z)).all()
        assert _same(tk.quantize_weight(lin.weight.detach(), 4, 32, True, method="gptq", hessian=h * 4.0 ** 30),
                     (q, s, z))
