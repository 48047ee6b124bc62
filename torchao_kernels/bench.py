"""Benchmarks: our op next to its peers, and every registered kernel on its own.

    python -m torchao_kernels.bench [--quick] [--kernels] [--json PATH] ...

Op table: for each shape (n, k), m, thread count and mode, the per-call time,
GOPS, effective GB/s and % of this machine's roofline of
torch.ops.torchao.linear_8bit_act_xbit_weight (b-bit weights, group 32, no
zeros) and of its peers: torch fp32 F.linear, torch's dynamic int8 linear
(quantized::linear_dynamic, 8-bit weights, what torch.ao.quantization.
quantize_dynamic builds) and ONNX Runtime's MatMulNBits (4-bit, block 32,
accuracy_level 4) when onnxruntime is importable. The variants of one
configuration are timed in interleaved rounds so their ratios come from the
same stretch of machine time.

Kernel table: each runnable registered kernel alone (single-threaded
torch.ops.torchao_kernels._run_kernel, hot weights), and per (shape, bits, m)
the fastest kernel next to the one selection picks, flagged when the pick is
more than 5% slower.

The scalar reference kernels take seconds per call at the large shapes;
--kernel-filter '^(?!.*scalar)' leaves them out.

Roofline: read bandwidth is measured with a torch fp32 sum over buffers sized
like each variant's weights (hot) and over a buffer larger than L3 (cold). The
int8 compute ceilings are measured once per run by the library's probes
(torch.ops.torchao_kernels._int8_peaks_json: one core's GOPS per instruction
sequence); each of our rows is bounded by the ceiling of its kernel's own ISA
family (the name's suffix after "__": avx2 -> the int16 pair sums, avxvnni ->
256-bit vpdpbusd, avx512vnni -> 512-bit vpdpbusd), the peers and the scalar
kernels by the highest family the run allows. --peak-gops replaces all of them
by one constant. A torch sum is a lower bound of the bandwidth a kernel can
reach, so a row may exceed 100%.

--cap ISA measures as if the CPU had only that x86 ISA level: our op through
TORCHAO_KERNELS_MAX_ISA, torch's fbgemm (torch int8 dyn) through
FBGEMM_ENABLE_INSTRUCTIONS and MKL (torch fp32) through
MKL_ENABLE_INSTRUCTIONS. fbgemm and MKL read theirs once, at their first use,
so the variables must be in the environment before torch runs anything:
`python -m torchao_kernels.bench --cap ...` re-executes itself with them set
(TORCHAO_KERNELS_BENCH_CAP marks the re-executed process, so it cannot loop),
and run([... "--cap", ...]) called from Python runs the benchmark in a fresh
subprocess. ONNX Runtime has no such cap: its rows stay, and its ratio column
reads n/c (not comparable) when the CPU has ISA above the cap.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

import torchao_kernels as tk
from torchao_kernels.ops import copy_packed

# The command-line types and bounds, shared by every command line (they
# were defined here: bench.positive_float and the others stay importable).
from .cli_types import (GROUP_MULTIPLE, MAX_DIM, MAX_DIM_TEXT, MAX_GROUP_SIZE, MAX_THREADS, bit_widths,
                        group_size, ints_up_to, positive_float, positive_int, writable_path)

__all__ = ["run", "quick_table", "main"]

GROUP_SIZE = 32
# Our op's group size in this run (--group-size; 0: one group per output
# channel, group = k). The peers' own granularity does not change with it.
_group_setting = GROUP_SIZE


def _group(k: int) -> int:
    return k if _group_setting == 0 else _group_setting


def _group_label() -> str:
    return "per channel (group = k)" if _group_setting == 0 else f"group {_group_setting}"
DEFAULT_SHAPES: List[Tuple[int, int]] = [(4096, 4096), (14336, 4096), (4096, 14336), (2048, 2048)]
DEFAULT_M = [1, 4, 32, 128]
DEFAULT_THREADS = [1, 2]
DEFAULT_BITS = [2, 3, 4, 8]
QUICK = dict(shapes=[(2048, 2048)], m=[1, 32], threads=[1], bits=[4], mode="hot", min_time=0.1)

# int8 multiply-accumulate throughput of one core, in GOPS (2 ops per MAC),
# measured with AVX512-VNNI VPDPBUSD on the development machine: the compute
# roof only when no ceiling probe of the library runs on this CPU (and no
# --peak-gops is given).
DEFAULT_PEAK_GOPS_PER_CORE = 765.0

# --cap: the x86 levels of TORCHAO_KERNELS_MAX_ISA a run can be capped to.
#   fbgemm / mkl: what FBGEMM_ENABLE_INSTRUCTIONS / MKL_ENABLE_INSTRUCTIONS are
#                 set to (fbgemm has no AVX-VNNI path: on such a CPU it runs
#                 AVX2; MKL's AVX2_E1 is AVX2 with AVX-VNNI);
#   families:     the int8 ceiling families (probe isa_name) the level allows;
#   isa:          the CPU features (cpu_descriptor()["isa"] names) it allows;
#                 a CPU with others runs ONNX Runtime (not capped) with them.
# No "avx512": the library has no AVX-512 kernel without VNNI (ours would run
# its AVX2 ones next to 512-bit fbgemm and MKL), and no probe measures that
# level's ceiling.
_X86_AVX2 = ("sse4.2", "avx2", "fma")
_X86_AVX512 = ("avx512f", "avx512bw", "avx512vl", "avx512dq")
CAPS: Dict[str, dict] = {
    "avx2": dict(fbgemm="AVX2", mkl="AVX2", families=("avx2",), isa=_X86_AVX2),
    "avxvnni": dict(fbgemm="AVX2", mkl="AVX2_E1", families=("avx2", "avxvnni"), isa=_X86_AVX2 + ("avxvnni",)),
    "avx512vnni": dict(fbgemm="AVX512_E1", mkl="AVX512_E1", families=("avx2", "avxvnni", "avx512vnni"),
                       isa=_X86_AVX2 + _X86_AVX512 + ("avx512vnni", "avxvnni")),
}
CAP_MARK = "TORCHAO_KERNELS_BENCH_CAP"  # set in the process started for --cap (with the variables)

# All cold-mode weight copies of one configuration together: 3 GiB, or half
# the memory available when that is more. A CPU with a large L3 needs 2 x L3
# per variant to stream from DRAM: on a 480 MiB L3 the 3 GiB over 11 variants
# rotated 279 MiB each, inside the L3, and the cold GEMV rows read partly
# from it (2-bit 1.21x faster than 4-bit there, 1.41x over 960 MiB;
# docs/benchmarks.md).
MEMORY_CAP_BYTES = 3 << 30
MEMORY_AVAILABLE_SHARE = 0.5
MAX_ORT_SESSIONS = 256      # cold-mode ORT copies are sessions, each with its own thread pool
HOT_BW_BYTES = 16 << 20     # the headline "hot" bandwidth buffer
MIN_BW_BYTES = 1 << 20
SLOWER_THRESHOLD = 1.05     # selection flagged when its pick is this much slower than the fastest
ROUNDS = 5                  # interleaving rounds per configuration
BATCH_SECONDS = 2e-3        # calls are timed in batches of about this length

OURS, FP32, INT8DYN, ORT = "ours", "fp32", "int8dyn", "ort"
SCALE_DTYPES = {"float32": (torch.float32,), "bfloat16": (torch.bfloat16,),
                "both": (torch.float32, torch.bfloat16)}
PEER_LABELS = {FP32: "torch fp32", INT8DYN: "torch int8 dyn", ORT: "ORT MatMulNBits 4-bit"}
RATIO_COLUMNS = [(FP32, "vs fp32"), (INT8DYN, "vs int8 dyn"), (ORT, "vs ORT")]
# A linear kernel's name up to its op (activations, output, weight format:
# docs/selection.md), dropped in tables where the op, tile, variant and ISA
# already tell the rows of one format apart.
# Not for int16 panels: their rows would print like the int8 panels' ones.
KERNEL_PREFIX_RE = re.compile(r"^qd8(?:p\d+x\d+)?_f32_qbwn\d+k\d+_")


def _log(msg: str, quiet: bool) -> None:
    if not quiet:
        print(f"[bench] {msg}", file=sys.stderr, flush=True)


def _mib(nbytes: float) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB"


def _short(kernel: Optional[str]) -> str:
    if not kernel:
        return "-"
    return KERNEL_PREFIX_RE.sub("", kernel)


# ----------------------------------------------------------------------------
# Timing


def _measure(callers: Sequence[Callable[[], object]], min_time: float, iters: Optional[int] = None,
             rounds: int = ROUNDS) -> List[dict]:
    """Times each caller, interleaved: in each of `rounds` rounds every caller
    runs its share (min_time / rounds seconds, or iters / rounds calls) in
    turn, the order rotating between rounds. Calls are timed in batches of
    about BATCH_SECONDS; a caller's result is the median per-call time over
    its batches. A caller slower than min_time runs once (after warm-up)."""
    n = len(callers)
    est = []
    for c in callers:  # warm-up: first call (allocations, thread pools, caches), then estimate
        t0 = time.perf_counter()
        c()
        first = time.perf_counter() - t0
        if first > min_time:  # slow: one timed call is all it gets
            est.append(first)
            continue
        times = []
        t_end = time.perf_counter() + min(0.02, min_time / 4)
        while len(times) < 3 and (not times or time.perf_counter() < t_end):
            t0 = time.perf_counter()
            c()
            times.append(time.perf_counter() - t0)
        est.append(statistics.median(times))
    batch = [1 if iters else max(1, min(10000, int(BATCH_SECONDS / max(e, 1e-9)))) for e in est]
    samples: List[List[float]] = [[] for _ in range(n)]
    spent = [0.0] * n
    calls = [0] * n
    for r in range(rounds):
        for j in range(n):
            i = (j + r) % n
            c, b = callers[i], batch[i]
            if iters:
                goal_calls = min(iters, math.ceil(iters * (r + 1) / rounds))
                done = lambda: calls[i] >= goal_calls  # noqa: E731
                finished = calls[i] >= iters
            else:
                goal_time = min_time * (r + 1) / rounds
                done = lambda: spent[i] >= goal_time  # noqa: E731
                finished = spent[i] >= min_time
            if finished:
                continue
            while True:  # at least one batch per round until the caller is finished
                t0 = time.perf_counter()
                for _ in range(b):
                    c()
                dt = time.perf_counter() - t0
                samples[i].append(dt / b)
                spent[i] += dt
                calls[i] += b
                if done():
                    break
    out = []
    for s, k in zip(samples, calls):
        out.append({"median_s": statistics.median(s), "min_s": min(s), "samples": len(s), "calls": k})
    return out


# ----------------------------------------------------------------------------
# Machine and roofline


def _onnxruntime():
    try:
        import onnxruntime  # noqa: F401
        from onnx import TensorProto, helper, numpy_helper  # noqa: F401
    except Exception:  # noqa: BLE001  (missing or broken install: the peer is skipped)
        return None
    return onnxruntime


def machine_info() -> dict:
    cpu = tk.cpu_descriptor()
    ort = _onnxruntime()
    return {
        "cpu": cpu.get("name"),
        "arch": cpu.get("arch"),
        "isa": cpu.get("isa", []),
        "cores": cpu.get("cores"),
        "l1d_bytes": cpu.get("l1d_bytes"),
        "l2_bytes": cpu.get("l2_bytes"),
        "l3_bytes": cpu.get("l3_bytes"),
        "torch": torch.__version__,
        "torch_quantized_engine": torch.backends.quantized.engine,
        "onnxruntime": ort.__version__ if ort else None,
        "python": platform.python_version(),
        "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }


def _pow2_bucket(nbytes: int, cap: int) -> int:
    b = MIN_BW_BYTES
    while b < nbytes and b < cap:
        b *= 2
    return min(b, cap)


def measure_int8_ceilings(quiet: bool = True) -> List[dict]:
    """The library's int8 ceiling probes, each run once now: a list of {name,
    isa_name, what, gops} (gops: one core, None where the CPU lacks the
    sequence); the first probe of an isa_name is that family's ceiling."""
    _log("int8 ceiling probes", quiet)
    try:
        return json.loads(torch.ops.torchao_kernels._int8_peaks_json())
    except (AttributeError, RuntimeError):  # an older build without the probes
        return []


def kernel_family(kernel: Optional[str]) -> Optional[str]:
    """The ISA family of a kernel name: its suffix after '__' (qd8_f32_qbwn16k4_gemm_4x16__avx2 -> avx2)."""
    return kernel.rsplit("__", 1)[1] if kernel and "__" in kernel else None


class Roofline:
    """Read bandwidth (torch fp32 sum) per buffer size and thread count, and the
    int8 compute ceilings; roof(ops, bytes, ...) = min(ceiling x threads, bandwidth * ops / bytes).

    Ceilings: with probes (measure_int8_ceilings()), a kernel of a probed family
    (kernel_family) is bounded by that family's ceiling; anything else (the
    peers, kernel=None, and kernels of no probed family such as the scalar
    ones, "borrowed") by the highest of `families` (the families the run
    allows; default: all) that this CPU runs. Without probes, or with
    override=True (--peak-gops), every row is bounded by peak_gops_per_core."""

    def __init__(self, peak_gops_per_core: Optional[float], dram_bytes: int, min_time: float, quiet: bool = True,
                 probes: Optional[List[dict]] = None, families: Optional[Sequence[str]] = None,
                 override: bool = False, kernel_ceilings: Optional[Dict[str, str]] = None):
        self.probes = list(probes or [])
        # kernel name -> the probe the registry names as its ceiling (rows
        # whose exact sequence is not their family's, e.g. 8-bit over int16).
        self.kernel_ceilings = dict(kernel_ceilings or {})
        self.override = override and peak_gops_per_core is not None
        self.ceilings: Dict[str, dict] = {}  # family -> its ceiling probe, where this CPU runs it
        seen = set()
        for p in self.probes:
            fam = p.get("isa_name")
            if fam in seen:
                continue
            seen.add(fam)
            if p.get("gops"):
                self.ceilings[fam] = p
        # The probes come lowest ISA first: the last allowed family is the highest.
        allowed = [f for f in self.ceilings if families is None or f in families]
        self.peer_probe: Optional[dict] = self.ceilings[allowed[-1]] if allowed else None
        self.allowed_families = allowed
        if peak_gops_per_core is None:
            peak_gops_per_core = self.peer_probe["gops"] if self.peer_probe else DEFAULT_PEAK_GOPS_PER_CORE
        self.peak_gops_per_core = peak_gops_per_core
        self.dram_bytes = dram_bytes
        self.min_time = min_time
        self.quiet = quiet
        self.bw: Dict[Tuple[int, int], float] = {}  # (bytes, threads) -> GB/s

    def ceiling(self, kernel: Optional[str] = None) -> Tuple[float, str, bool]:
        """(GOPS per core, the probe (or '--peak-gops' / 'default'), borrowed):
        borrowed = a kernel with no ceiling of its own family."""
        if self.override:
            return self.peak_gops_per_core, "--peak-gops", False
        own = next((p for p in self.probes if p["name"] == self.kernel_ceilings.get(kernel or "")), None)
        if own is not None and own.get("gops"):
            return own["gops"], own["name"], False
        fam = kernel_family(kernel)
        if fam in self.ceilings:
            p = self.ceilings[fam]
            return p["gops"], p["name"], False
        if self.peer_probe is not None:
            return self.peer_probe["gops"], self.peer_probe["name"], kernel is not None
        return self.peak_gops_per_core, "default", False

    def _measure_bw(self, nbytes: int, threads: int) -> float:
        key = (nbytes, threads)
        if key not in self.bw:
            _log(f"read bandwidth: {_mib(nbytes)}, {threads} thread(s)", self.quiet)
            torch.set_num_threads(threads)
            buf = torch.ones(nbytes // 4, dtype=torch.float32)
            # The roof is a ceiling: take the fastest pass, not the median.
            r = _measure([buf.sum], max(self.min_time, 0.05 if nbytes < (64 << 20) else 0.25), rounds=1)[0]
            self.bw[key] = nbytes / r["min_s"] / 1e9
            del buf
        return self.bw[key]

    def hot_bw(self, nbytes: int, threads: int) -> float:
        return self._measure_bw(_pow2_bucket(nbytes, self.dram_bytes), threads)

    def dram_bw(self, threads: int) -> float:
        return self._measure_bw(self.dram_bytes, threads)

    def peak_gops(self, threads: int, kernel: Optional[str] = None) -> float:
        return self.ceiling(kernel)[0] * threads

    def roof(self, ops: float, nbytes: float, weight_bytes: int, threads: int, cold: bool,
             kernel: Optional[str] = None) -> Tuple[float, str]:
        """(roofline GOPS, what bounds it: 'mem' or 'cmp'); kernel: ours' kernel
        name (its family's ceiling), None for a peer."""
        bw = self.dram_bw(threads) if cold else self.hot_bw(weight_bytes, threads)
        mem = bw * ops / nbytes
        peak = self.peak_gops(threads, kernel)
        return (mem, "mem") if mem < peak else (peak, "cmp")

    def row_fields(self, ops: float, nbytes: float, weight_bytes: int, threads: int, cold: bool,
                   kernel: Optional[str], seconds: float) -> dict:
        """A result row's roofline fields."""
        roof_gops, bound = self.roof(ops, nbytes, weight_bytes, threads, cold, kernel)
        gops_core, name, borrowed = self.ceiling(kernel)
        gops = ops / seconds / 1e9
        return {"gops": gops, "gbps": nbytes / seconds / 1e9, "roof_gops": roof_gops, "bound": bound,
                "pct_roof": 100.0 * gops / roof_gops, "ceiling": name, "ceiling_gops_per_core": gops_core,
                "ceiling_borrowed": borrowed}

    def table(self) -> str:
        sizes = sorted({b for b, _ in self.bw})
        threads = sorted({t for _, t in self.bw})
        headers = ["buffer"] + [f"{t} thr GB/s" for t in threads]
        rows = []
        for s in sizes:
            label = _mib(s) + (" (DRAM)" if s == self.dram_bytes else "")
            rows.append([label] + [f"{self.bw[(s, t)]:.1f}" if (s, t) in self.bw else "-" for t in threads])
        return _md_table(headers, rows, right=set(range(1, len(headers))))


# ----------------------------------------------------------------------------
# Op variants


def ort_pack_4bit(qvals: torch.Tensor, scales: torch.Tensor, block_size: int = GROUP_SIZE):
    """Symmetric 4-bit qvals (n, k) in [-8, 7] and float scales (n, k / block_size)
    -> MatMulNBits' B (uint8 (n, k / block_size, block_size / 2), two codes per
    byte, the lower k index in the low nibble, code = q + 8 so the default zero
    point 8 undoes it) and scales (float (n * k / block_size))."""
    n, k = qvals.shape
    u = (qvals.to(torch.int16) + 8).to(torch.uint8).reshape(n, k // block_size, block_size // 2, 2)
    b = (u[..., 0] | (u[..., 1] << 4)).contiguous()
    return b.numpy(), scales.to(torch.float32).reshape(-1).contiguous().numpy()


def ort_session(b, scales, n: int, k: int, threads: int, block_size: int = GROUP_SIZE,
                accuracy_level: int = 4):
    """An InferenceSession computing Y = A @ dequant(B)^T with one MatMulNBits
    node; B and scales are initializers so ORT prepacks them at load."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    node = helper.make_node("MatMulNBits", ["A", "B", "scales"], ["Y"], domain="com.microsoft",
                            K=k, N=n, bits=4, block_size=block_size, accuracy_level=accuracy_level)
    graph = helper.make_graph(
        [node], "matmulnbits",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["m", k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["m", n])],
        initializer=[numpy_helper.from_array(b, "B"), numpy_helper.from_array(scales, "scales")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    # Idle ORT workers would otherwise spin and steal the cores from the
    # torch variants timed in between.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _ort_caller(sessions, x: torch.Tensor, n: int) -> Callable[[], object]:
    import numpy as np

    xa = x.numpy()
    y = torch.empty(x.shape[0], n, dtype=torch.float32)
    bindings = []
    for s in sessions:
        bd = s.io_binding()
        bd.bind_cpu_input("A", xa)
        bd.bind_output("Y", "cpu", 0, np.float32, list(y.shape), y.data_ptr())
        bindings.append((s, bd))
    if len(bindings) > 1:  # a session's first run sets up its arena: keep that out of the cold timings
        for s, bd in bindings:
            s.run_with_iobinding(bd)
    # The default arguments keep x's array and y alive as long as the bindings pointing at them.
    return _rotating([lambda s=s, bd=bd, xa=xa, y=y: s.run_with_iobinding(bd) for s, bd in bindings])


def _rotating(fns: List[Callable[[], object]]) -> Callable[[], object]:
    if len(fns) == 1:
        return fns[0]
    state = [0]

    def call():
        i = state[0]
        state[0] = (i + 1) % len(fns)
        return fns[i]()

    return call


@dataclass
class Variant:
    kind: str                 # OURS / FP32 / INT8DYN / ORT
    label: str
    bits: int
    weight_bytes: int         # bytes of one weight copy a call reads
    copies: int
    make: Callable[[torch.Tensor, int], Callable[[], object]]  # (x, threads) -> one call
    packed: Optional[torch.Tensor] = None
    extra: dict = field(default_factory=dict)


def _packed_bytes(packed: torch.Tensor) -> int:
    """Bytes a call reads: header and body (a buffer packed from float32 scales
    that are all bfloat16 values stores them as bfloat16 and ends in unused bytes)."""
    return 64 + tk.packed_info(packed)["body_bytes"]


def _available_memory() -> int:
    """Bytes of memory available to this process now (MemAvailable), 0 if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def cold_memory_cap(available: Optional[int] = None) -> int:
    """Bytes all cold-mode copies of one configuration may take (MEMORY_CAP_BYTES
    or MEMORY_AVAILABLE_SHARE of the available memory, the larger)."""
    avail = _available_memory() if available is None else available
    return max(MEMORY_CAP_BYTES, int(avail * MEMORY_AVAILABLE_SHARE))


def _copies(one: int, target: int, cold: bool) -> int:
    return max(2, math.ceil(target / one)) if cold else 1


def build_variants(n: int, k: int, bits_list: Sequence[int], cold: bool, target_bytes: int,
                   with_ort: bool, with_int8: bool, quiet: bool, notes: List[str],
                   scale_dtypes: Sequence[torch.dtype] = (torch.float32,)) -> List[Variant]:
    """Our op at each bit width (and scale storage) and the peers, for weight
    (n, k); in cold mode each holds enough copies to make target_bytes."""
    g = torch.Generator().manual_seed(n * 131 + k)
    w = torch.randn(n, k, generator=g) / math.sqrt(k)
    out: List[Variant] = []
    q4 = s4 = None
    for bits in bits_list:
        for scale_dtype in scale_dtypes:
            q, s, _ = tk.quantize_weight(w, bits, _group(k), False, scale_dtype=scale_dtype)
            if bits == 4 and q4 is None and _group(k) == GROUP_SIZE:  # ORT's blocks are GROUP_SIZE
                q4, s4 = q, s.float()
            packed = torch.ops.torchao.pack_8bit_act_xbit_weight(q, s, None, bits, _group(k), None, None)
            del q, s
            nbytes = _packed_bytes(packed)
            c = _copies(nbytes, target_bytes, cold)
            # Copies allocated as the pack op allocates (huge pages), as a model's
            # buffers are: from DRAM a GEMV over clones in 4 KB pages took 1.02x
            # (Granite Rapids class) to 1.22x (Zen 4, 4096x4096 capped to AVX2)
            # the time over huge pages (docs/embeddings.md).
            bufs = [packed] + [copy_packed(packed) for _ in range(c - 1)]

            def make(x, threads, bufs=bufs):
                op = torch.ops.torchao.linear_8bit_act_xbit_weight
                return _rotating([lambda p=p: op(x, p, _group(k), n, k) for p in bufs])

            label = f"ours {bits}-bit" + (" bf16 scales" if scale_dtype == torch.bfloat16 else "")
            out.append(Variant(OURS, label, bits, nbytes, c, make, packed=packed))

    c = _copies(w.numel() * 4, target_bytes, cold)
    ws = [w] + [w.clone() for _ in range(c - 1)]
    out.append(Variant(FP32, PEER_LABELS[FP32], 32, w.numel() * 4, c,
                       lambda x, threads: _rotating([lambda wi=wi: F.linear(x, wi) for wi in ws])))

    if with_int8:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lin = torch.nn.Linear(k, n, bias=False)
            with torch.no_grad():
                lin.weight.copy_(w)
            mod = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(lin), {torch.nn.Linear},
                                                         dtype=torch.qint8)[0]
        one = n * k + 4 * n  # int8 weights + column offsets
        c = _copies(one, target_bytes, cold)
        params = [mod._packed_params._packed_params]
        if c > 1:
            qw = mod.weight()
            params += [torch.ops.quantized.linear_prepack(qw, None) for _ in range(c - 1)]

        def make_int8(x, threads, params=params):
            op = torch.ops.quantized.linear_dynamic
            # reduce_range=True, as torch.ao.nn.quantized.dynamic.Linear.forward calls it
            return _rotating([lambda pp=pp: op(x, pp, True) for pp in params])

        out.append(Variant(INT8DYN, PEER_LABELS[INT8DYN], 8, one, c, make_int8))

    if with_ort:
        if q4 is None:
            q4, s4, _ = tk.quantize_weight(w, 4, GROUP_SIZE, False)
        b, sc = ort_pack_4bit(q4, s4)
        one = b.nbytes + sc.nbytes
        c = _copies(one, target_bytes, cold)
        if c > MAX_ORT_SESSIONS:
            notes.append(f"{n}x{k} cold: ORT rotates {MAX_ORT_SESSIONS} sessions ({_mib(MAX_ORT_SESSIONS * one)}) "
                         f"instead of {c}")
            c = MAX_ORT_SESSIONS
        sessions: Dict[int, list] = {}

        def make_ort(x, threads, b=b, sc=sc, c=c):
            if threads not in sessions:
                sessions.clear()  # one thread count's sessions alive at a time
                _log(f"  ORT: {c} session(s), {threads} thread(s)", quiet)
                sessions[threads] = [ort_session(b, sc, n, k, threads) for _ in range(c)]
            return _ort_caller(sessions[threads], x, n)

        out.append(Variant(ORT, PEER_LABELS[ORT], 4, one, c, make_ort))
    return out


def _ops_and_bytes(m: int, n: int, k: int, weight_bytes: int) -> Tuple[float, float]:
    return 2.0 * m * n * k, float(weight_bytes + 4 * m * k + 4 * m * n)


# ----------------------------------------------------------------------------
# Tables


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right=frozenset()) -> str:
    cols = len(headers)
    width = [max(len(str(headers[c])), *(len(str(r[c])) for r in rows)) if rows else len(headers[c])
             for c in range(cols)]

    def line(cells):
        out = []
        for c, v in enumerate(cells):
            v = str(v)
            out.append(v.rjust(width[c]) if c in right else v.ljust(width[c]))
        return "| " + " | ".join(out) + " |"

    sep = "|" + "|".join(("-" * (width[c] + 1) + ":") if c in right else ("-" * (width[c] + 2))
                         for c in range(cols)) + "|"
    return "\n".join([line(headers), sep] + [line(r) for r in rows])


def _fmt_us(s: float) -> str:
    us = s * 1e6
    return f"{us:.1f}" if us < 100 else f"{us:.0f}"


BORROWED_MARK = "*"  # a compute roof from the run's highest ceiling: the kernel's family has none


def _borrowed(r: dict) -> str:
    return BORROWED_MARK if r.get("ceiling_borrowed") and r.get("bound") == "cmp" else ""


def _ratio(r: dict, kind: str) -> str:
    if kind in r.get("speedup_not_comparable", ()):
        return "n/c"
    return f"{r['speedup'][kind]:.2f}x" if r.get("speedup", {}).get(kind) else ""


def ops_table(results: List[dict]) -> str:
    headers = ["shape (n x k)", "m", "thr", "mode", "op", "kernel", "us/call", "GOPS", "GB/s", "% roof",
               "roof GOPS"] + [h for _, h in RATIO_COLUMNS]
    rows = []
    for r in results:
        ratios = [_ratio(r, kind) for kind, _ in RATIO_COLUMNS]
        rows.append([f"{r['n']}x{r['k']}", r["m"], r["threads"], r["mode"], r["op"], _short(r.get("kernel")),
                     _fmt_us(r["median_s"]), f"{r['gops']:.1f}", f"{r['gbps']:.1f}", f"{r['pct_roof']:.0f}%",
                     f"{r['roof_gops']:.0f} ({r['bound']}{_borrowed(r)})"] + ratios)
    return _md_table(headers, rows, right={1, 2, 6, 7, 8, 9, 10, 11, 12, 13})


def kernels_table(results: List[dict]) -> str:
    headers = ["shape (n x k)", "bits", "m", "kernel", "m range", "us/call", "GOPS", "GB/s", "% roof",
               "vs fastest"]
    rows = []
    for r in results:
        rows.append([f"{r['n']}x{r['k']}", r["bits"], r["m"], _short(r["kernel"]), "yes" if r["in_m_range"] else "no",
                     _fmt_us(r["median_s"]), f"{r['gops']:.1f}", f"{r['gbps']:.1f}",
                     f"{r['pct_roof']:.0f}%{_borrowed(r)}", f"{r['vs_fastest']:.2f}x"])
    return _md_table(headers, rows, right={1, 2, 5, 6, 7, 8, 9})


def ceilings_table(roof: "Roofline", bounds: Dict[str, str]) -> str:
    """One line per probe: name, sequence, one core's GOPS and what it bounds."""
    rows = []
    for p in roof.probes:
        gops = f"{p['gops']:.1f}" if p.get("gops") else "n/a (not on this CPU)"
        rows.append([p["name"], p["what"], gops, bounds.get(p["name"], "-")])
    return _md_table(["probe", "sequence", "GOPS", "bounds"], rows, right={2})


def selection_table(results: List[dict]) -> str:
    headers = ["shape (n x k)", "bits", "m", "thr", "fastest", "us", "selected", "us", "selected / fastest", "flag"]
    rows = []
    for r in results:
        sel_us = _fmt_us(r["selected_s"]) if r["selected_s"] else "-"
        ratio = f"{r['selected_over_fastest']:.2f}" if r["selected_over_fastest"] else "-"
        rows.append([f"{r['n']}x{r['k']}", r["bits"], r["m"], r.get("threads", 1), _short(r["fastest"]),
                     _fmt_us(r["fastest_s"]), _short(r["selected"]), sel_us, ratio, r["flag"]])
    return _md_table(headers, rows, right={1, 2, 3, 5, 7, 8})


def _selection_row(n: int, k: int, bits: int, m: int, threads: int, rows: List[dict], selected: str) -> dict:
    best = min(rows, key=lambda r: r["median_s"])
    sel = next((r for r in rows if r["kernel"] == selected), None)
    ratio = sel["median_s"] / best["median_s"] if sel else None
    if sel is None:
        flag = "n/a (not measured)"
    elif ratio > SLOWER_THRESHOLD:
        flag = f"SLOWER by {100 * (ratio - 1):.0f}%"
    else:
        flag = "ok"
    return {
        "n": n, "k": k, "bits": bits, "m": m, "threads": threads, "fastest": best["kernel"],
        "fastest_s": best["median_s"], "selected": selected, "selected_s": sel["median_s"] if sel else None,
        "selected_over_fastest": ratio, "flag": flag,
    }


# ----------------------------------------------------------------------------
# Benchmarks


def bench_ops(args, roof: Roofline, machine: dict, notes: List[str]) -> List[dict]:
    ort_ok = _onnxruntime() is not None
    int8_ok = torch.backends.quantized.engine in ("x86", "fbgemm")
    if not ort_ok:
        notes.append("onnxruntime/onnx not importable: ORT MatMulNBits peer skipped")
    if not int8_ok:
        notes.append(f"torch quantized engine {torch.backends.quantized.engine!r}: int8 dynamic peer skipped")
    modes = ["hot", "cold"] if args.mode == "both" else [args.mode]
    l3 = int(machine.get("l3_bytes") or 0) or (32 << 20)
    scale_dtypes = SCALE_DTYPES[args.scales]
    n_variants = len(args.bits) * len(scale_dtypes) + 1 + int(ort_ok) + int(int8_ok)
    cap = cold_memory_cap() if "cold" in modes else MEMORY_CAP_BYTES
    target = min(2 * l3, cap // n_variants)
    if "cold" in modes:
        if target < 2 * l3:
            notes.append(f"L3 is large ({_mib(l3)}): cold mode rotates ~{_mib(target)} of weight copies per "
                         f"variant (2 x L3 capped by {_mib(cap)} over {n_variants} variants)"
                         + ("; this does NOT exceed L3, cold rows are partly cache-bound" if target <= l3 else ""))
        else:
            notes.append(f"cold mode rotates >= {_mib(target)} (2 x L3) of weight copies per variant")

    results: List[dict] = []
    for n, k in args.shapes:
        for mode in modes:
            cold = mode == "cold"
            _log(f"{n}x{k} {mode}: building weights", args.quiet)
            variants = build_variants(n, k, args.bits, cold, target, ort_ok, int8_ok, args.quiet, notes,
                                      scale_dtypes)
            for threads in args.threads:
                for m in args.m:
                    _log(f"{n}x{k} {mode} threads={threads} m={m}", args.quiet)
                    torch.set_num_threads(threads)
                    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
                    callers = [v.make(x, threads) for v in variants]
                    torch.set_num_threads(threads)
                    timings = _measure(callers, args.min_time, args.iters)
                    by_kind = {}
                    rows = []
                    for v, t in zip(variants, timings):
                        ops, nbytes = _ops_and_bytes(m, n, k, v.weight_bytes)
                        kernel = tk.explain(v.packed, m, threads).winner if v.packed is not None else None
                        row = {
                            "n": n, "k": k, "m": m, "threads": threads, "mode": mode, "op": v.label,
                            "kind": v.kind, "bits": v.bits, "group_size": _group(k) if v.kind == OURS else (GROUP_SIZE if v.kind == ORT else None),
                            "kernel": kernel, "weight_bytes": v.weight_bytes, "copies": v.copies,
                            "bytes_per_call": nbytes,
                            **roof.row_fields(ops, nbytes, v.weight_bytes, threads, cold, kernel, t["median_s"]),
                            **t,
                        }
                        rows.append(row)
                        if v.kind != OURS:
                            by_kind[v.kind] = t["median_s"]
                    for row in rows:
                        if row["kind"] == OURS:
                            row["speedup"] = {kind: by_kind[kind] / row["median_s"] for kind in by_kind}
                            if getattr(args, "ort_not_comparable", False) and ORT in row["speedup"]:
                                row["speedup_not_comparable"] = [ORT]
                    results += rows
                    del callers
            del variants
    return results


def _kernel_list(pattern: Optional[str] = None) -> List[dict]:
    """The linear kernels selection may run: runnable on this CPU and within
    the ISA cap (TORCHAO_KERNELS_MAX_ISA), whose name matches pattern."""
    d = tk.info()
    allowed = set(d["runnable"])
    ks = [kk for kk in d["kernels"] if kk.get("runnable") and kk["name"] in allowed and kk["op"] == "linear"]
    if pattern:
        rx = re.compile(pattern)
        ks = [kk for kk in ks if rx.search(kk["name"])]
    return ks


def bench_kernels(args, roof: Roofline, notes: List[str]) -> Tuple[List[dict], List[dict]]:
    """Each runnable kernel alone (single thread, hot) and selection vs measurement."""
    kernels = _kernel_list(args.kernel_filter)
    d = tk.info()
    linear_ks = [kk for kk in d["kernels"] if kk["op"] == "linear"]
    skipped = [kk["name"] for kk in linear_ks if not kk.get("runnable")]
    if skipped:
        notes.append("kernels skipped (not runnable on this CPU): " + ", ".join(_short(s) for s in skipped))
    capped = [kk["name"] for kk in linear_ks if kk.get("runnable") and kk["name"] not in set(d["runnable"])]
    if capped:
        notes.append(f"kernels skipped (above the ISA cap {d['overrides']['max_isa']}): "
                     + ", ".join(_short(s) for s in capped))
    per_kernel: List[dict] = []
    selection: List[dict] = []
    torch.set_num_threads(1)
    for n, k in args.shapes:
        g = torch.Generator().manual_seed(n * 131 + k)
        w = torch.randn(n, k, generator=g) / math.sqrt(k)
        for bits in args.bits:
            q, s, _ = tk.quantize_weight(w, bits, _group(k), False)
            auto = torch.ops.torchao.pack_8bit_act_xbit_weight(q, s, None, bits, _group(k), None, None)
            packed = {tk.packed_info(auto)["format"]: auto}
            usable = [kk for kk in kernels if bits in kk["bits"]]
            for fmt in sorted({kk["format"] for kk in usable} - set(packed)):
                packed[fmt] = tk.pack(q, s, None, bits=bits, group_size=_group(k), target=fmt)
            del q, s
            for m in args.m:
                _log(f"kernels {n}x{k} bits={bits} m={m}", args.quiet)
                x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
                run_kernel = torch.ops.torchao_kernels._run_kernel
                callers = [lambda kk=kk: run_kernel(x, packed[kk["format"]], kk["name"]) for kk in usable]
                timings = _measure(callers, args.min_time, args.iters) if callers else []
                rows = []
                for kk, t in zip(usable, timings):
                    pb = _packed_bytes(packed[kk["format"]])
                    ops, nbytes = _ops_and_bytes(m, n, k, pb)
                    m_max = kk.get("m_max")
                    rows.append({
                        "n": n, "k": k, "bits": bits, "m": m, "kernel": kk["name"], "format": kk["format"],
                        "in_m_range": kk["m_min"] <= m and (not m_max or m <= m_max),
                        **roof.row_fields(ops, nbytes, pb, 1, False, kk["name"], t["median_s"]), **t,
                    })
                if not rows:
                    continue
                best = min(rows, key=lambda r: r["median_s"])
                for r in rows:
                    r["vs_fastest"] = r["median_s"] / best["median_s"]
                per_kernel += rows
                selection.append(_selection_row(n, k, bits, m, 1, rows, tk.explain(auto, m, 1).winner))
                # More threads: every kernel forced through the op, which
                # splits the work as it does for the selected one.
                for threads in [t for t in args.threads if t > 1]:
                    _log(f"kernels {n}x{k} bits={bits} m={m} threads={threads}", args.quiet)
                    # Rows for short groups only cannot be forced onto long ones.
                    long_groups = tk.explain(auto, m, threads)["groups"] == "long-groups"
                    auto_usable = [kk for kk in usable if kk["format"] == tk.packed_info(auto)["format"]
                                   and (kk["long_groups"] or not long_groups)]
                    linear = torch.ops.torchao.linear_8bit_act_xbit_weight

                    current = [None]  # the kernel forced now: reset overrides (and the cache) only on a change

                    def forced(name: str) -> Callable[[], object]:
                        def call():
                            if current[0] != name:
                                tk.set_overrides(force=name)  # a full kernel name matches only itself
                                current[0] = name
                            return linear(x, auto, _group(k), n, k)
                        return call

                    saved = tk.get_overrides()
                    torch.set_num_threads(threads)
                    try:
                        timings = _measure([forced(kk["name"]) for kk in auto_usable], args.min_time, args.iters)
                    finally:
                        tk.set_overrides(saved["max_isa"], saved["force"], saved["exclude"])
                        torch.set_num_threads(1)
                    trows = [{"kernel": kk["name"], **t} for kk, t in zip(auto_usable, timings)]
                    if trows:
                        selection.append(_selection_row(n, k, bits, m, threads, trows,
                                                        tk.explain(auto, m, threads).winner))
    return per_kernel, selection


# ----------------------------------------------------------------------------
# CLI


def physical_memory_bytes() -> Optional[int]:
    """This machine's memory (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _regex(text: str) -> str:
    """An argparse type: a regular expression (kept as text: the JSON config
    records it as given)."""
    try:
        re.compile(text)
    except re.error as e:
        raise argparse.ArgumentTypeError(f"not a valid regular expression ({e}): {text!r}") from None
    return text


# --group-size: 0 stands for one group per output channel ('k').
_parse_group = group_size({"k": 0, "channel": 0, "per-channel": 0}, "'k'")


def _parse_shapes(text: str) -> List[Tuple[int, int]]:
    shapes = []
    for part in text.replace(" ", "").split(","):
        mt = re.fullmatch(r"(\d+)[xX*](\d+)", part)
        if not mt:
            raise argparse.ArgumentTypeError(f"shapes are NxK separated by commas (e.g. 4096x4096), got {part!r}")
        n, k = int(mt.group(1)), int(mt.group(2))
        if n <= 0 or k <= 0 or k % GROUP_SIZE:
            raise argparse.ArgumentTypeError(f"shape {part!r}: k must be a positive multiple of {GROUP_SIZE}")
        if n > MAX_DIM or k > MAX_DIM:
            raise argparse.ArgumentTypeError(f"shape {part!r}: n and k must be at most {MAX_DIM_TEXT} (the ops' bound)")
        shapes.append((n, k))
    return shapes


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m torchao_kernels.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", type=_parse_shapes,
                   help=f"NxK,... with n, k in 1..{MAX_DIM_TEXT} (default: 4096x4096,14336x4096,4096x14336,2048x2048); "
                        "the float32 weights, activations and outputs of one call (4 bytes x (n*k + m*k + m*n) "
                        "at the largest --m) must fit in this machine's memory")
    p.add_argument("--m", type=ints_up_to(MAX_DIM, MAX_DIM_TEXT), help="activation rows (default: 1,4,32,128)")
    p.add_argument("--threads", type=ints_up_to(MAX_THREADS, "threads"),
                   help=f"torch / ORT threads, at most {MAX_THREADS} (default: 1,2)")
    p.add_argument("--bits", type=bit_widths, help="weight bit widths of our op (default: 2,3,4,8)")
    # --mode and --scales default to None so that --selection and --kernels
    # can tell them given (and refuse them) from their defaults.
    p.add_argument("--mode", choices=["hot", "cold", "both"], help="hot: same weights each call; cold: rotate "
                   "copies larger than L3 (default: both; hot with --quick or --kernels); the kernel table "
                   "is always hot")
    p.add_argument("--scales", choices=sorted(SCALE_DTYPES),
                   help="scale storage of our op in the op table: float32 (default), bfloat16 (scales rounded "
                        "to bfloat16, 2 bytes each) or both (one row each); the kernel table uses float32")
    p.add_argument("--group-size", type=_parse_group, default=GROUP_SIZE,
                   help=f"group size of our op's weights: a positive multiple of {GROUP_MULTIPLE} (at most "
                        f"{MAX_GROUP_SIZE}) dividing every k, or 'k' "
                        "for one group per output channel (default %(default)s; the peers keep their own: "
                        "fbgemm per channel, ONNX Runtime blocks of 32; --selection always uses 32)")
    p.add_argument("--quick", action="store_true", help="2048x2048, m 1,32, 1 thread, 4 bits, hot (seconds)")
    p.add_argument("--kernels", action="store_true", help="per-kernel table only")
    p.add_argument("--selection", action="store_true",
                   help="kernel selection against measurement: every row that may run each (shape, bits, m, "
                        "threads) point timed in its class's regime; the static policy's and the selected "
                        "(tuning table) choice over the fastest (defaults: 4096x4096,14336x4096,2048x2048 and "
                        "SmolLM2's shapes, m 1,2,3,4,8,32,128, threads 1,2, bits 2,4,8, min-time 0.05). Takes "
                        "only --shapes, --m, --threads, --bits, --min-time, --cap, --json and --quiet "
                        "(--group-size is ignored); the other options are errors")
    p.add_argument("--no-kernels", action="store_true", help="op table only")
    p.add_argument("--kernel-filter", metavar="REGEX", type=_regex,
                   help="only kernels whose name matches (an error when none of this run's kernels does)")
    p.add_argument("--iters", type=positive_int, help="timed calls per variant (default: until --min-time)")
    p.add_argument("--min-time", type=positive_float, help="seconds of timed calls per variant (default 0.2)")
    p.add_argument("--peak-gops", type=positive_float,
                   help="int8 compute peak per core in GOPS for every row (default: the ceilings measured by "
                        "the library's probes, per kernel family)")
    p.add_argument("--cap", choices=list(CAPS), metavar="ISA",
                   help="measure as if the CPU had only this x86 ISA level (" + ", ".join(CAPS) + "): ours "
                        "through TORCHAO_KERNELS_MAX_ISA, fbgemm and MKL through FBGEMM_ENABLE_INSTRUCTIONS "
                        "and MKL_ENABLE_INSTRUCTIONS (in a re-executed process); ONNX Runtime cannot be capped")
    p.add_argument("--json", metavar="PATH", type=writable_path,
                   help="also write raw results as JSON (after the report is printed; its directory must exist)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return p


# What --selection takes (tuning.selection_report's arguments, the cap, the
# JSON file and the progress switch); every other option, given, is an error
# rather than silently dropped. --group-size is documented as ignored.
SELECTION_UNUSED = ("quick", "kernels", "no_kernels", "kernel_filter", "iters", "peak_gops", "mode", "scales")


def _value_error(message: str) -> None:
    raise ValueError(message)


def _resolve(args, error: Optional[Callable[[str], None]] = None) -> argparse.Namespace:
    """Fills the defaults and checks what no option's type can check alone
    (options together, the shapes against the group size, memory and the
    kernel filter), before anything is measured. error(message) reports a bad
    value and does not return: by default the parser's (a usage error, exit
    2); _bench, called from Python, passes one that raises ValueError."""
    if error is None:
        error = _parser().error
    if args.selection:
        from . import tuning

        given = [name for name in SELECTION_UNUSED if getattr(args, name) not in (None, False)]
        if given:
            error("--selection does not use " + ", ".join("--" + name.replace("_", "-") for name in given)
                  + " (it takes --shapes, --m, --threads, --bits, --min-time, --cap, --json, --quiet)")
        base = dict(shapes=list(tuning.SELECTION_SHAPES), m=list(tuning.SELECTION_M), threads=[1, 2],
                    bits=[2, 4, 8], min_time=0.05)
    else:
        base = dict(shapes=DEFAULT_SHAPES, m=DEFAULT_M, threads=DEFAULT_THREADS, bits=DEFAULT_BITS,
                    mode="hot" if args.kernels else "both", min_time=0.2, scales="float32")
        if args.quick:
            base.update(QUICK)
    for key, val in base.items():
        if getattr(args, key) is None:
            setattr(args, key, val)
    if not args.selection:
        if args.kernels and args.no_kernels:
            error("--kernels and --no-kernels exclude each other")
        if args.no_kernels and args.kernel_filter is not None:
            error(f"--kernel-filter {args.kernel_filter!r}: it selects the kernel table's kernels, which "
                  "--no-kernels leaves out")
        # The kernel table times float32 scales and hot weights only: with
        # --kernels (no op table) another --scales or --mode would do nothing.
        if args.kernels and (args.scales != "float32" or args.mode != "hot"):
            bad = [f"--{o} {getattr(args, o)}" for o, ok in (("scales", "float32"), ("mode", "hot"))
                   if getattr(args, o) != ok]
            error(f"--kernels: {', '.join(bad)} would do nothing: the kernel table times float32 scales and hot "
                  "weights only (--scales and --mode apply to the op table)")
        bad = [f"{n}x{k}" for n, k in args.shapes if k % (args.group_size or k)]
        if bad:
            error(f"--group-size {args.group_size}: it must divide every k, not that of {', '.join(bad)}")
        if args.group_size == 0:
            big = [f"{n}x{k}" for n, k in args.shapes if k > MAX_GROUP_SIZE]
            if big:
                error(f"--group-size k: a group of k must be at most {MAX_GROUP_SIZE}, not that of {', '.join(big)}")
    # A bound against absurd values (an allocation error after minutes of
    # measuring), not a promise that a run just below it fits.
    mem = physical_memory_bytes()
    if mem:
        m = max(args.m)
        for n, k in args.shapes:
            need = 4 * (n * k + m * k + m * n)
            if need > mem:
                error(f"--shapes {n}x{k} with --m {m}: the float32 weights, activations and outputs of one call "
                      f"need {need / 2**30:.1f} GiB, more than this machine's {mem / 2**30:.1f} GiB of memory")
    if not args.selection and not args.no_kernels and args.kernel_filter is not None:
        # The kernels of this process: a --cap run checks again in its capped process.
        usable = [kk["name"] for kk in _kernel_list(args.kernel_filter) if set(kk["bits"]) & set(args.bits)]
        if not usable:
            error(f"--kernel-filter {args.kernel_filter!r} matches none of the kernels this run may time "
                  f"(linear, runnable on this CPU, within the ISA cap, taking bits {','.join(map(str, args.bits))})")
    _check_cap(args.cap, error)
    return args


# ----------------------------------------------------------------------------
# --cap


def cap_env(cap: str) -> Dict[str, str]:
    """The environment variables --cap cap sets, in the order of the report."""
    c = CAPS[cap]
    return {"TORCHAO_KERNELS_MAX_ISA": cap, "FBGEMM_ENABLE_INSTRUCTIONS": c["fbgemm"],
            "MKL_ENABLE_INSTRUCTIONS": c["mkl"]}


def _check_cap(cap: Optional[str], error: Optional[Callable[[str], None]] = None) -> None:
    """error(message): how to report a cap this machine or build cannot take
    (default: the parser's usage error)."""
    if cap is None:
        return
    if error is None:
        error = _parser().error
    if platform.machine().lower() not in ("x86_64", "amd64"):
        error(f"--cap {cap}: caps x86 ISA levels; this machine is {platform.machine()}")
    if cap not in tk.isa_levels():
        error(f"--cap {cap}: this build's TORCHAO_KERNELS_MAX_ISA levels are {tk.isa_levels()}")


def _cap_env_set(cap: str) -> bool:
    return all(os.environ.get(k) == v for k, v in cap_env(cap).items())


def _capped_here(cap: str) -> bool:
    """True when this process was started for --cap cap: the variables were in
    its environment before torch ran anything."""
    return os.environ.get(CAP_MARK) == cap and _cap_env_set(cap)


def _capped_environ(cap: str) -> Dict[str, str]:
    env = dict(os.environ)
    env.update(cap_env(cap))
    env[CAP_MARK] = cap
    return env


def _bench_command(argv: Sequence[str]) -> List[str]:
    return [sys.executable, "-m", "torchao_kernels.bench", *argv]


def _run_capped_subprocess(argv: Sequence[str], cap: str) -> int:
    """The benchmark in a fresh process with the --cap variables set: its report
    printed to sys.stdout, its progress forwarded to sys.stderr; its exit code."""
    proc = subprocess.Popen(_bench_command(argv), env=_capped_environ(cap), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    out: List[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)
    reader.start()
    for line in proc.stderr:
        sys.stderr.write(line)
        sys.stderr.flush()
    reader.join()
    rc = proc.wait()
    sys.stdout.write("".join(out))
    sys.stdout.flush()
    return rc


def cap_info(cap: str, machine: dict) -> dict:
    """What --cap cap capped, what it could not, and whether ONNX Runtime's rows
    compare (the CPU has no ISA above the cap)."""
    env = cap_env(cap)
    capped = [("ours", "TORCHAO_KERNELS_MAX_ISA"), ("fbgemm", "FBGEMM_ENABLE_INSTRUCTIONS"),
              ("MKL", "MKL_ENABLE_INSTRUCTIONS")]
    above = [f for f in machine.get("isa", []) if f not in CAPS[cap]["isa"]]
    lacking = [f for f in CAPS[cap]["isa"] if f not in machine.get("isa", [])]
    ort = machine.get("onnxruntime") is not None
    return {
        "isa": cap,
        "capped": [{"who": who, "variable": var, "value": env[var]} for who, var in capped],
        "not_capped": ["ONNX Runtime"] if ort else [],
        "cpu_isa_above_cap": above,
        "cpu_isa_lacking": lacking,
        "ort_comparable": not (ort and above),
        "environment": {k: os.environ.get(k) for k in env},  # what this (measuring) process has
    }


def _cap_line(info: dict) -> str:
    capped = ", ".join(f"{c['who']} {c['variable']}={c['value']}" for c in info["capped"])
    return f"capped to {info['isa']}: {capped}; not capped: {', '.join(info['not_capped']) or 'none'}"


def _cap_notes(info: dict) -> List[str]:
    notes = ["--cap " + info["isa"] + ": capped: ours (TORCHAO_KERNELS_MAX_ISA), torch int8 dyn (fbgemm, "
             "FBGEMM_ENABLE_INSTRUCTIONS), torch fp32 (MKL, MKL_ENABLE_INSTRUCTIONS); could not be capped: "
             + ("ORT MatMulNBits (ONNX Runtime has no ISA cap)" if info["not_capped"]
                else "none (ONNX Runtime, which has no ISA cap, is not installed)")]
    if info["not_capped"] and not info["ort_comparable"]:
        notes.append(f"ORT MatMulNBits runs with this CPU's {', '.join(info['cpu_isa_above_cap'])}, above "
                     f"{info['isa']}: its rows are not capped and 'vs ORT' is n/c (not comparable)")
    elif info["not_capped"]:
        notes.append(f"this CPU has no ISA above {info['isa']}: ONNX Runtime runs as capped, 'vs ORT' compares")
    if info["cpu_isa_lacking"]:
        notes.append(f"this CPU lacks {', '.join(info['cpu_isa_lacking'])} of {info['isa']}: the cap removes "
                     "only what it has above")
    return notes


def _ceiling_bounds(roof: Roofline, kernels: List[dict], peers: List[str]) -> Dict[str, str]:
    """probe name -> what it bounds, for the ceilings table."""
    if roof.override:
        return {p["name"]: "- (--peak-gops)" for p in roof.probes}
    out: Dict[str, str] = {}
    first: Dict[str, str] = {}
    for p in roof.probes:
        first.setdefault(p["isa_name"], p["name"])
    borrowed = [kk["name"] for kk in kernels if kernel_family(kk["name"]) not in roof.ceilings]
    for p in roof.probes:
        fam, name = p["isa_name"], p["name"]
        declared = [_short(kk["name"]) for kk in kernels if roof.kernel_ceilings.get(kk["name"]) == name]
        if first[fam] != name:
            out[name] = ("ours: " + ", ".join(declared)) if declared and p.get("gops") else \
                f"- ({fam} kernels: {first[fam]})"
            continue
        if not p.get("gops"):
            continue
        parts = []
        own = [_short(kk["name"]) for kk in kernels
               if kernel_family(kk["name"]) == fam and not roof.kernel_ceilings.get(kk["name"])]
        if own:
            parts.append("ours: " + ", ".join(own))
        if roof.peer_probe is p:
            if peers:
                parts.append("peers: " + ", ".join(peers))
            if borrowed:
                parts.append(f"{BORROWED_MARK}: " + ", ".join(_short(b) for b in borrowed)
                             + " (no int8 ceiling of their own)")
        if not parts:
            parts.append("- (above the cap)" if fam not in roof.allowed_families else "-")
        out[name] = "; ".join(parts)
    return out


def _bench_selection(args) -> Tuple[str, dict]:
    """--selection's report and data (args resolved: the defaults filled in)."""
    from . import tuning
    text, rows = tuning.selection_report(args.shapes, args.bits, args.m, args.threads, args.min_time,
                                         progress=not args.quiet)
    machine = machine_info()
    isa = " ".join(machine["isa"]) or "no SIMD extensions"
    st = tuning.tuning_status()
    # Only this library's kernels run here: the cap is TORCHAO_KERNELS_MAX_ISA
    # (fbgemm's and MKL's variables are set, but nothing of theirs is timed).
    cap = cap_info(args.cap, machine) if args.cap else None
    head = (f"machine: {machine['cpu']} | {machine['arch']} | ISA: {isa} | cores: {machine['cores']} | "
            f"torch {machine['torch']}")
    if cap:
        machine["cap"] = cap
        head += (f" | capped to {args.cap}: ours TORCHAO_KERNELS_MAX_ISA={args.cap} (--selection times only "
                 "this library's kernels)")
    head += f"\ntuning table: {st['status']}\n"
    config = {k: getattr(args, k) for k in ("shapes", "bits", "m", "threads", "min_time", "cap")}
    return head + "\n" + text, {"machine": machine, "tuning": st, "cap": cap, "config": config, "selection": rows}


def _write_json(path: str, data: dict) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=1, default=str)


def _bench(argv: Optional[Sequence[str]]) -> Tuple[str, dict]:
    """The report and its data for argv, called from Python: a bad argument
    raises ValueError (the command line, run(), reports the same checks as
    usage errors first); writes --json."""
    args = _resolve(_parser().parse_args(argv), _value_error)
    text, data = _report(args)
    if args.json:
        _write_json(args.json, data)
    return text, data


def _report(args) -> Tuple[str, dict]:
    """Measures what the resolved args ask for: the report and the JSON data."""
    if args.cap and not _capped_here(args.cap):
        raise RuntimeError(
            f"--cap {args.cap} needs {', '.join(f'{k}={v}' for k, v in cap_env(args.cap).items())} in the "
            "environment before torch first runs fbgemm and MKL: use run() (a fresh subprocess) or "
            f"python -m torchao_kernels.bench --cap {args.cap}")
    if args.selection:
        return _bench_selection(args)
    global _group_setting
    _group_setting = args.group_size
    machine = machine_info()
    cores = machine.get("cores") or torch.get_num_threads()
    threads_before = torch.get_num_threads()
    notes: List[str] = []
    cap = cap_info(args.cap, machine) if args.cap else None
    if cap:
        notes += _cap_notes(cap)
        args.ort_not_comparable = not cap["ort_comparable"]
        machine["cap"] = cap
    over = [t for t in args.threads if t > cores]
    if over:
        notes.append(f"threads {over} exceed the {cores} cores: those rows are oversubscribed")
    # The kernel table's rows are float32 scales and hot weights whatever
    # --scales and --mode ask of the op table (--kernels alone refuses others).
    kernel_table = None if args.no_kernels else {"scales": "float32", "mode": "hot"}
    op_only = [f"--{o} {getattr(args, o)}" for o, same in (("scales", "float32"), ("mode", "hot"))
               if getattr(args, o) != same]
    if kernel_table and op_only:
        notes.append(f"{' and '.join(op_only)}: the op table only; the kernel and selection tables time float32 "
                     "scales and hot weights")
    l3 = int(machine.get("l3_bytes") or 0) or (32 << 20)
    dram_bytes = min(max(2 * l3, 256 << 20), 1 << 30)
    probes = measure_int8_ceilings(args.quiet)
    roof = Roofline(args.peak_gops, dram_bytes, min(args.min_time, 0.1), args.quiet, probes=probes,
                    families=CAPS[args.cap]["families"] if args.cap else None,
                    override=args.peak_gops is not None,
                    kernel_ceilings={kk["name"]: kk["ceiling"] for kk in tk.info()["kernels"] if kk.get("ceiling")})
    try:
        # Roofline first, before the benchmark's own buffers are live.
        for t in args.threads:
            roof.hot_bw(HOT_BW_BYTES, t)
            roof.dram_bw(t)
        ops_results: List[dict] = []
        kernel_results: List[dict] = []
        selection: List[dict] = []
        if not args.kernels:
            ops_results = bench_ops(args, roof, machine, notes)
        if not args.no_kernels:
            kernel_results, selection = bench_kernels(args, roof, notes)
    finally:
        torch.set_num_threads(threads_before)

    isa = " ".join(machine["isa"]) or "no SIMD extensions"
    machine_line = (
        f"machine: {machine['cpu']} | {machine['arch']} | ISA: {isa} | cores: {machine['cores']} | "
        f"L2 {_mib(machine['l2_bytes'] or 0)} L3 {_mib(machine['l3_bytes'] or 0)} | torch {machine['torch']} "
        f"(quantized engine {machine['torch_quantized_engine']}) | "
        f"onnxruntime {machine['onnxruntime'] or 'not installed'} | {machine['date']}")
    if cap:
        machine_line += " | " + _cap_line(cap)
    lines = [machine_line, ""]
    seen_peers = []
    for r in ops_results:
        if r["kind"] != OURS and r["op"] not in seen_peers:
            seen_peers.append(r["op"])
    kernels_in_run = _kernel_list(None)
    bounds = _ceiling_bounds(roof, kernels_in_run, seen_peers)
    if roof.override:
        lines.append(f"int8 compute peak: {args.peak_gops:g} GOPS per core (--peak-gops); applied to every row, "
                     "fp32 included")
    elif roof.peer_probe is None:
        lines.append(f"int8 compute peak: {DEFAULT_PEAK_GOPS_PER_CORE:g} GOPS per core (default: measured with "
                     "AVX512-VNNI on the development machine); applied to every row, fp32 included")
        lines.append("warning: no int8 ceiling probe of the library runs on this CPU; the default peak does not "
                     "describe it, pass --peak-gops")
    else:
        lines.append("int8 compute ceilings (one core, measured now by the library's probes; a compute-bound "
                     "row's roof is its ceiling x threads: ours the ceiling of its kernel's ISA family, the "
                     "peers (fp32 included) the highest the run allows):")
    if roof.probes:
        lines += ["", ceilings_table(roof, bounds), ""]
    load = machine.get("load_average_1min")
    if load is not None and load > 0.5:
        lines.append(f"warning: load average {load:.2f} at start: other work is running, timings (most of all "
                     "multi-thread ones) are noisy")
    lookup_ns = torch.ops.torchao_kernels._bench_cached_lookup(2_000_000)
    machine["cached_kernel_lookup_ns"] = lookup_ns
    lines.append(f"selection: a cached kernel lookup (the per-call hot path) costs {lookup_ns:.1f} ns")
    lines += [
        "read bandwidth (best pass of a torch fp32 sum; hot rows use the buffer size nearest above their weights, "
        "cold rows the DRAM one):",
        "",
        roof.table(),
        "",
    ]
    for note in notes:
        lines.append(f"note: {note}")
    if notes:
        lines.append("")
    legend = (f"{BORROWED_MARK} compute roof of a kernel with no int8 ceiling of its own (scalar): "
              f"{roof.peer_probe['name'] if roof.peer_probe else 'the default peak'}, the highest the run allows.")
    if ops_results:
        lines += [
            f"ours N-bit = torch.ops.torchao.linear_8bit_act_xbit_weight, {_group_label()}, no zeros; "
            "torch int8 dyn = quantized::linear_dynamic (8-bit weights); "
            f"ORT = MatMulNBits bits 4, block {GROUP_SIZE}, accuracy_level 4. "
            "us/call is the median; 'vs X' = X's time / ours (speedup); kernel = selection's pick.",
            "",
            ops_table(ops_results),
            "",
        ]
        if any(_borrowed(r) for r in ops_results):
            lines += [legend, ""]
    if kernel_results:
        lines += [
            "each kernel alone (torch.ops.torchao_kernels._run_kernel, 1 thread, hot):",
            "",
            kernels_table(kernel_results),
            "",
        ]
        if any(_borrowed(r) for r in kernel_results):
            lines += [legend, ""]
        lines += [
            f"selection vs measurement (selected = explain(packed, m, threads).winner; 1 thread: the kernels "
            "alone above; more threads: each kernel forced through the op; flagged when more than "
            f"{100 * (SLOWER_THRESHOLD - 1):.0f}% slower than the fastest):",
            "",
            selection_table(selection),
            "",
        ]
    config = {k: v for k, v in vars(args).items() if k not in ("json", "ort_not_comparable")}
    first: Dict[str, str] = {}
    for p in roof.probes:
        first.setdefault(p["isa_name"], p["name"])
    ceilings = [{**p, "family_ceiling": first[p["isa_name"]] == p["name"], "bounds": bounds.get(p["name"], "-")}
                for p in roof.probes]
    data = {"machine": machine, "config": config, "kernel_table": kernel_table, "cap": cap,
            "peak_gops_per_core": roof.ceiling(None)[0], "peak_gops_override": args.peak_gops,
            "peer_ceiling": roof.ceiling(None)[1], "int8_ceilings": ceilings,
            "bandwidth_gbps": [{"bytes": b, "threads": t, "gbps": v} for (b, t), v in sorted(roof.bw.items())],
            "dram_bytes": dram_bytes, "notes": notes, "ops": ops_results, "kernels": kernel_results,
            "selection": selection}
    return "\n".join(lines), data


def run(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of `python -m torchao_kernels.bench` (argv: the arguments,
    default sys.argv[1:]); prints the report, returns the exit code.

    With --cap, fbgemm and MKL must see their variables before their first use
    in the process, which a caller's process cannot promise: unless this
    process was started for the cap (by `python -m torchao_kernels.bench
    --cap ...`, which marks it with TORCHAO_KERNELS_BENCH_CAP), run() runs the
    benchmark in a fresh `python -m torchao_kernels.bench` subprocess with the
    variables set, prints its report and returns its exit code (its --json
    file, if any, is written by that subprocess)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parse(argv)
    if args.cap and not _capped_here(args.cap):
        return _run_capped_subprocess(argv, args.cap)
    text, data = _report(args)
    # The report first: a --json file that cannot be written loses nothing
    # of the run.
    print(text, flush=True)
    if args.json:
        _write_json(args.json, data)
    return 0


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    """argv parsed and resolved; a bad value is a usage error (exit 2, naming
    the option and the value) before anything is measured or re-executed."""
    p = _parser()
    return _resolve(p.parse_args(argv), p.error)


def _main(argv: Optional[Sequence[str]] = None) -> int:
    """`python -m torchao_kernels.bench`: with --cap and the variables not yet in
    the environment, re-executes itself with them (nothing has run fbgemm or
    MKL yet), marked so that it cannot loop; otherwise run(argv)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    cap = _parse(argv).cap
    if cap and not _cap_env_set(cap):
        if os.environ.get(CAP_MARK) == cap:
            raise SystemExit(f"--cap {cap}: this process was re-executed for the cap ({CAP_MARK}={cap}) but "
                             f"does not have {', '.join(f'{k}={v}' for k, v in cap_env(cap).items())}; "
                             "not re-executing again")
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, _bench_command(argv), _capped_environ(cap))
    if cap:
        os.environ[CAP_MARK] = cap  # the variables were there from the start
    return run(argv)


def quick_table() -> str:
    """The --quick benchmark's report (machine line, roofline, tables) as a string."""
    text, _ = _bench(["--quick", "--quiet"])
    return text


main = run

if __name__ == "__main__":
    sys.exit(_main())
