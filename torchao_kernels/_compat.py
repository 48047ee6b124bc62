"""torchao's per-bit-width ops (_pack_8bit_act_{b}bit_weight, ...), registered
at import unless another library already defines them."""
import functools
import json
import warnings

import torch

_status = torch.ops.torchao_kernels._register_torchao_compat()
if _status != "registered":
    warnings.warn(f"torchao_kernels: {_status}", stacklevel=2)
# torchao's embedding ops (_pack_embedding_{b}bit, _embedding_{b}bit, _shared_embedding_{b}bit).
_embedding_status = torch.ops.torchao_kernels._register_torchao_embedding_compat()
if _embedding_status != "registered" and _embedding_status != _status:
    warnings.warn(f"torchao_kernels: {_embedding_status}", stacklevel=2)


def torchao_compat_status(ops: str = "linear") -> str:
    """'registered' when torchao_kernels serves torchao's per-bit-width ops, else why not.
    ops: "linear" (_linear_8bit_act_{b}bit_weight, _pack_8bit_act_{b}bit_weight) or
    "embedding" (_embedding_{b}bit, _shared_embedding_{b}bit, _pack_embedding_{b}bit)."""
    if ops == "linear":
        return _status
    if ops == "embedding":
        return _embedding_status
    raise ValueError(f"ops must be 'linear' or 'embedding', got {ops!r}")


@functools.lru_cache(maxsize=None)
def op_list() -> dict:
    """The extension's op list (ops/impl/op_list.h), written once in C++:
    {"families": [{"family", "name", "per_bit": [torchao's per-bit-width names], "out"}],
     "executorch": ["torchao::<name>.out", ... the ExecuTorch kernel library's ops]}."""
    return json.loads(torch.ops.torchao_kernels._op_list_json())


def op_family(family: str) -> dict:
    """One family of op_list() by its id ("linear", "embedding", ...)."""
    for f in op_list()["families"]:
        if f["family"] == family:
            return f
    raise ValueError(f"unknown op family {family!r}; known: {[f['family'] for f in op_list()['families']]}")
