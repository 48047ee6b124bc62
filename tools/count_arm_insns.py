#!/usr/bin/env python3
"""Executed AArch64 instructions per multiply-accumulate of every registered
ARM kernel, counted exactly under qemu (the speed proxy for ARM kernels when
no ARM hardware is in reach), written as a markdown table.

    python tools/count_arm_insns.py [--tool PATH/count_insns.py] [--out docs/results/arm_instruction_counts.md]

Needs the cross-built probe (bash tools/test_arm.sh builds build/aarch64;
this script builds the tk_insn_count target) and the instruction counter
(count_insns.py: runs qemu-aarch64 -d in_asm,exec,nochain and sums executed
translation blocks between region markers). Shape (n, k) = (4096, 4096),
4-bit weights, group 32, m in {1, 2, 4, 32}; region 1 is the activation
quantization, region 2 the matmul call.

The counts are then the benchmark of the selection policy on ARM: for fake
CPUs of each ARM feature level (and both clusters of a big.LITTLE one), the
kernel selection picks per m is compared with the kernel of fewest counted
instructions (matmul + activation quantization) among those the CPU can run.
In-order little cores may prefer a kernel on purpose (see the registry's
reasoning); the table says so.

    python tools/count_arm_insns.py --embedding [--out docs/results/arm_embedding_instruction_counts.md]

instead counts the ARM embedding-lookup rows: instructions per looked-up
value, 64 rows spread over a 49152x576 table (SmolLM2's vocabulary), group
32, at 2, 3, 4, 5 and 8 bits.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # this checkout's package, whatever is installed
# the project's argument types
from torchao_kernels.cli_types import positive_ints, writable_path  # noqa: E402
PROBE = os.path.join(ROOT, "build", "aarch64", "kernels", "tests", "tk_insn_count")
ARM_ISAS = ("neon", "dotprod", "i8mm")
# Instructions per MAC of the best ARM kernels known, same method and shape
# (matmul call alone), for comparison.
PEERS = [
    ("KleidiAI 1x8 GEMV (qsi4c32p8x8_1x8x32)", "dotprod", {1: 0.251, 4: 0.251, 32: 0.251}),
    ("KleidiAI 4x8 GEMM (qsi4c32p8x8_4x8x32)", "i8mm", {1: 0.420, 4: 0.105, 32: 0.105}),
    ("KleidiAI 16x4 GEMM (qsi4c32p4x8_16x4x32)", "i8mm", {1: 0.472, 4: 0.118, 32: 0.090}),
    ("torchao kernel_1x8x16_f32_neondot<4>", "dotprod", {1: 0.379, 4: 0.379, 32: 0.379}),
]


def arm_kernels(op: str = "linear"):
    import torchao_kernels as tk  # the registry lists every architecture's kernels

    return [k for k in tk.info()["kernels"] if k["isa"] in ARM_ISAS and k["op"] == op]


def run_tool(tool: str, cpu: str, args) -> dict:
    """The instruction counter's JSON report of one probe run; when the counter
    fails, its stderr is shown (its output is captured) and the script stops."""
    cmd = [sys.executable, tool, "--cpu", cpu, "--", PROBE] + [str(a) for a in args]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        raise SystemExit(f"the instruction counter failed (exit {r.returncode}): {' '.join(cmd)}")
    return json.loads(r.stdout)


def count_region(tool: str, cpu: str, args) -> list:
    """Instructions of each marked region of one probe run."""
    return [r["insns"] for r in run_tool(tool, cpu, args)["regions"]]


def embedding_counts(tool: str, cpu: str, out_path: str) -> None:
    rows, n, k, lookups = [], 49152, 576, 64
    for kern in arm_kernels("embedding"):
        for bits in (2, 3, 4, 5, 8):
            insns = count_region(tool, cpu, [kern["name"], lookups, n, k, bits, 32])[1]
            rows.append((kern["name"], bits, insns / (lookups * k)))
            print(f"{kern['name']:<40} {bits}-bit {insns / (lookups * k):.3f} insns/value", flush=True)
    lines = [
        "# ARM embedding lookups: executed instructions per looked-up value",
        "",
        f"Counted exactly under `qemu-aarch64 -cpu {cpu}` (same count on every run); {lookups} rows "
        f"spread over a {n}x{k} table, group 32, no zero points, float32 scales. Made by "
        "`bash tools/test_arm.sh && python tools/count_arm_insns.py --embedding` on "
        f"{datetime.date.today().isoformat()}.",
        "",
        "| kernel | bits | instructions / value |",
        "|---|---:|---:|",
    ]
    lines += [f"| `{name}` | {bits} | {v:.3f} |" for name, bits, v in rows]
    # torchao's weights-only tables (_embedding_{b}bit): scales per call, and
    # zero points that torchao passes even for symmetric weights (all 0).
    table_rows = []
    for kern in arm_kernels("embedding"):
        if kern["format"] != "n1k4":
            continue
        for bits in (2, 4, 8):
            per = []
            for variant in ("table", "table-zeros0", "table-zeros1"):
                insns = count_region(tool, cpu, [kern["name"], lookups, n, k, bits, 32, variant])[1]
                per.append(insns / (lookups * k))
            table_rows.append((kern["name"], bits, per))
            print(f"{kern['name']:<40} {bits}-bit weights-only table " + " / ".join(f"{v:.3f}" for v in per),
                  flush=True)
    lines += ["", "Weights-only tables (torchao's `_embedding_{b}bit`: float32 scales per call, group 32), "
              "instructions / value:", "",
              "| kernel | bits | no zero points | zero points, all 0 | zero points, all 1 |",
              "|---|---:|---:|---:|---:|"]
    lines += [f"| `{name}` | {bits} | " + " | ".join(f"{v:.3f}" for v in per) + " |"
              for name, bits, per in table_rows]
    with open(out_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {out_path}")


SELECTION_CPUS = ["cortex-a53", "cortex-a76", "neoverse-n1", "neoverse-v2", "big-little-x2-a710-a510"]


def selection_check(rows):
    """Markdown lines: selection's pick per fake ARM CPU, cluster and m, against
    the kernel of fewest instructions (matmul + activation quantization) that
    the CPU can run."""
    import torchao_kernels as tk

    kinfo = {k["name"]: k for k in arm_kernels()}
    total = {(name, m): mm + q for name, m, mm, q, _ in rows}
    ms = sorted({m for _, m, _, _, _ in rows})
    out = ["", "Selection against the counts (fake CPUs; 'fewest' = fewest instructions per MAC, "
           "matmul + activation quantization, among the kernels the CPU can run):", "",
           "| cpu | cluster | m | selected | instr./MAC | fewest | instr./MAC | selected within 5% |",
           "|---|---|---:|---|---:|---|---:|---|"]
    for cpu in SELECTION_CPUS:
        d0 = tk.explain("n16k4", 1, cpu=cpu).to_dict()
        isa = set(d0["cpu"]["isa"])
        runnable = [n for n, k in kinfo.items() if set(k["required_isa"]) <= isa]
        for m in ms:
            d = tk.explain("n16k4", m, cpu=cpu).to_dict()
            for c in d["clusters"]:
                sel = c["winner"]
                best = min(runnable, key=lambda n: total[(n, m)])
                ok = total[(sel, m)] <= 1.05 * total[(best, m)]
                note = "yes" if ok else (
                    "no: the registry keeps the GEMV at m = 2-3 on out-of-order cores (see its "
                    "reasoning); to settle on hardware" if c["uarch_class"] == "arm_big" and m in (2, 3)
                    else "no")
                out.append(f"| {cpu} | {c['uarch']} | {m} | `{sel}` | {total[(sel, m)]:.3f} | `{best}` | "
                           f"{total[(best, m)]:.3f} | {note} |")
    return out


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, every value checked (usage errors, exit 2) before the build."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tool", default=os.path.join(ROOT, "..", "shared", "tools", "arm-insns", "count_insns.py"))
    p.add_argument("--out", type=writable_path,
                   help="markdown output (default: docs/results/arm_instruction_counts.md, "
                        "with --embedding docs/results/arm_embedding_instruction_counts.md)")
    p.add_argument("--m", type=positive_ints, default=None,
                   help="activation rows, comma-separated (default 1,2,4,32; not with --embedding)")
    p.add_argument("--cpu", default="max")
    p.add_argument("--embedding", action="store_true", help="count the embedding-lookup rows instead")
    args = p.parse_args(argv)
    if args.embedding and args.m is not None:
        p.error(f"argument --m: not used with --embedding (the lookups have no m), got {','.join(map(str, args.m))}")
    if args.m is None:
        args.m = [1, 2, 4, 32]
    if not os.path.isfile(args.tool):
        p.error(f"argument --tool: no such file: {args.tool!r} (the instruction counter, count_insns.py)")
    return args


def main(argv=None):
    args = parse_args(argv)
    subprocess.run(["ninja", "-C", os.path.join(ROOT, "build", "aarch64"), "tk_insn_count"], check=True)
    if args.embedding:
        embedding_counts(args.tool, args.cpu, args.out or os.path.join(
            ROOT, "docs", "results", "arm_embedding_instruction_counts.md"))
        return
    args.out = args.out or os.path.join(ROOT, "docs", "results", "arm_instruction_counts.md")
    n = k = 4096
    rows = []
    for kern in arm_kernels():
        for m in args.m:
            res = run_tool(args.tool, args.cpu, [kern["name"], m])
            probe = json.loads(res["stdout"].strip().splitlines()[-1])
            quant, matmul = res["regions"][0]["insns"], res["regions"][1]["insns"]
            macs = m * n * k
            rows.append((kern["name"], m, matmul / macs, quant / macs, (probe["packed_bytes"] - 64) / n))
            print(f"{kern['name']:<40} m={m:<3} {matmul / macs:.4f} insns/MAC (act quant {quant / macs:.5f})",
                  flush=True)
    lines = [
        "# ARM kernels: executed instructions per multiply-accumulate",
        "",
        f"Counted exactly under `qemu-aarch64 -cpu {args.cpu}` (same count on every run); "
        f"(n, k) = ({n}, {k}), 4-bit weights, group 32, no zero points. Made by "
        "`bash tools/test_arm.sh && python tools/count_arm_insns.py` on "
        f"{datetime.date.today().isoformat()}.",
        "",
        "| kernel | m | instructions / MAC (matmul) | activation quantization / MAC | packed weight bytes per output |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, m, per_mac, quant, bpo in rows:
        lines.append(f"| `{name}` | {m} | {per_mac:.3f} | {quant:.4f} | {bpo:.1f} |")
    lines += ["", "The best ARM kernels known, measured the same way:", "",
              "| kernel | ISA | m=1 | m=4 | m=32 |", "|---|---|---:|---:|---:|"]
    for name, isa, v in PEERS:
        lines.append(f"| {name} | {isa} | {v[1]:.3f} | {v[4]:.3f} | {v[32]:.3f} |")
    lines += selection_check(rows)
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
