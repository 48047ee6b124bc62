"""Tensor parallelism for packed low-bit weights (docs/distributed.md).

shard / narrow cut packed buffers without requantizing; the parallel styles,
the Llama plan and the process setup need torch.distributed's tensor-parallel
modules, which are imported on first use (importing torchao_kernels stays
as fast as before).
"""
from .shard import narrow, shard, shard_bounds, shard_sizes, shard_unit

_LAZY = {
    "QuantizedColwiseParallel": "styles",
    "QuantizedRowwiseParallel": "styles",
    "TPShard": "styles",
    "comm_stats": "styles",
    "reset_comm_stats": "styles",
    "llama_tp_plan": "llama",
    "parallelize_llama": "llama",
    "llama_head_split": "llama",
    "init_tp": "runtime",
    "rank_cores": "runtime",
    "free_port": "runtime",
    "launch": "runtime",
    "explain_shards": "runtime",
}

__all__ = ["shard", "narrow", "shard_bounds", "shard_sizes", "shard_unit", *_LAZY]


def __getattr__(name):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value
