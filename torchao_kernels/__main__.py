"""Command line: python -m torchao_kernels [info [--json] | bench ... | demo ... | eval ... | main]

  info    the CPU descriptor, the kernels compiled in, those this CPU can run,
          and the kernel selection table per format and m-bucket
  bench   the benchmark (python -m torchao_kernels.bench --help)
  demo    real models, offline: SmolLM2-135M-Instruct and all-MiniLM-L6-v2
          quantized, with speed, size, and the kernels that ran (demo --help)
  eval    accuracy and speed of every bit width / group size on those models,
          written as a table and a plot (eval --help)
  tune    measure every kernel per problem class on this CPU and write the
          tuning table kernel selection then uses (tune --help)
  main    (default) info, then a short benchmark of LLM-sized shapes next to
          torch.nn.functional.linear in fp32, naming the kernel that ran
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from . import selection
from ._format_limits import MAX_BITS


def format_info(d: dict) -> str:
    cpu = d["cpu"]
    lines = [
        f"CPU: {cpu['name']}",
        f"  arch {cpu['arch']}, {cpu['cores']} cores, ISA: {' '.join(cpu['isa']) or '(none)'}",
        f"  caches: L1d {cpu['l1d_bytes'] // 1024} KiB, L2 {cpu['l2_bytes'] // 1024} KiB, "
        f"L3 {cpu['l3_bytes'] // 1024} KiB",
    ]
    for i, c in enumerate(cpu["clusters"]):
        lines.append(f"  cluster {i}: {c['cores']} x {c['uarch']} ({c['uarch_class']})")
    ov = d["overrides"]
    lines.append(
        "Overrides: " + (", ".join(f"{k}={v}" for k, v in ov.items() if v) or "none")
        + "  (TORCHAO_KERNELS_MAX_ISA / _FORCE / _EXCLUDE, or torchao_kernels.set_overrides)"
    )
    tn = d.get("tuning", {})
    lines.append(f"Tuning table: {tn.get('status') or 'none'}"
                 + ("" if tn.get("loaded") else "  (python -m torchao_kernels tune measures this CPU)"))
    lines.append(f"Best format for packing here: {d['best_format']}")
    lines.append("")
    lines.append("Formats:")
    for f in d["formats"]:
        lines.append(f"  {f['name']:<7} nr={f['nr']:<3} kr={f['kr']}  {f['description']}")
    lines.append("")
    lines.append(f"Kernels compiled in ({len(d['kernels'])}; * = this CPU can run it under the overrides):")
    runnable = set(d["runnable"])
    for k in d["kernels"]:
        m_range = f"{k['m_min']}..{k['m_max'] if k['m_max'] is not None else 'inf'}"
        if k.get("op") == "embedding":
            m_range = "lookup"
        lines.append(
            f"  {'*' if k['name'] in runnable else ' '} {k['name']:<40} {k['format']:<6} "
            f"m {m_range:<7} tile {k['mr']}x{k['nr']}c{k['kr']}  priority {k['priority']}"
        )
    lines.append("")
    lines.append("Selection (4-bit weights, no zeros, no bias) by m:")
    buckets = list(d["selection"][0]["by_m"].keys())
    for row in d["selection"]:
        lines.append(f"  format {row['format']}:")
        for b in buckets:
            lines.append(f"    m {b:<7} -> {row['by_m'][b]}")
        if "embedding" in row:
            lines.append(f"    lookup    -> {row['embedding']}")
    return "\n".join(lines)


def format_markdown(d: dict) -> str:
    """The kernel registry as a markdown table (docs/kernels.md is this output)."""
    lines = [
        "| kernel | format | ISA needed | m range | tile (mr x nr c kr) | bits | zeros | bias | priority | why |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for k in d["kernels"]:
        m_range = f"{k['m_min']}..{k['m_max'] if k['m_max'] is not None else 'inf'}"
        if k.get("op") == "embedding":
            m_range = "lookup"
        bits = ",".join(str(b) for b in k["bits"])
        isa = "+".join(k["required_isa"]) or "none"
        prefs = "; ".join(f"{p['bonus']:+d} on {p['uarch_class']}"
                          + ("" if (p.get("m_min", 1), p.get("m_max")) == (1, None)
                             else f" at m {p['m_min']}..{p['m_max'] or 'inf'}")
                          + ("" if (p.get("bits_min", 1), p.get("bits_max", MAX_BITS)) == (1, MAX_BITS)
                             else f" for {p['bits_min']}..{p['bits_max']}-bit weights")
                          + ("" if p.get("residency") is None else f" with the weights in {p['residency']}")
                          + ("" if p.get("groups") is None else f" with {p['groups']} groups")
                          + ("" if p.get("rows") is None else f" over {p['rows']} rows")
                          + ("" if p.get("threads") is None else f" on {p['threads']} threads")
                          for p in k["uarch_prefs"])
        lines.append(
            f"| `{k['name']}` | {k['format']} | {isa} | {m_range} | {k['mr']}x{k['nr']}c{k['kr']} | {bits} | "
            f"{'yes' if k['zeros'] else 'no'} | {'yes' if k['bias'] else 'no'} | {k['priority']}"
            f"{' (' + prefs + ')' if prefs else ''} | {k['why']} |"
        )
    return "\n".join(lines)


def cmd_info(args) -> int:
    d = selection.info()
    if args.json:
        print(json.dumps(d, indent=2))
    elif getattr(args, "markdown", False):
        print(format_markdown(d))
    else:
        print(format_info(d))
    return 0


def short_benchmark() -> str:
    """A few LLM-sized shapes: our op vs torch fp32 F.linear, 1 call = median of repeats."""
    from .nn import QuantizedLinear

    torch.manual_seed(0)
    rows = []
    header = (
        f"{'shape (n x k)':<14} {'m':>4} {'bits':>4} {'ours us':>9} {'fp32 us':>9} {'speedup':>8}  kernel"
    )
    for (n, k) in [(2048, 2048), (4096, 4096), (11008, 4096)]:
        lin = torch.nn.Linear(k, n, bias=False)
        q = QuantizedLinear.from_linear(lin, bits=4, group_size=32)
        for m in (1, 32):
            x = torch.randn(m, k)
            t_ours = _time(lambda: q(x))
            t_ref = _time(lambda: torch.nn.functional.linear(x, lin.weight))
            kernel = selection.explain(q.packed_weights, m).winner
            rows.append(
                f"{f'{n}x{k}':<14} {m:>4} {4:>4} {t_ours:>9.0f} {t_ref:>9.0f} {t_ref / t_ours:>7.1f}x  {kernel}"
            )
    return "\n".join([header] + rows)


def _time(fn, min_time: float = 0.2) -> float:
    fn()
    times = []
    start = time.perf_counter()
    while time.perf_counter() - start < min_time or len(times) < 5:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2] * 1e6


def cmd_main(args) -> int:
    cmd_info(argparse.Namespace(json=False, markdown=False))
    print("")
    print(f"Short benchmark ({torch.get_num_threads()} threads, hot cache, group 32; "
          f"full benchmark: python -m torchao_kernels.bench):")
    print(short_benchmark())
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        from . import bench

        return bench.run(argv[1:]) or 0
    if argv and argv[0] == "demo":
        from . import demo

        return demo.run(argv[1:]) or 0
    if argv and argv[0] == "eval":
        from . import evaluate

        return evaluate.run(argv[1:]) or 0
    if argv and argv[0] == "tune":
        from . import tuning

        return tuning.run(argv[1:]) or 0
    p = argparse.ArgumentParser(prog="python -m torchao_kernels", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd")
    pi = sub.add_parser("info", help="CPU, kernels and selection table")
    pi.add_argument("--json", action="store_true", help="machine-readable output")
    pi.add_argument("--markdown", action="store_true", help="the kernel registry as a markdown table")
    sub.add_parser("demo", help="real models quantized: speed, size, kernels (demo --help)")
    sub.add_parser("eval", help="accuracy and speed sweep on real models (eval --help)")
    sub.add_parser("tune", help="measure kernels on this CPU, write the tuning table (tune --help)")
    sub.add_parser("main", help="info + short benchmark (the default)")
    args = p.parse_args(argv)
    if args.cmd == "info":
        return cmd_info(args)
    return cmd_main(args)


if __name__ == "__main__":
    sys.exit(main())
