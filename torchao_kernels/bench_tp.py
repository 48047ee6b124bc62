"""Tensor-parallel speed and memory: python -m torchao_kernels.bench_tp

SmolLM2-135M-Instruct quantized by quantize_ (default 4 bits, group 32, zero
points), prefill (128 prompt tokens, logits of the last position, best of
--repeats) and decode (--decode-tokens greedy steps after the prompt, best of
--repeats) tokens per second:

- TP = 1 with 1 thread, and with as many threads as the TP run uses in all;
- TP = --tp (default 2, at least 2, at most the cores) with 1 thread per
  rank, each rank pinned to its own core(s), for each --modes (reduce,
  full_row_quant, exact: see docs/distributed.md); the time spent in the
  styles' collectives is shown apart (it includes waiting for the slower
  rank), as is each rank's memory;
- the latency of one collective through gloo and through shared memory
  (where shared memory can run: x86-64 with /dev/shm).

Not a test: numbers depend on the machine and its load.
"""
from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import platform
import sys
import time
from typing import List, Optional

import torch

from . import models
from .nn import quantize_

PROMPT_TOKENS = 128


def _rss_mb() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def _prompt(tok) -> torch.Tensor:
    from .evaluate import eval_text

    return tok(eval_text(), return_tensors="pt").input_ids[:, :PROMPT_TOKENS]


@torch.inference_mode()
def _time_prefill(model, ids, repeats: int, comm) -> dict:
    kw = models._cache_kwarg(model)
    model(ids[:, :8], use_cache=True, logits_to_keep=1, **{kw: models._new_cache(model)})  # warm-up
    best, best_comm = float("inf"), 0.0
    for _ in range(repeats):
        comm.reset()
        t0 = time.perf_counter()
        model(ids, use_cache=True, logits_to_keep=1, **{kw: models._new_cache(model)})
        dt = time.perf_counter() - t0
        if dt < best:
            best, best_comm = dt, comm.seconds()
    return {"prefill_tok_s": ids.shape[1] / best, "prefill_s": best, "prefill_comm_s": best_comm}


@torch.inference_mode()
def _time_decode(model, ids, steps: int, repeats: int, comm) -> dict:
    kw = models._cache_kwarg(model)
    best, best_comm = float("inf"), 0.0
    for _ in range(repeats):
        cache = models._new_cache(model)
        out = model(ids, use_cache=True, logits_to_keep=1, **{kw: cache})
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        comm.reset()
        t0 = time.perf_counter()
        for _ in range(steps):
            out = model(nxt, use_cache=True, **{kw: cache})
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        dt = time.perf_counter() - t0
        if dt < best:
            best, best_comm = dt, comm.seconds()
    return {"decode_tok_s": steps / best, "decode_s": best, "decode_comm_s": best_comm}


class _Comm:
    """The quantized styles' collective time (nothing at TP = 1)."""

    def __init__(self, distributed: bool):
        self.styles = None
        if distributed:
            from .distributed import styles

            self.styles = styles

    def reset(self) -> None:
        if self.styles is not None:
            self.styles.reset_comm_stats()

    def seconds(self) -> float:
        if self.styles is None:
            return 0.0
        return sum(v["seconds"] for v in self.styles.comm_stats().values())


def worker(mesh, spec: dict) -> List[dict]:
    """One rank: load, quantize, (shard,) time. Returns one row per mode."""
    from .distributed.example import _packed_bytes

    tp = mesh.size()
    model, tok = models.load_smollm2()
    quantize_(model, bits=spec["bits"], group_size=spec["group_size"], has_zeros=spec["zeros"], progress=False,
              **spec.get("quantize_kwargs", {}))
    ids = _prompt(tok)
    rows = []
    modes = spec["modes"] if tp > 1 else ["-"]
    base = copy.deepcopy(model) if len(modes) > 1 else None
    for i, mode in enumerate(modes):
        m = model if i == 0 else copy.deepcopy(base)
        if tp > 1:
            from .distributed import parallelize_llama

            parallelize_llama(m, mesh, mode=mode)
        gc.collect()
        comm = _Comm(tp > 1)
        row = {"tp": tp, "mode": mode, "rank": mesh.get_local_rank(), "threads": torch.get_num_threads(),
               "model_mb": models.model_size_bytes(m) / 1e6, "packed_mb": _packed_bytes(m) / 1e6,
               "rss_mb": _rss_mb()}
        row.update(_time_prefill(m, ids, spec["repeats"], comm))
        row.update(_time_decode(m, ids, spec["decode_tokens"], spec["repeats"], comm))
        rows.append(row)
        del m
        gc.collect()
    return rows


def latency_worker(mesh, widths: List[int], iters: int) -> dict:
    """Median microseconds of the styles' all-reduce and all-gather of one row
    of each width, through whatever init_tp set up (shared memory or gloo)."""
    from .distributed import styles

    group, world = mesh.get_group(), mesh.size()
    out = {}
    for w in widths:
        x = torch.randn(1, w)
        for name, fn in (("all_reduce", lambda: styles._all_reduce(x, group)),
                         ("all_gather", lambda: styles._all_gather_cat(x, [w] * world, group))):
            for _ in range(20):
                fn()
            ts = []
            for _ in range(iters):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
            out[f"{name} {w}"] = sorted(ts)[len(ts) // 2] * 1e6
    return out


def _best(rounds: List[List[List[dict]]]) -> List[List[dict]]:
    """rounds[round][rank][mode] -> [rank][mode] with, per mode, the prefill of
    the round whose slowest rank was fastest, and likewise the decode
    (interleaved rounds: a burst of other work on the machine spoils one
    round, not the result)."""
    out = [[dict(row) for row in rows] for rows in rounds[0]]
    for rnd in rounds[1:]:
        for j in range(len(out[0])):
            for key in ("prefill", "decode"):
                if min(rows[j][f"{key}_tok_s"] for rows in rnd) > min(rows[j][f"{key}_tok_s"] for rows in out):
                    for orows, nrows in zip(out, rnd):
                        for f in (f"{key}_tok_s", f"{key}_s", f"{key}_comm_s"):
                            orows[j][f] = nrows[j][f]
    return out


def _fmt_table(runs: List[List[dict]]) -> str:
    head = ("| run | threads per rank | prefill tok/s | of which comm | decode tok/s | of which comm | "
            "model MB per rank | packed MB per rank |")
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for ranks in runs:
        for j in range(len(ranks[0])):
            rows = [r[j] for r in ranks]
            r0 = rows[0]
            # a step ends when the slowest rank ends: the ranks' times agree to the
            # collectives' latency; report rank 0's and the largest comm share
            label = "TP = 1" if r0["tp"] == 1 else f"TP = {r0['tp']}, {r0['mode']}"
            pc = max(r["prefill_comm_s"] / r["prefill_s"] for r in rows)
            dc = max(r["decode_comm_s"] / r["decode_s"] for r in rows)
            mem = " / ".join(f"{r['model_mb']:.1f}" for r in rows)
            pk = " / ".join(f"{r['packed_mb']:.1f}" for r in rows)
            lines.append(f"| {label} | {r0['threads']} | {min(r['prefill_tok_s'] for r in rows):.0f} | "
                         f"{pc:.0%} | {min(r['decode_tok_s'] for r in rows):.1f} | {dc:.0%} | {mem} | {pk} |")
    return "\n".join(lines)


def _machine() -> str:
    from .selection import cpu_descriptor

    cpu = cpu_descriptor()
    return (f"{platform.machine()}, {os.cpu_count()} CPUs, {cpu.get('name', '?')} "
            f"({' '.join(cpu.get('isa', []))}); torch {torch.__version__}")


def _modes(text: str) -> List[str]:
    """--modes: comma-separated, each one of the Llama plan's modes, at least one, none twice."""
    from .distributed.llama import MODES

    modes = [m.strip() for m in text.split(",")]
    if not text.strip() or any(not m for m in modes):
        raise argparse.ArgumentTypeError(f"expected comma-separated modes from {', '.join(MODES)}, got {text!r}")
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown mode(s) {', '.join(map(repr, bad))} in {text!r}: "
                                         f"choose from {', '.join(MODES)}")
    if len(set(modes)) < len(modes):
        raise argparse.ArgumentTypeError(f"a mode is given twice in {text!r}")
    return modes


def _parser() -> argparse.ArgumentParser:
    from .cli_types import GROUP_MULTIPLE, MAX_BITS, bits, group_size, positive_int, writable_path
    from .quant import METHODS

    ap = argparse.ArgumentParser(prog="python -m torchao_kernels.bench_tp", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tp", type=positive_int, default=2,
                    help="ranks of the TP run, at least 2 and at most the cores this process may run on "
                         "(each rank is pinned to its own core; TP = 1 is always measured) (default %(default)s)")
    ap.add_argument("--modes", type=_modes, default="reduce,full_row_quant,exact",
                    help="the TP run's modes, comma-separated (default %(default)s)")
    ap.add_argument("--bits", type=bits, default=4, help=f"weight bits, 1..{MAX_BITS} (default %(default)s)")
    ap.add_argument("--group-size", type=group_size(), default=32,
                    help=f"a positive multiple of {GROUP_MULTIPLE} (default %(default)s)")
    ap.add_argument("--no-zeros", action="store_true")
    ap.add_argument("--decode-tokens", type=positive_int, default=32)
    ap.add_argument("--repeats", type=positive_int, default=3)
    ap.add_argument("--rounds", type=positive_int, default=1,
                    help="run every configuration this many times, interleaved")
    # gptq needs a calibration, which this benchmark does not record
    ap.add_argument("--method", default=None, choices=[m for m in METHODS if m != "gptq"],
                    help="quantize_'s method (default: quantize_'s, search)")
    ap.add_argument("--comm", choices=["auto", "shm", "gloo"], default="auto",
                    help="the TP run's collectives (default: shared memory on one machine)")
    ap.add_argument("--json", metavar="PATH", type=writable_path, default=None,
                    help="also write the raw rows to this file (its directory must exist)")
    return ap


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """The command line, every value checked (usage errors, exit 2) before any rank starts."""
    from .cli_types import cores_short_for

    ap = _parser()
    a = ap.parse_args(argv)
    if a.tp < 2:
        # TP = 1 is the baseline, measured anyway; a TP run of one rank would
        # measure it a third time, without its modes or collectives
        ap.error(f"argument --tp: at least 2 (TP = 1 is always measured as the baseline), got {a.tp}")
    cores = cores_short_for(a.tp, threads=1, pin=True)  # the TP run's ranks: 1 thread each, pinned
    if cores is not None:
        ap.error(f"argument --tp: {a.tp} ranks, each pinned to its own core, but this process may run on only "
                 f"{cores} cores")
    from .distributed.shm import shm_supported

    a.shm_unsupported = shm_supported()  # None, or why the shared-memory collectives cannot run here
    if a.comm == "shm" and a.shm_unsupported:
        ap.error(f"argument --comm: 'shm' is not possible here: {a.shm_unsupported}")
    return a


def main(argv: Optional[List[str]] = None) -> int:
    from .distributed import launch

    a = parse_args(argv)
    spec = {"bits": a.bits, "group_size": a.group_size, "zeros": not a.no_zeros, "repeats": a.repeats,
            "decode_tokens": a.decode_tokens, "modes": a.modes}
    if a.method:
        spec["quantize_kwargs"] = {"method": a.method}
    t0 = time.perf_counter()
    # other work on the machine slows whichever rank it lands on, and the
    # other rank waits for it in the next collective: say how busy it was
    load0 = " ".join(f"{x:.2f}" for x in os.getloadavg())
    # what one collective costs, apart from the model: a decode step issues
    # 2 per layer + 2 (embedding, logits)
    widths = [576, 24576]
    comms = ("gloo",) if a.shm_unsupported else ("gloo", "shm")
    lat = {c: launch(latency_worker, a.tp, widths, 500, threads=1, pin=True, comm=c)[0] for c in comms}
    configs = [(1, dict(threads=1, pin=True)), (1, dict(threads=a.tp)),
               (a.tp, dict(threads=1, pin=True, comm=a.comm))]
    rounds = [[launch(worker, world, spec, timeout=1200, **kw) for world, kw in configs] for _ in range(a.rounds)]
    runs = [_best([rnd[i] for rnd in rounds]) for i in range(len(configs))]
    print(f"SmolLM2-135M-Instruct, {a.bits}-bit weights, group {a.group_size}, "
          f"{'symmetric' if a.no_zeros else 'zero points'}; prefill {PROMPT_TOKENS} tokens, decode "
          f"{a.decode_tokens} tokens, best of {a.repeats} x {a.rounds} round(s); TP collectives: {a.comm} "
          f"(auto: {'gloo' if a.shm_unsupported else 'shared memory'})")
    print(f"load average before / after: {load0} / {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"machine: {_machine()}")
    print(_fmt_table(runs))
    print(f"\none collective between {a.tp} ranks (median µs; the run above used {a.comm}):")
    print("| comm | " + " | ".join(lat["gloo"]) + " |")
    print("|---|" + "---:|" * len(lat["gloo"]))
    for c, v in lat.items():
        print(f"| {c} | " + " | ".join(f"{x:.0f}" for x in v.values()) + " |")
    if a.shm_unsupported:
        print(f"(no shm row: {a.shm_unsupported})")
    print(f"(took {time.perf_counter() - t0:.0f} s)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": _machine(), "spec": spec, "comm": a.comm, "runs": runs, "latency_us": lat,
                       "load_before": load0, "load_after": os.getloadavg()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
