"""torchao's per-bit-width ops (_pack_8bit_act_{b}bit_weight, ...), registered
at import unless another library already defines them."""
import functools
import importlib.util
import json
import sys
import warnings

import torch

from ._after_import import after_import

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


# ---------------------------------------------------------------------------
# torchao's Python package registers Meta kernels for the per-bit-width names
# when it is imported (torchao/csrc_meta_ops.py). Imported after this package,
# they replace this package's, and they take 2-D activations and 1-D indices
# only, so torch.compile and torch.export of the 1-D / 3-D calls that run
# eagerly would fail (ExecuTorch's exir imports torchao). Once that module has
# run, the per-bit-width names get Meta kernels again that defer to this
# package's own ops' (the same shape rules, symbolic shapes included).

def _linear_meta(activations, packed_weights, group_size, n, k):
    return torch.ops.torchao.linear_8bit_act_xbit_weight(activations, packed_weights, group_size, n, k)


def _embedding_meta(packed_weight_qvals, num_embeddings, embedding_dim, weight_scales, weight_zeros, indices):
    return torch.ops.torchao.embedding_xbit(packed_weight_qvals, num_embeddings, embedding_dim, weight_scales,
                                            weight_zeros, indices)


def _shared_embedding_meta(packed_weights, group_size, n, k, indices):
    return torch.ops.torchao.shared_embedding_xbit(packed_weights, group_size, n, k, indices)


_META_LIBS = []


def _reassert_meta_kernels() -> None:
    lib = torch.library.Library("torchao", "IMPL")
    families = []
    if _status == "registered":
        families.append(("linear", _linear_meta))
    if _embedding_status == "registered":
        families += [("embedding", _embedding_meta), ("shared_embedding", _shared_embedding_meta)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel": on purpose
        for family, fn in families:
            for name in op_family(family)["per_bit"]:
                lib.impl(name, fn, "Meta")
    _META_LIBS.append(lib)


_TORCHAO_META_MODULE = "torchao.csrc_meta_ops"
if (_status == "registered" or _embedding_status == "registered") and \
        importlib.util.find_spec("torchao") is not None:
    if _TORCHAO_META_MODULE in sys.modules:  # ran before this package defined the ops
        _reassert_meta_kernels()
    # always: the module raises at its later registrations (ops this package
    # does not define) after replacing the Meta kernels of ours; and every time
    # it runs (a failed import leaves it out of sys.modules, to run again)
    after_import(_TORCHAO_META_MODULE, _reassert_meta_kernels, once=False, always=True)
