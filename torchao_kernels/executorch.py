"""ExecuTorch: export models that use torchao_kernels' ops to a .pte, and run them.

    import torchao_kernels as tk
    from torchao_kernels import executorch as tke

    tk.quantize_(model, bits=4, group_size=32)              # or torchao's quantize_ flow
    tke.export(model, (x,), "model.pte")                     # torch.export -> to_edge -> to_executorch
    method = tke.load("model.pte")                           # loads the kernel library, then the program
    y = method.execute([x])[0]

The .pte holds the ops' out variants (torchao::linear_8bit_act_xbit_weight.out,
torchao::_linear_8bit_act_{b}bit_weight.out) and the packed weights as
constants. At run time they are served by libtorchao_kernels_executorch.so, an
ExecuTorch kernel library built from the same op body and kernels as the torch
extension (tools/build_executorch.sh builds it); `load_kernels()` loads it into
this process, once. Needs the `executorch` package (pip install executorch==1.5.1).
"""
from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import threading
import warnings
from typing import Any, Dict, List, Optional, Sequence, Union

import torch

from . import selection as _selection
from ._compat import op_list as _op_list

__all__ = [
    "LIBRARY_NAME",
    "OPS",
    "library_path",
    "load_kernels",
    "is_loaded",
    "export",
    "operators",
    "load",
    "kernels_info",
    "kernels_stats",
]

LIBRARY_NAME = "libtorchao_kernels_executorch.so"
ENV_LIBRARY = "TORCHAO_KERNELS_EXECUTORCH_LIB"

# The ops the kernel library registers: the out= variants of the extension's op
# list (ops/impl/op_list.h), read from the extension rather than restated here.
OPS = tuple(_op_list()["executorch"])

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[str] = None


def _require_executorch() -> None:
    if importlib.util.find_spec("executorch") is None:
        raise ImportError(
            "torchao_kernels.executorch needs the executorch package: "
            "pip install executorch==1.5.1 (or pip install torchao-kernels[executorch])"
        )


def _candidates() -> List[str]:
    env = os.environ.get(ENV_LIBRARY)
    if env:
        return [env]
    pkg_dirs = list(importlib.util.find_spec("torchao_kernels").submodule_search_locations or [])
    out = [os.path.join(d, LIBRARY_NAME) for d in pkg_dirs]
    # A source checkout: the build tree of tools/build_executorch.sh.
    out += [os.path.join(os.path.dirname(d), "build", "executorch", LIBRARY_NAME) for d in pkg_dirs]
    return out


def library_path() -> str:
    """The kernel library load_kernels() would load: $TORCHAO_KERNELS_EXECUTORCH_LIB, else
    the package folder, else build/executorch/ of a source checkout."""
    cands = _candidates()
    for c in cands:
        if os.path.isfile(c):
            return os.path.realpath(c)
    raise FileNotFoundError(
        f"{LIBRARY_NAME} not found (looked in: {', '.join(cands)}). Build it with "
        f"`bash tools/build_executorch.sh` in the torchao_kernels source tree, or point "
        f"{ENV_LIBRARY} at it."
    )


def _mapped_copies() -> List[str]:
    """Files named like the kernel library that are mapped into this process."""
    stem = LIBRARY_NAME[: -len(".so")]
    found = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6:
                    p = parts[5].strip()
                    if os.path.basename(p).startswith(stem) and p not in found:
                        found.append(p)
    except OSError:
        pass
    return found


def _registered_torchao_ops() -> List[str]:
    from executorch.extension.pybindings import portable_lib

    return [op for op in portable_lib._get_operator_names() if op.startswith("torchao::")]


def load_kernels(path: Optional[str] = None) -> str:
    """Loads the ExecuTorch kernel library into this process (idempotent) and returns its path.

    ExecuTorch aborts the process when an op is registered twice, so a library is
    loaded only if none of its ops is registered yet: a second call, a second copy
    of the library, or another library serving the same ops (torchao's own) are
    detected through ExecuTorch's operator registry first.
    """
    global _lib, _lib_path
    _require_executorch()
    with _lock:
        if _lib_path is not None:
            return _lib_path
        registered = set(_registered_torchao_ops())
        ours = [op for op in OPS if op in registered]
        if ours:
            copies = _mapped_copies()
            if len(ours) == len(OPS) and copies:
                # Loaded earlier in this process (another module instance, or ctypes directly).
                _lib_path = os.path.realpath(copies[0])
                _lib = ctypes.CDLL(_lib_path)  # already mapped: no second registration
                return _lib_path
            raise RuntimeError(
                "another library already registered these ExecuTorch ops: "
                + ", ".join(ours)
                + "; loading torchao_kernels' kernel library too would abort the process "
                "(ExecuTorch forbids registering an op twice)"
            )
        lib_path = os.path.realpath(path) if path else library_path()
        _lib = ctypes.CDLL(lib_path)
        _lib_path = lib_path
        for name in ("torchao_kernels_executorch_ops", "torchao_kernels_executorch_info_json",
                     "torchao_kernels_executorch_stats_json"):
            getattr(_lib, name).restype = ctypes.c_char_p
        missing = [op for op in OPS if op not in _registered_torchao_ops()]
        if missing:
            raise RuntimeError(
                f"{lib_path} was loaded but ExecuTorch does not list {', '.join(missing)}: is "
                "executorch's runtime (libexecutorch.so) the one this library was built against?"
            )
        # The library's own selection layer follows tk.set_overrides() from now on;
        # start it from the torch extension's current overrides.
        ov = _selection.get_overrides()
        _set_overrides(ov["max_isa"], ov["force"], ov["exclude"])
        # Likewise its tuning table: the torch extension's setting.
        _set_tuning(json.loads(torch.ops.torchao_kernels._tuning_json())["setting"])
        return lib_path


def _set_overrides(max_isa: Optional[str], force: Optional[str], exclude: Optional[str]) -> None:
    """The kernel library's copy of torchao_kernels.set_overrides (called by it)."""
    fn = _lib.torchao_kernels_executorch_set_overrides
    fn.restype = ctypes.c_char_p
    fn.argtypes = [ctypes.c_char_p] * 3
    error = fn(*((v or "").encode() for v in (max_isa, force, exclude))).decode()
    if error:
        raise ValueError(error)


def _set_tuning(setting: str) -> None:
    """The kernel library's copy of torchao_kernels.set_tuning (called by it)."""
    fn = _lib.torchao_kernels_executorch_set_tuning
    fn.restype = None
    fn.argtypes = [ctypes.c_char_p]
    fn(setting.encode())


def is_loaded() -> bool:
    """Whether this process loaded the kernel library (through load_kernels)."""
    return _lib_path is not None


def _json_call(name: str) -> Dict[str, Any]:
    load_kernels()
    fn = getattr(_lib, name)
    fn.restype = ctypes.c_char_p
    return json.loads(fn().decode())


def kernels_info() -> Dict[str, Any]:
    """CPU descriptor, kernels and selection table of the kernel library's own copy of the
    selection layer (the same structure as torchao_kernels.info()). It reads the
    TORCHAO_KERNELS_* environment overrides at its first use and follows
    tk.set_overrides() once loaded."""
    return _json_call("torchao_kernels_executorch_info_json")


def kernels_stats() -> Dict[str, int]:
    """Calls per kernel made by ExecuTorch programs in this process."""
    return _json_call("torchao_kernels_executorch_stats_json")


def operators(program) -> List[str]:
    """The operators an ExecuTorch program calls ("ns::name.overload"), from the manager
    export() returns."""
    plan = program.executorch_program.execution_plan
    return sorted(
        {f"{op.name}.{op.overload}" if op.overload else op.name for p in plan for op in p.operators}
    )


def export(
    model: Union[torch.nn.Module, "torch.export.ExportedProgram"],
    example_inputs: Sequence[Any],
    path: Optional[Union[str, os.PathLike]] = None,
    *,
    dynamic_shapes: Any = None,
    strict: bool = False,
    compile_config: Any = None,
    backend_config: Any = None,
):
    """Exports `model` to an ExecuTorch program: torch.export.export, then
    executorch.exir.to_edge and to_executorch, which turn torchao_kernels' ops (and
    torchao's _linear_8bit_act_{b}bit_weight) into their out variants. Writes the .pte
    to `path` when given and returns the ExecutorchProgramManager (`.buffer` holds the
    bytes).

    dynamic_shapes: as torch.export.export, e.g. ({0: torch.export.Dim("batch", max=64)},);
    every dynamic dimension needs a max (ExecuTorch plans memory for the upper bound).
    model may also be an ExportedProgram (example_inputs are then ignored).
    """
    _require_executorch()
    from executorch.exir import to_edge

    if isinstance(model, torch.export.ExportedProgram):
        ep = model
    else:
        ep = torch.export.export(model, tuple(example_inputs), dynamic_shapes=dynamic_shapes,
                                 strict=strict)
    unbounded = [str(sym) for sym, vr in ep.range_constraints.items()
                 if str(vr.upper) in ("int_oo", "oo")]
    if unbounded:
        warnings.warn(
            f"torchao_kernels.executorch.export: dynamic dimension(s) {', '.join(unbounded)} have no "
            "upper bound; ExecuTorch then plans memory for the example inputs' sizes only. Give "
            "each torch.export.Dim a max.",
            stacklevel=2,
        )
    edge = to_edge(ep, compile_config=compile_config) if compile_config else to_edge(ep)
    manager = edge.to_executorch(backend_config) if backend_config else edge.to_executorch()
    if not any(op in OPS for op in operators(manager)):
        warnings.warn(
            "torchao_kernels.executorch.export: the program calls none of torchao_kernels' ops "
            "(was the model quantized with torchao_kernels.quantize_ or torchao's "
            "opaque_torchao_* packing?)",
            stacklevel=2,
        )
    if path is not None:
        with open(path, "wb") as f:
            manager.write_to_file(f)
    return manager


def load(program: Union[str, os.PathLike, bytes], method: str = "forward"):
    """Loads the kernel library, then `method` of an ExecuTorch program (a .pte path or its
    bytes) with executorch.runtime; call .execute([inputs]) on the result."""
    load_kernels()
    from executorch.runtime import Runtime

    if isinstance(program, os.PathLike):
        program = os.fspath(program)
    loaded = Runtime.get().load_program(program)
    return _Method(loaded.load_method(method), loaded, program)


class _Method:
    """An executorch.runtime Method that keeps its Program and the program's bytes
    alive: the runtime's Method points into both without owning them, so
    load(export(...).buffer) would otherwise read freed memory."""

    def __init__(self, method, program, data):
        self._method, self._program, self._data = method, program, data

    def execute(self, inputs):
        return self._method.execute(inputs)

    def __getattr__(self, name):
        return getattr(self._method, name)
