"""Tensor-parallel styles for QuantizedLinear, for torch's parallelize_module.

QuantizedColwiseParallel and QuantizedRowwiseParallel take the keyword
arguments of torch's ColwiseParallel / RowwiseParallel (input_layouts,
output_layouts, use_local_output) and lay activations out the same way, so a
plan written for nn.Linear works after swapping the style names. What differs
is the weight: a packed buffer is opaque to DTensor (no `narrow`, no sharding
rules for the torchao ops), so each rank keeps a plain packed buffer of its own
shard (cut by `shard`, without requantizing) and the module computes on local
tensors; the styles' hooks do the collectives DTensor would do
(all-gather for a replicated column-parallel output, all-reduce for a
row-parallel one) directly, on the mesh's process group or on the shared
memory init_tp set up for it, and go through DTensor for the other layouts
and for DTensor inputs / outputs.

Extensions over torch's styles:
- sizes: uneven shards (e.g. 3 key/value heads on 2 ranks), each cut on a
  boundary of the packed format; input_sizes for an unevenly sharded input;
- QuantizedRowwiseParallel(full_row_quant=True): every rank quantizes its
  slice of an activation row with the scale and zero point of the *full* row,
  as TP = 1 does, instead of its slice's own (see docs/distributed.md).
Plain nn.Linear modules are accepted too (their weight is sliced), so a
partly quantized model can use one plan, and QuantizedRowwiseParallel takes
embeddings (vocabulary-parallel, as torch's RowwiseParallel does).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Dict, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DeviceMesh, DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.parallel import ParallelStyle
from torch.distributed.tensor.placement_types import Placement

from .. import ops
from ..embedding import QuantizedEmbedding
from ..nn import QuantizedLinear
from .shard import _int_sizes, _resolve_sizes, narrow, shard_sizes

__all__ = [
    "QuantizedColwiseParallel",
    "QuantizedRowwiseParallel",
    "comm_stats",
    "reset_comm_stats",
    "register_shm",
    "TPShard",
]


# ---------------------------------------------------------------------------
# communication accounting: the styles time their own (blocking) collectives,
# so a benchmark can show the time spent in them apart from compute. On one
# machine this includes waiting for the slower rank.

_COMM: Dict[str, List[float]] = {}


def _account(kind: str, seconds: float, nbytes: int) -> None:
    rec = _COMM.setdefault(kind, [0, 0.0, 0])
    rec[0] += 1
    rec[1] += seconds
    rec[2] += nbytes


def comm_stats() -> Dict[str, dict]:
    """{collective: {"calls", "seconds", "bytes"}} issued by the quantized styles
    in this process since start (or reset_comm_stats())."""
    return {k: {"calls": int(v[0]), "seconds": v[1], "bytes": int(v[2])} for k, v in _COMM.items()}


def reset_comm_stats() -> None:
    _COMM.clear()


# Process groups whose ranks share one machine and have a shared-memory
# communicator (init_tp registers it): the styles' own collectives go there.
_SHM: Dict[object, object] = {}


def register_shm(group, comm) -> None:
    """Routes the styles' collectives on `group` through `comm` (a ShmComm), or
    back to torch.distributed with comm=None."""
    if comm is None:
        _SHM.pop(group, None)
    else:
        _SHM[group] = comm


def _all_reduce(t: torch.Tensor, group) -> torch.Tensor:
    t0 = time.perf_counter()
    shm = _SHM.get(group)
    if shm is not None:
        shm.all_reduce(t)
    else:
        dist.all_reduce(t, group=group)
    _account("all_reduce", time.perf_counter() - t0, t.numel() * t.element_size())
    return t


def _all_gather_list(t: torch.Tensor, group, world: int) -> List[torch.Tensor]:
    shm = _SHM.get(group)
    if shm is not None:
        return shm.all_gather(t)
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t, group=group)
    return parts


def _all_gather_cat(t: torch.Tensor, sizes: Sequence[int], group, dim: int = -1) -> torch.Tensor:
    """Concatenation along `dim` of every rank's `t`, rank r's of size sizes[r]
    along dim (gloo's all_gather wants equal sizes: uneven shards are padded)."""
    t0 = time.perf_counter()
    dim = dim % t.dim()
    width = max(sizes)
    shm = _SHM.get(group)
    if shm is not None:
        out = shm.all_gather_cat(t, sizes, dim)
    else:
        x = t.contiguous()
        if x.shape[dim] != width:
            pad = list(x.shape)
            pad[dim] = width - x.shape[dim]
            x = torch.cat([x, x.new_zeros(pad)], dim)
        parts = [torch.empty_like(x) for _ in sizes]
        dist.all_gather(parts, x, group=group)
        out = torch.cat([p.narrow(dim, 0, s) for p, s in zip(parts, sizes)], dim)
    nbytes = t.numel() // max(1, t.shape[dim]) * width * t.element_size() * len(sizes)
    _account("all_gather", time.perf_counter() - t0, nbytes)
    return out


# ---------------------------------------------------------------------------


@dataclasses.dataclass
class TPShard:
    """What a parallelized module holds: its slice of the full layer."""
    style: str                 # "colwise" or "rowwise"
    dim: int                   # weight dim cut: 0 (n) colwise, 1 (k) rowwise
    full: int                  # the full layer's size along dim
    sizes: List[int]           # every rank's shard size along dim
    rank: int                  # this rank's index in the mesh
    full_row_quant: bool = False

    @property
    def start(self) -> int:
        return sum(self.sizes[: self.rank])

    @property
    def length(self) -> int:
        return self.sizes[self.rank]


def _mesh_rank(mesh: DeviceMesh):
    if mesh.ndim != 1:
        raise ValueError(f"the quantized styles take a 1-D device mesh (tensor parallel), got {mesh.ndim}-D {mesh}")
    return mesh.get_local_rank(), mesh.size(), mesh.get_group()


def _is_last_dim_shard(p: Placement, ndim: int) -> bool:
    return isinstance(p, Shard) and p.dim in (-1, ndim - 1)


def _layer_sizes(module: nn.Module, dim: int, count: int, sizes: Optional[Sequence[int]]) -> List[int]:
    if isinstance(module, QuantizedLinear):
        info = ops.packed_info(module.packed_weights)
        return _resolve_sizes(info, dim, count, sizes)
    total = module.weight.shape[dim]
    if sizes is None:
        if total % count:
            raise ValueError(f"cannot cut {total} features into {count} equal shards; pass sizes= "
                             f"(e.g. {shard_sizes(total, count, 1)})")
        return [total // count] * count
    sizes = _int_sizes(sizes)
    if len(sizes) != count or sum(sizes) != total or min(sizes) <= 0:
        raise ValueError(f"sizes={sizes} must be {count} positive sizes adding up to {total}")
    return sizes


def _append_zero_group(packed: torch.Tensor) -> torch.Tensor:
    """The buffer with one more group of zero weights at the end of k: its
    integer dot product is 0 and its row-sum term is 0, so it adds exactly
    nothing; the activation values fed to it only steer the per-row
    quantization (full_row_quant)."""
    info = ops.packed_info(packed)
    q, s, z, b = ops.unpack(packed)
    g = info["group_size"]
    q = torch.cat([q, q.new_zeros(q.shape[0], g)], 1)
    s = torch.cat([s, s.new_ones(s.shape[0], 1)], 1)
    z = None if z is None else torch.cat([z, z.new_zeros(z.shape[0], 1)], 1)
    return ops.pack(q, s, z, bits=info["bits"], group_size=g, bias=b, target=info["format"])


def _check_fresh(module: nn.Module) -> None:
    if getattr(module, "tp_shard", None) is not None:
        raise ValueError(f"this {type(module).__name__} is already parallelized ({module.tp_shard}); "
                         "apply a parallel style to the unsharded module once")


def _install(module: nn.Module, mesh: DeviceMesh, prepare_input, prepare_output) -> nn.Module:
    # Not distribute_module: it would turn the packed buffer (and the sliced
    # weights) into replicated DTensors, which the torchao ops cannot take.
    # The module keeps plain local tensors; only activations cross ranks.
    module.register_forward_pre_hook(lambda mod, inputs: prepare_input(mod, inputs, mesh))
    module.register_forward_hook(lambda mod, inputs, outputs: prepare_output(mod, outputs, mesh))
    return module


def _shard_module(module: nn.Module, tp: TPShard, keep_bias: bool) -> None:
    start, length = tp.start, tp.length
    if isinstance(module, QuantizedLinear):
        packed = narrow(module.packed_weights, tp.dim, start, length, bias=keep_bias)
        if tp.full_row_quant:
            packed = _append_zero_group(packed)
        info = ops.packed_info(packed)
        module.out_features, module.in_features = info["n"], info["k"]
        module.packed_weights = packed
        module._read_header()
    elif isinstance(module, nn.Linear):
        w = module.weight.detach().narrow(tp.dim, start, length).clone()
        module.weight = nn.Parameter(w, requires_grad=module.weight.requires_grad)
        if module.bias is not None:
            if tp.dim == 0:
                module.bias = nn.Parameter(module.bias.detach()[start:start + length].clone(),
                                           requires_grad=module.bias.requires_grad)
            elif not keep_bias:
                module.bias = None
        module.out_features, module.in_features = module.weight.shape
    else:
        raise NotImplementedError(
            f"the quantized parallel styles support QuantizedLinear and nn.Linear, got {type(module).__name__}"
        )
    module.tp_shard = tp


class QuantizedColwiseParallel(ParallelStyle):
    """Column-wise (output features, n) sharding of a QuantizedLinear.

    Keyword args as torch's ColwiseParallel: input_layouts (default
    Replicate()), output_layouts (default Shard(-1)), use_local_output
    (default True); plus sizes: every rank's number of output features
    (default equal shards; cuts on the format's row blocks) and input_sizes:
    with input_layouts=Shard(-1), every rank's input width if uneven (the
    input is all-gathered first).

    Each output element is computed exactly as TP = 1 computes it (the per-row
    activation quantization sees the same full row), so a rank's output is
    bit-identical to the same columns of the unsharded layer.
    """

    def __init__(self, *, input_layouts: Optional[Placement] = None, output_layouts: Optional[Placement] = None,
                 use_local_output: bool = True, sizes: Optional[Sequence[int]] = None,
                 input_sizes: Optional[Sequence[int]] = None):
        super().__init__()
        self.input_layouts = (input_layouts or Replicate(),)
        self.output_layouts = (output_layouts or Shard(-1),)
        self.desired_input_layouts = (Replicate(),)
        self.use_local_output = use_local_output
        self.sizes = None if sizes is None else _int_sizes(sizes)
        # with input_layouts=Shard(-1): every rank's input width, when uneven
        self.input_sizes = None if input_sizes is None else _int_sizes(input_sizes, "input_sizes")

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        rank, world, group = _mesh_rank(device_mesh)
        if not isinstance(module, (QuantizedLinear, nn.Linear)):
            raise NotImplementedError(
                f"QuantizedColwiseParallel supports QuantizedLinear and nn.Linear, got {type(module).__name__}"
            )
        _check_fresh(module)
        tp = TPShard("colwise", 0, module.out_features, _layer_sizes(module, 0, world, self.sizes), rank)
        k_full = module.in_features
        in_sizes = self.input_sizes
        # every check before the module is cut: an error leaves it as it was
        if in_sizes is not None and (len(in_sizes) != world or sum(in_sizes) != k_full or min(in_sizes) <= 0):
            raise ValueError(f"input_sizes={in_sizes} must be {world} positive widths adding up to "
                             f"in_features={k_full}")
        _shard_module(module, tp, keep_bias=True)

        def prepare_input(mod, inputs, mesh):
            x = inputs[0]
            if isinstance(x, DTensor):
                x = x.full_tensor()
            elif _is_last_dim_shard(self.input_layouts[0], x.dim()):
                # Gathered here rather than through DTensor, which needs even
                # shards: attention heads split 2 + 1 are not.
                sizes = in_sizes or [x.shape[-1]] * world
                if x.shape[-1] != sizes[rank] or sum(sizes) != k_full:
                    raise ValueError(f"{type(self).__name__}: rank {rank}'s input has {x.shape[-1]} features; "
                                     f"expected {sizes[rank]} of {k_full} (input_sizes={in_sizes})")
                x = _all_gather_cat(x, sizes, group)
            elif not isinstance(self.input_layouts[0], Replicate):
                x = DTensor.from_local(x, mesh, self.input_layouts, run_check=False).full_tensor()
            return (x, *inputs[1:])

        def prepare_output(mod, outputs, mesh):
            return _colwise_output(outputs, tp, mesh, group, self.output_layouts[0], self.use_local_output)

        return _install(module, device_mesh, prepare_input, prepare_output)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(input_layouts={self.input_layouts}, output_layouts={self.output_layouts}, "
                f"use_local_output={self.use_local_output}, sizes={self.sizes}, input_sizes={self.input_sizes})")


def _colwise_output(out: torch.Tensor, tp: TPShard, mesh: DeviceMesh, group, want: Placement,
                    use_local: bool):
    full_shape = (*out.shape[:-1], tp.full)
    if _is_last_dim_shard(want, out.dim()):
        if use_local:
            return out
        return DTensor.from_local(out, mesh, [Shard(out.dim() - 1)], run_check=False, shape=full_shape,
                                  stride=_contiguous_stride(full_shape))
    if isinstance(want, Replicate):
        full = _all_gather_cat(out, tp.sizes, group)
        return full if use_local else DTensor.from_local(full, mesh, [Replicate()], run_check=False)
    d = DTensor.from_local(out, mesh, [Shard(out.dim() - 1)], run_check=False, shape=full_shape,
                           stride=_contiguous_stride(full_shape)).redistribute(placements=[want])
    return d.to_local() if use_local else d


def _contiguous_stride(shape) -> tuple:
    stride, acc = [], 1
    for s in reversed(shape):
        stride.append(acc)
        acc *= s
    return tuple(reversed(stride))


class QuantizedRowwiseParallel(ParallelStyle):
    """Row-wise (input features, k) sharding of a QuantizedLinear.

    Keyword args as torch's RowwiseParallel: input_layouts (default Shard(-1):
    each rank gets its slice of the input), output_layouts (default
    Replicate(): the partial outputs are all-reduced), use_local_output
    (default True); plus sizes: every rank's number of input features (cuts
    on groups) and full_row_quant.

    The bias lives in rank 0's shard only (the kernel adds it there), so the
    all-reduce adds it once.

    Outputs differ from TP = 1 by the float summation of the ranks' partial
    sums and, by default, by the activation quantization: each rank quantizes
    its slice of a row with that slice's own range. full_row_quant=True makes
    every rank use the scale and zero point of the full row, as TP = 1 does
    (an all-gather of each row's min and max, 2 floats per row per rank, when
    the input is sharded; nothing when it is replicated), at the cost of one
    more group of (zero) weights per rank; then every integer dot product is
    TP = 1's and only the float sum of the partials differs.
    """

    def __init__(self, *, input_layouts: Optional[Placement] = None, output_layouts: Optional[Placement] = None,
                 use_local_output: bool = True, sizes: Optional[Sequence[int]] = None,
                 full_row_quant: bool = False):
        super().__init__()
        self.input_layouts = (input_layouts or Shard(-1),)
        self.output_layouts = (output_layouts or Replicate(),)
        self.desired_input_layouts = (Shard(-1),)
        self.use_local_output = use_local_output
        self.sizes = None if sizes is None else _int_sizes(sizes)
        if not isinstance(full_row_quant, bool):
            raise ValueError(f"full_row_quant must be True or False, got {full_row_quant!r}")
        self.full_row_quant = full_row_quant

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        rank, world, group = _mesh_rank(device_mesh)
        if isinstance(module, (QuantizedEmbedding, nn.Embedding)):
            _check_fresh(module)
            return _vocab_parallel(module, device_mesh, self.sizes, self.output_layouts[0], self.use_local_output)
        if not isinstance(module, (QuantizedLinear, nn.Linear)):
            raise NotImplementedError(
                "QuantizedRowwiseParallel supports QuantizedLinear, nn.Linear, QuantizedEmbedding and "
                f"nn.Embedding, got {type(module).__name__}"
            )
        _check_fresh(module)
        full_row = self.full_row_quant and isinstance(module, QuantizedLinear)
        tp = TPShard("rowwise", 1, module.in_features, _layer_sizes(module, 1, world, self.sizes), rank, full_row)
        even = len(set(tp.sizes)) == 1
        pad_width = module.group_size if full_row else 0

        _shard_module(module, tp, keep_bias=(rank == 0))

        def prepare_input(mod, inputs, mesh):
            x = inputs[0]
            full = None
            if isinstance(x, DTensor):
                if even and len(x.placements) == 1 and _is_last_dim_shard(x.placements[0], x.dim()):
                    x = x.to_local()
                else:
                    full = x.full_tensor()
            elif isinstance(self.input_layouts[0], Replicate):
                full = x
            elif not _is_last_dim_shard(self.input_layouts[0], x.dim()):
                full = DTensor.from_local(x, mesh, self.input_layouts, run_check=False).full_tensor()
            if full is not None:
                if full.shape[-1] != tp.full:
                    raise ValueError(f"{type(self).__name__}: the full input has {full.shape[-1]} features, "
                                     f"the layer {tp.full}")
                x = full.narrow(-1, tp.start, tp.length)
            elif x.shape[-1] != tp.length:
                raise ValueError(
                    f"{type(self).__name__}: rank {tp.rank}'s input has {x.shape[-1]} features, its shard takes "
                    f"{tp.length} (of {tp.full}); pass input_layouts=Replicate() to give it the full input"
                )
            if pad_width:
                x = _full_row_pad(x, full, pad_width, group, len(tp.sizes))
            return (x, *inputs[1:])

        def prepare_output(mod, outputs, mesh):
            want = self.output_layouts[0]
            if isinstance(want, Replicate):
                out = _all_reduce(outputs, group)
                return out if self.use_local_output else DTensor.from_local(out, mesh, [Replicate()],
                                                                            run_check=False)
            d = DTensor.from_local(outputs, mesh, [Partial()], run_check=False).redistribute(placements=[want])
            return d.to_local() if self.use_local_output else d

        return _install(module, device_mesh, prepare_input, prepare_output)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(input_layouts={self.input_layouts}, output_layouts={self.output_layouts}, "
                f"use_local_output={self.use_local_output}, sizes={self.sizes}, "
                f"full_row_quant={self.full_row_quant})")


def _full_row_pad(x: torch.Tensor, full: Optional[torch.Tensor], width: int, group, world: int) -> torch.Tensor:
    """x (..., k_shard) followed by `width` values that hold the full row's min
    and max (then zeros): the op's per-row quantization range, min(0, min) to
    max(0, max), is then the full row's, so every q_i of the slice is the value
    TP = 1 computes. They meet only the zero group of the shard."""
    src = x if full is None else full
    lo, hi = src.amin(-1, keepdim=True), src.amax(-1, keepdim=True)
    if full is None:
        stats = torch.cat([lo, hi], -1).contiguous()
        t0 = time.perf_counter()
        parts = _all_gather_list(stats, group, world)
        _account("all_gather", time.perf_counter() - t0, stats.numel() * stats.element_size() * world)
        # amin / amax propagate NaN, so a NaN anywhere in the row makes every
        # rank's row NaN, as it does at TP = 1 (gloo's min / max might not).
        allst = torch.stack(parts)
        lo, hi = allst[..., :1].amin(0), allst[..., 1:].amax(0)
    pad = x.new_zeros(*x.shape[:-1], width)
    pad[..., :1] = lo
    pad[..., 1:2] = hi
    return torch.cat([x, pad], -1)


def _vocab_parallel(module: nn.Module, mesh: DeviceMesh, sizes: Optional[Sequence[int]], want: Placement,
                    use_local: bool) -> nn.Module:
    """Row-wise (vocabulary) sharding of an embedding, as torch's RowwiseParallel
    does for nn.Embedding: each rank looks up the ids in its rows, gives zeros
    for the others, and the all-reduce adds one nonzero row to zeros, which
    is exact. The ids must be replicated (every rank sees all of them).

    A QuantizedEmbedding tied to the output head reads the head's buffer, so
    the head must be sharded along n with the same sizes (the Llama plan
    does); an untied one, or an nn.Embedding, has its own table cut here.
    """
    rank, world, group = _mesh_rank(mesh)
    full = module.num_embeddings
    if isinstance(module, QuantizedEmbedding):
        src = module.weight_source if module.is_tied else module.packed_weights
        # a tied table may already be cut by its head's style: validate against the full size
        sz = _resolve_sizes({**ops.packed_info(src), "n": full}, 0, world, sizes)
    else:
        sz = _layer_sizes(module, 0, world, sizes)
    tp = TPShard("rowwise", 0, full, sz, rank)
    start, length = tp.start, tp.length
    if isinstance(module, QuantizedEmbedding):
        if not module.is_tied:
            module.packed_weights = narrow(module.packed_weights, 0, start, length)
        module.num_embeddings = length
    else:
        module.weight = nn.Parameter(module.weight.detach()[start:start + length].clone(),
                                     requires_grad=module.weight.requires_grad)
        module.num_embeddings = length
        if module.padding_idx is not None:
            # padding rows only matter for gradients; keep the index local or drop it
            p = module.padding_idx - start
            module.padding_idx = p if 0 <= p < length else None
    module.tp_shard = tp
    state = {}

    def prepare_input(mod, inputs, mesh):
        ids = inputs[0]
        if isinstance(ids, DTensor):
            ids = ids.full_tensor()
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= full):
            raise IndexError(f"embedding ids must be in [0, {full}), got [{int(ids.min())}, {int(ids.max())}]")
        if isinstance(mod, QuantizedEmbedding) and mod.is_tied:
            n = ops.packed_info(mod.weight_source)["n"]
            if n != length:
                raise ValueError(
                    f"this embedding reads its tied output head's packed buffer, which holds {n} rows; rank "
                    f"{rank}'s vocabulary shard has {length}: shard the head with "
                    f"QuantizedColwiseParallel(sizes={tp.sizes}) too"
                )
        local = ids - start
        mask = (local < 0) | (local >= length)
        state["mask"] = mask
        return (local.masked_fill(mask, 0), *inputs[1:])

    def prepare_output(mod, outputs, mesh):
        out = outputs.masked_fill(state.pop("mask").unsqueeze(-1), 0.0)
        if isinstance(want, Replicate):
            out = _all_reduce(out, group)
            return out if use_local else DTensor.from_local(out, mesh, [Replicate()], run_check=False)
        d = DTensor.from_local(out, mesh, [Partial()], run_check=False).redistribute(placements=[want])
        return d.to_local() if use_local else d

    return _install(module, mesh, prepare_input, prepare_output)
