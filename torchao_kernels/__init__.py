"""torchao-kernels: low-bit linear layers for PyTorch on CPU, with dynamic kernel selection."""
import torch  # noqa: F401  (loads libtorch before the extension)

from . import _C  # noqa: F401  (registers the ops)
from ._compat import torchao_compat_status
