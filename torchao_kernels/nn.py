"""QuantizedLinear and quantize_: swap nn.Linear for low-bit packed layers."""
from __future__ import annotations

import logging
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from . import ops
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

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        bits: int = 4,
        group_size: Optional[int] = 32,
        has_zeros: bool = False,
        target: Optional[str] = None,
    ) -> "QuantizedLinear":
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be an nn.Linear, got {type(linear).__name__}")
        w = linear.weight.detach()
        if group_size is None or group_size == -1:
            group_size = w.shape[1]
        q, s, z = quantize_weight(w, bits, group_size, has_zeros)
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

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        # The packed buffer's size depends on its format and shape, so adopt the
        # saved tensor instead of copying into the current one.
        key = prefix + "packed_weights"
        if key in state_dict:
            self.packed_weights = state_dict[key].detach().clone().contiguous()
            try:
                self._read_header()
            except (ValueError, RuntimeError) as e:
                error_msgs.append(f"{key}: {e}")
        elif strict:
            missing_keys.append(key)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}, "
            f"group_size={self.group_size}, has_zeros={self.has_zeros}, bias={self.has_bias}, "
            f"format={self.format}"
        )


def quantize_(
    model: nn.Module,
    bits: int = 4,
    group_size: Optional[int] = 32,
    has_zeros: bool = False,
    filter_fn: Optional[Callable[[nn.Module, str], bool]] = None,
    target: Optional[str] = None,
) -> Dict[str, List[Tuple[str, str]]]:
    """Replaces, in place, every nn.Linear of `model` (that filter_fn(module, fqn)
    accepts) by a QuantizedLinear. Layers that cannot be quantized (k not a
    multiple of group_size, ...) are left as they are.

    Returns {"quantized": [(fqn, description)], "skipped": [(fqn, reason)]}.
    """
    report: Dict[str, List[Tuple[str, str]]] = {"quantized": [], "skipped": []}
    targets = [
        (fqn, mod)
        for fqn, mod in model.named_modules()
        if isinstance(mod, nn.Linear) and (filter_fn is None or filter_fn(mod, fqn))
    ]
    if isinstance(model, nn.Linear) and targets and targets[0][0] == "":
        raise ValueError("quantize_ replaces submodules; wrap a bare nn.Linear in a container")
    for fqn, mod in targets:
        g = mod.in_features if group_size in (None, -1) else group_size
        if mod.in_features % g or g % 16:
            reason = f"in_features={mod.in_features} is not a multiple of group_size={g}"
            report["skipped"].append((fqn, reason))
            logger.info("torchao_kernels.quantize_: skipping %s: %s", fqn, reason)
            continue
        q = QuantizedLinear.from_linear(mod, bits=bits, group_size=g, has_zeros=has_zeros, target=target)
        parent_name, _, child = fqn.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, q)
        report["quantized"].append((fqn, q.extra_repr()))
    return report
