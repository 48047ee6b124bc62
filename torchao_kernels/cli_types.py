"""The argparse types and bounds of every command line of the package and its
tools (bench, bench_embedding, bench_tp, tune, eval, demo,
distributed.example, tools/gemv_prefetch_by_row_length.py,
tools/count_arm_insns.py): each value is checked as it is parsed, a usage
error (exit 2, naming the option and the value) before any model loads, rank
starts or measurement runs, and each check is stated here once so that the
commands accept the same values with the same messages.

Standard library only (the bounds come from _format_limits.py, generated from
kernels/manifest.toml): it adds nothing to the package's own import, and the
commands parse their arguments before they load a model or time anything.
"""
from __future__ import annotations

import argparse
import math
import os
from typing import Callable, List, Mapping, Optional

# The ops' bounds (kernels/manifest.toml [format]; bench bounds m by MAX_DIM too).
from ._format_limits import (GROUP_MULTIPLE, MAX_BITS, MAX_DIM, MAX_DIM_TEXT, MAX_GROUP_SIZE,  # noqa: E402,F401
                             MAX_GROUP_SIZE_WHY)

BITS = range(1, MAX_BITS + 1)
# torch.set_num_threads takes a C int: an absurd count used to end, after
# minutes of measuring, in an overflow; far beyond any CPU this runs on.
MAX_THREADS = 4096

ArgumentTypeError = argparse.ArgumentTypeError


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ArgumentTypeError(f"expected an integer, got {text!r}") from None


def positive_int(text: str) -> int:
    """An argparse type: an integer > 0."""
    v = _int(text)
    if v <= 0:
        raise ArgumentTypeError(f"expected an integer > 0, got {text!r}")
    return v


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0 (a NaN would pass `<= 0` checks
    and never end a timing loop)."""
    try:
        v = float(text)
    except ValueError:
        raise ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return v


def thread_count(text: str) -> int:
    """An argparse type: a thread count in 1..MAX_THREADS."""
    v = positive_int(text)
    if v > MAX_THREADS:
        raise ArgumentTypeError(f"expected at most {MAX_THREADS} threads, got {text!r}")
    return v


def _items(text: str) -> List[str]:
    """The comma-separated items of text (spaces and empty items dropped), at least one."""
    items = [v for v in text.replace(" ", "").split(",") if v]
    if not items:  # an empty sweep would write a report of the baselines alone
        raise ArgumentTypeError(f"expected at least one integer, got {text!r}")
    return items


def _ints(text: str) -> List[int]:
    items = _items(text)
    try:
        return [int(v) for v in items]
    except ValueError:
        raise ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def positive_ints(text: str) -> List[int]:
    """An argparse type: comma-separated integers > 0, at least one."""
    vals = _ints(text)
    if any(v <= 0 for v in vals):
        raise ArgumentTypeError(f"expected positive integers, got {text!r}")
    return vals


def ints_up_to(limit: int, what: str) -> Callable[[str], List[int]]:
    """An argparse type: comma-separated integers in 1..limit (what: why the
    bound, for the message)."""
    def parse(text: str) -> List[int]:
        vals = positive_ints(text)
        if any(v > limit for v in vals):
            raise ArgumentTypeError(f"expected integers in 1..{limit} ({what}), got {text!r}")
        return vals
    return parse


def bits(text: str) -> int:
    """An argparse type: weight bits, an integer in 1..MAX_BITS (else
    quantize_ raises it later, with a traceback)."""
    v = _int(text)
    if v not in BITS:
        raise ArgumentTypeError(f"bits must be in 1..{MAX_BITS}, got {text!r}")
    return v


def bit_widths(text: str) -> List[int]:
    """An argparse type: comma-separated weight bit widths, each in 1..MAX_BITS."""
    vals = _ints(text)
    if any(v not in BITS for v in vals):
        raise ArgumentTypeError(f"bit widths must be in 1..{MAX_BITS}, got {text!r}")
    return vals


def check_group_size(g: int, per_channel: str = "") -> None:
    """Raises ArgumentTypeError unless g is a group size the kernels take: a
    positive multiple of GROUP_MULTIPLE, at most MAX_GROUP_SIZE (whether it
    divides k is for the command to check: it knows the shapes). per_channel:
    how the command spells per channel, named in the message ("" if it has none)."""
    alt = f" or {per_channel}" if per_channel else ""
    if g <= 0 or g % GROUP_MULTIPLE:
        raise ArgumentTypeError(f"group size must be a positive multiple of {GROUP_MULTIPLE}{alt}, got {g}")
    if g > MAX_GROUP_SIZE:
        raise ArgumentTypeError(f"group size must be at most {MAX_GROUP_SIZE} ({MAX_GROUP_SIZE_WHY}), got {g}")


def group_size(per_channel: Optional[Mapping[str, int]] = None, shown: str = "") -> Callable[[str], int]:
    """An argparse type: a group size (check_group_size) or one of the
    per-channel spellings a command accepts. per_channel maps each spelling
    (lower case; an integer one also matches the other texts int() reads as
    it) to the value the command reads as per channel (bench: 'k' -> 0;
    quantize_'s commands: '-1' -> -1); shown names them in the messages."""
    spellings = dict(per_channel or {})
    alt = f" or {shown}" if shown else ""

    def parse(text: str) -> int:
        key = text.strip().lower()
        if key in spellings:
            return spellings[key]
        try:
            g = int(text)
        except ValueError:
            raise ArgumentTypeError(f"group size must be an integer{alt}, got {text!r}") from None
        if str(g) in spellings:
            return spellings[str(g)]
        check_group_size(g, shown)
        return g
    return parse


def group_sizes(per_channel: Optional[Mapping[str, int]] = None, shown: str = "") -> Callable[[str], List[int]]:
    """An argparse type: comma-separated group sizes (group_size's), at least one."""
    one = group_size(per_channel, shown)

    def parse(text: str) -> List[int]:
        return [one(v) for v in _items(text)]
    return parse


def writable_path(text: str) -> str:
    """An argparse type: a file path whose directory exists and is writable
    (a --json path is written at the end of a run: a bad one used to fail
    only then)."""
    if os.path.isdir(text):
        raise ArgumentTypeError(f"{text!r} is a directory, expected a file path")
    directory = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(directory):
        raise ArgumentTypeError(f"directory {directory!r} of {text!r} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ArgumentTypeError(f"directory {directory!r} of {text!r} is not writable")
    return text


def cores_short_for(ranks: int, threads: Optional[int], pin: bool) -> Optional[int]:
    """The cores this process may run on when they are fewer than ranks that
    each need their own, else None. Ranks need their own cores when pinned or
    when the threads per rank are not given (they default to cores / ranks);
    given threads without pinning, ranks may share cores."""
    if threads is not None and not pin:
        return None
    cores = len(os.sched_getaffinity(0))
    return cores if ranks > cores else None
