"""Measured kernel selection: tune(), tuning tables, set_tuning().

Every kernel of a problem class gives bit-identical results, so the choice
between them changes speed only. tune() times every row that may run each
class on this CPU, in the cache regime the class runs in (decode-like classes,
m <= 3, with the weights evicted from the caches; prefill-like classes warm),
and writes the winners to a JSON tuning table named by this CPU's signature
under ~/.cache/torchao_kernels/tuning/. The selection layer (C++, shared by
the torch extension and the ExecuTorch kernel library) loads that table at the
first selection and prefers its measured winners; classes it lacks use the
static policy. A table made on another CPU or with another kernel set is
ignored with one warning.

    python -m torchao_kernels tune                 # standard LLM shapes, 1 and N threads
    python -m torchao_kernels tune --model smollm2 # a model's own shapes
    torchao_kernels.tune(model)                    # a model converted by quantize_
"""
from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch

from ._format_limits import GROUP_MULTIPLE, MAX_GROUP_SIZE, MAX_GROUP_SIZE_WHY
from .ops import copy_packed
from .quant import is_group_size

__all__ = ["tune", "set_tuning", "tuning_status", "tuning_table_path", "load_table", "TuneResult",
           "measure_classes", "STANDARD_SHAPES", "SMOLLM2_SHAPES"]

_K = torch.ops.torchao_kernels

SCHEMA = "torchao_kernels.tuning"
VERSION = 1
GROUP_SIZE = 32
# One m per m-bucket of the selection layer (1, 2, 3, 4-7, ..., 128+).
BUCKET_MS = (1, 2, 3, 4, 8, 16, 32, 64, 128)
DECODE_M_MAX = 3  # classes up to this m are timed cold (weights streamed from DRAM)
SMOLLM2_SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576)]
STANDARD_SHAPES = SMOLLM2_SHAPES + [(2048, 2048), (4096, 4096), (14336, 4096), (4096, 14336)]
# A row whose first calls take this many times the fastest row's so far is
# not timed further: it cannot win (its estimate is recorded). tune() races
# the rows (TUNE_CUT_FACTOR, the selection layer's race cut, which
# TORCHAO_KERNELS_TUNE=first-use applies too: kernels/manifest.toml [tuning]);
# bench --selection times every row unless it is hopeless (CUT_FACTOR).
CUT_FACTOR = 3.0
MAX_COLD_BYTES = 1 << 30  # weight copies rotated for one cold class, at most
# A measured winner that leads the static choice by OVERRIDE_MARGIN or more
# is timed again against it (and the runner-up), those rows alone,
# CONFIRM_ROUNDS interleaved rounds of CONFIRM_FACTOR times the first pass's
# time; that look's fastest row enters the table only if the static choice
# took at least 1 + OVERRIDE_MARGIN times its time there, and did so in at
# least CONFIRM_WINS of the look's rounds (the two rows' times of the same
# round compared, at every point of the class). A first pass over a dozen rows crowns whichever was luckiest on a
# noisy machine; a median over rounds still follows a few lucky ones; and a
# lead of a few percent does not survive a rerun where the machine's state
# changes between runs (two threads streaming from DRAM next to other
# tenants: the same call at 402 and 757 us in two tune runs a minute apart,
# docs/benchmarks.md). The table should hold only what a second look agrees
# with, by a margin; a smaller first-pass lead keeps the static choice
# without a second look. The rule and its constants are the selection layer's
# (kernels/manifest.toml [tuning], kernels/select/tuning_table.h), which
# TORCHAO_KERNELS_TUNE=first-use applies as well.
CONFIRM_ROUNDS, OVERRIDE_MARGIN, CONFIRM_WINS, TUNE_CUT_FACTOR, TUNE_ROUND_CUT = _K._tuning_rule()
CONFIRM_FACTOR = 2.0
# bench --selection times the rows behind any ratio above 1 + CONFIRM_MARGIN
# again before it reports it.
CONFIRM_MARGIN = 0.02


# ----------------------------------------------------------------------------
# The table in force


def tuning_status() -> dict:
    """Setting, default path, the table loaded (if any) and why one was ignored."""
    return json.loads(_K._tuning_json())


def tuning_table_path() -> str:
    """Where tune() writes by default: a file named by this CPU's signature."""
    return tuning_status()["default_path"]


def set_tuning(table: Union[str, os.PathLike, None, bool] = None) -> None:
    """Chooses the tuning table: None = the default file for this CPU (if it
    exists), False or "0" = none (static policy only), or a path. Same power as
    TORCHAO_KERNELS_TUNING; resets the selection cache, in the torch extension
    and, once loaded, in the ExecuTorch kernel library."""
    if table is None or table is True:
        setting = ""
    elif table is False:
        setting = "0"
    elif isinstance(table, (str, os.PathLike)):
        setting = os.fspath(table)
        if setting == "":
            raise ValueError("set_tuning: table must be None, False, '0' or a path; got ''")
    else:
        raise TypeError(f"set_tuning: table must be None, False, '0' or a path; got {table!r}")
    _K._set_tuning(setting)
    et = sys.modules.get("torchao_kernels.executorch")
    if et is not None and et.is_loaded():
        et._set_tuning(setting)


def load_table(path: Union[str, os.PathLike]) -> Optional[dict]:
    """The table at path if it is a tuning table of this CPU and kernel set, else None."""
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError):
        return None
    st = tuning_status()
    if (not isinstance(d, dict) or d.get("schema") != SCHEMA or d.get("version") != VERSION
            or d.get("cpu_signature") != st["cpu_signature"] or d.get("kernel_set") != st["kernel_set"]
            or not isinstance(d.get("entries"), dict)):
        return None
    return d


# ----------------------------------------------------------------------------
# Problems and classes


@dataclass
class Problem:
    """One weight matrix as a call would see it: its packed buffer and shape."""
    n: int
    k: int
    bits: int
    packed: torch.Tensor
    label: str = ""


def _packed_problem(n: int, k: int, bits: int, zeros: bool, group_size: int, seed: int) -> Problem:
    from .quant import quantize_weight
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) / math.sqrt(k)
    q, s, z = quantize_weight(w, bits, group_size, zeros, method="rtn")
    packed = torch.ops.torchao.pack_8bit_act_xbit_weight(q, s, z if zeros else None, bits, group_size, None, None)
    return Problem(n, k, bits, packed, f"{n}x{k}")


def problems_from_shapes(shapes: Sequence[Tuple[int, int]], bits: Sequence[int] = (4,), zeros: bool = False,
                         group_size: int = GROUP_SIZE) -> List[Problem]:
    if not is_group_size(group_size):
        raise ValueError(f"group_size must be a positive multiple of {GROUP_MULTIPLE}, got {group_size!r}")
    if group_size > MAX_GROUP_SIZE:
        raise ValueError(f"group_size must be at most {MAX_GROUP_SIZE} ({MAX_GROUP_SIZE_WHY}), got {group_size}")
    for shape in shapes:
        if (not isinstance(shape, (tuple, list)) or len(shape) != 2
                or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in shape)):
            raise ValueError(f"shapes must be (n, k) pairs of positive ints, got {shape!r}")
    out = []
    for b in bits:
        for n, k in shapes:
            if k % group_size:
                raise ValueError(f"shape {n}x{k}: k={k} is not a multiple of group_size={group_size}")
            out.append(_packed_problem(n, k, b, zeros, group_size, seed=n * 131 + k + b))
    return out


def problems_from_model(model: torch.nn.Module) -> List[Problem]:
    """The distinct quantized linear weights of a model converted by quantize_
    (one per shape, bit width, zero points, bias and format)."""
    from .nn import QuantizedLinear
    seen, out = set(), []
    for name, mod in model.named_modules():
        if not isinstance(mod, QuantizedLinear):
            continue
        key = (mod.out_features, mod.in_features, mod.bits, mod.has_zeros, mod.has_bias, mod.format,
               mod.group_size, mod.scale_dtype)
        if key in seen:
            continue
        seen.add(key)
        out.append(Problem(mod.out_features, mod.in_features, mod.bits, mod.packed_weights,
                           f"{mod.out_features}x{mod.in_features} ({name})"))
    if not out:
        raise ValueError("tune(model): the model has no QuantizedLinear layers; convert it with "
                         "torchao_kernels.quantize_ first (or pass shapes=)")
    return out


def _timed_rows(runnable: List[str]) -> List[str]:
    """The rows worth timing: the portable reference rows only where no SIMD
    row may run (elsewhere they are tens of times slower, and one call of
    theirs on a large prefill shape takes seconds)."""
    simd = [r for r in runnable if not r.endswith("__scalar")]
    return simd or list(runnable)


@dataclass
class ClassPlan:
    key: str
    cold: bool
    threads: int
    runnable: List[str]
    static: Optional[str]
    points: List[Tuple[Problem, int]] = field(default_factory=list)  # (problem, m)
    # The rows tune() races: runnable less those far outside their m range
    # (kernels/manifest.toml [tuning] range_factor); bench --selection times
    # them all.
    raced: List[str] = field(default_factory=list)


def plan_classes(problems: Sequence[Problem], ms: Sequence[int], threads: Sequence[int]) -> List[ClassPlan]:
    """Groups every (problem, m, threads) by the problem class selection sees."""
    plans: Dict[str, ClassPlan] = {}
    for t in threads:
        for p in problems:
            for m in ms:
                c = json.loads(_K._linear_class_json(p.packed, int(m), int(t)))
                plan = plans.get(c["key"])
                if plan is None:
                    plan = plans[c["key"]] = ClassPlan(c["key"], m <= DECODE_M_MAX, t, _timed_rows(c["runnable"]),
                                                       c["static"], raced=_timed_rows(c["raced"]))
                plan.points.append((p, m))
    return list(plans.values())


# ----------------------------------------------------------------------------
# Timing


def _l3_bytes() -> int:
    """This CPU's last-level cache, as the descriptor has it (0 if unknown)."""
    return int(json.loads(_K._cpu_json(None)).get("l3_bytes") or 0)


def _cold_copies(packed: torch.Tensor, l3: int) -> List[torch.Tensor]:
    one = max(1, packed.numel())
    target = min(MAX_COLD_BYTES, 2 * max(l3, 8 << 20))
    count = max(2, math.ceil(target / one))
    # In huge pages as the pack op's buffer is (bench.build_variants).
    return [packed] + [copy_packed(packed) for _ in range(count - 1)]


class _ColdCopies:
    """The rotated copies of the last cold problem's weights, kept for its
    next cold class or second look: a problem is timed at several m and
    thread counts, and on a CPU with a large last-level cache the copies
    are up to MAX_COLD_BYTES (480 MiB of L3: 960 MiB per problem), whose
    cloning took a quarter of tuning SmolLM2's classes when every class made
    its own. One problem's copies at a time: the previous ones are freed
    before the next are made. The first copy is the problem's own buffer,
    so the cached key (its identity) cannot be reused by another tensor."""

    def __init__(self) -> None:
        self._packed: Optional[torch.Tensor] = None
        self._l3 = -1
        self._bufs: List[torch.Tensor] = []

    def get(self, packed: torch.Tensor, l3: int) -> List[torch.Tensor]:
        if self._packed is not packed or self._l3 != l3:
            self.clear()
            self._bufs = _cold_copies(packed, l3)
            self._packed, self._l3 = packed, l3
        return self._bufs

    def clear(self) -> None:
        self._packed, self._l3, self._bufs = None, -1, []


_COLD = _ColdCopies()


def _cold_grouped(items: Sequence, cold_problem: Callable[[object], Optional[Problem]]) -> List:
    """items in an order that times each cold problem's points one after the
    other (so _ColdCopies makes its copies once): the warm items first, in
    their order, then the cold ones grouped by problem in order of first
    appearance."""
    first: Dict[int, int] = {}
    keyed = []
    for i, it in enumerate(items):
        p = cold_problem(it)
        if p is None:
            keyed.append(((0, 0, i), it))
        else:
            g = first.setdefault(id(p), len(first))
            keyed.append(((1, g, i), it))
    return [it for _, it in sorted(keyed, key=lambda kv: kv[0])]


def _time_rows(rows: Sequence[str], p: Problem, m: int, threads: int, cold: bool, min_time: float,
               rounds: int, l3: int, cut: float = CUT_FACTOR,
               samples_out: Optional[Dict[str, List[float]]] = None, round_cut: float = 0.0) -> Dict[str, float]:
    """Median seconds per call of each row through the op's own parallel split,
    interleaved over rounds; cold rotates copies of the weights (about twice
    the last-level cache) so every call streams them from DRAM. cut: rows
    whose estimate is this many times the best estimate are not timed in the
    rounds (their estimate is returned); 0 times every row. round_cut (tune's
    race, 0 = none): after the first round, rows whose best time so far (their
    estimate or that round's) is round_cut times the fastest row's are timed
    no further (their one round is their time). samples_out: gets each timed
    row's seconds per round, the i-th from round i for every row (no
    round_cut then)."""
    x = torch.randn(m, p.k, generator=torch.Generator().manual_seed(m))
    bufs = _COLD.get(p.packed, l3) if cold else [p.packed]
    run = _K._linear_forced
    state = {"i": 0}

    def step(name: str) -> None:
        i = state["i"]
        state["i"] = (i + 1) % len(bufs)
        run(x, bufs[i], name)

    def call(name: str) -> float:
        t0 = time.perf_counter()
        step(name)
        return time.perf_counter() - t0

    per_round = min_time / rounds
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        est: Dict[str, float] = {}
        timed = []
        for i, r in enumerate(rows):  # warm-up call, then a first estimate
            first = call(r)
            best = min(est.values(), default=None)
            if cut and best is not None and first > 2 * cut * best:
                est[r] = first  # far slower even counting its warm-up: not timed further
                continue
            if i > 0 and first >= per_round:
                # A costly call after the first row's (which brought the
                # weights in, or rotates cold copies): no warm-up left in it.
                ts = [first]
            else:
                ts = [call(r)]
                if ts[0] < per_round:  # a cheap call: one more (a costly one is its own round below)
                    ts.append(call(r))
            est[r] = min(ts)
            timed.append(r)
        best_est = min(est[r] for r in timed)
        timed = [r for r in timed if not cut or est[r] <= cut * best_est]
        # A call that takes a whole round's time is timed once per round: its
        # one estimate call is already a sample (interleaved with the other rows'),
        # unless the rows' samples are compared round by round (samples_out):
        # then every row's i-th sample comes from round i.
        reuse = samples_out is None
        samples: Dict[str, List[float]] = {r: [est[r]] if reuse and est[r] >= per_round else [] for r in timed}
        for rd in range(rounds):
            if rd == 1 and round_cut and samples_out is None:
                best_so_far = {r: min([est[r]] + samples[r]) for r in timed}
                lead = min(best_so_far.values())
                timed = [r for r in timed if best_so_far[r] <= round_cut * lead]
            order = timed[rd % len(timed):] + timed[:rd % len(timed)]
            for r in order:
                if len(samples[r]) >= rounds:
                    continue
                batch = max(1, min(1000, int(per_round / max(est[r], 1e-7))))
                if batch == 1:
                    samples[r].append(call(r))
                    continue
                t0 = time.perf_counter()
                for _ in range(batch):
                    step(r)
                samples[r].append((time.perf_counter() - t0) / batch)
        out = {r: statistics.median(s) for r, s in samples.items()}
        if samples_out is not None:
            samples_out.update(samples)
        for r in rows:
            out.setdefault(r, est[r])  # cut: its estimate
        return out
    finally:
        torch.set_num_threads(old_threads)


def measure_classes(plans: Sequence[ClassPlan], min_time: float, rounds: int = 3, progress: bool = True,
                    cut: float = CUT_FACTOR, round_cut: float = 0.0,
                    on_result: Optional[Callable[[ClassPlan, Problem, int, Dict[str, float]], None]] = None,
                    raced_only: bool = False) -> None:
    """Times the runnable rows of each class (raced_only: the rows tune()
    races, ClassPlan.raced) at every one of its points, calling
    on_result(plan, problem, m, seconds_by_row)."""
    l3 = _l3_bytes()
    jobs = _cold_grouped([(pl, pt) for pl in plans for pt in pl.points],
                         lambda job: job[1][0] if job[0].cold else None)
    bar = _progress(len(jobs), progress)
    try:
        for plan, (p, m) in jobs:
            candidates = plan.raced if raced_only else plan.runnable
            if candidates:
                # the static choice first: its estimate is the bar the others must come near
                rows = sorted(candidates, key=lambda r: r != plan.static)
                # a class of many points spends less on each (its mean is over all of them)
                t = max(min_time / 4, min_time / math.sqrt(len(plan.points)))
                secs = _time_rows(rows, p, m, plan.threads, plan.cold, t, rounds, l3, cut, round_cut=round_cut)
                if on_result:
                    on_result(plan, p, m, secs)
            bar.update(1)
    finally:
        bar.close()
        _COLD.clear()


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int, enabled: bool):
    if not enabled:
        return _NoBar()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, desc="tuning", unit="class", file=sys.stderr, leave=False)


# ----------------------------------------------------------------------------
# tune()


@dataclass
class TuneResult:
    """What tune() measured: one entry per class, and where the table went."""
    path: Optional[str]
    entries: Dict[str, dict]
    seconds: float

    def __str__(self) -> str:
        return format_entries(self.entries) + (f"\ntable: {self.path}" if self.path else "") + \
            f"\ntuned {len(self.entries)} classes in {self.seconds:.1f} s"

    __repr__ = __str__


def _short(name: Optional[str]) -> str:
    if not name:
        return "-"
    return name.replace("_f32_qbw", " ").replace("__", " ")


def format_entries(entries: Dict[str, dict], known: Optional[Iterable[str]] = None) -> str:
    """The table's entries, one line per class; `known`: the kernel names selection
    accepts (default: this build's registry)."""
    lines = [f"{'class':<44} {'winner':<44} {'us':>9}   {'runner-up':<44} {'us':>9}   "
             f"{'static':<44} {'us':>9}"]
    def times(d) -> Dict[str, float]:  # a field's valid rows (a table file may be corrupt)
        if not isinstance(d, dict):
            return {}
        return {r: float(v) for r, v in d.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0}

    if known is None:
        from .selection import info
        known = {k["name"] for k in info()["kernels"]}
    known = set(known)
    for key, e in sorted(entries.items()):
        if not isinstance(e, dict):
            continue
        if e.get("winner") not in known:  # selection ignores the entry: the static policy decides
            lines.append(f"{key:<44} {_short(e.get('winner')):<44}   (unknown kernel: ignored)")
            continue
        # the second look's times where there was one: they decided the winner
        t, note = times(e.get("confirm_us")), "   (second look)"
        if e.get("winner") not in t:
            t, note = times(e.get("times_us")), ""
        if e.get("winner") not in t:
            lines.append(f"{key:<44} {_short(e.get('winner')):<44}")
            continue
        ranked = [r for r in sorted(t, key=t.get) if r != e["winner"]]
        ru = ranked[0] if ranked else None
        st = e.get("static")
        lines.append(f"{key:<44} {_short(e['winner']):<44} {t[e['winner']]:>9.1f}   {_short(ru):<44} "
                     f"{(t[ru] if ru else float('nan')):>9.1f}   {_short(st):<44} "
                     f"{(t.get(st, float('nan')) if st else float('nan')):>9.1f}{note}")
    return "\n".join(lines)


def tune(model: Optional[torch.nn.Module] = None, *, shapes: Optional[Sequence[Tuple[int, int]]] = None,
         bits: Sequence[int] = (4,), zeros: bool = False, group_size: int = GROUP_SIZE,
         m: Sequence[int] = BUCKET_MS, threads: Union[int, Sequence[int], None] = None,
         budget: Optional[float] = None, path: Union[str, os.PathLike, None] = None, merge: bool = True,
         progress: bool = True, verbose: bool = True, min_time: Optional[float] = None) -> TuneResult:
    """Measures every kernel that may run each problem class and writes the
    winners to the tuning table (path, default: this CPU's file under
    ~/.cache/torchao_kernels/tuning/), which selection then uses.

    model: a model converted by quantize_ (exactly its layers' buffers, bits
      and formats; threads default to torch.get_num_threads()); or shapes=
      [(n, k), ...] with bits / zeros / group_size (threads default to 1 and
      torch.get_num_threads()). Neither: STANDARD_SHAPES.
    m: activation rows to tune, one per m-bucket by default.
    budget: seconds to aim for (the time per row is scaled to fit).
    merge: keep the table's other classes (same CPU and kernel set).
    verbose: print, per class, the winner, the runner-up and the static
      policy's choice with their times.
    """
    t_start = time.perf_counter()
    if model is not None and shapes is not None:
        raise ValueError("tune: pass a model or shapes, not both")
    if model is not None:
        problems = problems_from_model(model)
        thread_list = [torch.get_num_threads()] if threads is None else _int_list(threads, "threads")
    else:
        problems = problems_from_shapes(list(shapes) if shapes is not None else STANDARD_SHAPES,
                                        _int_list(bits, "bits"), zeros, group_size)
        thread_list = sorted({1, torch.get_num_threads()}) if threads is None else _int_list(threads, "threads")
    ms = _int_list(m, "m")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float))
                               or not math.isfinite(budget) or not budget > 0):
        raise ValueError(f"tune: budget must be a positive number of seconds, got {budget!r}")
    if min_time is not None and (isinstance(min_time, bool) or not isinstance(min_time, (int, float))
                                 or not math.isfinite(min_time) or not min_time > 0):
        raise ValueError(f"tune: min_time must be a positive number of seconds, got {min_time!r}")
    out_path = os.fspath(path) if path is not None else tuning_table_path()
    if out_path and os.path.isdir(out_path):  # found now, not after the measuring
        raise ValueError(f"tune: path must name a file, got the directory {out_path!r}")
    plans = plan_classes(problems, ms, thread_list)
    if min_time is None:
        # Each class times ~3 rows; the budget covers them with warm-up and cold copies.
        min_time = 0.012 if budget is None else max(0.005, min(0.25, budget / max(1, len(plans)) / 5))
    entries: Dict[str, dict] = {}


    # Every point of every class: a class spans shapes (and the m of its
    # bucket) whose best rows can differ, so the winner is the row with the
    # lowest geometric mean time over the class's points (the lowest mean
    # ratio to each point's fastest row); the table records those means.
    per_class: Dict[str, List[Tuple[Problem, int, Dict[str, float]]]] = {}
    measure_classes(plans, min_time, progress=progress, cut=TUNE_CUT_FACTOR, round_cut=TUNE_ROUND_CUT,
                    raced_only=True,
                    on_result=lambda plan, p, mm, secs: per_class.setdefault(plan.key, []).append((p, mm, secs)))
    l3 = _l3_bytes()
    means = {}
    for plan in plans:
        pts = per_class.get(plan.key)
        if pts:
            rows = set.intersection(*(set(secs) for _, _, secs in pts))
            means[plan.key] = _geomean_by_row(rows, [secs for _, _, secs in pts])
    second = _confirm_all([pl for pl in plans if pl.key in means], per_class, means, min_time, l3)
    for plan in plans:
        if plan.key in means:
            confirmed, wins = second.get(plan.key, ({}, {}))
            entries[plan.key] = _entry(plan, means[plan.key], per_class[plan.key], confirmed, wins)
    if out_path:
        st = tuning_status()
        table = {"schema": SCHEMA, "version": VERSION, "cpu_signature": st["cpu_signature"],
                 "kernel_set": st["kernel_set"], "entries": {}}
        if merge:
            old = load_table(out_path)
            if old is not None:
                table["entries"].update(old["entries"])
        table["entries"].update(entries)
        table["created"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        table["torch"] = torch.__version__
        os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
        tmp = f"{out_path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(table, f, indent=1, sort_keys=True)
        os.replace(tmp, out_path)
        # Reload: the default file, or this path when it is not the default.
        set_tuning(None if path is None else out_path)
    result = TuneResult(out_path or None, entries, time.perf_counter() - t_start)
    if verbose:
        print(result)
    return result


def _geomean_by_row(rows: Iterable[str], secs_per_point: List[Dict[str, float]]) -> Dict[str, float]:
    return {r: math.exp(sum(math.log(secs[r]) for secs in secs_per_point) / len(secs_per_point)) for r in rows}


def confirmed_winner(first: Dict[str, float], second: Dict[str, float], static: Optional[str],
                     margin: float = OVERRIDE_MARGIN, wins: Optional[Dict[str, float]] = None,
                     min_wins: float = CONFIRM_WINS) -> str:
    """The row a class's table entry names, from the first pass's times and
    the second look's (rows timed again; empty when there was none): the
    fastest of the second look, unless the static choice took less than
    1 + `margin` times its time there, or (wins: each row's share of the
    second look's rounds in which the static choice took at least 1 + `margin`
    times its time, paired_wins) it won fewer than `min_wins` of them: then
    the static choice (a near-tie, or a lead some rounds contradict, is not
    worth an entry that a rerun would flip). The selection layer's rule
    (kernels/select/tuning_table.h), the one first-use tuning applies."""
    return _K._confirmed_winner(json.dumps(first), json.dumps(second), static or "", float(margin),
                                None if wins is None else json.dumps(wins), float(min_wins))


def paired_wins(samples_per_point: List[Dict[str, List[float]]], static: str,
                margin: float = OVERRIDE_MARGIN) -> Dict[str, float]:
    """Each row's share of the rounds (pooled over the points) in which
    `static` took at least 1 + `margin` times its time in the same round
    (the selection layer's rule, as confirmed_winner)."""
    wins = json.loads(_K._paired_wins(json.dumps(samples_per_point), static, float(margin)))
    return {r: float(w) for r, w in wins.items()}


def _confirm_all(plans: Sequence[ClassPlan], per_class, means: Dict[str, Dict[str, float]], min_time: float,
                 l3: int) -> Dict[str, Tuple[Dict[str, float], Dict[str, float]]]:
    """For each class whose first pass crowned a row other than the static
    choice: the winner, the runner-up and the static choice timed again at
    every point of the class (see CONFIRM_ROUNDS), as their geometric means
    (seconds) and paired_wins against the static choice. The points of all
    such classes run grouped by cold problem (_cold_grouped)."""
    todo = {}
    for plan in plans:
        mean = means[plan.key]
        ranked = sorted(mean, key=mean.get)
        if not ranked or ranked[0] == plan.static or plan.static not in mean:
            continue
        if mean[plan.static] < mean[ranked[0]] * (1 + OVERRIDE_MARGIN):
            continue  # a near-tie already: the rule keeps the static choice (see _entry)
        todo[plan.key] = list(dict.fromkeys([plan.static, ranked[0]] + ranked[1:2]))
    jobs = [(plan, i, p, m) for plan in plans if plan.key in todo
            for i, (p, m, _) in enumerate(per_class[plan.key])]
    jobs = _cold_grouped(jobs, lambda job: job[2] if job[0].cold else None)
    again: Dict[str, Dict[int, Tuple[Dict[str, float], Dict[str, List[float]]]]] = {}
    try:
        for plan, i, p, m in jobs:
            t = CONFIRM_FACTOR * max(min_time / 4, min_time / math.sqrt(len(per_class[plan.key])))
            per_round: Dict[str, List[float]] = {}
            secs = _time_rows(todo[plan.key], p, m, plan.threads, plan.cold, t, CONFIRM_ROUNDS, l3, cut=0,
                              samples_out=per_round)
            again.setdefault(plan.key, {})[i] = (secs, per_round)
    finally:
        _COLD.clear()
    static = {plan.key: plan.static for plan in plans}
    out = {}
    for key, by_point in again.items():
        pts = [by_point[i] for i in sorted(by_point)]
        out[key] = (_geomean_by_row(todo[key], [secs for secs, _ in pts]),
                    paired_wins([samples for _, samples in pts], static[key]))
    return out


def _entry(plan: ClassPlan, mean_s: Dict[str, float], pts, confirmed: Optional[Dict[str, float]] = None,
           wins: Optional[Dict[str, float]] = None) -> dict:
    us = {r: round(t * 1e6, 3) for r, t in sorted(mean_s.items(), key=lambda kv: kv[1])}
    # Without a second look the first pass stands in for it: the static choice
    # unless a row leads it by the margin (a class whose lead was that large
    # had its second look, _confirm_all), as first-use tuning decides.
    if confirmed:
        winner = confirmed_winner(mean_s, confirmed, plan.static, wins=wins)
    else:
        winner = confirmed_winner(mean_s, mean_s, plan.static)
    e = {"winner": winner, "times_us": us, "static": plan.static, "regime": "cold" if plan.cold else "warm",
         "threads": plan.threads, "points": [f"{p.n}x{p.k} m={m}" for p, m, _ in pts]}
    if confirmed:
        e["confirm_us"] = {r: round(t * 1e6, 3) for r, t in sorted(confirmed.items(), key=lambda kv: kv[1])}
    if wins:
        e["confirm_wins"] = {r: round(w, 3) for r, w in sorted(wins.items())}
    return e


def _int_list(v: Union[int, Iterable[int]], what: str) -> List[int]:
    vals = [v] if isinstance(v, int) else list(v)
    if not vals or any(not isinstance(x, int) or isinstance(x, bool) or x < 1 for x in vals):
        raise ValueError(f"tune: {what} must be positive integers, got {v!r}")
    return sorted(set(vals))


# ----------------------------------------------------------------------------
# Selection against measurement (bench --selection)

SELECTION_SHAPES = [(4096, 4096), (14336, 4096), (2048, 2048)] + SMOLLM2_SHAPES
SELECTION_M = (1, 2, 3, 4, 8, 32, 128)


def selection_report(shapes: Sequence[Tuple[int, int]] = SELECTION_SHAPES, bits: Sequence[int] = (2, 4, 8),
                     ms: Sequence[int] = SELECTION_M, threads: Sequence[int] = (1, 2), min_time: float = 0.05,
                     progress: bool = True, confirm: bool = True) -> Tuple[str, List[dict]]:
    """Times every row that may run each (shape, bits, m, threads) point in
    one run, in its class's regime, and states the static policy's choice and
    the selected one (the tuning table's, where it has the class) against the
    fastest (the oracle). confirm: time the rows that decide a ratio above
    1 + CONFIRM_MARGIN again, alone, and report that second look."""
    problems = problems_from_shapes(shapes, bits)
    plans = plan_classes(problems, ms, threads)
    rows: List[dict] = []

    l3 = _l3_bytes()

    def rec(plan: ClassPlan, p: Problem, m: int, secs: Dict[str, float]) -> None:
        c = json.loads(_K._linear_class_json(p.packed, m, plan.threads))
        best = min(secs, key=secs.get)
        static, sel = c["static"], c["selected"]
        first, confirmed = secs, False
        # The fastest of a dozen rows timed once is partly the luckiest: where
        # the static or the selected row seems more than CONFIRM_MARGIN slower,
        # those rows and the fastest are timed again alone, and the ratios
        # come from that second look.
        again = [r for r in dict.fromkeys([best, static, sel]) if r in secs]
        if confirm and len(again) > 1 and max(secs[r] for r in again) > secs[best] * (1 + CONFIRM_MARGIN):
            secs = _time_rows(again, p, m, plan.threads, plan.cold, CONFIRM_FACTOR * min_time,
                              CONFIRM_ROUNDS, l3, cut=0)
            best, confirmed = min(secs, key=secs.get), True
        rows.append({
            "class": plan.key, "shape": f"{p.n}x{p.k}", "bits": p.bits, "m": m, "threads": plan.threads,
            "regime": "cold" if plan.cold else "warm", "oracle": best, "oracle_us": secs[best] * 1e6,
            "static": static, "static_over_oracle": secs[static] / secs[best] if static in secs else None,
            "selected": sel, "source": c["source"],
            "selected_over_oracle": secs[sel] / secs[best] if sel in secs else None,
            "times_us": {r: round(t * 1e6, 3) for r, t in sorted(first.items(), key=lambda kv: kv[1])},
            "confirmed": confirmed,
        })

    measure_classes(plans, min_time, progress=progress, on_result=rec)
    # measure_classes groups the cold points by problem; report them in the plans' order
    points = [(pl.key, f"{p.n}x{p.k}", p.bits, m) for pl in plans for p, m in pl.points]
    order = {pt: i for i, pt in enumerate(points)}
    rows.sort(key=lambda r: order[(r["class"], r["shape"], r["bits"], r["m"])])
    return format_selection(rows), rows


def _ratio_summary(vals: List[float]) -> str:
    if not vals:
        return "-"
    return f"median {statistics.median(vals):.3f}, worst {max(vals):.3f} (n = {len(vals)})"


def format_selection(rows: List[dict]) -> str:
    head = ("| class | shape | bits | m | thr | regime | fastest | us | static | static / fastest | "
            "selected | source | selected / fastest |")
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        so = r["static_over_oracle"]
        se = r["selected_over_oracle"]
        lines.append(f"| {r['class']} | {r['shape']} | {r['bits']} | {r['m']} | {r['threads']} | {r['regime']} | "
                     f"{_short(r['oracle'])} | {r['oracle_us']:.1f} | {_short(r['static'])} | "
                     f"{'-' if so is None else f'{so:.3f}'} | {_short(r['selected'])} | {r['source']} | "
                     f"{'-' if se is None else f'{se:.3f}'} |")
    classes = len({r["class"] for r in rows})
    tabled = [r["selected_over_oracle"] for r in rows if r["source"] == "table" and r["selected_over_oracle"]]
    lines += ["", f"{len(rows)} points in {classes} problem classes.",
              "static policy / fastest: " + _ratio_summary([r["static_over_oracle"] for r in rows
                                                            if r["static_over_oracle"]]),
              "selected / fastest: " + _ratio_summary([r["selected_over_oracle"] for r in rows
                                                       if r["selected_over_oracle"]]),
              f"  of which from the tuning table: {_ratio_summary(tabled)}"]
    again = sum(1 for r in rows if r.get("confirmed"))
    if again:
        lines.append(f"{again} points timed again (the fastest, static and selected rows alone, "
                     f"{CONFIRM_ROUNDS} rounds): their ratios are from that second look")
    return "\n".join(lines)


# ----------------------------------------------------------------------------
# Command line


def _model_shapes(name: str, group_size: int) -> List[Tuple[int, int]]:
    """A model's linear weight shapes: the offline models by name, else a
    Hugging Face model id or folder (from its config, on the meta device)."""
    from . import models
    if name in ("smollm2", "minilm"):
        model, _ = models.load_smollm2() if name == "smollm2" else models.load_minilm()
    else:
        tf = models._transformers()
        cfg = tf.AutoConfig.from_pretrained(name)
        with torch.device("meta"):
            try:
                model = tf.AutoModelForCausalLM.from_config(cfg)
            except ValueError:
                model = tf.AutoModel.from_config(cfg)
    return sorted({(m.out_features, m.in_features) for m in model.modules()
                   if isinstance(m, torch.nn.Linear) and m.in_features % group_size == 0})


def _parser():
    import argparse
    from .bench import _parse_shapes
    from .cli_types import MAX_BITS, bit_widths, positive_float, positive_ints

    p = argparse.ArgumentParser(
        prog="python -m torchao_kernels tune",
        description="Measure every kernel that may run each problem class on this CPU and write the "
                    "winners to the tuning table kernel selection reads.")
    p.add_argument("--model", help="smollm2, minilm, or a Hugging Face model id/folder: tune its shapes")
    p.add_argument("--shapes", type=_parse_shapes, help="NxK[,NxK...] weight shapes (default: standard LLM shapes)")
    # checked here: else tune() raises a bad width, with a traceback
    p.add_argument("--bits", type=bit_widths, default=[4], help=f"weight bit widths, each in 1..{MAX_BITS} (default 4)")
    p.add_argument("--zeros", action="store_true", help="weights with zero points")
    p.add_argument("--m", type=positive_ints, default=list(BUCKET_MS),
                   help="activation rows (default: one per m-bucket, 1..128)")
    p.add_argument("--threads", type=positive_ints, help="thread counts (default: 1 and torch's)")
    p.add_argument("--budget", type=positive_float, help="seconds to aim for")
    p.add_argument("--output", help="table path (default: this CPU's file under ~/.cache/torchao_kernels/tuning)")
    p.add_argument("--no-merge", action="store_true", help="replace the table instead of adding to it")
    p.add_argument("--show", action="store_true", help="print the table in use and exit")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def show() -> str:
    st = tuning_status()
    lines = [f"tuning table: {st['status'] or 'not loaded yet'}",
             f"  setting: {st['setting'] or '(default)'}  (TORCHAO_KERNELS_TUNING / torchao_kernels.set_tuning)",
             f"  default path for this CPU: {st['default_path']}",
             f"  cpu signature: {st['cpu_signature']}",
             f"  kernel set: {st['kernel_set']}"]
    path = st["path"]
    table = load_table(path) if path else None
    if table:
        lines += ["", format_entries(table["entries"])]
    return "\n".join(lines)


def run(argv: Optional[Sequence[str]] = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if args.show:
        print(show())
        return 0
    if args.model and args.shapes:
        p.error("--model and --shapes exclude each other")
    if args.model:
        from .models import ModelNotInstalled
        try:
            problems_shapes = _model_shapes(args.model, GROUP_SIZE)
        except ModelNotInstalled as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        except (OSError, ValueError) as e:
            if args.model in ("smollm2", "minilm"):
                raise
            # Hugging Face's error for a name it cannot resolve offline (no such id in the
            # cache, no such folder, no model_type) is a usage error: the name is wrong.
            p.error(f"argument --model: {args.model!r} is not smollm2, minilm, or a Hugging Face model "
                    f"id / folder with a config.json found offline ({str(e).splitlines()[0]})")
    else:
        problems_shapes = args.shapes
    tune(shapes=problems_shapes, bits=args.bits, zeros=args.zeros, m=args.m, threads=args.threads,
         budget=args.budget, path=args.output, merge=not args.no_merge, progress=not args.quiet, verbose=True)
    return 0


if __name__ == "__main__":
    sys.exit(run())
