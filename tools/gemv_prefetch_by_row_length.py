"""Times each GEMV row that prefetches the next column step against its plain
form, weights streamed from DRAM, over layers of different row lengths
(k * bits / 8 bytes of quantized weights per output channel): the measurement
behind the row-length field of the problem class (docs/selection.md).

    python tools/gemv_prefetch_by_row_length.py [--shapes 576x576,...] [--bits 2,4,8] [--threads 1,2] [--m 1]

Prints one line per (shape, bits, threads): row bytes, both times, and the
prefetching form's time over the plain one's. Pairs every compiled,
runnable GEMV row whose name has "_prefetch" with the row without it.
"""
import argparse
import os
import sys

os.environ.setdefault("TORCHAO_KERNELS_TUNING", "0")

import torchao_kernels as tk  # noqa: E402
from torchao_kernels import tuning  # noqa: E402
# GROUP_SIZE is 32, the group _parse_shapes checks k against
from torchao_kernels.bench import GROUP_SIZE, _parse_shapes  # noqa: E402
# the project's argument types
from torchao_kernels.cli_types import MAX_BITS, bit_widths, positive_float, positive_int, positive_ints  # noqa: E402

SHAPES = ("576x576,1536x576,49152x576,576x1536,2048x1024,1024x2048,2048x2048,8192x1024,1024x4096,"
          "4096x4096,256x4096")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", type=_parse_shapes, default=SHAPES,
                    help="n x k, comma-separated (k a multiple of the group size, 32)")
    ap.add_argument("--bits", type=bit_widths, default="2,4,8", help=f"comma-separated, each in 1..{MAX_BITS}")
    ap.add_argument("--threads", type=positive_ints, default="1,2", help="comma-separated positive integers")
    ap.add_argument("--m", type=positive_int, default=1, help="activation rows")
    ap.add_argument("--min-time", type=positive_float, default=0.4, help="seconds of timing per row and point")
    return ap


def main(argv=None) -> int:
    a = _parser().parse_args(argv)  # every value checked (usage errors) before any timing
    info = tk.info()
    runnable = {k["name"] for k in info["kernels"] if k.get("runnable")}
    pairs = [(n.replace("_prefetch", ""), n) for n in sorted(runnable)
             if "gemv" in n and "_prefetch" in n and n.replace("_prefetch", "") in runnable]
    if not pairs:
        print("no prefetching GEMV row runs on this CPU", file=sys.stderr)
        return 1
    l3 = int(info["cpu"].get("l3_bytes") or 32 << 20)
    print(f"cpu: {info['cpu']['name']}; weights streamed from DRAM; m = {a.m}")
    print("plain, prefetch | n x k | bits | threads | row bytes | plain us | prefetch us | prefetch / plain")
    for plain, pf in pairs:
        for bits in a.bits:
            for n, k in a.shapes:
                p = tuning._packed_problem(n, k, bits, False, GROUP_SIZE, 0)
                for threads in a.threads:
                    t = tuning._time_rows([plain, pf], p, a.m, threads, True, a.min_time, 5, l3, cut=False)
                    print(f"{plain}, _prefetch | {n}x{k} | {bits} | {threads} | {k * bits // 8} | "
                          f"{t[plain] * 1e6:.1f} | {t[pf] * 1e6:.1f} | {t[pf] / t[plain]:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
