"""Cutting a packed buffer into tensor-parallel shards, without the float weights.

A shard is made from the integers and scales the buffer already holds
(`unpack`), sliced and packed again in the same format and scale storage: no
float weight is rebuilt and nothing is requantized, so every value of a shard
is the value of the original. Along n (output features, dim 0) a cut must fall
on a row block of the format (`nr` rows: the kernels' tile, so a shard keeps
full blocks and carries no padding of its own until its last row); along k
(input features, dim 1) on a group boundary (a scale covers a whole group).
"""
from __future__ import annotations

import numbers
from typing import List, Optional, Sequence, Tuple

import torch

from .. import ops

__all__ = ["shard", "narrow", "shard_bounds", "shard_sizes", "shard_unit"]

_DIM_NAMES = {0: "n (out_features)", 1: "k (in_features)"}


def shard_unit(packed: torch.Tensor, dim: int) -> int:
    """The granularity of valid cuts along `dim`: the format's row block (nr) for
    dim 0, the group size for dim 1."""
    info = ops.packed_info(packed)
    return _unit(info, _check_dim(dim))


def _check_dim(dim) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int) or dim not in (0, 1, -1, -2):
        raise ValueError(f"dim must be 0 (n, out_features) or 1 (k, in_features), got {dim!r}")
    return dim % 2


def _unit(info: dict, dim: int) -> int:
    return info["nr"] if dim == 0 else info["group_size"]


def _unit_name(info: dict, dim: int) -> str:
    if dim == 0:
        return f"{info['nr']}-row block of format {info['format']}"
    return f"group of {info['group_size']}"


def _nearest(x: int, unit: int, total: int, ends: bool = False) -> List[int]:
    """The valid cut points nearest x: multiples of unit strictly inside
    (0, total), or also 0 and total with ends."""
    lo = (x // unit) * unit
    cands = [min(c, total) if ends else c for c in (lo, lo + unit)]
    cands = [c for c in cands if (0 <= c <= total if ends else 0 < c < total)]
    if not cands:
        return []
    best = min(abs(c - x) for c in cands)
    return [c for c in cands if abs(c - x) == best]


def shard_sizes(total: int, count: int, unit: int) -> List[int]:
    """Sizes of `count` shards of `total` as even as possible with every cut on a
    multiple of `unit`: whole units are dealt out evenly (the first shards take
    the extra ones) and the last shard also takes the partial unit at the end,
    or is that partial unit alone when there is one shard more than whole units.
    (576, 2, 16) -> [288, 288]; (100, 2, 16) -> [48, 52]; (192, 2, 64) -> [128, 64];
    (24, 2, 16) -> [16, 8]."""
    for name, v in (("total", total), ("count", count), ("unit", unit)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    total, count, unit = int(total), int(count), int(unit)
    units, rest = divmod(total, unit)
    if units >= count:
        base, extra = divmod(units, count)
        sizes = [(base + (1 if i < extra else 0)) * unit for i in range(count)]
        sizes[-1] += rest
        return sizes
    if rest and units == count - 1:
        return [unit] * units + [rest]
    raise ValueError(f"cannot cut {total} into {count} shards on multiples of {unit}: "
                     f"there are only {units + (1 if rest else 0)} pieces ({units} whole units"
                     f"{f' and a partial one of {rest}' if rest else ''})")


def _int_sizes(sizes, what: str = "sizes") -> List[int]:
    """sizes as a list of ints (any sequence or iterable of integers; read once)."""
    if isinstance(sizes, (str, bytes)) or not hasattr(sizes, "__iter__"):
        raise ValueError(f"{what} must be a sequence of ints, got {sizes!r}")
    sizes = list(sizes)
    if any(isinstance(v, bool) or not isinstance(v, numbers.Integral) for v in sizes):
        raise ValueError(f"{what} must be a sequence of ints, got {sizes!r}")
    return [int(v) for v in sizes]


def _even_split_hint(total: int, count: int, unit: int) -> str:
    pieces = -(-total // unit)  # whole units and a partial one at the end
    if count > pieces:
        return f"no valid split into {count} shards: at most {pieces} on multiples of {unit}"
    return f"sizes={shard_sizes(total, count, unit)} is the most even valid split into {count}"


def _resolve_sizes(info: dict, dim: int, count: int, sizes: Optional[Sequence[int]]) -> List[int]:
    total = info["n"] if dim == 0 else info["k"]
    unit = _unit(info, dim)
    what = _DIM_NAMES[dim]
    if sizes is None:
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"count must be a positive int, got {count!r}")
        if total % count:
            raise ValueError(
                f"cannot cut {what}={total} into {count} equal shards ({total}/{count} is not an integer); "
                f"pass sizes= ({_even_split_hint(total, count, unit)})"
            )
        sizes = [total // count] * count
    else:
        sizes = _int_sizes(sizes)
        if count is not None and len(sizes) != count:
            raise ValueError(f"sizes={sizes} has {len(sizes)} entries, but there are {count} shards (ranks)")
        if any(s <= 0 for s in sizes) or sum(sizes) != total:
            raise ValueError(f"sizes={sizes} must be positive and add up to {what}={total}")
    cut = 0
    for s in sizes[:-1]:
        cut += s
        if cut % unit:
            near = _nearest(cut, unit, total)
            hint = (" or ".join(str(c) for c in near)) if near else "none"
            raise ValueError(
                f"cannot cut {what}={total} at {cut}: shards must start on a whole {_unit_name(info, dim)}; "
                f"nearest valid cut: {hint} ({_even_split_hint(total, len(sizes), unit)})"
            )
    return sizes


def shard_bounds(packed: torch.Tensor, dim: int, index: int, count: int,
                 sizes: Optional[Sequence[int]] = None) -> Tuple[int, int]:
    """(start, length) of shard `index` of `count` along dim, validated."""
    info = ops.packed_info(packed)
    d = _check_dim(dim)
    sz = _resolve_sizes(info, d, count, sizes)
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(sz):
        raise ValueError(f"index must be an int in [0, {len(sz)}), got {index!r}")
    return sum(sz[:index]), sz[index]


def narrow(packed: torch.Tensor, dim: int, start: int, length: int, *, bias: bool = True) -> torch.Tensor:
    """The packed buffer of rows [start, start+length) (dim 0) or input features
    [start, start+length) (dim 1) of `packed`, in the same format and scale storage.

    start and start+length must lie on a row block (dim 0) or group (dim 1)
    boundary, or at the end. bias: keep the bias (sliced along n for dim 0, whole
    for dim 1: give it to one k-shard only, or the sum of the shards adds it twice).
    """
    if not isinstance(bias, bool):
        raise ValueError(f"bias must be True or False, got {bias!r} (shard() takes 'first' / 'none')")
    info = ops.packed_info(packed)
    d = _check_dim(dim)
    total = info["n"] if d == 0 else info["k"]
    unit = _unit(info, d)
    what = _DIM_NAMES[d]
    for name, v in (("start", start), ("length", length)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{name} must be an int, got {v!r}")
    if start < 0 or length <= 0 or start + length > total:
        raise ValueError(f"[start={start}, start+length={start + length}) is not a non-empty range of {what}={total}")
    for name, v in (("start", start), ("start+length", start + length)):
        if v % unit and v != total:
            near = _nearest(v, unit, total, ends=True)
            raise ValueError(
                f"{name}={v} of {what}={total} is not on a whole {_unit_name(info, d)}; "
                f"nearest valid: {' or '.join(str(c) for c in near)}"
            )
    q, s, z, b = ops.unpack(packed)
    if d == 0:
        sl = slice(start, start + length)
        q, s = q[sl], s[sl]
        z = None if z is None else z[sl]
        b = None if b is None else b[sl]
    else:
        g = info["group_size"]
        q = q[:, start:start + length]
        gs = slice(start // g, (start + length) // g)
        s = s[:, gs]
        z = None if z is None else z[:, gs]
    if not bias:
        b = None
    # contiguous: pack reads rows with the packed stride; unpack's scales come
    # back bfloat16 for a bfloat16 buffer, so the shard keeps that storage.
    return ops.pack(q.contiguous(), s.contiguous(), None if z is None else z.contiguous(),
                    bits=info["bits"], group_size=info["group_size"],
                    bias=None if b is None else b.contiguous(), target=info["format"])


def shard(packed: torch.Tensor, dim: int, index: int, count: Optional[int] = None, *,
          sizes: Optional[Sequence[int]] = None, bias: str = "first") -> torch.Tensor:
    """Shard `index` of `count` of a packed buffer along dim 0 (n, out_features:
    column-parallel) or dim 1 (k, in_features: row-parallel), as a packed buffer
    in the same format and scale storage with exactly the same values.

    sizes: the shard sizes along dim (default: count equal shards); every cut
      must fall on a row block of the format (dim 0) or a group (dim 1); the
      error names the nearest valid cut and the most even valid sizes.
    bias: "first" (default): along n each shard keeps its slice of the bias;
      along k only shard 0 keeps it, so that the sum of the shards' outputs
      adds it once (what an all-reduce of row-parallel outputs needs).
      "none": no shard has a bias (add it yourself after the reduction).

    Concatenating the shards' unpacked qvals / scales / zeros (or their
    dequantized weights) along dim gives the original's exactly.
    """
    if bias not in ("first", "none"):
        raise ValueError(f"bias must be 'first' or 'none', got {bias!r}")
    if count is None and sizes is None:
        raise ValueError("give count (equal shards) or sizes")
    d = _check_dim(dim)
    start, length = shard_bounds(packed, d, index, count, sizes)
    keep_bias = bias == "first" and (d == 0 or index == 0)
    return narrow(packed, d, start, length, bias=keep_bias)
