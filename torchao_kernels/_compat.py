"""torchao's per-bit-width ops (_pack_8bit_act_{b}bit_weight, ...), registered
at import unless another library already defines them."""
import warnings

import torch

_status = torch.ops.torchao_kernels._register_torchao_compat()
if _status != "registered":
    warnings.warn(f"torchao_kernels: {_status}", stacklevel=2)


def torchao_compat_status() -> str:
    """'registered' when torchao_kernels serves torchao's per-bit-width ops, else why not."""
    return _status
