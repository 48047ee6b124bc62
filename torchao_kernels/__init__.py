"""torchao-kernels: low-bit linear layers for PyTorch on CPU, with dynamic kernel selection.

Ops live in the `torchao` namespace (torch.ops.torchao.linear_8bit_act_xbit_weight,
torchao's _linear_8bit_act_{b}bit_weight, ...); this package adds the Python API.
"""
import torch  # noqa: F401  (loads libtorch before the extension)

from . import _C  # noqa: F401  (registers the ops)
from ._compat import torchao_compat_status
from . import autograd as _autograd  # noqa: F401  (gradients w.r.t. the activations)
from .distributed import shard
from .calibrate import Calibration, calibrate
from .config import QuantConfig
from .nn import QuantizedLinear, quantize_
from .embedding import QuantizedEmbedding
from .ops import embedding, linear, pack, pack_embedding, packed_info, repack, shared_embedding, unpack
from .quant import dequantize_weight, quantize_weight
from .tuning import set_tuning, tune, tuning_status
from . import selection as _selection
from .selection import *  # noqa: F401,F403  (explain, stats, overrides, ...: selection.__all__)

__version__ = "0.1.0"

__all__ = [
    "QuantizedLinear",
    "QuantizedEmbedding",
    "quantize_",
    "QuantConfig",
    "calibrate",
    "Calibration",
    "quantize_weight",
    "dequantize_weight",
    "pack",
    "linear",
    "repack",
    "packed_info",
    "unpack",
    "pack_embedding",
    "embedding",
    "shared_embedding",
    "shard",
    *_selection.__all__,
    "torchao_compat_status",
    "tune",
    "set_tuning",
    "tuning_status",
]
