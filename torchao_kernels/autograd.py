"""Gradients through the low-bit linear ops, with respect to the activations.

The weights are frozen (packed int8 buffers are not parameters), so the only
gradient a quantized layer has to give is the one its input needs: for
y = x @ W^T + b, dL/dx = dL/dy @ W, with W the weights as the kernels
dequantize them, scale * (q - zero). The int8 rounding of the activations
inside the op is treated as the identity (a straight-through estimator), as
quantization-aware training does. This is what training adapters (LoRA and
the like) on top of a quantized base model needs.

The functional ops' Autograd kernels are C++ (ops/aten/register_ops.cpp, a
torch::autograd::Function whose backward calls dequantize_packed below), so
calls that need no gradient pay nothing for it; they work eagerly, under
torch.compile(fullgraph=True) and in torch.export's training IR. The out=
variants cannot record a graph: with an input that requires a gradient (and
grad mode on) they raise instead of returning a result that silently has no
gradient.
"""
from __future__ import annotations

import torch

from ._compat import op_family, torchao_compat_status
from .quant import dequantize_weight

__all__ = ["dequantize_packed"]


@torch.library.custom_op("torchao_kernels::_dequantize_packed", mutates_args=())
def dequantize_packed(packed_weights: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The (n, k) float32 weights a packed buffer holds, scale * (q - zero)."""
    q, s, z, _ = torch.ops.torchao_kernels._unpack(packed_weights)
    if q.shape != (n, k):
        raise ValueError(f"packed_weights hold ({q.shape[0]}, {q.shape[1]}) weights, not (n={n}, k={k})")
    return dequantize_weight(q, s.to(torch.float32), z if z.numel() else None, k // s.shape[1])


@dequantize_packed.register_fake
def _(packed_weights, n, k):
    return packed_weights.new_empty((n, k), dtype=torch.float32)


def _refuse_grad_for_out(name: str):
    op = getattr(torch.ops.torchao, name).out

    def out_autograd(activations, packed_weights, group_size, n, k, *, out):
        if torch.is_grad_enabled() and (activations.requires_grad or out.requires_grad):
            raise RuntimeError(
                f"torchao::{name}.out does not record gradients (out= variants cannot): call "
                f"torch.ops.torchao.{name} (or QuantizedLinear) for a gradient with respect to the activations, "
                "or run under torch.no_grad()"
            )
        with torch._C._AutoDispatchBelowAutograd():
            return op(activations, packed_weights, group_size, n, k, out=out)

    return out_autograd


def _refuse_grad_for_lookup_out(name: str):
    # The lookups record no gradient at all; an out= call with a tensor that
    # requires one (out itself, or the caller's scales) would return a result
    # that silently has none, so it raises as aten's out= variants do.
    op = getattr(torch.ops.torchao, name).out

    def out_autograd(*args, out):
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in (*args, out)):
            raise RuntimeError(
                f"torchao::{name}.out does not record gradients (out= variants cannot), but one of its "
                "arguments requires grad: pass tensors that do not require grad, or run under torch.no_grad()"
            )
        with torch._C._AutoDispatchBelowAutograd():
            return op(*args, out=out)

    return out_autograd


_lib = torch.library.Library("torchao", "IMPL")


def _register(name: str) -> None:
    # The functional ops' Autograd kernels are C++ (ops/aten/register_ops.cpp:
    # the same backward, with no Python on calls that need no gradient).
    _lib.impl(f"{name}.out", _refuse_grad_for_out(name), "Autograd")


for _family in ("embedding", "shared_embedding"):
    _ops = op_family(_family)
    _lib.impl(f"{_ops['name']}.out", _refuse_grad_for_lookup_out(_ops["name"]), "Autograd")
    if torchao_compat_status("embedding") == "registered":
        for _name in _ops["per_bit"]:
            _lib.impl(f"{_name}.out", _refuse_grad_for_lookup_out(_name), "Autograd")

_linear_ops = op_family("linear")
_register(_linear_ops["name"])
if torchao_compat_status() == "registered":
    # torchao's per-bit-width names, when this package serves them
    for _name in _linear_ops["per_bit"]:
        _register(_name)
