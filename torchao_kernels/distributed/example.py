"""End-to-end tensor parallelism on one machine, compared with TP = 1.

    python -m torchao_kernels.distributed.example                 # SmolLM2-135M, 4 bits, TP = 2
    python -m torchao_kernels.distributed.example --model tiny    # a small random Llama-like model
    python -m torchao_kernels.distributed.example --generate      # only shard and answer, with tokens/s

Starts `--tp` processes (gloo over 127.0.0.1, `--threads` per rank). Every rank
loads the model, quantizes it with quantize_ (deterministic, so every rank
holds the same packed weights), runs the TP = 1 reference, shards the model
with parallelize_llama and runs it again, then reports: whether every
column-parallel layer's output equals the same columns of TP = 1 (torch.equal),
how far the row-parallel layers and the logits move, perplexity on a fixed
text (the first --text-tokens tokens of it; the report says how many were
used), and whether greedy generation gives the same tokens; once for each of
the three ways to split o_proj / down_proj: reduce (the default row-parallel
quantization), full_row_quant and exact (docs/distributed.md).

With --generate, each rank only shards the model (one --mode) and answers the
prompt: no TP = 1 comparison, no perplexity text.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from typing import Dict, List, Optional

import torch
import torch.distributed as dist
from torch import nn

from .. import models
from ..embedding import QuantizedEmbedding
from ..nn import quantize_

PROMPT = "In two sentences, why do lighthouses flash in different patterns?"


def tiny_llama(seed: int = 0, heads: int = 6, kv_heads: int = 3, head_dim: int = 32, layers: int = 2,
               intermediate: int = 512, vocab: int = 1024) -> nn.Module:
    """A random Llama-like model (LlamaForCausalLM) whose shapes exercise what
    SmolLM2 needs: GQA, a number of key/value heads that TP = 2 cannot split
    evenly, a tied output head. Same weights for the same seed."""
    tf = models._transformers()
    torch.manual_seed(seed)
    cfg = tf.LlamaConfig(hidden_size=heads * head_dim, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         head_dim=head_dim, intermediate_size=intermediate, num_hidden_layers=layers,
                         vocab_size=vocab, tie_word_embeddings=True, max_position_embeddings=512)
    model = tf.LlamaForCausalLM(cfg).eval()
    # Random init gives near-zero logits everywhere; scaling the head spreads
    # them like a trained model's, so greedy tokens are not decided by noise.
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(4.0)
    return model


def _load(spec: dict, mesh):
    if spec["model"] == "tiny":
        model = tiny_llama(**spec.get("tiny", {}))
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, model.config.vocab_size, (1, spec.get("text_tokens", 64)), generator=g)
        prompt = ids[:, :12]
        return model, ids, prompt
    # Rank 0 loads first: the first load converts the GGUF (~20 s) and writes
    # the float32 cache, which the other ranks then read.
    rank = dist.get_rank()
    if rank != 0:
        dist.barrier()
    model, tok = models.load_smollm2()
    if rank == 0:
        dist.barrier()
    from ..evaluate import eval_text

    ids = tok(eval_text(), return_tensors="pt").input_ids[:, : spec.get("text_tokens", 256)]
    return model, ids, models.chat_input_ids(tok, spec.get("prompt", PROMPT))


def _capture(model: nn.Module, names: List[str]):
    """Hooks recording each named module's (input, output) on its next call."""
    store: Dict[str, tuple] = {}
    handles = []
    for name in names:
        mod = model.get_submodule(name)

        def hook(m, args, out, name=name):
            store[name] = (args[0].detach().clone(), out.detach().clone())

        handles.append(mod.register_forward_hook(hook))
    return store, handles


@torch.inference_mode()
def _logits(model, ids):
    return model(ids, use_cache=False).logits[0].float()


def _perplexity(logits: torch.Tensor, ids: torch.Tensor) -> float:
    logp = torch.log_softmax(logits[:-1], -1)
    return float(torch.exp(-logp.gather(1, ids[0, 1:, None]).mean()))


def _packed_bytes(model: nn.Module) -> int:
    """Bytes of the model's packed buffers (a tied embedding's is its head's, counted once)."""
    return sum(b.numel() for b in {id(b): b for n, b in model.named_buffers() if n.endswith("packed_weights")}.values())


@torch.inference_mode()
def compare(mesh, spec: dict) -> dict:
    """One rank's side of the comparison (run under launch()); returns its report."""
    from .llama import llama_tp_plan, parallelize_llama
    from .runtime import explain_shards
    from .styles import comm_stats, reset_comm_stats

    rank = mesh.get_local_rank()
    clock = _Clock()
    model, ids, prompt = _load(spec, mesh)
    clock("load")
    quantize_(model, bits=spec.get("bits", 4), group_size=spec.get("group_size", 32),
              has_zeros=spec.get("zeros", True), progress=False, **spec.get("quantize_kwargs", {}))
    gen_tokens = spec.get("gen_tokens", 16)
    plan = llama_tp_plan(model, mesh.size())
    col = [n for n, s in plan.items() if type(s).__name__ == "QuantizedColwiseParallel"]
    # the vocabulary-parallel embedding is exact too (one nonzero row per id)
    emb = [n for n in plan if isinstance(model.get_submodule(n), (nn.Embedding, QuantizedEmbedding))]
    row = [n for n in plan if n not in col and n not in emb]

    store, handles = _capture(model, col + emb + row)
    ref_logits = _logits(model, ids)
    for h in handles:
        h.remove()
    clock("quantize")
    ref_tokens = models.greedy_generate(model, prompt, gen_tokens).tokens
    packed_before, bytes_before = _packed_bytes(model), models.model_size_bytes(model)
    clock("tp1 reference")

    out = {"rank": rank, "tp": mesh.size(), "threads": torch.get_num_threads(),
           "ppl_tp1": _perplexity(ref_logits, ids), "tokens_tp1": ref_tokens,
           "packed_bytes_tp1": packed_before, "model_bytes_tp1": bytes_before, "variants": {},
           # the perplexity text: smollm2's eval text may hold fewer tokens than asked
           "text_tokens": int(ids.shape[1]), "text_tokens_asked": spec.get("text_tokens")}
    variants = spec.get("modes", ["reduce", "full_row_quant", "exact"])
    unsharded = copy.deepcopy(model) if len(variants) > 1 else None
    for i, variant in enumerate(variants):
        m = model if i == 0 else copy.deepcopy(unsharded)
        vplan = llama_tp_plan(m, mesh.size(), mode=variant)
        parallelize_llama(m, mesh, mode=variant, plan=vplan)
        clock(f"{variant}: parallelize")
        res: dict = {}
        if i == 0:
            out["kv_heads"] = m.tp_plan_applied["kv_heads"]
            out["packed_bytes"] = _packed_bytes(m)
            out["model_bytes"] = models.model_size_bytes(m)
            out["explain_m1"] = {k: v for k, v in list(explain_shards(m, 1).items())[:7]}
            # Every column-parallel shard, fed the input its layer saw at TP = 1,
            # against the same columns of the TP = 1 output.
            eq = {}
            for name in col + emb:
                x, y = store[name]
                mod = m.get_submodule(name)
                got = mod(x)
                sh = mod.tp_shard
                want = y if got.shape[-1] == y.shape[-1] else y.narrow(-1, sh.start, sh.length)
                eq[name] = bool(torch.equal(got, want))
            res["colwise_equal"] = eq
            clock(f"{variant}: column-parallel checks")
        # o_proj / down_proj in isolation: the TP = 1 input, cut as the
        # column-parallel layer before them leaves it; the output after the
        # collective, against TP = 1's.
        worst, ref_scale, exact = 0.0, 0.0, 0
        for name in row:
            x, y = store[name]
            mod = m.get_submodule(name)
            style = vplan[name]
            cut = getattr(style, "input_sizes", None) or mod.tp_shard.sizes
            got = mod(x.narrow(-1, sum(cut[:rank]), cut[rank]))
            worst = max(worst, float((got - y).abs().max()))
            ref_scale = max(ref_scale, float(y.abs().max()))
            exact += int(torch.equal(got, y))
        res["rowwise_max_abs"] = worst
        res["rowwise_ref_max_abs"] = ref_scale
        res["rowwise_layers_equal"] = exact
        res["rowwise_layers"] = len(row)
        logits = _logits(m, ids)
        res["logits_max_abs"] = float((logits - ref_logits).abs().max())
        res["logits_ref_max_abs"] = float(ref_logits.abs().max())
        res["argmax_agreement"] = float((logits.argmax(-1) == ref_logits.argmax(-1)).float().mean())
        res["ppl"] = _perplexity(logits, ids)
        reset_comm_stats()
        res["tokens"] = models.greedy_generate(m, prompt, gen_tokens).tokens
        res["tokens_equal"] = res["tokens"] == ref_tokens
        res["first_divergence"] = next((j for j, (a, b) in enumerate(zip(res["tokens"], ref_tokens)) if a != b),
                                       None)
        res["comm_during_generate"] = comm_stats()
        out["variants"][variant] = res
        clock(f"{variant}: model runs")
        del m
    out["seconds"] = clock.laps
    return out


class _Clock:
    def __init__(self):
        self.laps: Dict[str, float] = {}
        self.t = time.perf_counter()

    def __call__(self, what: str) -> None:
        now = time.perf_counter()
        self.laps[what] = round(now - self.t, 2)
        self.t = now


def summarize(reports: List[dict]) -> str:
    r0 = reports[0]
    lines = [f"TP = {r0['tp']}, {r0['threads']} thread(s) per rank; key/value heads per rank: "
             f"{[r['kv_heads'] for r in reports]}",
             f"packed weights per rank: {[round(r['packed_bytes'] / 1e6, 2) for r in reports]} MB "
             f"(TP = 1: {r0['packed_bytes_tp1'] / 1e6:.2f} MB); whole model per rank: "
             f"{[round(r['model_bytes'] / 1e6, 2) for r in reports]} MB (TP = 1: {r0['model_bytes_tp1'] / 1e6:.2f} MB)"]
    if "text_tokens" in r0:
        used, asked = r0["text_tokens"], r0.get("text_tokens_asked")
        lines.append(f"perplexity over {used} text tokens" + (
            f" (--text-tokens {asked} asked: the text has only {used})" if asked is not None and asked > used
            else ""))
    for r in reports:
        lines.append(f"rank {r['rank']} kernels at m = 1: " + ", ".join(
            f"{k.removeprefix('model.')} {n}x{kk} {w}" for k, (n, kk, w) in list(r["explain_m1"].items())[:3]))
    for variant, v in r0["variants"].items():
        if "colwise_equal" in v:
            ok = sum(all(r["variants"][variant]["colwise_equal"].values()) for r in reports)
            lines.append(f"column-parallel layers and the embedding bit-identical to TP = 1: "
                         f"{sum(sum(r['variants'][variant]['colwise_equal'].values()) for r in reports)} of "
                         f"{sum(len(r['variants'][variant]['colwise_equal']) for r in reports)} shards "
                         f"({ok} of {len(reports)} ranks all equal)")
        lines.append(
            f"[{variant}] o_proj/down_proj: max |diff| {v['rowwise_max_abs']:.3g} (outputs up to "
            f"{v['rowwise_ref_max_abs']:.3g}; {v['rowwise_layers_equal']}/{v['rowwise_layers']} layers equal); "
            f"logits max |diff| {v['logits_max_abs']:.3g} (up to {v['logits_ref_max_abs']:.3g}), argmax "
            f"agreement {v['argmax_agreement']:.1%}; perplexity {r0['ppl_tp1']:.4f} -> {v['ppl']:.4f} "
            f"({(v['ppl'] / r0['ppl_tp1'] - 1) * 100:+.3f}%); greedy tokens "
            + (f"same ({len(v['tokens'])})" if v["tokens_equal"] else
               f"differ from token {v['first_divergence']} of {len(v['tokens'])}"))
    return "\n".join(lines)


@torch.inference_mode()
def generate(mesh, spec: dict) -> dict:
    """Load, quantize, shard (mode spec["mode"]) and answer the prompt: what a
    serving rank does, without the TP = 1 comparison."""
    from .llama import parallelize_llama
    from .styles import comm_stats, reset_comm_stats

    model, ids, prompt = _load(spec, mesh)
    quantize_(model, bits=spec.get("bits", 4), group_size=spec.get("group_size", 32),
              has_zeros=spec.get("zeros", True), progress=False, **spec.get("quantize_kwargs", {}))
    if mesh.size() > 1:
        parallelize_llama(model, mesh, mode=spec.get("mode", "reduce"))
    models.greedy_generate(model, prompt[:, :8], 2)  # warm-up
    reset_comm_stats()
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    g = models.greedy_generate(model, prompt, spec.get("gen_tokens", 24), eos if isinstance(eos, int) else None)
    comm = sum(v["seconds"] for v in comm_stats().values())
    return {"rank": mesh.get_local_rank(), "tokens": g.tokens, "prefill_tok_s": g.prefill_tokens_per_s,
            "decode_tok_s": g.decode_tokens_per_s, "comm_s": comm, "total_s": g.prefill_s + g.decode_s,
            "threads": torch.get_num_threads(), "model_mb": models.model_size_bytes(model) / 1e6}


def _text_tokens(text: str) -> int:
    from ..cli_types import positive_int

    v = positive_int(text)
    if v < 2:
        raise argparse.ArgumentTypeError(f"expected an integer >= 2 (perplexity needs a next token to predict), "
                                         f"got {text!r}")
    return v


def _under_torchrun() -> bool:
    import os

    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def _parser() -> argparse.ArgumentParser:
    from ..cli_types import GROUP_MULTIPLE, MAX_BITS, bits, group_size, positive_int

    ap = argparse.ArgumentParser(prog="python -m torchao_kernels.distributed.example", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    ap.add_argument("--tp", type=positive_int, default=2, help="ranks to start here (ignored under torchrun)")
    ap.add_argument("--threads", type=positive_int, default=None,
                    help="threads per rank (default: cores / ranks; given and without --pin, more ranks "
                         "than cores may share them)")
    ap.add_argument("--pin", action="store_true", help="pin each rank to its own block of cores")
    ap.add_argument("--comm", choices=["auto", "shm", "gloo"], default="auto")
    ap.add_argument("--bits", type=bits, default=4, help=f"weight bits, 1..{MAX_BITS} (default %(default)s)")
    ap.add_argument("--group-size", type=group_size(), default=32,
                    help=f"a positive multiple of {GROUP_MULTIPLE} (default %(default)s)")
    ap.add_argument("--no-zeros", action="store_true")
    ap.add_argument("--text-tokens", type=_text_tokens, default=None,
                    help="tokens of the perplexity text, at least 2 (default 512; smollm2's text may hold "
                         "fewer: the report says how many were used); not with --generate")
    ap.add_argument("--gen-tokens", type=positive_int, default=24,
                    help="greedy tokens to generate (default %(default)s; with --generate at least 2, the "
                         "first coming from the prefill)")
    ap.add_argument("--generate", action="store_true",
                    help="only shard and answer the prompt (no TP = 1 comparison), with tokens/s")
    ap.add_argument("--mode", choices=["reduce", "full_row_quant", "exact"], default="reduce",
                    help="only with --generate: how o_proj / down_proj are split (the comparison runs all "
                         "three)")
    ap.add_argument("--json", action="store_true", help="print the per-rank reports as JSON")
    return ap


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """The command line, every value checked (usage errors, exit 2) before any rank starts."""
    from ..cli_types import cores_short_for

    ap = _parser()
    a = ap.parse_args(argv)
    if a.generate and a.text_tokens is not None:
        ap.error(f"argument --text-tokens: not used with --generate (it sets the comparison's perplexity "
                 f"text), got {a.text_tokens}")
    if a.text_tokens is None:
        a.text_tokens = 512
    if a.generate and a.gen_tokens < 2:
        ap.error(f"argument --gen-tokens: with --generate at least 2 (the first token comes from the prefill; "
                 f"the decode speed needs another), got {a.gen_tokens}")
    cores = None if _under_torchrun() else cores_short_for(a.tp, a.threads, a.pin)
    if cores is not None:
        why = ("--pin gives each rank its own core(s)" if a.pin
               else "without --threads each rank gets its own core(s)")
        ap.error(f"argument --tp: {a.tp} ranks but this process may run on only {cores} cores ({why}; "
                 "give --threads without --pin to let ranks share cores)")
    return a


def main(argv: Optional[List[str]] = None) -> int:
    from .runtime import init_tp, launch

    a = parse_args(argv)
    spec = {"model": a.model, "bits": a.bits, "group_size": a.group_size, "zeros": not a.no_zeros,
            "text_tokens": a.text_tokens, "gen_tokens": a.gen_tokens, "mode": a.mode}
    fn = generate if a.generate else compare
    if _under_torchrun():
        # started by torchrun (or by hand with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
        mesh = init_tp(threads=a.threads, pin=a.pin, comm=a.comm)
        mine = fn(mesh, spec)
        reports = [None] * mesh.size()
        dist.all_gather_object(reports, mine)
        if dist.get_rank() != 0:
            return 0
    else:
        reports = launch(fn, a.tp, spec, threads=a.threads, pin=a.pin, comm=a.comm)
    if a.json:
        print(json.dumps(reports, indent=1))
    elif a.generate:
        r0 = reports[0]
        print(f"TP = {len(reports)} ({a.mode}), {r0['threads']} thread(s) per rank: prefill "
              f"{r0['prefill_tok_s']:.0f} tok/s, decode {r0['decode_tok_s']:.1f} tok/s, "
              f"{r0['comm_s'] / r0['total_s']:.0%} of the time in collectives; model per rank "
              f"{[round(r['model_mb'], 1) for r in reports]} MB")
        print("answer:", _decode(spec, r0["tokens"]))
    else:
        print(summarize(reports))
    return 0


def _decode(spec: dict, tokens: List[int]) -> str:
    if spec["model"] != "smollm2":
        return str(tokens)
    _, tok = models.load_smollm2()
    return tok.decode(tokens, skip_special_tokens=True)


if __name__ == "__main__":
    sys.exit(main())
