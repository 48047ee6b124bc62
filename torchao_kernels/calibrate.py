"""Activation statistics for activation-aware quantization (the imatrix idea).

calibrate(model, batches) runs the float model on a few batches of the user's
own data and records, for every nn.Linear, the mean squared input per input
channel. quantize_(model, calibration=...) then weights each weight's rounding
error by how large the activations it multiplies are: an error in a channel
that carries large activations costs more of the layer's output than one in a
channel that is nearly always 0. That is the diagonal of the expected output
error E||(W - W_q) x||^2, which is what the layer actually adds to the model.

It also records each layer's whole input second moment E[x x^T] (k x k,
float32; layers that always see the same input tensors, e.g. the q / k / v
projections, share one), which method="gptq" needs: its off-diagonal terms
say how the rounding error of one input channel can be made up by the others.
second_moment=False leaves it out (less memory: 4 k^2 bytes per distinct input).

A layer called several times in a forward counts every call's rows (in both
statistics), with its input by position or as input=. "The same input" is the
same tensor object unchanged in place since (its version counter): a tensor
changed in place between two layers is another input. Called inside
torch.inference_mode, activations have no version counter, and each layer keeps
its own second moment (exact, more memory).
"""
from __future__ import annotations

import itertools
import sys
import weakref
from collections import Counter
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

    A layer called more than once per forward records every call.

    Returns a Calibration for quantize_(model, ..., calibration=...), which
    quantizes the same model object (or a copy.deepcopy of it: names match).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(second_moment, bool):
        raise ValueError(f"second_moment must be True or False, got {second_moment!r}")
    # no_grad, not inference_mode: inference tensors have no version counter,
    # which tells an input changed in place between two layers from the same
    # input. A model whose tensors were made under inference_mode can only be
    # updated in place (a step counter, a cache) inside it: then inference_mode,
    # where each layer keeps its own second moment.
    made_in_inference = any(torch.is_inference(t) for t in itertools.chain(model.parameters(), model.buffers()))
    with torch.inference_mode() if made_in_inference else torch.no_grad():
        return _calibrate(model, batches, filter_fn, progress, second_moment)


def _calibrate(model: nn.Module, batches: Iterable, filter_fn, progress, second_moment: bool) -> Calibration:
    if isinstance(batches, (torch.Tensor, dict)):
        batches = [batches]
    sum_sq: Dict[str, torch.Tensor] = {}
    rows: Dict[str, int] = {}
    by_module: Dict[int, str] = {}
    handles = []
    moments = _SecondMoments()

    def hook_for(fqn: str):
        def hook(mod, args, kwargs):
            # nn.Linear.forward(input): positional or by keyword
            x = args[0] if args else kwargs.get("input")
            if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[-1] != mod.in_features:
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
            handles.append(mod.register_forward_pre_hook(hook_for(fqn), with_kwargs=True))
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


class _Group:
    """One accumulator: the sum of x^T x shared by the layers in members, which
    have all received the same inputs. added: the inputs (keys) added to sum in
    this batch; pending: x^T x of those of them that some member has not
    received yet (to take out again for a member that never does)."""

    __slots__ = ("sum", "members", "added", "pending")

    def __init__(self, total: torch.Tensor, members, added=None):
        self.sum = total
        self.members = set(members)
        self.added: Counter = Counter(added or {})
        self.pending: Dict[Any, torch.Tensor] = {}


class _SecondMoments:
    """Per layer, the sum of x^T x over its input rows (float32), one
    accumulator per group of layers that received the very same inputs.

    An input is identified by the tensor object and its version counter (an
    in-place change makes it another input). In a batch, the first member of a
    group to receive an input adds its x^T x to the group's sum; members that
    receive the same inputs (q, k and v projections of one attention) add
    nothing and stay; a member that receives an input the group did not get
    (or, at the end of the batch, did not receive all the group got) leaves it
    with its own copy of its true sum. A layer called several times in a batch
    adds every call. Layers seen for the first time join the group created in
    this batch from their first input while it holds nothing else.
    """

    def __init__(self):
        self.group: Dict[str, _Group] = {}
        self._got: Dict[str, Counter] = {}           # layer -> the inputs it received this batch
        self._forks: Dict[tuple, _Group] = {}        # (parent or None, got before, input) -> group made this batch
        self._ids: Dict[int, tuple] = {}             # id(tensor) -> (weakref, serial), this batch
        self._serial = itertools.count()

    @property
    def acc(self) -> Dict[str, torch.Tensor]:
        return {fqn: g.sum for fqn, g in self.group.items()}

    @staticmethod
    def _xtx(x: torch.Tensor) -> torch.Tensor:
        xf = x.detach().reshape(-1, x.shape[-1]).to(torch.float32)
        return xf.T @ xf

    def _key(self, x: torch.Tensor):
        """A key equal for two calls only when they saw the same values: the
        tensor object (not its id alone, which a later tensor may reuse) and
        its version counter."""
        try:
            version = x._version
        except RuntimeError:
            # an inference tensor: no version counter; it cannot be changed in
            # place outside inference mode, inside it nothing tells, so no sharing
            if torch.is_inference_mode_enabled():
                return ("call", next(self._serial))
            version = -1
        entry = self._ids.get(id(x))
        if entry is not None and entry[0]() is x:
            serial = entry[1]
        else:
            try:
                ref = weakref.ref(x)
            except TypeError:
                return ("call", next(self._serial))
            serial = next(self._serial)
            self._ids[id(x)] = (ref, serial)
        return (serial, version)

    def _tidy(self, g: _Group) -> None:
        """Drops the pending x^T x every member has received."""
        for key in list(g.pending):
            if all(self._got.get(m, Counter())[key] >= g.added[key] for m in g.members):
                del g.pending[key]

    def _lacking(self, g: _Group, got: Counter) -> torch.Tensor:
        """g's sum less the inputs g got this batch that `got` lacks."""
        out = g.sum.clone()
        for key, n in g.added.items():
            short = n - got[key]
            if short > 0:
                out.sub_(g.pending[key], alpha=short)
        return out

    def add(self, fqn: str, x: torch.Tensor) -> None:
        key = self._key(x)
        got = self._got.setdefault(fqn, Counter())
        g = self.group.get(fqn)
        if g is not None and got == g.added:
            # the first (or level) member: add to the group's sum
            xt = self._xtx(x)
            g.sum += xt
            g.added[key] += 1
            got[key] += 1
            if len(g.members) > 1:
                g.pending[key] = xt
                self._tidy(g)
            return
        if g is not None and got[key] < g.added[key]:
            # the same input as the group got: nothing to add
            got[key] += 1
            self._tidy(g)
            return
        # first seen, or an input the group did not get: a group of its own,
        # shared with the layers in the same place that receive the same input
        fork_key = (g, frozenset(got.items()), key)
        after = got + Counter({key: 1})
        new = self._forks.get(fork_key)
        if new is None or new.added != after:
            xt = self._xtx(x)
            total = xt if g is None else self._lacking(g, got).add_(xt)
            new = _Group(total, (), after)
            self._forks[fork_key] = new
        if g is not None:
            g.members.discard(fqn)
            self._tidy(g)
        new.members.add(fqn)
        self.group[fqn] = new
        got[key] += 1

    def end_batch(self) -> None:
        # members that did not receive all their group got this batch leave it
        for g in {id(g): g for g in self.group.values()}.values():
            stay = g.added
            split: Dict[frozenset, List[str]] = {}
            for fqn in g.members:
                got = self._got.get(fqn, Counter())
                if got != stay:
                    split.setdefault(frozenset(got.items()), []).append(fqn)
            for items, fqns in split.items():
                new = _Group(self._lacking(g, Counter(dict(items))), fqns)
                g.members.difference_update(fqns)
                for fqn in fqns:
                    self.group[fqn] = new
        for g in self.group.values():
            g.added.clear()
            g.pending.clear()
        self._got.clear()
        self._forks.clear()
        self._ids.clear()
