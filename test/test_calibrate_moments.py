"""calibrate()'s statistics when a layer is called several times in a forward,
when its input was changed in place after another layer read it, and when it is
called with input= as a keyword: every layer's sum of x^T x is that of exactly
the rows it counted, its per-channel mean square is the diagonal of hessian(),
and layers share an accumulator only when they received the same values."""
import pytest
import torch
from torch import nn

import torchao_kernels as tk

K = 64


def _xtx(*inputs):
    """sum of x^T x over the rows of inputs, in float64."""
    xs = torch.cat([x.reshape(-1, x.shape[-1]) for x in inputs]).double()
    return xs.T @ xs


def _close(got, want):
    return torch.allclose(got.double(), want, rtol=1e-5, atol=1e-4)


def _check_consistent(cal, names):
    """rows, sum_sq, mean_sq, sum_xxt and hessian() describe the same rows;
    a state dict round trip keeps them."""
    again = tk.Calibration.from_state_dict(cal.state_dict())
    for name in names:
        rows = cal.rows[name]
        assert rows > 0
        h = cal.hessian(name)
        # the shrinkage towards the diagonal keeps the diagonal: it is the mean square
        assert torch.allclose(torch.diagonal(h), cal.mean_sq(name), rtol=1e-5, atol=1e-6)
        assert torch.allclose(torch.diagonal(cal.sum_xxt[name]).double(), cal.sum_sq[name], rtol=1e-5, atol=1e-4)
        assert torch.equal(again.hessian(name), h)
        assert torch.equal(again.mean_sq(name), cal.mean_sq(name))
        assert again.rows[name] == rows


def _module(forward, **layers):
    m = nn.Module()
    for name, layer in layers.items():
        setattr(m, name, layer)
    m.forward = forward
    return m


def _lin():
    return nn.Linear(K, K)


# ---------------------------------------------------------------------------
# 1. a layer called more than once per forward


def test_a_layer_called_twice_adds_both_inputs():
    torch.manual_seed(0)
    m = _module(lambda x, y: m.l(x) + m.l(y), l=_lin())
    x, y = torch.randn(32, K), torch.randn(32, K)
    cal = tk.calibrate(m, [(x, y)])
    assert cal.rows["l"] == 64
    assert _close(cal.sum_xxt["l"], _xtx(x, y))
    assert torch.allclose(cal.sum_sq["l"], (_xtx(x, y)).diagonal(), rtol=1e-10)
    _check_consistent(cal, ["l"])


def test_a_layer_called_twice_with_the_same_tensor_counts_it_twice():
    torch.manual_seed(1)
    m = _module(lambda x: m.l(x) + m.l(x), l=_lin())
    xs = [torch.randn(8, K), torch.randn(2, 5, K)]
    cal = tk.calibrate(m, xs)
    assert cal.rows["l"] == 2 * 18
    assert _close(cal.sum_xxt["l"], 2 * _xtx(*xs))
    _check_consistent(cal, ["l"])


def test_repeated_calls_in_a_group_of_layers_that_share_an_input():
    """q, k, v see x; q is called again on y, in some batches only: q leaves the
    group with its own sum, k and v keep sharing one."""
    torch.manual_seed(2)
    m = _module(None, q=_lin(), k=_lin(), v=_lin())
    m.again = False

    def forward(x, y):
        out = m.q(x) + m.k(x) + m.v(x)
        return (out, m.q(y)) if m.again else out

    m.forward = forward
    x0, y0, x1, y1, x2, y2 = (torch.randn(n, K) for n in (16, 4, 8, 12, 24, 6))

    def batches():
        yield x0, y0                  # all three see x0 only: one accumulator
        m.again = True
        yield x1, y1                  # q sees x1 and y1
        m.again = False
        yield x2, y2

    cal = tk.calibrate(m, batches())
    assert cal.rows["q"] == 16 + 8 + 12 + 24 and cal.rows["k"] == cal.rows["v"] == 16 + 8 + 24
    assert _close(cal.sum_xxt["q"], _xtx(x0, x1, y1, x2))
    assert _close(cal.sum_xxt["k"], _xtx(x0, x1, x2))
    assert cal.sum_xxt["k"] is cal.sum_xxt["v"]
    assert cal.sum_xxt["q"] is not cal.sum_xxt["k"]
    _check_consistent(cal, ["q", "k", "v"])


def test_layers_called_twice_with_the_same_tensors_share():
    """a and b both see x and then y (a shared layer stack run twice): one sum."""
    torch.manual_seed(3)
    m = _module(lambda x, y: (m.a(x) + m.b(x), m.a(y) + m.b(y)), a=_lin(), b=_lin())
    x, y = torch.randn(32, K), torch.randn(16, K)
    cal = tk.calibrate(m, [(x, y), (y, x)])
    assert cal.rows["a"] == cal.rows["b"] == 96
    assert _close(cal.sum_xxt["a"], 2 * _xtx(x, y))
    assert cal.sum_xxt["a"] is cal.sum_xxt["b"]
    _check_consistent(cal, ["a", "b"])


def test_the_qkv_sharing_is_kept():
    torch.manual_seed(4)
    m = _module(lambda x: m.o(m.q(x) * m.k(x) + m.v(x)), q=_lin(), k=_lin(), v=_lin(), o=_lin())
    xs = [torch.randn(8, K), torch.randn(3, 4, K)]
    cal = tk.calibrate(m, xs)
    assert cal.sum_xxt["q"] is cal.sum_xxt["k"] is cal.sum_xxt["v"]
    assert cal.sum_xxt["o"] is not cal.sum_xxt["q"]
    assert _close(cal.sum_xxt["q"], _xtx(*xs))
    with torch.no_grad():
        hid = [m.q(x) * m.k(x) + m.v(x) for x in xs]
    assert _close(cal.sum_xxt["o"], _xtx(*hid))
    _check_consistent(cal, ["q", "k", "v", "o"])


# ---------------------------------------------------------------------------
# 2. an input changed in place between two layers


def _inplace_net(seed):
    torch.manual_seed(seed)
    m = _module(None, a=_lin(), b=_lin())

    def forward(x):
        x = x.clone()
        x += m.a(x)
        return m.b(x)

    m.forward = forward
    return m


def test_an_input_changed_in_place_is_another_input():
    m = _inplace_net(5)
    x = torch.randn(32, K)
    cal = tk.calibrate(m, [x])
    with torch.no_grad():
        xb = x + m.a(x)
    assert cal.sum_xxt["b"] is not cal.sum_xxt["a"]
    assert _close(cal.sum_xxt["a"], _xtx(x))
    assert _close(cal.sum_xxt["b"], _xtx(xb))
    _check_consistent(cal, ["a", "b"])


def test_an_input_changed_in_place_in_a_later_batch():
    """a and b share in the first batch; in the second b's input is changed
    in place after a read it: b leaves with its own sum."""
    torch.manual_seed(6)
    m = _module(None, a=_lin(), b=_lin())
    m.bump = False

    def forward(x):
        x = x.clone()
        y = m.a(x)
        if m.bump:
            x.mul_(3.0)
        return y + m.b(x)

    m.forward = forward
    x0, x1, x2 = torch.randn(16, K), torch.randn(8, K), torch.randn(4, K)

    def batches():
        yield x0
        m.bump = True
        yield x1
        m.bump = False
        yield x2

    cal = tk.calibrate(m, batches())
    assert _close(cal.sum_xxt["a"], _xtx(x0, x1, x2))
    assert _close(cal.sum_xxt["b"], _xtx(x0, 3 * x1, x2))
    assert cal.sum_xxt["a"] is not cal.sum_xxt["b"]
    _check_consistent(cal, ["a", "b"])


def test_an_input_changed_in_place_after_both_layers_read_it_is_shared():
    torch.manual_seed(7)
    m = _module(None, a=_lin(), b=_lin())

    def forward(x):
        x = x.clone()
        out = m.a(x) + m.b(x)
        x += 1
        return out

    m.forward = forward
    x = torch.randn(32, K)
    cal = tk.calibrate(m, [x])
    assert cal.sum_xxt["a"] is cal.sum_xxt["b"]
    assert _close(cal.sum_xxt["a"], _xtx(x))


def test_inside_inference_mode_the_statistics_stay_exact():
    """Inference tensors have no version counter: calibrate called inside
    torch.inference_mode shares nothing by identity, but records the truth."""
    m = _inplace_net(8)
    x = torch.randn(32, K)
    with torch.inference_mode():
        cal = tk.calibrate(m, [x])
        xb = x + m.a(x)
    assert _close(cal.sum_xxt["a"], _xtx(x))
    assert _close(cal.sum_xxt["b"], _xtx(xb))
    _check_consistent(cal, ["a", "b"])


# ---------------------------------------------------------------------------
# 3. a Linear called with input= as a keyword


def test_a_layer_called_with_a_keyword_input():
    torch.manual_seed(9)
    m = _module(lambda x: m.l(input=x), l=_lin())
    xs = [torch.randn(4, K), torch.randn(2, 3, K)]
    cal = tk.calibrate(m, xs)
    assert cal.rows["l"] == 10
    assert _close(cal.sum_xxt["l"], _xtx(*xs))
    assert torch.allclose(cal.sum_sq["l"], _xtx(*xs).diagonal(), rtol=1e-10)
    _check_consistent(cal, ["l"])


def test_keyword_and_positional_calls_of_one_layer_add_up():
    torch.manual_seed(10)
    m = _module(lambda x, y: (m.l(x) + m.k(input=x), m.l(input=y)), l=_lin(), k=_lin())
    x, y = torch.randn(16, K), torch.randn(8, K)
    cal = tk.calibrate(m, [(x, y)])
    assert cal.rows["l"] == 24 and cal.rows["k"] == 16
    assert _close(cal.sum_xxt["l"], _xtx(x, y))
    assert _close(cal.sum_xxt["k"], _xtx(x))
    _check_consistent(cal, ["l", "k"])


def test_second_moment_false_still_records_the_mean_square():
    m = _module(lambda x, y: (m.l(x), m.l(input=y)), l=_lin())
    x, y = torch.randn(16, K), torch.randn(8, K)
    cal = tk.calibrate(m, [(x, y)], second_moment=False)
    assert not cal.has_second_moment and cal.rows["l"] == 24
    assert torch.allclose(cal.mean_sq("l").double(), _xtx(x, y).diagonal() / 24, rtol=1e-6)


# ---------------------------------------------------------------------------
# all three at random: layers called any number of times (by position or by
# keyword) on a few tensors that are changed in place in between


@pytest.mark.parametrize("seed", range(60))
def test_random_call_patterns_match_the_inputs_each_layer_saw(seed):
    import random
    rng = random.Random(seed)
    torch.manual_seed(seed)
    names = [f"l{i}" for i in range(4)]
    m = _module(None, **{n: _lin() for n in names})
    plans = [[("mut", rng.randrange(3)) if rng.random() < 0.15 else
              ("call", rng.choice(names), rng.randrange(3), rng.random() < 0.3)
              for _ in range(rng.randint(0, 8))] for _ in range(4)]
    seen = {n: [] for n in names}
    batch = iter(plans)

    def forward(x):
        pool = [x.clone() for _ in range(3)]
        for step in next(batch):
            if step[0] == "mut":
                pool[step[1]].mul_(1.5).add_(0.1)
            else:
                _, name, i, keyword = step
                seen[name].append(pool[i].clone())
                getattr(m, name)(input=pool[i]) if keyword else getattr(m, name)(pool[i])

    m.forward = forward
    cal = tk.calibrate(m, [torch.randn(rng.randint(1, 6), K) for _ in range(4)])
    called = [n for n in names if seen[n]]
    for n in names:
        assert cal.rows[n] == sum(t.shape[0] for t in seen[n])
    for n in called:
        assert _close(cal.sum_xxt[n], _xtx(*seen[n]))
    _check_consistent(cal, called)


def test_a_model_made_under_inference_mode_that_updates_a_buffer():
    # its in-place updates only work inside inference_mode: calibrate runs there
    with torch.inference_mode():
        class Counting(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(64, 64)
                self.register_buffer("seen", torch.zeros(()))

            def forward(self, x):
                self.seen += 1
                return self.lin(x)

        m = Counting()
    xs = [torch.randn(4, 64), torch.randn(4, 64)]
    c = tk.calibrate(m, xs)
    assert c.rows["lin"] == 8 and float(m.seen) == 2
    x = torch.cat(xs).double()
    assert torch.allclose(c.sum_xxt["lin"].double(), x.T @ x, rtol=1e-5, atol=1e-4)
