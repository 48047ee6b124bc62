"""Kernel selection from Python: explain(), overrides, stats(), CPU descriptors."""
from __future__ import annotations

import contextlib
import json
import numbers
import os
import sys
from typing import Dict, List, Optional, Union

import torch

__all__ = [
    "explain",
    "Explanation",
    "set_overrides",
    "get_overrides",
    "overrides",
    "stats",
    "reset_stats",
    "cpu_descriptor",
    "fake_cpus",
    "isa_levels",
    "info",
    "best_format",
]

_K = torch.ops.torchao_kernels


class Explanation:
    """What would run, and why: the CPU, each candidate kernel with its
    rejection reason or score, and the winner (per core cluster)."""

    def __init__(self, data: dict):
        self._data = data

    @property
    def winner(self) -> Optional[str]:
        return self._data["winner"]

    @property
    def source(self) -> str:
        """"table" when the winner (cluster 0) comes from a tuning table, else "static"."""
        return self._data["clusters"][0].get("source", "static")

    def to_dict(self) -> dict:
        return json.loads(json.dumps(self._data))

    def __getitem__(self, key):
        return self._data[key]

    def __str__(self) -> str:
        d = self._data
        cpu = d["cpu"]
        lines = [
            f"cpu: {cpu['name']} ({cpu['arch']}; {' '.join(cpu['isa']) or 'no SIMD extensions'})",
            (f"problem: embedding lookup, format={d['format']} bits={d['bits']} zeros={d['zeros']} "
             f"threads={d['threads']}" if d.get("op") == "embedding" else
             f"problem: format={d['format']} bits={d['bits']} zeros={d['zeros']} bias={d['bias']} "
             f"m={d['m']} (bucket {d['m_bucket']}) threads={d['threads']} weights in {d['residency']}, "
             f"{d['rows']}, {d['groups']}"),
            f"overrides: {d['overrides']}",
        ]
        for c in d["clusters"]:
            source = c.get("source", "static")
            how = ("measured (tuning table" + (f": {c['table_note']}" if c.get("table_note") else "") + ")"
                   if source == "table" else "static policy"
                   + (f" ({c['table_note']})" if c.get("table_note") else ""))
            lines.append(
                f"cluster {c['cluster']} ({c['uarch']}, {c['uarch_class']}, {c['cores']} cores): "
                f"winner {c['winner'] or 'NONE: ' + c['error']} [{how}]"
            )
            if c.get("table_times_us"):
                times = ", ".join(f"{t['kernel']} {t['us']:.1f} us" for t in c["table_times_us"])
                lines.append(f"  class {c['class_key']}: measured {times}")
            if source == "table" or c.get("table_times_us"):
                if c.get("table_confirm_us"):
                    again = ", ".join(f"{t['kernel']} {t['us']:.1f} us"
                                      + (f" (won {t['wins']:.0%} of rounds by the margin)" if "wins" in t else "")
                                      for t in c["table_confirm_us"])
                    lines.append(f"  second look against the static choice: {again}")
                if c.get("static_winner") and c["static_winner"] != c["winner"]:
                    lines.append(f"  (the static policy would pick {c['static_winner']})")
            for cand in c["candidates"]:
                if cand.get("op_mismatch"):
                    continue  # a kernel of the other op (matmul vs lookup)
                mark = "*" if cand["name"] == c["winner"] else ("+" if cand["eligible"] else "-")
                lines.append(f"  {mark} {cand['name']:<40} {cand['reason']}")
        return "\n".join(lines)

    __repr__ = __str__


def explain(
    packed_weights_or_format: Union[torch.Tensor, str, None] = None,
    m: int = 1,
    threads: Optional[int] = None,
    *,
    cpu: Optional[str] = None,
    bits: int = 4,
    zeros: bool = False,
    bias: bool = False,
    op: str = "linear",
) -> Explanation:
    """Explains kernel selection for packed weights (or a format name / target) at m rows.

    cpu: None for this CPU, or a fake CPU name (fake_cpus()) to see what would run there.
    op: "linear" (the matmul at m rows) or "embedding" (row lookups in the packed
      buffer, which needs the buffer itself; m does not matter for lookups).
    """
    packed = packed_weights_or_format if isinstance(packed_weights_or_format, torch.Tensor) else None
    if packed is None and packed_weights_or_format is not None and not isinstance(packed_weights_or_format, str):
        raise TypeError("explain: the first argument must be packed weights (a tensor), a format or target "
                        f"name, or None, got {type(packed_weights_or_format).__name__}")
    for name, v in (("m", m), ("threads", threads), ("bits", bits)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Integral)):
            raise TypeError(f"explain: {name} must be an int, got {v!r}")
    for name, v in (("zeros", zeros), ("bias", bias)):
        if not isinstance(v, bool):
            raise TypeError(f"explain: {name} must be True or False, got {v!r}")
    if cpu is not None and not isinstance(cpu, str):
        raise TypeError(f"explain: cpu must be a fake CPU name (fake_cpus()) or None, got {cpu!r}")
    if op not in ("linear", "embedding"):
        raise ValueError(f"op must be 'linear' or 'embedding', got {op!r}")
    if op == "embedding":
        if packed is None:
            raise ValueError("op='embedding' explains lookups in a packed buffer: pass the buffer")
        threads = torch.get_num_threads() if threads is None else int(threads)
        return Explanation(json.loads(_K._explain_embedding_json(packed, threads, cpu)))
    fmt = None if packed is not None else (packed_weights_or_format or "auto")
    threads = torch.get_num_threads() if threads is None else int(threads)
    return Explanation(json.loads(_K._explain_json(packed, fmt, bits, zeros, bias, int(m), threads, cpu)))


def get_overrides() -> Dict[str, str]:
    return json.loads(_K._overrides_json())


def set_overrides(max_isa: Optional[str] = None, force: Optional[str] = None,
                  exclude: Optional[str] = None) -> None:
    """Sets the selection overrides (same powers as TORCHAO_KERNELS_MAX_ISA / _FORCE /
    _EXCLUDE; None clears one) and resets the selection cache, in the torch
    extension and, once loaded, in the ExecuTorch kernel library. force and exclude
    are comma-separated patterns or a list of them; a pattern that matches no kernel
    is an error (a typo would otherwise exclude nothing)."""
    def text(name, v):  # force / exclude may be a list of patterns
        if isinstance(v, (list, tuple)) and name != "max_isa":
            if not all(isinstance(p, str) for p in v):
                raise TypeError(f"set_overrides: {name} must be a string or a list of strings, got {v!r}")
            v = ",".join(v)
        if v is not None and not isinstance(v, str):
            raise TypeError(f"set_overrides: {name} must be a string{'' if name == 'max_isa' else ' or a list of strings'}"
                            f" or None, got {v!r}")
        return v or ""
    max_isa, force, exclude = text("max_isa", max_isa), text("force", force), text("exclude", exclude)
    _K._set_overrides(max_isa, force, exclude)
    et = sys.modules.get("torchao_kernels.executorch")
    if et is not None and et.is_loaded():
        et._set_overrides(max_isa, force, exclude)


@contextlib.contextmanager
def overrides(max_isa: Optional[str] = None, force: Optional[str] = None, exclude: Optional[str] = None):
    """Context manager: selection overrides inside, previous ones restored after
    (the selection cache is reset on entry and exit)."""
    old = get_overrides()
    set_overrides(max_isa, force, exclude)
    try:
        yield
    finally:
        set_overrides(old["max_isa"], old["force"], old["exclude"])


def stats() -> Dict[str, int]:
    """How many op calls each kernel served since start (or reset_stats())."""
    return json.loads(_K._stats_json())


def reset_stats() -> None:
    _K._reset_stats()


def cpu_descriptor(cpu: Optional[str] = None) -> dict:
    """The descriptor of this CPU (cpu=None) or of a named fake CPU."""
    return json.loads(_K._cpu_json(cpu))


def fake_cpus() -> List[str]:
    return list(_K._fake_cpu_names())


def isa_levels() -> List[str]:
    return list(_K._isa_levels())


def best_format(bits: int = 4, zeros: bool = False, bias: bool = False, *, target: Optional[str] = None,
                cpu: Optional[str] = None) -> str:
    """The format pack() would choose for `target` on this (or a fake) CPU."""
    return _K._best_format(target, bits, zeros, bias, cpu)


def info() -> dict:
    """CPU descriptor, formats, kernels compiled in, those this CPU can run, selection table."""
    return json.loads(_K._info_json())
