"""Embedding-lookup benchmark: quantized lookups against float32 nn.Embedding
and the bandwidth roofline of the bytes each lookup touches.

    python -m torchao_kernels.bench_embedding [--shape 49152x576] [--count 128] [--bits 4]

For each variant, a batch of `count` lookups with fresh random indices per
call (a pool of index batches is cycled, so rows come from wherever the table
lives: L3 for the 4-bit tables of LLM vocabularies, DRAM for their float32
tables), timed in interleaved rounds (medians). Variants:
  ours n16k4   torchao::shared_embedding_xbit on the linear pack op's n16k4
               buffer: what a tied input embedding reads (the output head's weights)
  ours n1k4    the same op on an n1k4 buffer: what an untied QuantizedEmbedding owns
  torchao op   torchao::_embedding_{b}bit on a weights-only table (scales passed per call)
  float32      torch.nn.functional.embedding on the float32 table
Bytes touched: the 64-byte lines each lookup reads (for n16k4 a row is 4
bytes of every 64-byte unit of its 16-row block, so the whole block's lines
are read) plus the float32 rows written. Roofline time: read bytes at the
read bandwidth of a buffer as large as the table (torch fp32 sum, fastest
pass) plus written bytes at the write bandwidth of an output-sized buffer
(fill_ of the output minus fill_ of 16 floats, fastest passes: the write
without the cost of a call), measured in the same run.

Two times per variant: a call from Python (what a model pays: dispatch,
argument checks, the output's allocation, the lookup) and, for ours, the
lookup alone (the op body timed in C++ over the same index batches into one
output buffer, torchao_kernels::_time_lookups): the share of the roofline
the kernel reaches, apart from the ~3-4 µs any torch.ops call costs.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Callable, List, Optional, Sequence, Tuple

import torch

import torchao_kernels as tk

from .bench import _measure, _md_table, _mib, machine_info, physical_memory_bytes
from .cli_types import (BITS, GROUP_MULTIPLE, MAX_BITS, MAX_DIM, MAX_DIM_TEXT, MAX_THREADS, ArgumentTypeError,
                        check_group_size, positive_float, positive_int, thread_count, writable_path)

LINE = 64
POOL = 64  # index batches cycled per variant
# --models: the widths (embedding_dim and in_features) of the models' layers
# the group size must divide (their MLPs' 1536 is a multiple of both), known
# here so that a bad --group-size fails before a model loads.
MODEL_WIDTHS = {"SmolLM2-135M": 576, "all-MiniLM-L6-v2": 384}


def _lines(nbytes: int) -> int:
    return (nbytes + LINE - 1) // LINE + 1  # +1: a row need not start on a line


def touched_read_bytes(packed: torch.Tensor, count: int) -> int:
    """64-byte lines a batch of `count` lookups reads from a packed buffer (no
    two lookups in one block counted once: random rows of a large table)."""
    info = tk.packed_info(packed)
    n, k, g, nr = info["n"], info["k"], info["group_size"], info["nr"]
    body = info["body_bytes"]
    blocks = (n + nr - 1) // nr
    block_bytes = body // blocks
    # row sums (and bias) at the end of a block are not read by a lookup
    per_row = block_bytes - 4 * nr * (2 if info["has_bias"] else 1)
    if nr > 1:
        return count * per_row  # every line of the block holds a part of the row
    return count * _lines(per_row) * LINE


def _bandwidth(fn: Callable[[], object], nbytes: int, min_time: float,
               baseline: Optional[Callable[[], object]] = None) -> float:
    """nbytes over the fastest pass of fn (minus the fastest pass of baseline:
    the same call on almost no bytes, so only the bytes' time is left)."""
    r = _measure([fn] + ([baseline] if baseline else []), min_time, rounds=1)
    t = r[0]["min_s"] - (r[1]["min_s"] if baseline else 0.0)
    return nbytes / max(t, 1e-9) / 1e9


def kernel_times(args_list: Sequence[tuple], pool: torch.Tensor, min_time: float,
                 rounds: int = 5) -> List[float]:
    """Seconds per lookup of the op body alone (torchao_kernels::_time_lookups:
    no dispatch, one output buffer) for each (packed, scales, zeros), index
    batches cycled from pool; interleaved rounds, median of the rounds'
    medians (the first calls of a round, which bring the rows in, dropped)."""
    T = torch.ops.torchao_kernels._time_lookups
    est = [float(T(p, s, z, pool, 20).median()) for p, s, z in args_list]
    per_round = [[] for _ in args_list]
    for r in range(rounds):
        for j in range(len(args_list)):
            i = (j + r) % len(args_list)
            p, s, z = args_list[i]
            calls = max(100, int(min_time / rounds / max(est[i], 1e-7)))
            t = T(p, s, z, pool, calls + 20)[20:]
            per_round[i].append(float(t.median()))
    return [sorted(x)[len(x) // 2] for x in per_round]


def _state_dict_bytes(model) -> int:
    import io

    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return buf.tell()


def model_check(bits: int, group_size: int, zeros: bool) -> None:
    """SmolLM2-135M and all-MiniLM-L6-v2 quantized with the float embedding kept
    and with embeddings quantized (the tied SmolLM2 head sharing its buffer):
    size in memory and on disk, perplexity / cosine similarity."""
    import copy

    from . import models
    from .evaluate import _lm_accuracy, _lm_logits, eval_text

    model, tok = models.load_smollm2()
    ids = tok(eval_text(), return_tensors="pt").input_ids
    ref, _ = _lm_accuracy(_lm_logits(model, ids), ids, None)
    print(f"SmolLM2-135M, {ids.shape[1]} tokens of the eval text; float32: {models.model_size_bytes(model) / 1e6:.1f} MB, "
          f"perplexity {ref['perplexity']:.3f}")
    rows = []
    base = None
    for emb in (False, True):
        m = copy.deepcopy(model)
        tk.quantize_(m, bits=bits, group_size=group_size, has_zeros=zeros, embeddings=emb, progress=False)
        acc, _ = _lm_accuracy(_lm_logits(m, ids), ids, None)
        e = m.get_input_embeddings()
        shared = isinstance(e, tk.QuantizedEmbedding) and e.is_tied and e.weight_source is m.lm_head.packed_weights
        ppl = acc["perplexity"]
        base = ppl if base is None else base
        rows.append([("quantized, tied head shares one buffer" if shared else "quantized (own copy)")
                     if emb else "float32 (head: own packed copy)",
                     f"{models.model_size_bytes(m) / 1e6:.1f}", f"{_state_dict_bytes(m) / 1e6:.1f}",
                     f"{ppl:.3f}", f"{100 * (ppl / base - 1):+.2f}%"])
        del m
    print(_md_table(["input embedding", "MB in memory", "MB state_dict", "perplexity", "vs float embedding"], rows,
                    right=frozenset({1, 2, 3, 4})))
    del model
    model, tok = models.load_minilm()
    from .demo import SEARCH_DOCS, SEARCH_QUERIES

    sents = SEARCH_DOCS + SEARCH_QUERIES + [x for x in eval_text().split(". ") if len(x.split()) > 4][:48]
    ref = models.embed(model, tok, sents)
    print()
    print(f"all-MiniLM-L6-v2, {len(sents)} sentences; float32: {models.model_size_bytes(model) / 1e6:.1f} MB")
    rows = []
    for emb in (False, True):
        m = copy.deepcopy(model)
        tk.quantize_(m, bits=bits, group_size=group_size, has_zeros=zeros, embeddings=emb, progress=False)
        cos = (models.embed(m, tok, sents) * ref).sum(-1)
        rows.append(["quantized" if emb else "float32", f"{models.model_size_bytes(m) / 1e6:.1f}",
                     f"{_state_dict_bytes(m) / 1e6:.1f}", f"{float(cos.mean()):.4f}", f"{float(cos.min()):.4f}"])
    print(_md_table(["embeddings", "MB in memory", "MB state_dict", "mean cosine", "min cosine"], rows,
                    right=frozenset({1, 2, 3, 4})))


def _parse_shape(text: str) -> Tuple[int, int]:
    parts = text.lower().split("x")
    try:
        n, k = (int(v) for v in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NUMxDIM (e.g. 49152x576), got {text!r}") from None
    if n <= 0 or k <= 0 or k % GROUP_MULTIPLE:
        raise argparse.ArgumentTypeError(f"expected positive sizes with DIM a multiple of {GROUP_MULTIPLE}, "
                                         f"got {text!r}")
    if n > MAX_DIM or k > MAX_DIM:
        raise argparse.ArgumentTypeError(f"expected sizes of at most {MAX_DIM_TEXT} (the ops' bound), got {text!r}")
    return n, k


def _parse_args(p: argparse.ArgumentParser, argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """argv parsed and checked: a bad value is a usage error (exit 2) before
    a model loads or anything is measured."""
    args = p.parse_args(argv)
    g = args.group_size
    if args.models:
        # The lookup benchmark's options: --models would silently drop them.
        given = [opt for opt, name in (("--shape", "shape"), ("--count", "count"), ("--min-time", "min_time"),
                                       ("--json", "json")) if getattr(args, name) is not None]
        if given:
            p.error(f"--models does not use {', '.join(given)} (it takes --bits, --group-size, --zeros, --threads)")
        # quantize_ would skip (keep in float) every layer whose width the
        # group does not divide: the comparison would be of other models.
        bad = {name: w for name, w in MODEL_WIDTHS.items() if w % g}
        if g % GROUP_MULTIPLE or bad:
            fits = [d for d in range(GROUP_MULTIPLE, min(MODEL_WIDTHS.values()) + 1, GROUP_MULTIPLE)
                    if all(w % d == 0 for w in MODEL_WIDTHS.values())]
            p.error(f"--group-size with --models must be a multiple of {GROUP_MULTIPLE} that divides the models' "
                    "widths ("
                    + ", ".join(f"{name} {w}" for name, w in MODEL_WIDTHS.items()) + "): "
                    + ", ".join(map(str, fits)) + f"; got {g}")
        return args
    args.shape = args.shape or (49152, 576)
    args.count = args.count or 128
    args.min_time = args.min_time or 0.5
    n, k = args.shape
    if k % g or g % GROUP_MULTIPLE:
        p.error(f"--group-size must be a multiple of {GROUP_MULTIPLE} that divides embedding_dim {k}, got {g}")
    try:  # the kernels' own bound on a group (what divides k may still exceed it)
        check_group_size(g)
    except ArgumentTypeError as e:
        p.error(f"argument --group-size: {e}")
    # A bound against absurd values (an allocation error after the table is
    # built), not a promise that a run just below it fits: the float32 table,
    # the index pool and one output.
    mem = physical_memory_bytes()
    need = 4 * n * k + POOL * args.count * 8 + 4 * args.count * k
    if mem and need > mem:
        p.error(f"--shape {n}x{k} with --count {args.count}: the float32 table, indices and output need "
                f"{need / 2**30:.1f} GiB, more than this machine's {mem / 2**30:.1f} GiB of memory")
    return args


def run(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m torchao_kernels.bench_embedding", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    # --shape, --count, --min-time default to None so that --models can tell
    # them given (and refuse them); _parse_args fills the defaults.
    p.add_argument("--shape", type=_parse_shape,
                   help=f"num_embeddings x embedding_dim, each at most {MAX_DIM_TEXT} (default 49152x576: SmolLM2's "
                        "vocabulary); the float32 table, indices and output must fit in this machine's memory")
    p.add_argument("--count", type=positive_int, help="lookups per call (default 128)")
    p.add_argument("--bits", type=int, default=4, choices=BITS, metavar=f"1..{MAX_BITS}")
    p.add_argument("--group-size", type=positive_int, default=32,
                   help=f"a multiple of {GROUP_MULTIPLE} dividing embedding_dim (with --models: dividing 576 and 384)")
    p.add_argument("--zeros", action="store_true", help="weights with zero points")
    p.add_argument("--threads", type=thread_count, default=1, help=f"torch threads (at most {MAX_THREADS})")
    p.add_argument("--min-time", type=positive_float, help="seconds of timed calls per variant (default 0.5)")
    p.add_argument("--json", metavar="PATH", type=writable_path,
                   help="also write the results as JSON (its directory must exist)")
    p.add_argument("--models", action="store_true",
                   help="instead: SmolLM2-135M and all-MiniLM-L6-v2 with float vs quantized embeddings "
                        "(size, perplexity, cosine) at --bits / --group-size / --zeros / --threads (--shape, "
                        "--count, --min-time and --json are errors with it)")
    args = _parse_args(p, argv)
    if args.models:
        torch.set_num_threads(args.threads)
        model_check(args.bits, args.group_size, args.zeros)
        return 0
    n, k = args.shape
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(n, k, generator=gen) * 0.05
    q, s, z = tk.quantize_weight(w, args.bits, args.group_size, args.zeros, method="rtn")
    w = tk.dequantize_weight(q, s, z, args.group_size)  # the float table holds the same values
    g = args.group_size
    n16 = tk.pack(q, s, z, bits=args.bits, group_size=g, target="n16k4")
    n1 = tk.pack(q, s, z, bits=args.bits, group_size=g, target="n1k4")
    table = tk.pack_embedding(q, args.bits)
    zz = z if z is not None else torch.zeros_like(s, dtype=torch.int8)
    op = getattr(torch.ops.torchao, f"_embedding_{args.bits}bit")
    pool = [torch.randint(0, n, (args.count,), generator=gen) for _ in range(POOL)]
    out = torch.empty(args.count, k)
    state = {"i": 0}

    def cycling(fn):
        def call():
            state["i"] = (state["i"] + 1) % len(pool)
            return fn(pool[state["i"]])
        return call

    variants = {
        "ours n16k4 (tied head's buffer)": (cycling(lambda i: tk.shared_embedding(n16, g, n, k, i)),
                                           touched_read_bytes(n16, args.count)),
        "ours n1k4 (QuantizedEmbedding)": (cycling(lambda i: tk.shared_embedding(n1, g, n, k, i)),
                                           touched_read_bytes(n1, args.count)),
        f"torchao::_embedding_{args.bits}bit": (cycling(lambda i: op(table, n, k, s, zz, i)),
                                            args.count * (_lines(k * args.bits // 8)
                                                          + _lines(4 * (k // g)) + _lines(k // g)) * LINE),
        "float32 F.embedding": (cycling(lambda i: torch.nn.functional.embedding(i, w)),
                                args.count * _lines(4 * k) * LINE),
    }
    for i in pool[:2]:  # results agree before timing
        ref = w[i]
        assert torch.equal(tk.shared_embedding(n16, g, n, k, i), ref)
        assert torch.equal(tk.shared_embedding(n1, g, n, k, i), ref)
        assert torch.equal(op(table, n, k, s, zz, i), ref)
    timings = _measure([fn for fn, _ in variants.values()], args.min_time)
    pool_t = torch.stack(pool)
    kernels = kernel_times([(n16, None, None), (n1, None, None), (table, s, zz)], pool_t, args.min_time) + [None]
    written = args.count * k * 4
    # Bandwidths, same run: reads from a buffer as large as each table, writes of the output.
    tiny = torch.empty(16)
    wbw = _bandwidth(lambda: out.fill_(1.0), written, 0.1, baseline=lambda: tiny.fill_(1.0))
    read_bw = {}
    for name, nbytes in (("n16k4", n16.numel()), ("n1k4", n1.numel()), ("table", table.numel()),
                         ("float32", w.numel() * 4)):
        buf = torch.ones(max(nbytes, 1 << 20) // 4)
        read_bw[name] = _bandwidth(buf.sum, buf.numel() * 4, 0.2)
        del buf
    bw_key = ["n16k4", "n1k4", "table", "float32"]
    f32_time = timings[-1]["median_s"]
    rows = []
    results = []
    for (name, (_, rbytes)), t, kern, key in zip(variants.items(), timings, kernels, bw_key):
        roof = rbytes / (read_bw[key] * 1e9) + written / (wbw * 1e9)
        med = t["median_s"]
        results.append({"variant": name, "median_us": med * 1e6,
                        "kernel_us": kern * 1e6 if kern is not None else None,
                        "read_bytes": rbytes, "written_bytes": written,
                        "read_bw_gbs": read_bw[key], "write_bw_gbs": wbw, "roofline_us": roof * 1e6,
                        "of_roofline": roof / med, "kernel_of_roofline": roof / kern if kern else None,
                        "vs_float32": f32_time / med})
        rows.append([name, f"{med * 1e6:.1f}", f"{kern * 1e6:.1f}" if kern else "-",
                     f"{(rbytes + written) / 1024:.0f}", f"{roof * 1e6:.1f}",
                     f"{100 * roof / kern:.0f}%" if kern else "-", f"{100 * roof / med:.0f}%",
                     f"{f32_time / med:.2f}x"])
    m = machine_info()
    print(f"machine: {m['cpu']} ({m['arch']}; {' '.join(m['isa'])}), {m['cores']} cores, "
          f"L2 {_mib(m['l2_bytes'])}, L3 {_mib(m['l3_bytes'])}; torch {m['torch']}; {args.threads} thread(s)")
    print(f"{args.count} lookups per call, table {n}x{k}, {args.bits}-bit, group {g}, "
          f"{'zero points' if args.zeros else 'symmetric'}; fresh random indices each call; "
          f"kernels: n16k4 {tk.explain(n16, op='embedding').winner}, n1k4 {tk.explain(n1, op='embedding').winner}")
    print(f"bandwidth (same run): read {', '.join(f'{k_} {v:.0f} GB/s' for k_, v in read_bw.items())}; "
          f"write {wbw:.0f} GB/s")
    print()
    print(_md_table(["variant", "µs per call", "lookup alone µs", "KiB touched", "roofline µs",
                     "of roofline (lookup)", "of roofline (call)", "vs float32 (call)"], rows,
                    right=frozenset(range(1, 8))))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": m, "args": vars(args), "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(run())
