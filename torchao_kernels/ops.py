"""Thin Python wrappers over the torch ops (torch.ops.torchao.*)."""
from __future__ import annotations

import json
import numbers
from typing import Optional

import torch

__all__ = ["pack", "linear", "repack", "packed_info", "unpack", "pack_embedding", "embedding", "shared_embedding"]


def _ints(names: str, *values) -> None:
    """The integer arguments of a wrapper (`names` space-separated, in order), checked
    before the op's schema sees them (its cast error names neither the argument nor the
    value). Plain ints return at once: the lookups and linears call this per forward."""
    for v in values:
        if type(v) is not int:
            break
    else:
        return
    for name, v in zip(names.split(), values):
        if isinstance(v, bool) or not isinstance(v, (numbers.Integral, torch.SymInt)):
            raise TypeError(f"{name} must be an int, got {v!r}")


def pack(
    weight_qvals: torch.Tensor,
    weight_scales: torch.Tensor,
    weight_zeros: Optional[torch.Tensor] = None,
    *,
    bits: int,
    group_size: int,
    bias: Optional[torch.Tensor] = None,
    target: Optional[str] = None,
) -> torch.Tensor:
    """Packs int8 qvals (n, k) in the `bits`-bit range, float scales (n, k / group_size),
    optional int8 zero points (same shape) and optional bias (n) into a packed int8 tensor.

    Scales are stored in bfloat16 when weight_scales is a bfloat16 tensor (2 bytes per
    row and group instead of 4: 10% fewer bytes to read at 4 bits, group 32; results are
    those of the same values in float32), otherwise in float32.

    target: None / "auto" picks the best format for this CPU; a format name ("n1k4",
    "n16k4") forces one; torchao's "universal", "kleidiai", "aten" are accepted.
    """
    _ints("bits group_size", bits, group_size)
    return torch.ops.torchao.pack_8bit_act_xbit_weight(
        weight_qvals, weight_scales, weight_zeros, bits, group_size, bias, target
    )


def linear(x: torch.Tensor, packed_weights: torch.Tensor, group_size: int, n: int, k: int) -> torch.Tensor:
    """y = x @ W^T (+ bias) with x of shape (..., k) in float32 / bfloat16 / float16."""
    _ints("group_size n k", group_size, n, k)
    return torch.ops.torchao.linear_8bit_act_xbit_weight(x, packed_weights, group_size, n, k)


def repack(packed_weights: torch.Tensor, target: Optional[str] = None) -> torch.Tensor:
    """Converts packed weights to another format (default: this CPU's best) without the original weights."""
    return torch.ops.torchao_kernels._repack(packed_weights, target)


def packed_info(packed_weights: torch.Tensor) -> dict:
    """The validated header of a packed buffer: format, bits, n, k, group size, zeros, bias, tile."""
    return json.loads(torch.ops.torchao_kernels._packed_info_json(packed_weights))


def unpack(packed_weights: torch.Tensor):
    """(qvals, scales, zeros or None, bias or None) recovered from a packed buffer."""
    q, s, z, b = torch.ops.torchao_kernels._unpack(packed_weights)
    return q, s, (z if z.numel() else None), (b if b.numel() else None)


def pack_embedding(weight_qvals: torch.Tensor, bits: int) -> torch.Tensor:
    """Packs int8 qvals (num_embeddings, embedding_dim) of a `bits`-bit table into a
    weights-only buffer (torchao::_pack_embedding_{b}bit's layout); its scales and zero
    points are passed with each lookup (embedding()). embedding_dim must be a positive multiple
    of 16 (_format_limits.GROUP_MULTIPLE)."""
    _ints("bits", bits)
    return torch.ops.torchao.pack_embedding_xbit(weight_qvals, bits)


def embedding(packed_weight_qvals: torch.Tensor, num_embeddings: int, embedding_dim: int,
              weight_scales: torch.Tensor, weight_zeros: Optional[torch.Tensor],
              indices: torch.Tensor) -> torch.Tensor:
    """Rows `indices` (any shape) of a weights-only table, dequantized:
    scale * (q - zero), float32, shape indices.shape + (embedding_dim,)."""
    _ints("num_embeddings embedding_dim", num_embeddings, embedding_dim)
    return torch.ops.torchao.embedding_xbit(packed_weight_qvals, num_embeddings, embedding_dim,
                                           weight_scales, weight_zeros, indices)


def shared_embedding(packed_weights: torch.Tensor, group_size: int, n: int, k: int,
                     indices: torch.Tensor) -> torch.Tensor:
    """Rows `indices` (any shape) of the dequantized weight (n, k) of a buffer packed by
    pack() (any format), float32, shape indices.shape + (k,); the bias is not added.
    One packed buffer so serves a linear layer and an embedding (tied weights)."""
    _ints("group_size n k", group_size, n, k)
    return torch.ops.torchao.shared_embedding_xbit(packed_weights, group_size, n, k, indices)


def copy_packed(packed_weights: torch.Tensor) -> torch.Tensor:
    """A copy of a packed buffer that owns its memory. On the CPU it is allocated as the
    pack ops allocate theirs (advised into transparent huge pages on Linux: random row
    lookups in a large table are ~1.2x faster than from a plain clone); a tensor the op
    does not take as a packed buffer (another device, shape or dtype, whose header check
    then reports it) is cloned."""
    try:
        return torch.ops.torchao_kernels._copy_packed(packed_weights)
    except ValueError:
        return packed_weights.clone().contiguous()


def adopt_packed_buffer(module, state_dict, prefix: str, strict: bool, missing_keys, unexpected_keys,
                        error_msgs) -> None:
    """_load_from_state_dict for modules holding one packed buffer (`packed_weights`):
    a buffer's size depends on its format and shape, so the module adopts the saved
    tensor instead of copying into its current one, then re-reads the header
    (module._read_header), reporting a bad buffer as load_state_dict does (and
    keeping the buffer it had). With strict, the module's other keys (a float
    checkpoint's `weight` and `bias`) are unexpected, as nn.Module reports them."""
    key = prefix + "packed_weights"
    if key in state_dict:
        old = module.packed_weights
        module.packed_weights = copy_packed(state_dict[key].detach())
        try:
            module._read_header()
        except (ValueError, RuntimeError) as e:
            module.packed_weights = old
            module._read_header()
            error_msgs.append(f"{key}: {e}")
    elif strict:
        missing_keys.append(key)
    if strict:
        unexpected_keys.extend(k for k in state_dict if k.startswith(prefix) and k != key)
