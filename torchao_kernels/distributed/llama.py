"""The usual tensor-parallel plan for Llama-style Hugging Face models.

q/k/v, gate and up projections column-parallel, o and down projections
row-parallel (one all-reduce after attention and one after the MLP per
layer), the output head column-parallel with its logits gathered, the input
embedding row-parallel along the vocabulary; the norms and the rotary
embedding stay replicated. That is the plan of torch's own Llama
tensor-parallel example and of Hugging Face's `base_model_tp_plan` for
Llama, with two differences a quantized model on few ranks needs:

- attention is cut by whole key/value groups (a key/value head and the
  query heads that share it), which need not divide evenly: SmolLM2-135M
  has 3 key/value heads, so TP = 2 gives one rank 2 and the other 1 (6 and
  3 query heads), where an even cut would split a head;
- every cut also falls on the packed format's row blocks (column-parallel)
  and groups (row-parallel).

Attention modules then see fewer heads: Hugging Face's LlamaAttention
infers them from the projections' widths (reshape to (-1, head_dim)); older
attributes (num_heads, num_key_value_heads) are set per rank when present.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional

from torch import nn
from torch.distributed.tensor import DeviceMesh, Replicate, Shard
from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module

from .. import ops
from ..embedding import QuantizedEmbedding
from ..nn import QuantizedLinear
from .shard import shard_sizes
from .styles import QuantizedColwiseParallel, QuantizedRowwiseParallel

__all__ = ["llama_tp_plan", "parallelize_llama", "llama_head_split"]


def _unit(mod: nn.Module, dim: int) -> int:
    if isinstance(mod, QuantizedLinear):
        info = ops.packed_info(mod.packed_weights)
        return info["nr"] if dim == 0 else info["group_size"]
    return 1


def _decoder_layers(model: nn.Module) -> List[nn.Module]:
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no .model.layers (a Llama-style decoder stack)")
    return list(layers)


def _prefix(model: nn.Module) -> str:
    return "model." if hasattr(model, "model") and hasattr(model.model, "layers") else ""


def llama_head_split(num_kv_heads: int, tp_size: int) -> List[int]:
    """Key/value heads per rank: as even as possible, the first ranks take the extra ones."""
    if tp_size > num_kv_heads:
        raise ValueError(
            f"tp_size={tp_size} is more than num_key_value_heads={num_kv_heads}: every rank needs at "
            f"least one key/value head (replicating key/value heads is not supported)"
        )
    return shard_sizes(num_kv_heads, tp_size, 1)


MODES = ("reduce", "full_row_quant", "exact")


def llama_tp_plan(model: nn.Module, tp_size: int, *, mode: str = "reduce",
                  lm_head: bool = True, embedding: bool = True) -> Dict[str, ParallelStyle]:
    """{module fqn: style} for parallelize_module, for this model and tp_size.

    mode: how o_proj and down_proj are split (docs/distributed.md):
      "reduce" (default): row-parallel, one all-reduce each; outputs differ
        from TP = 1 by the float sum of the partials and by each rank
        quantizing only its slice of the activation row;
      "full_row_quant": row-parallel, every rank quantizes with the full
        row's range (QuantizedRowwiseParallel(full_row_quant=True)): integer
        parts as TP = 1, only the float sum of the partials differs;
      "exact": column-parallel on the all-gathered input, output all-gathered
        (two all-gathers instead of one all-reduce, about the same bytes):
        every layer's output is bit-identical to TP = 1, so is the model's.
    lm_head: shard the output head along the vocabulary and all-gather the logits.
    embedding: shard the input embedding along the vocabulary (each rank looks
      up its rows, an all-reduce assembles them: exact). A QuantizedEmbedding
      tied to the head reads the head's shard; with lm_head=False it stays whole.
    """
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise ValueError(f"tp_size must be a positive int, got {tp_size!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    cfg = model.config
    heads, kv = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    per_kv = heads // kv
    kv_split = llama_head_split(kv, tp_size)
    pre = _prefix(model)
    plan: Dict[str, ParallelStyle] = {}
    for i, layer in enumerate(_decoder_layers(model)):
        attn, mlp = layer.self_attn, layer.mlp
        q_sizes = [h * per_kv * head_dim for h in kv_split]
        kv_sizes = [h * head_dim for h in kv_split]
        _check_cuts(f"{pre}layers.{i}.self_attn.q_proj", attn.q_proj, 0, q_sizes, "query heads")
        _check_cuts(f"{pre}layers.{i}.self_attn.k_proj", attn.k_proj, 0, kv_sizes, "key/value heads")
        _check_cuts(f"{pre}layers.{i}.self_attn.v_proj", attn.v_proj, 0, kv_sizes, "key/value heads")
        if mode != "exact":  # exact mode cuts o_proj along n, its input whole
            _check_cuts(f"{pre}layers.{i}.self_attn.o_proj", attn.o_proj, 1, q_sizes, "query heads")
        a = f"{pre}layers.{i}.self_attn."
        plan[a + "q_proj"] = QuantizedColwiseParallel(sizes=q_sizes)
        plan[a + "k_proj"] = QuantizedColwiseParallel(sizes=kv_sizes)
        plan[a + "v_proj"] = QuantizedColwiseParallel(sizes=kv_sizes)
        plan[a + "o_proj"] = _second(mode, attn.o_proj, q_sizes, tp_size)
        inter = mlp.gate_proj.out_features
        # gate/up are cut along n and down along k at the same places: a unit
        # that is both a row block and a group (exact mode gathers down's input
        # and cuts it along n: no group to meet).
        unit = math.lcm(_unit(mlp.gate_proj, 0), _unit(mlp.up_proj, 0),
                        1 if mode == "exact" else _unit(mlp.down_proj, 1))
        m_sizes = shard_sizes(inter, tp_size, unit)
        m = f"{pre}layers.{i}.mlp."
        plan[m + "gate_proj"] = QuantizedColwiseParallel(sizes=m_sizes)
        plan[m + "up_proj"] = QuantizedColwiseParallel(sizes=m_sizes)
        plan[m + "down_proj"] = _second(mode, mlp.down_proj, m_sizes, tp_size)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head_sizes = None
    if lm_head and isinstance(head, (QuantizedLinear, nn.Linear)):
        name = next(n for n, mod in model.named_modules() if mod is head)
        head_sizes = shard_sizes(head.out_features, tp_size, _unit(head, 0))
        plan[name] = QuantizedColwiseParallel(output_layouts=Replicate(), sizes=head_sizes)
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if (not embedding and head_sizes is not None and isinstance(emb, QuantizedEmbedding) and emb.is_tied
            and emb.weight_source is getattr(head, "packed_weights", None)):
        raise ValueError("the input embedding is tied to the output head (it reads the head's packed buffer), so "
                         "sharding the head shards its table too: pass embedding=True (the embedding is cut "
                         "with the head's sizes) or lm_head=False (both stay whole)")
    if embedding and isinstance(emb, (QuantizedEmbedding, nn.Embedding)):
        name = next(n for n, mod in model.named_modules() if mod is emb)
        tied = isinstance(emb, QuantizedEmbedding) and emb.is_tied
        if tied and head_sizes is None:
            pass  # it reads the head's buffer, which stays whole: so does the embedding
        else:
            unit = ops.packed_info(emb.packed_weights)["nr"] if isinstance(emb, QuantizedEmbedding) and not tied \
                else 1
            sizes = head_sizes if tied else shard_sizes(emb.num_embeddings, tp_size, unit)
            plan[name] = QuantizedRowwiseParallel(input_layouts=Replicate(), sizes=sizes)
    return plan


def _second(mode: str, mod: nn.Module, in_sizes: List[int], tp_size: int) -> ParallelStyle:
    """The style of the layer after a column-parallel one (o_proj, down_proj),
    whose input arrives cut into in_sizes."""
    if mode == "exact":
        return QuantizedColwiseParallel(input_layouts=Shard(-1), output_layouts=Replicate(), input_sizes=in_sizes,
                                        sizes=shard_sizes(mod.out_features, tp_size, _unit(mod, 0)))
    return QuantizedRowwiseParallel(sizes=in_sizes, full_row_quant=(mode == "full_row_quant"))


def _check_cuts(fqn: str, mod: nn.Module, dim: int, sizes: List[int], what: str) -> None:
    unit = _unit(mod, dim)
    cut = 0
    for s in sizes[:-1]:
        cut += s
        if cut % unit:
            kind = "row block" if dim == 0 else "group"
            raise ValueError(f"{fqn}: cutting by whole {what} puts a cut at {cut}, not on a {unit}-wide {kind} "
                             f"of its packed weights; use another tp_size or group size")


def parallelize_llama(model: nn.Module, mesh: DeviceMesh, *, mode: str = "reduce", lm_head: bool = True,
                      embedding: bool = True, plan: Optional[Dict[str, ParallelStyle]] = None) -> nn.Module:
    """Applies llama_tp_plan(model, mesh.size(), mode=, lm_head=, embedding=)
    (or `plan`) to a Llama-style model converted by quantize_, in place, on a
    1-D mesh; returns the model.

    Every rank must hold the same full model before (e.g. each loads and
    quantizes it: quantize_ is deterministic); afterwards each holds its shards.
    """
    tp = mesh.size()
    if plan is None:
        plan = llama_tp_plan(model, tp, mode=mode, lm_head=lm_head, embedding=embedding)
    parallelize_module(model, mesh, plan)
    rank = mesh.get_local_rank()
    cfg = model.config
    heads, kv = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    mine = llama_head_split(kv, tp)[rank]
    for layer in _decoder_layers(model):
        attn = layer.self_attn
        # LlamaAttention in transformers >= 4.48 derives the head counts from the
        # tensors; earlier versions (and torch's example model) read these.
        if hasattr(attn, "num_heads"):
            attn.num_heads = mine * (heads // kv)
        if hasattr(attn, "num_key_value_heads"):
            attn.num_key_value_heads = mine
    model.tp_plan_applied = {"tp_size": tp, "rank": rank, "kv_heads": mine, "mode": mode}
    return model
