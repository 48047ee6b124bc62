"""torchao's per-bit-width ops (_pack_8bit_act_{b}bit_weight, ...), registered
at import unless another library already defines them."""
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
