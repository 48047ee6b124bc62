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

SHAPES = ("576x576,1536x576,49152x576,576x1536,2048x1024,1024x2048,2048x2048,8192x1024,1024x4096,"
          "4096x4096,256x4096")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=SHAPES, help="n x k, comma-separated")
    ap.add_argument("--bits", default="2,4,8")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--min-time", type=float, default=0.4, help="seconds of timing per row and point")
    a = ap.parse_args(argv)
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
        for bits in map(int, a.bits.split(",")):
            for shape in a.shapes.split(","):
                n, k = map(int, shape.lower().split("x"))
                p = tuning._packed_problem(n, k, bits, False, 32, 0)
                for threads in map(int, a.threads.split(",")):
                    t = tuning._time_rows([plain, pf], p, a.m, threads, True, a.min_time, 5, l3, cut=False)
                    print(f"{plain}, _prefetch | {n}x{k} | {bits} | {threads} | {k * bits // 8} | "
                          f"{t[plain] * 1e6:.1f} | {t[pf] * 1e6:.1f} | {t[pf] / t[plain]:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
