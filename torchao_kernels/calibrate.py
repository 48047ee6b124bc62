"""Activation statistics for activation-aware quantization (the imatrix idea).

calibrate(model, batches) runs the float model on a few batches of the user's
own data and records, for every nn.Linear, the mean squared input per input
channel. quantize_(model, calibration=...) then weights each weight's rounding
error by how large the activations it multiplies are: an error in a channel
that carries large activations costs more of the layer's output than one in a
channel that is nearly always 0. That is the diagonal of the expected output
error E||(W - W_q) x||^2, which is what the layer actually adds to the model.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional

import torch
from torch import nn

__all__ = ["Calibration", "calibrate", "calibration_text"]

CALIBRATION_TEXT = Path(__file__).resolve().parent / "data" / "calibration_text.txt"


def calibration_text() -> str:
    """A short English text (recipes, science, dialogue, a little code, news), written
    for calibration and disjoint from the evaluation text (data/eval_text.txt)."""
    return CALIBRATION_TEXT.read_text(encoding="utf-8")


class Calibration:
    """Per-layer activation statistics: for each nn.Linear (by its name in the
    model), the mean of x_i^2 over every input row it saw, per input channel i,
    and the number of rows.

    importance(fqn, module) is what quantize_ passes to the search: the mean
    squared activation, with a floor of 1e-3 of its mean so that a channel that
    never fired in the calibration data still counts a little.
    """

    FLOOR = 1e-3

    def __init__(self, sum_sq: Dict[str, torch.Tensor], rows: Dict[str, int],
                 modules: Optional[Dict[int, str]] = None):
        self.sum_sq = sum_sq
        self.rows = rows
        self._by_module = dict(modules or {})

    def __contains__(self, fqn: str) -> bool:
        return fqn in self.sum_sq

    def __len__(self) -> int:
        return len(self.sum_sq)

    def layers(self) -> List[str]:
        return list(self.sum_sq)

    def mean_sq(self, fqn: str) -> torch.Tensor:
        return (self.sum_sq[fqn] / max(self.rows[fqn], 1)).to(torch.float32)

    def name_of(self, module: nn.Module) -> Optional[str]:
        """The name a module was calibrated under (for callers that only have the module)."""
        return self._by_module.get(id(module))

    def importance(self, fqn: Optional[str], module: Optional[nn.Module] = None) -> Optional[torch.Tensor]:
        """Per-input-channel weights for the search, or None when the layer was not seen."""
        if fqn is None or fqn not in self.sum_sq:
            fqn = self.name_of(module) if module is not None else None
        if fqn is None or fqn not in self.sum_sq or self.rows[fqn] == 0:
            return None
        m = self.mean_sq(fqn)
        if not torch.isfinite(m).all():
            raise ValueError(f"calibration statistics of {fqn} are not finite (an input held inf or NaN)")
        mean = float(m.mean())
        if mean <= 0:
            return None
        return m + self.FLOOR * mean

    def state_dict(self) -> Dict[str, Any]:
        return {"sum_sq": dict(self.sum_sq), "rows": dict(self.rows)}

    @classmethod
    def from_state_dict(cls, state: Dict[str, Any]) -> "Calibration":
        return cls(dict(state["sum_sq"]), dict(state["rows"]))

    def __repr__(self) -> str:
        rows = sorted(set(self.rows.values()))
        seen = f"{rows[0]}" if len(rows) == 1 else (f"{rows[0]}..{rows[-1]}" if rows else "0")
        return f"Calibration({len(self)} layers, {seen} input rows each)"


def _call(model: nn.Module, batch):
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


@torch.inference_mode()
def calibrate(
    model: nn.Module,
    batches: Iterable,
    *,
    filter_fn: Optional[Callable[[nn.Module, str], bool]] = None,
    progress: Optional[bool] = None,
) -> Calibration:
    """Runs `model` (in float, unchanged) on each batch and records every
    nn.Linear's mean squared input per input channel.

    batches: an iterable of model inputs; a tensor is passed as model(batch),
      a tuple or list as model(*batch), a dict as model(**batch) (e.g. a
      tokenizer's output). A handful of sequences of the data the model will
      see (a few thousand tokens) is enough.
    filter_fn(module, fqn): only the layers it accepts are recorded.

    Returns a Calibration for quantize_(model, ..., calibration=...), which
    quantizes the same model object (or a copy.deepcopy of it: names match).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if isinstance(batches, (torch.Tensor, dict)):
        batches = [batches]
    sum_sq: Dict[str, torch.Tensor] = {}
    rows: Dict[str, int] = {}
    by_module: Dict[int, str] = {}
    handles = []

    def hook_for(fqn: str):
        def hook(mod, args):
            x = args[0]
            if not isinstance(x, torch.Tensor) or x.shape[-1] != mod.in_features:
                return
            xf = x.detach().reshape(-1, x.shape[-1]).to(torch.float64)
            sum_sq[fqn] += (xf * xf).sum(0)
            rows[fqn] += xf.shape[0]
        return hook

    for fqn, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and (filter_fn is None or filter_fn(mod, fqn)):
            sum_sq[fqn] = torch.zeros(mod.in_features, dtype=torch.float64)
            rows[fqn] = 0
            by_module[id(mod)] = fqn
            handles.append(mod.register_forward_pre_hook(hook_for(fqn)))
    if not handles:
        raise ValueError("calibrate: the model has no nn.Linear to record (after filter_fn)")
    # every name a shared module is registered under sees the same statistics
    aliases = {}
    for fqn, mod in model.named_modules(remove_duplicate=False):
        if id(mod) in by_module and fqn != by_module[id(mod)]:
            aliases[fqn] = by_module[id(mod)]
    was_training = model.training
    model.eval()
    n_batches = 0
    try:
        items = batches
        if progress or (progress is None and sys.stderr.isatty()):
            try:
                from tqdm.auto import tqdm
                items = tqdm(batches, desc="calibrate", unit="batch", file=sys.stderr, dynamic_ncols=True)
            except ImportError:
                pass
        for batch in items:
            _call(model, batch)
            n_batches += 1
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    if n_batches == 0:
        raise ValueError("calibrate: batches was empty; pass at least one model input")
    for alias, fqn in aliases.items():
        sum_sq[alias], rows[alias] = sum_sq[fqn], rows[fqn]
    return Calibration(sum_sq, rows, by_module)
