"""QuantConfig: quantize_'s arguments as one object, in torchao's idiom.

    config = torchao_kernels.QuantConfig(bits=4, group_size=32, has_zeros=True,
                                         overrides={"lm_head": 8})
    torchao_kernels.quantize_(model, config)            # returns the report
    torchao.quantization.quantize_(model, config)       # torchao's own flow, same layers

With torchao installed, QuantConfig is an AOBaseConfig (a virtual subclass)
and its handler is registered in torchao's handler table as soon as torchao's
transform_module is imported (before or after this package), so torchao's
quantize_ swaps each nn.Linear its filter accepts for a QuantizedLinear.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import importlib.util
import logging
import re
import sys
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from ._after_import import after_import
from ._format_limits import GROUP_MULTIPLE, MAX_GROUP_SIZE, MAX_GROUP_SIZE_WHY
from .quant import METHODS, check_bits, is_group_size

__all__ = ["QuantConfig", "LayerConfig"]

logger = logging.getLogger("torchao_kernels")

_OVERRIDE_KEYS = ("bits", "group_size", "has_zeros", "method", "scale_dtype")


@dataclasses.dataclass(frozen=True)
class LayerConfig:
    """What one layer is quantized with (after overrides)."""
    bits: int
    group_size: Optional[int]
    has_zeros: bool
    method: str
    scale_dtype: Optional[torch.dtype]


def check_group_size(group_size) -> None:
    """The part of quantize_weight's check that does not depend on k."""
    if group_size is None or (group_size == -1 and not isinstance(group_size, bool)):
        return
    if not is_group_size(group_size):
        raise ValueError(
            f"group_size must be a multiple of {GROUP_MULTIPLE} (that divides in_features), or None / -1 for per "
            f"channel, got {group_size!r}"
        )
    if group_size > MAX_GROUP_SIZE:
        raise ValueError(f"group_size must be at most {MAX_GROUP_SIZE} ({MAX_GROUP_SIZE_WHY}), got {group_size}")


def check_method(method) -> None:
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(repr(m) for m in METHODS)}, got {method!r}")


def check_scale_dtype(scale_dtype) -> None:
    if scale_dtype not in (None, torch.float32, torch.bfloat16):
        raise ValueError(f"scale_dtype must be torch.float32, torch.bfloat16 or None, got {scale_dtype}")


def _check_bool(name: str, v) -> None:
    if not isinstance(v, bool):
        raise ValueError(f"{name} must be True or False, got {v!r}")


def _compile_pattern(pattern: str):
    """'re:<regex>' (full match, as torchao's FqnToConfig) or a glob on the layer's name."""
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"overrides: a key must be a non-empty layer name pattern (str), got {pattern!r}")
    if pattern.startswith("re:"):
        try:
            rx = re.compile(pattern[3:])
        except re.error as e:
            raise ValueError(f"overrides: {pattern!r} is not a valid regular expression: {e}") from None
        return lambda fqn: rx.fullmatch(fqn) is not None
    return lambda fqn: fnmatch.fnmatchcase(fqn, pattern)


def _normalize_override(pattern: str, value) -> Optional[Dict[str, Any]]:
    """None (keep the layer in float), an int (bits), or a dict of LayerConfig fields."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        value = {"bits": value}
    if isinstance(value, QuantConfig):
        whole = [f.name for f in dataclasses.fields(QuantConfig)  # an empty overrides mapping is none
                 if f.name not in _OVERRIDE_KEYS and f.name != "version"
                 and (getattr(value, f.name) or None if f.name == "overrides" else getattr(value, f.name)) != f.default]
        if whole:
            raise ValueError(f"overrides[{pattern!r}]: a QuantConfig as a layer's setting gives its "
                             f"{', '.join(_OVERRIDE_KEYS)}; its {', '.join(whole)} would be ignored (they "
                             "apply to a whole model: give them to quantize_)")
        value = {k: getattr(value, k) for k in _OVERRIDE_KEYS}
    if not isinstance(value, Mapping):
        raise ValueError(
            f"overrides[{pattern!r}] must be None (keep in float), an int (bits) or a dict with keys "
            f"{', '.join(_OVERRIDE_KEYS)}, got {value!r}"
        )
    unknown = set(value) - set(_OVERRIDE_KEYS)
    if unknown:
        raise ValueError(f"overrides[{pattern!r}]: unknown key(s) {sorted(unknown)}; allowed: "
                         f"{', '.join(_OVERRIDE_KEYS)}")
    try:
        if "bits" in value:
            check_bits(value["bits"])
        if "group_size" in value:
            check_group_size(value["group_size"])
        if "has_zeros" in value:
            _check_bool("has_zeros", value["has_zeros"])
        if "method" in value:
            check_method(value["method"])
        if "scale_dtype" in value:
            check_scale_dtype(value["scale_dtype"])
    except ValueError as e:
        raise ValueError(f"overrides[{pattern!r}]: {e}") from None
    return dict(value)


@dataclasses.dataclass
class QuantConfig:
    """Everything quantize_ takes besides the model, filter_fn and progress.

    bits, group_size, has_zeros, scale_dtype, method: as quantize_weight
      (method "search" by default, "rtn" for round to nearest, "gptq" for
      error feedback through the calibration's second moments: needs
      calibration).
    lm_head: quantize the output head (default True).
    calibration: a torchao_kernels.Calibration (from calibrate()) that weights
      the search's error per input channel; None: unweighted.
    overrides: {layer name pattern: setting}, first match wins, in order. A
      pattern is a glob on the layer's name ("lm_head", "*.down_proj",
      "model.layers.0.*") or "re:<regex>" (full match). A setting is an int
      (bits), a dict with some of bits / group_size / has_zeros / method /
      scale_dtype, or None to keep the layer in float. E.g. {"lm_head": 8}
      keeps the output head at 8 bits, as llama.cpp keeps its output tensor
      at a higher precision.
    target: packed format (None: this CPU's best).
    """

    bits: int = 4
    group_size: Optional[int] = 32
    has_zeros: bool = False
    method: str = "search"
    scale_dtype: Optional[torch.dtype] = None
    lm_head: bool = True
    # Replace nn.Embedding layers too (a tied one shares the output head's buffer).
    # torchao's own quantize_ hands over only what its filter_fn selects
    # (nn.Linear by default): embeddings are converted by torchao_kernels.quantize_.
    embeddings: bool = True
    calibration: Optional[Any] = None
    overrides: Optional[Mapping[str, Any]] = None
    target: Optional[str] = None

    def __post_init__(self):
        check_bits(self.bits)
        check_group_size(self.group_size)
        _check_bool("has_zeros", self.has_zeros)
        check_method(self.method)
        check_scale_dtype(self.scale_dtype)
        _check_bool("lm_head", self.lm_head)
        _check_bool("embeddings", self.embeddings)
        if self.target is not None and not isinstance(self.target, str):
            raise ValueError(f"target must be a format name (str) or None, got {self.target!r}")
        if self.calibration is not None:
            from .calibrate import Calibration

            if not isinstance(self.calibration, Calibration):
                raise ValueError(f"calibration must be a torchao_kernels.Calibration (from calibrate()), "
                                 f"got {type(self.calibration).__name__}")
            if self.method == "rtn":
                raise ValueError("calibration weights the search's error; method='rtn' does not use it")
        if self.overrides is not None and not isinstance(self.overrides, Mapping):
            raise ValueError(f"overrides must be a mapping {{layer name pattern: setting}}, got "
                             f"{type(self.overrides).__name__}")
        self._rules = [(p, _compile_pattern(p), _normalize_override(p, v))
                       for p, v in (self.overrides or {}).items()]
        for p, _, v in self._rules:
            if v is not None and v.get("method", self.method) == "rtn" and self.calibration is not None:
                raise ValueError(f"overrides[{p!r}]: method='rtn' does not use the calibration")
        uses_gptq = self.method == "gptq" or any(
            v is not None and v.get("method") == "gptq" for _, _, v in self._rules)
        if uses_gptq:
            if self.calibration is None:
                raise ValueError("method='gptq' needs calibration=torchao_kernels.calibrate(model, batches) "
                                 "(each layer's input second moment)")
            if not self.calibration.has_second_moment:
                raise ValueError("method='gptq' needs a calibration with second moments: "
                                 "torchao_kernels.calibrate(..., second_moment=True) (the default)")
        _register_with_torchao_if_loaded()
        object.__setattr__(self, "_ready", True)

    def __setattr__(self, name, value):
        # A field changed after construction is checked, and the overrides'
        # rules rebuilt, as at construction (else a new overrides mapping
        # would be described but not applied); a refused value is put back.
        # Each assignment is checked alone: to change fields that only make
        # sense together (method and calibration), use dataclasses.replace.
        if name.startswith("_") or name == "version" or not self.__dict__.get("_ready"):
            object.__setattr__(self, name, value)
            return
        missing = object()
        old = self.__dict__.get(name, missing)
        object.__setattr__(self, name, value)
        try:
            self.__post_init__()
        except Exception:
            if old is missing:
                object.__delattr__(self, name)
            else:
                object.__setattr__(self, name, old)
            raise

    # AOBaseConfig's instance field, for torchao's serialization helpers
    version: int = dataclasses.field(default=1, repr=False)

    @property
    def default(self) -> LayerConfig:
        return LayerConfig(self.bits, self.group_size, self.has_zeros, self.method, self.scale_dtype)

    def layer(self, fqn: Union[str, Sequence[str], None]) -> Tuple[Optional[LayerConfig], Optional[str]]:
        """(settings, matching pattern) for the layer named fqn, or registered
        under every name of the sequence fqn (a module shared by two parents):
        the first rule, in order, that matches any of the names; settings None:
        an override keeps it in float."""
        base = self.default
        if fqn is None:
            return base, None
        names = [fqn] if isinstance(fqn, str) else list(fqn)
        for pattern, match, value in self._rules:
            if any(match(name) for name in names):
                if value is None:
                    return None, pattern
                return dataclasses.replace(base, **value), pattern
        return base, None

    def describe(self) -> str:
        g = "per channel" if self.group_size in (None, -1) else f"g{self.group_size}"
        s = f"{self.bits}-bit {g} {'zeros' if self.has_zeros else 'sym'} {self.method}"
        if self.calibration is not None:
            s += " calibrated"
        if self.overrides:
            s += " overrides " + ", ".join(f"{p}={v}" for p, v in self.overrides.items())
        return s


# ---------------------------------------------------------------------------
# torchao's quantize_


def _torchao_handler(module: nn.Module, config: QuantConfig) -> nn.Module:
    """torchao's transform for QuantConfig: an nn.Linear becomes a QuantizedLinear."""
    from .nn import QuantizedLinear, _skip_reason

    if not isinstance(module, nn.Linear):
        return module
    if not config.lm_head:
        raise ValueError("QuantConfig(lm_head=False) needs the whole model to find its output head: use "
                         "torchao_kernels.quantize_(model, config), or a filter_fn that leaves the head out")
    fqn = config.calibration.name_of(module) if config.calibration is not None else None
    if config.calibration is not None and fqn is None and not config.__dict__.get("_warned_unmatched"):
        # torchao passes modules, not names: a calibration recorded on another
        # model object (a copy, a reloaded Calibration) matches none of them
        object.__setattr__(config, "_warned_unmatched", True)
        logger.warning("torchao_kernels.QuantConfig: the calibration has no statistics for a %s(%d, %d) of this "
                       "model (recorded on another model object, a copy, or filtered out when calibrating): it "
                       "and any other such layer are quantized uncalibrated (method 'search'). "
                       "torchao_kernels.quantize_(model, config) matches the calibration by layer name.",
                       type(module).__name__, module.in_features, module.out_features)
    if config.overrides and fqn is None:
        raise ValueError(
            "QuantConfig.overrides match layer names, which torchao's quantize_ does not pass to a handler: "
            "use torchao_kernels.quantize_(model, config), or torchao's FqnToConfig with one QuantConfig per name"
        )
    settings, _ = config.layer(fqn)
    if settings is None:
        return module
    reason = _skip_reason(module, settings.group_size, True, False, False)
    if reason is not None:
        logger.info("torchao_kernels.QuantConfig: leaving %s in float: %s", fqn or type(module).__name__, reason)
        return module
    importance = config.calibration.importance(fqn, module) if config.calibration is not None else None
    method, hessian = settings.method, None
    if method == "gptq":
        hessian = config.calibration.hessian(fqn, module)
        if hessian is None:
            method = "search"
    return QuantizedLinear.from_linear(
        module, bits=settings.bits, group_size=settings.group_size, has_zeros=settings.has_zeros,
        target=config.target, scale_dtype=settings.scale_dtype, method=method, importance=importance,
        hessian=hessian)


_TORCHAO_MODULE = "torchao.quantization.transform_module"
_registered = False


def _register_with_torchao_if_loaded() -> bool:
    global _registered
    if _registered:
        return True
    tm = sys.modules.get(_TORCHAO_MODULE)
    core = sys.modules.get("torchao.core.config")
    if tm is None or core is None or not hasattr(tm, "_QUANTIZE_CONFIG_HANDLER"):
        return False
    core.AOBaseConfig.register(QuantConfig)
    tm._QUANTIZE_CONFIG_HANDLER[QuantConfig] = _torchao_handler
    _registered = True
    return True


# Registered right after torchao's handler table is created, so the order of
# `import torchao` and `import torchao_kernels` does not matter, and torchao is
# never imported just for this.
if not _register_with_torchao_if_loaded() and importlib.util.find_spec("torchao") is not None:
    after_import(_TORCHAO_MODULE, _register_with_torchao_if_loaded)
