"""Gradients with respect to the activations through quantized layers
(weights frozen): eager, torch.compile, torch.export, torchao's per-bit ops,
opcheck; the out= variants refuse to drop a gradient."""
import copy

import pytest
import torch
from torch import nn

import torchao_kernels as tk

OPS = torch.ops.torchao


def _model(bits=4, zeros=True, seed=0):
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(64, 96), nn.SiLU(), nn.Linear(96, 32))
    f = copy.deepcopy(m)
    tk.quantize_(m, bits=bits, group_size=32, has_zeros=zeros)
    return m, f


def _dequantized(layer):
    q, s, z, b = tk.unpack(layer.packed_weights)
    return tk.dequantize_weight(q, s.float(), z, layer.group_size), b


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradient_is_the_dequantized_weights_transposed(dtype):
    m, _ = _model()
    layer = m[0]
    w, _ = _dequantized(layer)
    x = torch.randn(2, 5, 64).to(dtype).requires_grad_()
    y = layer(x)
    g = torch.randn_like(y)
    y.backward(g)
    assert x.grad.dtype == dtype and x.grad.shape == x.shape
    want = (g.float() @ w).to(dtype)
    assert torch.equal(x.grad, want)
    assert layer.packed_weights.grad is None and not list(layer.parameters())


def test_gradient_close_to_the_float_model_at_8_bits():
    m, f = _model(bits=8)
    x = torch.randn(7, 64, requires_grad=True)
    xf = x.detach().clone().requires_grad_()
    m(x).square().sum().backward()
    f(xf).square().sum().backward()
    rel = float((x.grad - xf.grad).norm() / xf.grad.norm())
    assert rel < 0.03, rel


class LoRA(nn.Module):
    """A trainable low-rank adapter around a frozen (quantized) base layer."""

    def __init__(self, base, n, k, r=4):
        super().__init__()
        self.base = base
        self.a = nn.Parameter(torch.randn(r, k) * 0.01)
        self.b = nn.Parameter(torch.zeros(n, r))

    def forward(self, x):
        return self.base(x) + (x @ self.a.T) @ self.b.T


def test_adapter_trains_on_a_quantized_base():
    m, _ = _model()
    m[0] = LoRA(m[0], 96, 64)
    m[2] = LoRA(m[2], 32, 96)
    torch.manual_seed(1)
    x, target = torch.randn(32, 64), torch.randn(32, 32)
    params = [p for p in m.parameters() if p.requires_grad]
    assert len(params) == 4                      # only the adapters
    opt = torch.optim.Adam(params, lr=1e-2)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = (m(x) - target).square().mean()
        loss.backward()
        # the first adapter's gradient flows back through the second quantized layer
        assert m[0].a.grad is not None and m[0].a.grad.abs().sum() > 0 or len(losses) == 0
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.9 * losses[0], losses


def test_compile_fullgraph_backward_equals_eager():
    m, _ = _model()
    x = torch.randn(6, 64, requires_grad=True)
    m(x).sum().backward()
    torch._dynamo.reset()
    compiled = torch.compile(m, fullgraph=True, dynamic=True)
    for rows in (6, 3):
        xc = x.detach()[:rows].clone().requires_grad_()
        compiled(xc).sum().backward()
        xe = x.detach()[:rows].clone().requires_grad_()
        m(xe).sum().backward()
        # the quantized layers' part is exact; inductor's fused SiLU backward rounds differently
        assert torch.allclose(xc.grad, xe.grad, rtol=1e-5, atol=1e-7), rows
    torch._dynamo.reset()


def test_export_keeps_the_op_and_its_gradient():
    m, _ = _model()
    ep = torch.export.export(m, (torch.randn(4, 64),))
    targets = [str(nd.target) for nd in ep.graph.nodes if nd.op == "call_function"]
    assert sum("torchao.linear_8bit_act_xbit_weight" in t for t in targets) == 2
    x = torch.randn(4, 64, requires_grad=True)
    ep.module()(x).sum().backward()
    xe = x.detach().clone().requires_grad_()
    m(xe).sum().backward()
    assert torch.equal(x.grad, xe.grad)


def test_torchao_per_bit_op_gradient():
    if tk.torchao_compat_status() != "registered":
        pytest.fail(f"torchao's per-bit ops are not served here: {tk.torchao_compat_status()}")
    m, _ = _model(bits=3)
    layer = m[0]
    x = torch.randn(3, 64, requires_grad=True)
    OPS._linear_8bit_act_3bit_weight(x, layer.packed_weights, 32, 96, 64).sum().backward()
    xe = x.detach().clone().requires_grad_()
    layer(xe).sum().backward()
    assert torch.equal(x.grad, xe.grad)


def test_opcheck_with_gradients():
    m, _ = _model()
    layer = m[0]
    x = torch.randn(5, 64, requires_grad=True)
    torch.library.opcheck(OPS.linear_8bit_act_xbit_weight.default, (x, layer.packed_weights, 32, 96, 64))


def test_out_variant_refuses_to_drop_the_gradient():
    m, _ = _model()
    p = m[0].packed_weights
    x = torch.randn(3, 64, requires_grad=True)
    out = torch.empty(3, 96)
    with pytest.raises(RuntimeError, match=r"linear_8bit_act_xbit_weight\.out does not record gradients"):
        OPS.linear_8bit_act_xbit_weight.out(x, p, 32, 96, 64, out=out)
    with pytest.raises(RuntimeError, match=r"_linear_8bit_act_4bit_weight\.out does not record gradients"):
        OPS._linear_8bit_act_4bit_weight.out(x, p, 32, 96, 64, out=out)
    with torch.no_grad():
        OPS.linear_8bit_act_xbit_weight.out(x, p, 32, 96, 64, out=out)
    assert torch.equal(out, m[0](x.detach()))
    OPS.linear_8bit_act_xbit_weight.out(x.detach(), p, 32, 96, 64, out=out)   # no gradient wanted: fine
