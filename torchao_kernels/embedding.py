"""QuantizedEmbedding: groupwise b-bit embedding tables, looked up by the
torchao::shared_embedding_xbit op straight from a packed buffer.

An untied embedding owns its buffer (format n1k4: each row's bytes are
contiguous, so a lookup reads only its row). A tied one (an input embedding
whose weight is also the output head's) reads the QuantizedLinear's buffer:
one packed copy of the weight serves both ends of the model, and the state
dict, torch.export and ExecuTorch programs hold it once.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

from . import ops
from .quant import quantize_weight

__all__ = ["QuantizedEmbedding", "find_ties", "quantize_embeddings_"]

# Untied tables: the portable row-per-block layout. Lookups read whole rows
# (n16k4 spreads a row over every 64-byte unit of its 16-row block).
EMBEDDING_FORMAT = "n1k4"


class QuantizedEmbedding(nn.Module):
    """An embedding whose table is a packed low-bit buffer (see module docstring).

    forward(indices) returns the dequantized rows, scale * (q - zero), exactly as
    dequantize_weight gives them, in `dtype` (the original weight's dtype).
    """

    def __init__(self, num_embeddings: int, embedding_dim: int,
                 packed_weights: Optional[torch.Tensor] = None, *,
                 tied_to: Optional[nn.Module] = None, padding_idx: Optional[int] = None,
                 dtype: torch.dtype = torch.float32):
        super().__init__()
        if (packed_weights is None) == (tied_to is None):
            raise ValueError("QuantizedEmbedding needs exactly one of packed_weights or tied_to")
        self.num_embeddings = int(num_embeddings)
        self.embedding_dim = int(embedding_dim)
        self.padding_idx = padding_idx
        self.dtype = dtype
        if tied_to is not None:
            if not hasattr(tied_to, "packed_weights"):
                raise TypeError(f"tied_to must be a QuantizedLinear, got {type(tied_to).__name__}")
            # Held in a tuple so it is not registered as a submodule: the buffer
            # then belongs to the linear layer alone (one copy in state_dict,
            # named_buffers and exported programs), and a state_dict load that
            # replaces the linear's buffer is seen here too.
            self._tied = (tied_to,)
            self.tied_name: Optional[str] = None
        else:
            self._tied = ()
            self.tied_name = None
            self.register_buffer("packed_weights", packed_weights)
        self._read_header()

    # -- construction

    @classmethod
    def from_embedding(cls, embedding: nn.Embedding, bits: int = 4, group_size: Optional[int] = 32,
                       has_zeros: bool = False, scale_dtype: Optional[torch.dtype] = None,
                       target: Optional[str] = EMBEDDING_FORMAT, **quantize_kw) -> "QuantizedEmbedding":
        """Quantizes an nn.Embedding's table groupwise (quantize_weight) and packs it."""
        if not isinstance(embedding, nn.Embedding):
            raise TypeError(f"embedding must be an nn.Embedding, got {type(embedding).__name__}")
        w = embedding.weight.detach()
        if group_size is None or group_size == -1:
            group_size = w.shape[1]
        q, s, z = quantize_weight(w, bits, group_size, has_zeros, scale_dtype=scale_dtype, **quantize_kw)
        packed = ops.pack(q, s, z, bits=bits, group_size=group_size, target=target)
        return cls(embedding.num_embeddings, embedding.embedding_dim, packed,
                   padding_idx=embedding.padding_idx, dtype=w.dtype)

    @classmethod
    def tied(cls, linear: nn.Module, padding_idx: Optional[int] = None,
             dtype: torch.dtype = torch.float32, name: Optional[str] = None) -> "QuantizedEmbedding":
        """An embedding that looks rows up in `linear`'s packed buffer (a QuantizedLinear
        whose weight, out_features x in_features, is the table)."""
        e = cls(linear.out_features, linear.in_features, tied_to=linear, padding_idx=padding_idx,
                dtype=dtype)
        e.tied_name = name
        return e

    # -- state

    @property
    def weight_source(self) -> torch.Tensor:
        """The packed buffer the lookups read (the tied linear's, when tied)."""
        return self._tied[0].packed_weights if self._tied else self.packed_weights

    @property
    def is_tied(self) -> bool:
        return bool(self._tied)

    def _read_header(self) -> None:
        info = ops.packed_info(self.weight_source)
        if info["weights_only"]:
            raise ValueError("the packed weights are a weights-only embedding table "
                             "(torchao::_pack_embedding_{b}bit), which carries no scales; QuantizedEmbedding "
                             "reads a buffer of torchao_kernels.pack (its scales inside)")
        if info["n"] != self.num_embeddings or info["k"] != self.embedding_dim:
            self._check_tied_shape()  # a tied head's buffer: the message says what to do
            raise ValueError(
                f"packed weights are for ({info['n']} x {info['k']}), the embedding is "
                f"({self.num_embeddings} x {self.embedding_dim})")
        self.bits = info["bits"]
        self.group_size = info["group_size"]
        self.has_zeros = info["has_zeros"]
        self.format = info["format"]
        self.scale_dtype = info["scale_dtype"]

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        if self._tied:  # the buffer is the tied linear's, loaded there
            return
        ops.adopt_packed_buffer(self, state_dict, prefix, strict, missing_keys, unexpected_keys,
                                error_msgs)

    def _apply(self, fn, recurse=True):
        # model.to(dtype) / .half() / .bfloat16() / .float(): the rows come out in
        # the new float type, as nn.Embedding's would (the packed buffer is
        # integers, which those casts leave alone, so probe what fn does to a float)
        out = super()._apply(fn, recurse)
        try:
            probe = fn(torch.empty(0, dtype=self.dtype))
        except Exception:  # a cast this module has nothing to follow (e.g. to a device it cannot use)
            return out
        if isinstance(probe, torch.Tensor) and probe.is_floating_point():
            self.dtype = probe.dtype
        return out

    # -- compute

    def _group_size(self) -> int:
        # A tied linear may have loaded (or repacked) another buffer since.
        return self._tied[0].group_size if self._tied else self.group_size

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        try:
            out = torch.ops.torchao.shared_embedding_xbit(
                self.weight_source, self._group_size(), self.num_embeddings, self.embedding_dim, indices)
        except (RuntimeError, ValueError) as e:
            problem = self._tied_shape_problem()  # a tied head changed under it: say so rather than the op's n / k
            if problem:
                raise ValueError(problem) from e
            raise
        return out if self.dtype == torch.float32 else out.to(self.dtype)

    def _check_tied_shape(self) -> None:
        problem = self._tied_shape_problem()
        if problem:
            raise ValueError(problem)

    def _tied_shape_problem(self) -> Optional[str]:
        if not self._tied:
            return None
        info = ops.packed_info(self.weight_source)
        if (info["n"], info["k"]) != (self.num_embeddings, self.embedding_dim):
            return (
                f"this embedding ({self.num_embeddings} x {self.embedding_dim}) is tied to "
                f"{self.tied_name or 'a QuantizedLinear'}, whose packed buffer now holds ({info['n']} x "
                f"{info['k']}) weights: a tied head sharded for tensor parallelism needs its embedding "
                "sharded with the same sizes (QuantizedRowwiseParallel(sizes=...), or parallelize_llama "
                "with embedding=True)")
        return None

    def dequantize(self) -> torch.Tensor:
        """The whole dequantized table (num_embeddings, embedding_dim), float32."""
        self._check_tied_shape()
        idx = torch.arange(self.num_embeddings)
        return torch.ops.torchao.shared_embedding_xbit(
            self.weight_source, self._group_size(), self.num_embeddings, self.embedding_dim, idx)

    def extra_repr(self) -> str:
        if self._tied:
            try:
                self._read_header()
            except (RuntimeError, ValueError) as e:  # printing a model never raises
                return (f"{self.num_embeddings}, {self.embedding_dim}, tied to "
                        f"{self.tied_name or 'a QuantizedLinear'} (its buffer no longer fits: {e})")
        s = (f"{self.num_embeddings}, {self.embedding_dim}, bits={self.bits}, group_size={self.group_size}, "
             f"has_zeros={self.has_zeros}, format={self.format}")
        if self.scale_dtype == "bfloat16":
            s += ", scales=bfloat16"
        if self._tied:
            s += f", tied to {self.tied_name or 'a QuantizedLinear'} (one packed buffer)"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        return s


# ---------------------------------------------------------------------------
# quantize_ support


def find_ties(model: nn.Module) -> Dict[str, str]:
    """{embedding fqn: linear fqn} for every nn.Embedding whose weight is an
    nn.Linear's weight (Hugging Face tie_word_embeddings and the like), found
    before the linears are replaced. The same shape is required: the table is
    the linear's (out_features x in_features) weight."""
    from .nn import _storage_key

    linear_by_weight: Dict[tuple, str] = {}
    for fqn, mod in model.named_modules():
        if isinstance(mod, nn.Linear):
            linear_by_weight.setdefault(_storage_key(mod.weight), fqn)
    ties: Dict[str, str] = {}
    for fqn, mod in model.named_modules():
        if isinstance(mod, nn.Embedding):
            head = linear_by_weight.get(_storage_key(mod.weight))
            if head is not None:
                ties[fqn] = head
    return ties


def _skip_reason(mod: nn.Embedding, group_size: Optional[int]) -> Optional[str]:
    from .nn import _module_skip_reason, group_size_skip_reason

    reason = _module_skip_reason(mod, nn.Embedding)
    if reason is not None:
        return reason
    if mod.max_norm is not None:
        return f"max_norm={mod.max_norm} renormalizes the table in forward"
    k = mod.embedding_dim
    if k == 0 or mod.num_embeddings == 0:
        return (f"an empty table (num_embeddings={mod.num_embeddings}, embedding_dim={k}) has nothing to "
                "quantize")
    per_channel = group_size in (None, -1)
    return group_size_skip_reason(k if per_channel else group_size, k, "embedding_dim", per_channel)


def quantize_embeddings_(model: nn.Module, config, ties: Dict[str, str],
                         report: Dict[str, List[Tuple[str, str]]]) -> None:
    """Replaces the nn.Embedding layers of `model` by QuantizedEmbedding, with the
    config's settings for each layer's name (QuantConfig.layer: its overrides
    apply to embeddings too). An embedding tied to a linear that is now a
    QuantizedLinear reads that layer's packed buffer (one copy for both); others
    get their own buffer. Appends to report["quantized"] / ["skipped"]."""
    import warnings

    from .nn import QuantizedLinear

    names: Dict[int, List[str]] = {}
    embeddings: List[Tuple[str, nn.Embedding]] = []
    for fqn, mod in model.named_modules(remove_duplicate=False):
        if isinstance(mod, nn.Embedding):
            if id(mod) not in names:
                embeddings.append((fqn, mod))
            names.setdefault(id(mod), []).append(fqn)
    for fqn, mod in embeddings:
        settings, pattern = config.layer(names[id(mod)])
        head_fqn = ties.get(fqn)
        head = None
        if head_fqn is not None:
            try:
                head = model.get_submodule(head_fqn)
            except AttributeError:
                head = None
        if settings is None:
            report["skipped"].append((fqn, f"overrides[{pattern!r}] keeps it in float"))
            continue
        if isinstance(head, QuantizedLinear) and _skip_reason(mod, head.group_size) is None:
            q = QuantizedEmbedding.tied(head, padding_idx=mod.padding_idx, dtype=mod.weight.dtype,
                                        name=head_fqn)
            desc = q.extra_repr()
            g = mod.embedding_dim if settings.group_size in (None, -1) else settings.group_size
            scales = "bfloat16" if settings.scale_dtype == torch.bfloat16 else (
                "float32" if settings.scale_dtype == torch.float32 else q.scale_dtype)
            if pattern is not None and ((settings.bits, g, settings.has_zeros, scales) !=
                                        (q.bits, q.group_size, q.has_zeros, q.scale_dtype)
                                        or settings.method != config.method):
                warnings.warn(f"quantize_: overrides[{pattern!r}] names {fqn!r}, which is tied to {head_fqn!r} and "
                              f"reads its packed buffer ({q.bits}-bit, group {q.group_size}): the head's settings "
                              f"apply; override {head_fqn!r} instead", stacklevel=5)
        else:
            reason = _skip_reason(mod, settings.group_size)
            if reason is not None:
                report["skipped"].append((fqn, reason))
                continue
            kw = {}
            if getattr(settings, "method", None) is not None:
                # a table has no input second moment: GPTQ's error feedback
                # does not apply, the search (as for uncalibrated layers) does
                kw["method"] = "search" if settings.method == "gptq" else settings.method
            q = QuantizedEmbedding.from_embedding(mod, bits=settings.bits, group_size=settings.group_size,
                                                  has_zeros=settings.has_zeros,
                                                  scale_dtype=settings.scale_dtype, **kw)
            desc = q.extra_repr()
            if head_fqn is not None:
                desc += f"; weight was tied to {head_fqn}, which stays in float: own packed copy"
        for name in names[id(mod)]:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, q)
        report["quantized"].append((fqn, desc))
