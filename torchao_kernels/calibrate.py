"""Activation statistics for activation-aware quantization (the imatrix idea).

calibrate(model, batches) runs the float model on a few batches of the user's
own data and records, for every nn.Linear, the mean squared input per input
channel. quantize_(model, calibration=...) then weights each weight's rounding
error by how large the activations it multiplies are: an error in a channel
that carries large activations costs more of the layer's output than one in a
channel that is nearly always 0. That is the diagonal of the expected output
error E||(W - W_q) x||^2, which is what the layer actually adds to the model.

It also records each layer's whole input second moment E[x x^T] (k x k,
float32; layers that always see the same input tensor, e.g. the q / k / v
projections, share one), which method="gptq" needs: its off-diagonal terms
say how the rounding error of one input channel can be made up by the others.
second_moment=False leaves it out (less memory: 4 k^2 bytes per distinct input).
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
                 modules: Optional[Dict[int, str]] = None, sum_xxt: Optional[Dict[str, torch.Tensor]] = None):
        self.sum_sq = sum_sq
        self.rows = rows
        self.sum_xxt = dict(sum_xxt or {})
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

    @property
    def has_second_moment(self) -> bool:
        return bool(self.sum_xxt)

    def hessian(self, fqn: Optional[str], module: Optional[nn.Module] = None) -> Optional[torch.Tensor]:
        """The layer's input second moment E[x x^T] (k, k) float32 for method="gptq",
        shrunk towards its diagonal by k / (k + rows) (rows: input rows seen), or
        None when the layer was not seen (or calibrate ran with second_moment=False)."""
        if fqn is None or fqn not in self.sum_xxt:
            fqn = self.name_of(module) if module is not None else None
        if fqn is None or fqn not in self.sum_xxt or self.rows.get(fqn, 0) == 0:
            return None
        rows = self.rows[fqn]
        h = self.sum_xxt[fqn] / rows
        if not torch.isfinite(h).all():
            raise ValueError(f"calibration statistics of {fqn} are not finite (an input held inf or NaN)")
        # Shrunk towards its diagonal by k / (k + rows): from fewer input rows
        # than channels the sample second moment is singular, and an error
        # feedback through it hides errors in directions the calibration data
        # never took (a 1536-channel down projection from 1214 tokens); with
        # many rows per channel it is the sample moment.
        k = h.shape[0]
        alpha = k / (k + rows)
        return (1.0 - alpha) * h + alpha * torch.diag(torch.diagonal(h))

    def state_dict(self) -> Dict[str, Any]:
        return {"sum_sq": dict(self.sum_sq), "rows": dict(self.rows), "sum_xxt": dict(self.sum_xxt)}

    @classmethod
    def from_state_dict(cls, state: Dict[str, Any]) -> "Calibration":
        return cls(dict(state["sum_sq"]), dict(state["rows"]), sum_xxt=dict(state.get("sum_xxt", {})))

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
    second_moment: bool = True,
) -> Calibration:
    """Runs `model` (in float, unchanged) on each batch and records every
    nn.Linear's mean squared input per input channel.

    batches: an iterable of model inputs; a tensor is passed as model(batch),
      a tuple or list as model(*batch), a dict as model(**batch) (e.g. a
      tokenizer's output). A handful of sequences of the data the model will
      see (a few thousand tokens) is enough.
    filter_fn(module, fqn): only the layers it accepts are recorded.
    second_moment: also record each layer's input second moment E[x x^T]
      (k x k float32, shared by layers that see the same input tensors), which
      method="gptq" needs; False records the per-channel statistics only.

    Returns a Calibration for quantize_(model, ..., calibration=...), which
    quantizes the same model object (or a copy.deepcopy of it: names match).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(second_moment, bool):
        raise ValueError(f"second_moment must be True or False, got {second_moment!r}")
    if isinstance(batches, (torch.Tensor, dict)):
        batches = [batches]
    sum_sq: Dict[str, torch.Tensor] = {}
    rows: Dict[str, int] = {}
    by_module: Dict[int, str] = {}
    handles = []
    moments = _SecondMoments()

    def hook_for(fqn: str):
        def hook(mod, args):
            x = args[0]
            if not isinstance(x, torch.Tensor) or x.shape[-1] != mod.in_features:
                return
            xf = x.detach().reshape(-1, x.shape[-1]).to(torch.float64)
            sum_sq[fqn] += (xf * xf).sum(0)
            rows[fqn] += xf.shape[0]
            if second_moment:
                moments.add(fqn, x)
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
            moments.end_batch()
            n_batches += 1
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    if n_batches == 0:
        raise ValueError("calibrate: batches was empty; pass at least one model input")
    sum_xxt = moments.acc
    for alias, fqn in aliases.items():
        sum_sq[alias], rows[alias] = sum_sq[fqn], rows[fqn]
        if fqn in sum_xxt:
            sum_xxt[alias] = sum_xxt[fqn]
    return Calibration(sum_sq, rows, by_module, sum_xxt)


class _SecondMoments:
    """Per layer, the sum of x^T x over its input rows (float32), one
    accumulator per group of layers that saw the very same input tensors.

    Within a batch, layers called with the same tensor object (q, k and v
    projections of one attention) share an accumulator created in that batch;
    a layer whose input differs, in a later batch, from its group's leaves the
    group with a copy of the sum so far (equal for the whole group until then)
    plus its own input.
    """

    def __init__(self):
        self.acc: Dict[str, torch.Tensor] = {}
        self._added: Dict[int, torch.Tensor] = {}      # id(accumulator) -> the input added this batch
        self._fresh: Dict[int, torch.Tensor] = {}      # id(input) -> accumulator created from it this batch
        self._split: Dict[tuple, torch.Tensor] = {}    # (id(accumulator), id(input)) -> its split
        self._keep: List[Any] = []                     # tensors whose ids are keys this batch
        self._called = set()                           # the layers called this batch

    @staticmethod
    def _xtx(x: torch.Tensor) -> torch.Tensor:
        xf = x.detach().reshape(-1, x.shape[-1]).to(torch.float32)
        return xf.T @ xf

    def add(self, fqn: str, x: torch.Tensor) -> None:
        self._keep.append(x)
        self._called.add(fqn)
        acc = self.acc.get(fqn)
        if acc is None:
            acc = self._fresh.get(id(x))
            if acc is None:
                acc = self._xtx(x)
                self._fresh[id(x)] = acc
                self._added[id(acc)] = x
            self.acc[fqn] = acc
            return
        prev = self._added.get(id(acc))
        if prev is None:
            acc += self._xtx(x)
            self._added[id(acc)] = x
        elif prev is not x:
            key = (id(acc), id(x))
            new = self._split.get(key)
            if new is None:
                new = acc - self._xtx(prev) + self._xtx(x)
                self._split[key] = new
                self._added[id(new)] = x
            self.acc[fqn] = new

    def end_batch(self) -> None:
        # a layer not called this batch leaves a group that was
        for fqn, acc in list(self.acc.items()):
            if fqn not in self._called and id(acc) in self._added:
                key = (id(acc), None)
                new = self._split.get(key)
                if new is None:
                    new = self._split[key] = acc - self._xtx(self._added[id(acc)])
                self.acc[fqn] = new
        self._called.clear()
        self._added.clear()
        self._fresh.clear()
        self._split.clear()
        self._keep.clear()
