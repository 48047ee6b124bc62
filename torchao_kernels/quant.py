"""Float weights -> groupwise b-bit qvals, scales and zero points."""
from __future__ import annotations

from typing import Optional, Tuple

import torch

__all__ = ["quantize_weight", "dequantize_weight"]


def _check(w: torch.Tensor, bits: int, group_size: int) -> None:
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"w must be a 2-D floating point tensor (n, k), got {getattr(w, 'shape', type(w))}")
    if not isinstance(bits, int) or not 1 <= bits <= 8:
        raise ValueError(f"bits must be an int in 1..8, got {bits!r}")
    k = w.shape[1]
    if not isinstance(group_size, int) or group_size < 16 or group_size % 16 or k % group_size:
        raise ValueError(
            f"group_size must be a multiple of 16 that divides k={k}, got {group_size!r}"
        )


def quantize_weight(
    w: torch.Tensor, bits: int = 4, group_size: Optional[int] = 32, has_zeros: bool = False,
    scale_dtype: Optional[torch.dtype] = None,
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Quantizes a float weight (n, k) groupwise to `bits` bits.

    Returns (qvals int8 (n, k) in [-2^(bits-1), 2^(bits-1)-1], scales float32
    (n, k / group_size), zeros int8 (n, k / group_size) or None). group_size None
    or -1 means per channel (one group of k). Symmetric without zero points
    (scale = max|w| / ((2^bits - 1) / 2)); asymmetric with them, over a range
    that includes 0 so the zero point stays in the bit range. 1- and 2-bit
    weights need has_zeros=True to be useful.

    scale_dtype: torch.float32 or torch.bfloat16; None (default) picks
    bfloat16 for a bfloat16 weight and float32 otherwise, as torchao does.
    With bfloat16 each scale is rounded to bfloat16 before the weights are
    quantized with it, and the scales are returned as a bfloat16 tensor, which
    pack() stores in 2 bytes instead of 4 (less to read per call: ~10% at 4
    bits, group 32).
    """
    if scale_dtype is None:
        scale_dtype = torch.bfloat16 if isinstance(w, torch.Tensor) and w.dtype == torch.bfloat16 else torch.float32
    if scale_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"scale_dtype must be torch.float32 or torch.bfloat16, got {scale_dtype}")
    if group_size is None or group_size == -1:
        group_size = w.shape[1] if isinstance(w, torch.Tensor) and w.dim() == 2 else group_size
    _check(w, bits, group_size)
    n, k = w.shape
    qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    wg = w.detach().to(torch.float32).reshape(n, k // group_size, group_size)
    tiny = torch.finfo(torch.float32).tiny
    if has_zeros:
        lo = wg.amin(-1).clamp(max=0.0)
        hi = wg.amax(-1).clamp(min=0.0)
        scale = _round_scale(((hi - lo) / float(qmax - qmin)).clamp(min=tiny), scale_dtype)
        zero = (qmin - torch.round(lo / scale)).clamp(qmin, qmax)
        q = torch.clamp(torch.round(wg / scale.unsqueeze(-1)) + zero.unsqueeze(-1), qmin, qmax)
        zeros = zero.to(torch.int8)
    else:
        amax = wg.abs().amax(-1)
        scale = _round_scale((amax / ((qmax - qmin) / 2.0)).clamp(min=tiny), scale_dtype)
        q = torch.clamp(torch.round(wg / scale.unsqueeze(-1)), qmin, qmax)
        zeros = None
    return q.to(torch.int8).reshape(n, k), scale.to(scale_dtype).contiguous(), zeros


def _round_scale(scale: torch.Tensor, scale_dtype: torch.dtype) -> torch.Tensor:
    """The float32 scales as they will be stored (bfloat16: rounded to nearest,
    kept at least as large as the smallest positive bfloat16 normal)."""
    if scale_dtype == torch.float32:
        return scale
    tiny = torch.finfo(torch.bfloat16).tiny
    return scale.to(torch.bfloat16).float().clamp(min=tiny)


def dequantize_weight(
    qvals: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor], group_size: int
) -> torch.Tensor:
    """float32 (n, k) weight = scale * (q - zero), groupwise."""
    n, k = qvals.shape
    q = qvals.to(torch.float32).reshape(n, k // group_size, group_size)
    if zeros is not None:
        q = q - zeros.to(torch.float32).reshape(n, -1, 1)
    return (q * scales.reshape(n, -1, 1)).reshape(n, k)
