"""QuantizedLinear and quantize_: swap nn.Linear for low-bit packed layers."""
from __future__ import annotations

import logging
import sys
import warnings
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from . import ops
from ._format_limits import GROUP_MULTIPLE, MAX_GROUP_SIZE, MAX_GROUP_SIZE_WHY
from .embedding import QuantizedEmbedding, find_ties, quantize_embeddings_  # noqa: F401
from .quant import quantize_weight

__all__ = ["QuantizedLinear", "quantize_"]

logger = logging.getLogger("torchao_kernels")


class QuantizedLinear(nn.Module):
    """A linear layer with groupwise b-bit weights and int8 dynamic activations.

    The weights live in one packed buffer (`packed_weights`, a self-describing
    int8 tensor); forward calls torch.ops.torchao.linear_8bit_act_xbit_weight.
    Inputs may be float32, bfloat16 or float16 with any leading dims.
    """

    def __init__(self, in_features: int, out_features: int, packed_weights: torch.Tensor):
        super().__init__()
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        self.register_buffer("packed_weights", packed_weights)
        self._read_header()

    def _read_header(self) -> None:
        info = ops.packed_info(self.packed_weights)
        if info["weights_only"]:
            raise ValueError("packed_weights is a weights-only embedding table (torchao::_pack_embedding_{b}bit), "
                             "which carries no scales; QuantizedLinear needs a buffer of torchao_kernels.pack")
        if info["n"] != self.out_features or info["k"] != self.in_features:
            raise ValueError(
                f"packed_weights are for (out_features={info['n']}, in_features={info['k']}), "
                f"module is ({self.out_features}, {self.in_features})"
            )
        self.bits = info["bits"]
        self.group_size = info["group_size"]
        self.has_zeros = info["has_zeros"]
        self.has_bias = info["has_bias"]
        self.format = info["format"]
        self.scale_dtype = info["scale_dtype"]

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        bits: int = 4,
        group_size: Optional[int] = 32,
        has_zeros: bool = False,
        target: Optional[str] = None,
        scale_dtype: Optional[torch.dtype] = None,
        *,
        method: str = "search",
        importance: Optional[torch.Tensor] = None,
        hessian: Optional[torch.Tensor] = None,
    ) -> "QuantizedLinear":
        """Quantizes and packs `linear` (see quantize_weight for bits, group_size,
        has_zeros, scale_dtype, method, importance and hessian; target names a packed format)."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be an nn.Linear, got {type(linear).__name__}")
        w = linear.weight.detach()
        if group_size is None or group_size == -1:
            group_size = w.shape[1]
        q, s, z = quantize_weight(w, bits, group_size, has_zeros, scale_dtype=scale_dtype, method=method,
                                  importance=importance, hessian=hessian)
        bias = None if linear.bias is None else linear.bias.detach().to(torch.float32)
        packed = ops.pack(q, s, z, bits=bits, group_size=group_size, bias=bias, target=target)
        return cls(linear.in_features, linear.out_features, packed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.torchao.linear_8bit_act_xbit_weight(
            x, self.packed_weights, self.group_size, self.out_features, self.in_features
        )

    def repack_(self, target: Optional[str] = None) -> "QuantizedLinear":
        """Converts the packed weights to this CPU's best (or the named) format, in place."""
        self.packed_weights = ops.repack(self.packed_weights, target)
        self._read_header()
        return self

    def shard(self, dim: int, index: int, count: Optional[int] = None, *, sizes=None,
              bias: str = "first") -> "QuantizedLinear":
        """A new QuantizedLinear holding shard `index` of `count` of this layer:
        dim 0 cuts the output features (column-parallel), dim 1 the input
        features (row-parallel; the bias goes to shard 0 only). Same values,
        no requantization; see torchao_kernels.shard."""
        from .distributed.shard import shard

        packed = shard(self.packed_weights, dim, index, count, sizes=sizes, bias=bias)
        info = ops.packed_info(packed)
        return type(self)(info["k"], info["n"], packed)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        ops.adopt_packed_buffer(self, state_dict, prefix, strict, missing_keys, unexpected_keys,
                                error_msgs)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}, "
            f"group_size={self.group_size}, has_zeros={self.has_zeros}, bias={self.has_bias}, "
            f"format={self.format}" + (", scales=bfloat16" if self.scale_dtype == "bfloat16" else "")
        )


def quantize_(
    model: nn.Module,
    bits=4,
    group_size: Optional[int] = 32,
    has_zeros: bool = False,
    filter_fn: Optional[Callable[[nn.Module, str], bool]] = None,
    target: Optional[str] = None,
    *,
    lm_head: bool = True,
    progress: Optional[bool] = None,
    scale_dtype: Optional[torch.dtype] = None,
    method: str = "search",
    calibration=None,
    overrides=None,
    embeddings: bool = True,
) -> Dict[str, List[Tuple[str, str]]]:
    """Replaces, in place, every nn.Linear of `model` (that filter_fn(module, fqn)
    accepts) by a QuantizedLinear. filter_fn sees the nn.Linear layers only, as
    torchao's does; embeddings are chosen by `embeddings` and by overrides
    (None keeps one in float). Layers that
    cannot be quantized are left as they are and reported with the reason: k
    (in_features) not a multiple of group_size, an empty layer, a weight that is
    not a float tensor on the CPU (e.g. on the meta device), a subclass that
    overrides forward, a layer already cut for tensor parallelism, or the
    out_proj of an nn.MultiheadAttention (which reads the weight directly
    instead of calling the module). Arguments are checked before any layer
    changes, and an error while quantizing (e.g. a calibration recorded on
    another model) puts back every layer already replaced; a call that
    converts no layer warns with the most common reason.

    quantize_(model, config) takes a torchao_kernels.QuantConfig instead of
    the keyword arguments (filter_fn and progress may still be given).

    method: "search" (default: per group, the scale and zero point with the
      smallest error of the dequantized weight, never worse than round to
      nearest), "rtn" (round to nearest) or "gptq" (rounding with error
      feedback through each layer's input second moment, from calibration,
      never worse per row than the calibrated search or round to nearest in
      the layer's expected output error); see quantize_weight.
    calibration: a Calibration from torchao_kernels.calibrate(model, batches):
      the search weights each weight's error by its input channel's mean
      squared activation (layers it did not see are searched unweighted).
    overrides: {layer name pattern: int bits | dict | None}, e.g.
      {"lm_head": 8} or {"*.down_proj": {"bits": 8, "group_size": 64}}; None
      keeps the matching layers in float. First match wins; see QuantConfig.

    embeddings: also replace every nn.Embedding by a QuantizedEmbedding (same
      settings, overrides apply by name). An embedding whose weight is the output
      head's (tied, e.g. Hugging Face tie_word_embeddings) reads the head's
      packed buffer: one low-bit copy serves both. False keeps embeddings in float.
    lm_head: whether to quantize the output head, i.e. model.get_output_embeddings()
      (Hugging Face models) or any nn.Linear whose weight is shared with an
      nn.Embedding. A head whose weight is tied to the input embedding gets its
      own packed copy; the embedding keeps the float weight. False leaves the
      head in float (reported in "skipped").
    scale_dtype: torch.bfloat16 rounds the scales to bfloat16 and stores them in
      2 bytes (see quantize_weight): ~10% less to read per call at 4 bits;
      torch.float32 keeps them; None (default): bfloat16 for layers whose
      weight is bfloat16, as torchao does.
    progress: a progress bar (tqdm, on stderr) while quantizing and packing;
      None shows it when stderr is a terminal and there are 8 or more layers.

    Returns {"quantized": [(fqn, description)], "skipped": [(fqn, reason)]}, in
    module order; filter_fn's rejections appear in neither list.
    """
    from .config import QuantConfig

    if isinstance(bits, QuantConfig) and callable(group_size) and filter_fn is None:
        # torchao's order: quantize_(model, config, filter_fn)
        group_size, filter_fn = 32, group_size
    if isinstance(bits, QuantConfig):
        given = {k: v for k, v in (("group_size", group_size != 32), ("has_zeros", has_zeros is not False),
                                   ("target", target is not None), ("lm_head", lm_head is not True),
                                   ("scale_dtype", scale_dtype is not None), ("method", method != "search"),
                                   ("calibration", calibration is not None), ("overrides", overrides is not None),
                                   ("embeddings", embeddings is not True))
                 if v}
        if given:
            raise TypeError(f"quantize_(model, config): {', '.join(given)} belong in the QuantConfig")
        config = bits
    else:
        config = QuantConfig(bits=bits, group_size=group_size, has_zeros=has_zeros, method=method,
                             scale_dtype=scale_dtype, lm_head=lm_head, calibration=calibration,
                             overrides=overrides, target=target, embeddings=embeddings)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if filter_fn is not None and not callable(filter_fn):
        raise ValueError(f"filter_fn must be a callable (module, fqn) -> bool or None, got {filter_fn!r}")
    if progress is not None and not isinstance(progress, bool):
        raise ValueError(f"progress must be True, False or None, got {progress!r}")
    return _quantize_with(model, config, filter_fn, progress)


def _quantize_with(model: nn.Module, config, filter_fn, progress) -> Dict[str, List[Tuple[str, str]]]:
    # All or nothing: an error in any layer (a calibration recorded on another
    # model, a non-finite weight) puts back every module already swapped.
    children = [(parent, dict(parent._modules)) for parent in model.modules()]
    try:
        return _quantize_layers(model, config, filter_fn, progress)
    except BaseException:
        for parent, saved in children:
            for name, child in saved.items():
                parent._modules[name] = child
        raise


def _quantize_layers(model: nn.Module, config, filter_fn, progress) -> Dict[str, List[Tuple[str, str]]]:
    lm_head, target, calibration = config.lm_head, config.target, config.calibration
    report: Dict[str, List[Tuple[str, str]]] = {"quantized": [], "skipped": []}
    # Every name a Linear is registered under: a module shared by two parents is
    # replaced at both places by the same QuantizedLinear.
    names: Dict[int, List[str]] = {}
    linears: List[Tuple[str, nn.Linear]] = []
    for fqn, mod in model.named_modules(remove_duplicate=False):
        if isinstance(mod, nn.Linear):
            if id(mod) not in names:
                linears.append((fqn, mod))
            names.setdefault(id(mod), []).append(fqn)
    targets = [(fqn, mod) for fqn, mod in linears if filter_fn is None or filter_fn(mod, fqn)]
    _warn_unmatched_overrides(model, config)
    if isinstance(model, nn.Linear) and targets and targets[0][0] == "":
        raise ValueError("quantize_ replaces submodules; wrap a bare nn.Linear in a container")

    heads = _output_heads(model)
    shared = _shared_weight_names(model)
    embed = getattr(config, "embeddings", True)
    ties = find_ties(model) if embed else {}
    tied_heads = set(ties.values())
    mha_out = {id(m.out_proj) for m in model.modules() if isinstance(m, nn.MultiheadAttention)}

    for fqn, mod in _progress(targets, progress, f"quantize_ {config.describe()}"):
        settings, pattern = config.layer(names[id(mod)])
        if settings is None:
            reason = f"overrides[{pattern!r}] keeps it in float"
        else:
            reason = _skip_reason(mod, settings.group_size, lm_head, id(mod) in heads, id(mod) in mha_out)
        if reason is not None:
            report["skipped"].append((fqn, reason))
            logger.info("torchao_kernels.quantize_: skipping %s: %s", fqn, reason)
            continue
        g = mod.in_features if settings.group_size in (None, -1) else settings.group_size
        importance = hessian = None
        fell_back = False
        method = settings.method
        if calibration is not None and method != "rtn":
            importance = calibration.importance(fqn, mod)
            if importance is not None and importance.shape != (mod.in_features,):
                raise ValueError(f"quantize_: the calibration's statistics of {fqn!r} are for "
                                 f"{importance.shape[0]} input channels, but the layer has in_features="
                                 f"{mod.in_features}: was the calibration recorded on another model?")
        if method == "gptq":
            hessian = calibration.hessian(fqn, mod)
            if hessian is None:      # a layer the calibration did not see: the search
                method = "search"
                fell_back = True
                logger.info("torchao_kernels.quantize_: %s was not calibrated: method='search' instead of 'gptq'", fqn)
        q = QuantizedLinear.from_linear(mod, bits=settings.bits, group_size=g, has_zeros=settings.has_zeros,
                                        target=target, scale_dtype=settings.scale_dtype, method=method,
                                        importance=importance, hessian=hessian)
        for name in names[id(mod)]:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, q)
        desc = q.extra_repr()
        if fell_back:
            desc += "; method 'search', not 'gptq': the calibration did not see this layer"
        own = {f + ".weight" for f in names[id(mod)]}
        tied = [n for n in shared.get(_storage_key(mod.weight), []) if n not in own]
        if tied and fqn in tied_heads:
            desc += f"; weight is tied to {', '.join(tied)}: one packed buffer, read by both"
        elif tied:
            desc += f"; weight was tied to {', '.join(tied)}: own packed copy, the float original stays there"
        report["quantized"].append((fqn, desc))
    if embed:
        quantize_embeddings_(model, config, ties, report)
    if not report["quantized"]:
        already = sum(isinstance(m, QuantizedLinear) for m in model.modules())
        _warn_nothing_converted(report["skipped"], len(linears), already)
    return report


def _warn_unmatched_overrides(model: nn.Module, config) -> None:
    """An overrides pattern that names no layer is most likely a typo: say so."""
    kinds = (nn.Linear, nn.Embedding) if getattr(config, "embeddings", True) else (nn.Linear,)
    layers = [fqn for fqn, m in model.named_modules(remove_duplicate=False)  # every name of a shared layer
              if isinstance(m, kinds)]
    for pattern, match, _ in getattr(config, "_rules", []):
        if not any(match(fqn) for fqn in layers):
            examples = ", ".join(repr(f) for f in layers[:3]) or "none"
            what = "nn.Linear or nn.Embedding" if len(kinds) == 2 else "nn.Linear (embeddings=False)"
            warnings.warn(f"quantize_: overrides[{pattern!r}] matches no {what} of the "
                          f"model (its layers are named like {examples})", stacklevel=5)


def _warn_nothing_converted(skipped: List[Tuple[str, str]], n_linear: int, n_quantized: int = 0) -> None:
    if not skipped and not n_linear and n_quantized:
        warnings.warn(f"quantize_ converted no layer: the model is already quantized ({n_quantized} "
                      "QuantizedLinear, no nn.Linear left)", stacklevel=5)
        return
    if skipped:
        by_reason: Dict[str, int] = {}
        for _, reason in skipped:
            by_reason[reason] = by_reason.get(reason, 0) + 1
        reason, count = max(by_reason.items(), key=lambda kv: kv[1])
        msg = (f"quantize_ converted no layer: all {len(skipped)} were skipped, {count} of them because "
               f"{reason} (report['skipped'] has every reason)")
    elif n_linear:
        msg = f"quantize_ converted no layer: filter_fn accepted none of the model's {n_linear} nn.Linear"
    else:
        msg = "quantize_ converted no layer: the model has no nn.Linear"
    warnings.warn(msg, stacklevel=5)


def _skip_reason(mod: nn.Linear, group_size: Optional[int], lm_head: bool, is_head: bool,
                 is_mha_out: bool) -> Optional[str]:
    """Why `mod` cannot (or must not) become a QuantizedLinear, or None."""
    if is_head and not lm_head:
        return "output head (lm_head=False keeps it in float)"
    if is_mha_out:
        return "out_proj of an nn.MultiheadAttention, which reads the weight directly"
    reason = _module_skip_reason(mod, nn.Linear)
    if reason is not None:
        return reason
    if mod.weight.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return (f"weight dtype is {mod.weight.dtype}; the op takes float32, bfloat16 or float16 "
                "activations, so the layer's inputs could not run through it")
    k = mod.in_features
    if k == 0 or mod.out_features == 0:
        return f"an empty layer (in_features={k}, out_features={mod.out_features}) has nothing to quantize"
    if group_size in (None, -1):
        return group_size_skip_reason(k, k, "in_features", per_channel=True)
    return group_size_skip_reason(group_size, k, "in_features")


def group_size_skip_reason(g: int, k: int, dim: str, per_channel: bool = False) -> Optional[str]:
    """Why groups of g values along a dimension `dim` of size k cannot be packed, or
    None (the limits of kernels/manifest.toml [format])."""
    what = f"group_size={g}" + (f" (per channel, = {dim})" if per_channel else "")
    if g % GROUP_MULTIPLE:
        return f"{what} is not a multiple of {GROUP_MULTIPLE}"
    if k % g:
        return f"{dim}={k} is not a multiple of group_size={g}"
    if g > MAX_GROUP_SIZE:
        return f"{what} is above {MAX_GROUP_SIZE} ({MAX_GROUP_SIZE_WHY} up to it)"
    return None


def _module_skip_reason(mod: nn.Module, base: type) -> Optional[str]:
    """What keeps a `base` module (nn.Linear, nn.Embedding) from being swapped for
    its packed counterpart, whatever the quantization settings, or None."""
    if type(mod).forward is not base.forward:
        return f"{type(mod).__name__} overrides nn.{base.__name__}.forward; swapping it would drop that behaviour"
    if getattr(mod, "tp_shard", None) is not None:
        # a new module would drop the parallel style's hooks (its collectives)
        return ("parallelized for tensor parallelism (tp_shard); quantize before parallelize_module "
                "(the quantized styles shard packed weights)")
    w = mod.weight
    if w.device.type != "cpu":
        return f"weight is on the {w.device.type} device (the kernels run on the CPU)"
    if not w.is_floating_point():
        return f"weight dtype is {w.dtype}, not a float type"
    return None


def _output_heads(model: nn.Module) -> set:
    """ids of the output head(s): get_output_embeddings() (Hugging Face) and any
    nn.Linear whose weight is an nn.Embedding's weight (tied embeddings)."""
    heads = set()
    get = getattr(model, "get_output_embeddings", None)
    if callable(get):
        try:
            out = get()
        except (NotImplementedError, AttributeError):
            out = None
        if isinstance(out, nn.Linear):
            heads.add(id(out))
    emb = {_storage_key(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    for m in model.modules():
        if isinstance(m, nn.Linear) and _storage_key(m.weight) in emb:
            heads.add(id(m))
    return heads


def _storage_key(t: torch.Tensor):
    """Equal for tensors that are the same memory (tied weights). The tensor's own
    address and shape, not its storage's: loaders may put every weight in one storage."""
    if t.device.type == "meta":
        return ("meta", id(t))
    try:
        # the strides too: a transposed view of a square weight is the same
        # memory and shape but another matrix (its rows are the columns)
        return (t.device.type, t.data_ptr(), tuple(t.shape), tuple(t.stride()))
    except (RuntimeError, NotImplementedError):  # tensor subclasses without plain data
        return ("id", id(t))


def _shared_weight_names(model: nn.Module) -> Dict[tuple, List[str]]:
    """memory -> every parameter name that is it (tied weights have several)."""
    out: Dict[tuple, List[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        out.setdefault(_storage_key(p), []).append(name)
    return out


def _progress(items: list, progress: Optional[bool], desc: str):
    if progress is None:
        progress = len(items) >= 8 and sys.stderr.isatty()
    if not progress:
        return items
    try:
        from tqdm.auto import tqdm
    except ImportError:
        logger.info("torchao_kernels.quantize_: tqdm is not installed, no progress bar")
        return items
    return tqdm(items, desc=desc, unit="layer", file=sys.stderr, dynamic_ncols=True)
