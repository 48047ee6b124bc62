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
variants (the linears' and the lookups') cannot record a graph: with a tensor
argument that requires a gradient (and grad mode on) they raise instead of
returning a result that silently has no gradient (ops/aten/aten_glue.h,
refuse_grad_for_out).
"""
from __future__ import annotations

import torch

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
