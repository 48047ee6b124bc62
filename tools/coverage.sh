#!/usr/bin/env bash
# Kernel coverage of the torch-free gtest suite: builds tk_kernel_tests with
# gcov instrumentation in build/coverage, runs it, and reports, for every
# kernel function of the manifest, whether the suite executed it (functions
# whose ISA this CPU lacks are listed as not runnable here, never left out),
# and line / branch coverage per kernel source file. Writes
# build/coverage/report.md and fails when a kernel function this CPU can run
# never executed: the parameter-derived cases of kernels/tests/test_kernels.cpp
# are meant to reach every one of them.
#   JOBS=1 tools/coverage.sh [gtest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
B=build/coverage
JOBS=${JOBS:-1}

if [ ! -d /usr/src/googletest ]; then
  source tools/quiet.sh
  step "apt: installing googletest"
  quietly apt-update apt-get update
  DEBIAN_FRONTEND=noninteractive quietly apt-install-gtest apt-get install -y googletest
fi

# x86 has no hwcap backend: detection there goes through the torch wheel's
# cpuinfo, as in the extension; aarch64 uses auxv (tools/test_arm.sh).
case "$(uname -m)" in
  x86_64|AMD64) cpuinfo=ON ;;
  *) cpuinfo=OFF ;;
esac
# A build type of its own, so the Release -O3 does not override -O1; the
# code-generation flags bit-exactness depends on stay (the project adds them
# to every file too).
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Coverage \
  -DCMAKE_CXX_FLAGS="--coverage -O1 -DNDEBUG -ffp-contract=off -fno-math-errno" \
  -DCMAKE_EXE_LINKER_FLAGS="--coverage" \
  -DTORCHAO_KERNELS_BUILD_ATEN=OFF -DTORCHAO_KERNELS_BUILD_TESTS=ON \
  -DTORCHAO_KERNELS_USE_CPUINFO=$cpuinfo >/dev/null
cmake --build "$B" -j"$JOBS" --target tk_kernel_tests

# Counters of an earlier run would add up with this one.
find "$B" -name '*.gcda' -delete
start=$(date +%s)
"$B/kernels/tests/tk_kernel_tests" --gtest_brief=1 "$@"
echo "tk_kernel_tests (instrumented, -O1): $(( $(date +%s) - start )) s"

python3 - "$B" <<'EOF'
import collections, glob, json, os, subprocess, sys, tomllib

build = sys.argv[1]
root = os.getcwd()
man = tomllib.load(open("kernels/manifest.toml", "rb"))
names = subprocess.run([sys.executable, "tools/gen_kernels.py", "--names"], check=True,
                       capture_output=True, text=True).stdout.split()

# Kernel functions: one per distinct fn (the reference rows share theirs).
fns = {}  # fn -> {"rows": [...], "isa": ..., "source": ...}
def row_name(row):
    # The name grammar (docs/selection.md): derived from the row's fields.
    if row["op"] == "embedding":
        return f"qbw{row['format']}_f32_embedding_{row['mr']}x{row['nr']}__{row['isa']}"
    lhs = "qd8" + (f"p{row['lhs_panel'][0]}x{row['lhs_panel'][1]}" if "lhs_panel" in row else "")
    var = f"_{row['variant']}" if "variant" in row else ""
    return f"{lhs}_f32_qbw{row['format']}_{row['op']}_{row['mr']}x{row['nr']}{var}__{row['isa']}"
for row in man["kernel"]:
    name = row_name(row)
    assert name in names, f"{name} not in gen_kernels.py --names"
    fn = row.get("fn", name)
    e = fns.setdefault(fn, {"rows": [], "isa": row["isa"], "source": row["source"]})
    e["rows"].append(name)
for q, row in man.get("quantizers", {}).items():
    fns.setdefault(q, {"rows": ["(activation quantizer)"], "isa": row["isa"], "source": row["source"]})

# What this CPU can execute: the kernel's own view of the OS (/proc/cpuinfo flags).
flags = set()
arch = os.uname().machine
with open("/proc/cpuinfo") as f:
    for line in f:
        if line.startswith(("flags", "Features")):
            flags |= set(line.split(":", 1)[1].split())
cpu_flag = {"avx2": "avx2", "fma": "fma", "avxvnni": "avx_vnni", "avx512f": "avx512f",
            "avx512bw": "avx512bw", "avx512vl": "avx512vl", "avx512dq": "avx512dq",
            "avx512vnni": "avx512_vnni", "neon": "asimd", "dotprod": "asimddp", "i8mm": "i8mm"}
def missing(isa):
    fam = man["isa"][isa]
    if fam["arch"] not in ("any", "x86_64" if arch in ("x86_64", "AMD64") else "aarch64"):
        return [fam["arch"]]
    return [f for f in fam["features"] if cpu_flag.get(f, f) not in flags]

# gcov over every object of the kernel library.
objs = sorted(glob.glob(f"{build}/CMakeFiles/tk_kernels.dir/**/*.gcda", recursive=True))
files = {}      # source path -> {line: covered}, {(line, fn, i): taken}
executed = collections.Counter()
for gcda in objs:
    out = subprocess.run(["gcov", "--json-format", "--stdout", "--branch-probabilities",
                          "--demangled-names", os.path.abspath(gcda)], cwd=os.path.dirname(gcda),
                         capture_output=True, text=True, check=True).stdout
    for doc in out.splitlines():
        if not doc.strip():
            continue
        d = json.loads(doc)
        for f in d["files"]:
            path = os.path.relpath(os.path.join(d.get("current_working_directory", ""), f["file"]), root)
            if not path.startswith("kernels/"):
                continue
            for fun in f["functions"]:
                dn = fun.get("demangled_name", fun["name"])
                base = dn.split("(")[0].split("<")[0].rsplit("::", 1)[-1]
                executed[base] += fun["execution_count"]
            lines, br = files.setdefault(path, ({}, {}))
            for ln in f["lines"]:
                key = ln["line_number"]
                lines[key] = lines.get(key, False) or ln["count"] > 0
                for i, b in enumerate(ln.get("branches", [])):
                    k2 = (key, ln.get("function_name", ""), i)
                    br[k2] = br.get(k2, False) or b["count"] > 0

out = []
ran, never, absent = [], [], []
for fn, e in sorted(fns.items(), key=lambda kv: (kv[1]["source"], kv[0])):
    miss = missing(e["isa"])
    label = f"`{fn}` ({', '.join(e['rows'])})"
    if miss:
        absent.append(f"- {label}: not runnable here (needs {'+'.join(miss)})")
    elif executed[fn] > 0:
        ran.append(f"- {label}: executed ({executed[fn]} calls)")
    else:
        never.append(f"- {label}: NEVER EXECUTED")
kernel_sources = sorted(set(man["sources"]) | {p for p in files if p.startswith(("kernels/x86/", "kernels/aarch64/"))
                                               or p == "kernels/format/layout_dispatch.h"})
out.append(f"# Kernel coverage ({arch}; tk_kernel_tests, -O1 --coverage)\n")
out.append(f"Kernel functions: {len(ran)} executed, {len(never)} runnable but never executed, "
           f"{len(absent)} not runnable here.\n")
out.append("## Executed\n")
out += ran
if never:
    out.append("\n## Runnable here but never executed\n")
    out += never
out.append("\n## Not runnable here\n")
out += absent
out.append("\n## Line and branch coverage per kernel source\n")
out.append("| file | lines | branches |")
out.append("|---|---|---|")
tl = tc = tb = tt = 0
for p in kernel_sources:
    if p not in files:
        out.append(f"| {p} | not built here | |")
        continue
    lines, br = files[p]
    lc, ln_ = sum(lines.values()), len(lines)
    bt, bn = sum(br.values()), len(br)
    tl += ln_; tc += lc; tb += bn; tt += bt
    pct = lambda a, b: f"{100.0 * a / b:.1f}% ({a}/{b})" if b else "-"
    out.append(f"| {p} | {pct(lc, ln_)} | {pct(bt, bn)} |")
pct = lambda a, b: f"{100.0 * a / b:.1f}% ({a}/{b})" if b else "-"
out.append(f"| **all of the above** | {pct(tc, tl)} | {pct(tt, tb)} |")
text = "\n".join(out) + "\n"
print(text)
open(f"{build}/report.md", "w").write(text)
sys.exit(1 if never else 0)
EOF
