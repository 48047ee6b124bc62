#!/usr/bin/env bash
# ExecuTorch on aarch64, under emulation: cross-builds the kernel library and
# tk_pte_runner against the aarch64 executorch wheel (build/executorch-aarch64),
# exports test models on this machine (x86), runs each .pte with the runner
# under qemu-aarch64 (-cpu neoverse-n1: dotprod; max: dotprod + i8mm;
# cortex-a72: NEON only) and compares with eager: every quantized linear bit
# for bit (the aarch64 kernels, like the x86 ones, reproduce the reference
# kernel exactly), so a .pte exported on x86 gives the same numbers on ARM.
#
#   bash tools/test_executorch_arm.sh   # CPUS="neoverse-n1 max cortex-a72" TK_QEMU_TIMEOUT=300 by default
#
# Needs (installed when missing, as root): g++-aarch64-linux-gnu, qemu-user,
# libc6:arm64 + libstdc++6:arm64 (multiarch; qemu runs without -L, see
# ../docs/executorch.md), and the executorch==1.5.1 aarch64 wheel from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python}
OUT=build/executorch-aarch64
CPUS=${CPUS:-"neoverse-n1 max cortex-a72"}
TIMEOUT=${TK_QEMU_TIMEOUT:-300}
JOBS=${JOBS:-2}
ET_VERSION=1.5.1
start=$(date +%s)

# ---------------------------------------------------------------- tools
need=()
command -v aarch64-linux-gnu-g++ >/dev/null || need+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
[ -e /usr/lib/aarch64-linux-gnu/libstdc++.so.6 ] || need+=(libc6:arm64 libstdc++6:arm64)
if [ ${#need[@]} -gt 0 ]; then
  source tools/quiet.sh
  step "apt: installing ${need[*]} (cross compiler, qemu)"
  dpkg --print-foreign-architectures | grep -q arm64 || dpkg --add-architecture arm64
  quietly apt-update apt-get update
  DEBIAN_FRONTEND=noninteractive quietly apt-install-arm apt-get install -y "${need[@]}"
fi

# ---------------------------------------------------------------- the aarch64 executorch wheel
WHEEL_DIR=$OUT/wheels
SITE=$OUT/site
if [ ! -f "$SITE/executorch/share/cmake/executorch-config.cmake" ]; then
  mkdir -p "$WHEEL_DIR"
  ls "$WHEEL_DIR"/executorch-$ET_VERSION-*aarch64*.whl >/dev/null 2>&1 ||
    $PY -m pip download --disable-pip-version-check -q --no-deps --only-binary=:all: \
      --platform manylinux_2_28_aarch64 --python-version 3.11 "executorch==$ET_VERSION" -d "$WHEEL_DIR"
  rm -rf "$SITE" && mkdir -p "$SITE"
  $PY -c "import glob, sys, zipfile; zipfile.ZipFile(glob.glob(sys.argv[1])[0]).extractall(sys.argv[2])" \
    "$WHEEL_DIR/executorch-$ET_VERSION-*aarch64*.whl" "$SITE"
fi

# ---------------------------------------------------------------- cross build
CMAKE=$($PY -c "import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, 'cmake'))" 2>/dev/null || command -v cmake)
# torch (this machine's wheel) only provides paths and cpuinfo.h (architecture-independent).
TORCH_DIR=$($PY -c "import importlib.util as u; print(u.find_spec('torch').submodule_search_locations[0])")
GEN=()
command -v ninja >/dev/null && [ ! -f "$OUT/build/CMakeCache.txt" ] && GEN=(-G Ninja)
"$CMAKE" -S ops/executorch -B "$OUT/build" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_TOOLCHAIN_FILE="$PWD/third_party/toolchain-aarch64-linux-gnu.cmake" \
  -DPython_EXECUTABLE="$(command -v "$PY")" \
  -Dexecutorch_DIR="$PWD/$SITE/executorch/share/cmake" \
  -DTORCH_ROOT="$TORCH_DIR" -DTK_CPUINFO_INCLUDE_DIR="$TORCH_DIR/include" >/dev/null
"$CMAKE" --build "$OUT/build" -j "$JOBS"
RUNNER=$OUT/build/tk_pte_runner
file "$RUNNER" | grep -q aarch64 || { echo "$RUNNER is not an aarch64 binary" >&2; exit 1; }
echo "cross build: $(( $(date +%s) - start ))s"

# ---------------------------------------------------------------- export, run under qemu, compare
# The exporting side needs the x86 kernel library (tools/build_executorch.sh) only for
# torchao_kernels.executorch's helpers; the models run only on the aarch64 runner.
$PY - "$RUNNER" "$OUT/cases" "$CPUS" "$TIMEOUT" <<'EOF'
import json, os, re, subprocess, sys, time, warnings

import torch

import torchao_kernels as tk
from torchao_kernels import executorch as tke

sys.path.insert(0, os.path.join(os.getcwd(), "test"))
from test_executorch import Block, WithTaps, mlp  # noqa: E402  (the models of the pytest suite)

runner, out, cpus, timeout = sys.argv[1], sys.argv[2], sys.argv[3].split(), int(sys.argv[4])
# Eager on this machine warns that n1k4 weights run the reference kernel here: expected.
warnings.filterwarnings("ignore", message="torchao_kernels: packed weights in format")
os.makedirs(out, exist_ok=True)
torch.manual_seed(0)


def torchao_mlp():
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerGroup

    model = mlp(seed=2)
    quantize_(model, Int8DynamicActivationIntxWeightConfig(
        weight_dtype=torch.int4, weight_granularity=PerGroup(32),
        intx_packing_format="opaque_torchao_auto"))
    return model


def tk_mlp(bits, zeros, target, seed):
    model = mlp(seed=seed)
    tk.quantize_(model, bits=bits, group_size=32, has_zeros=zeros, target=target)
    return model


def block():
    b = Block()
    tk.quantize_(b, bits=4, group_size=32)
    return b, WithTaps(b).eval()


batch = ({0: torch.export.Dim("batch", min=1, max=64)},)
seq = ({1: torch.export.Dim("seq", min=2, max=32)},)
cases = [  # name, eager model, exported model, example input, dynamic shapes, run inputs, kind
    ("mlp_4bit", *(lambda m: (m, m))(tk_mlp(4, False, None, 0)), torch.randn(4, 64), batch,
     [torch.randn(1, 64), torch.randn(13, 64)], "exact"),
    ("mlp_3bit_zeros_n1k4", *(lambda m: (m, m))(tk_mlp(3, True, "n1k4", 1)), torch.randn(4, 64),
     batch, [torch.randn(7, 64)], "exact"),
]
if tk.torchao_compat_status() == "registered":
    cases.append(("mlp_torchao_int4", *(lambda m: (m, m))(torchao_mlp()), torch.randn(4, 64),
                  batch, [torch.randn(5, 64)], "exact"))
b, tapped = block()
cases.append(("block_4bit", b, tapped, torch.randn(2, 8, 64), seq, [torch.randn(2, 11, 64)], "block"))

LINEARS = ("q", "k", "v", "o", "gate", "up", "down")
failures = 0
print(f"{'case':22s} {'cpu':12s} {'shape':10s} {'result':34s} {'kernels that ran (aarch64)':36s} time")
for name, eager_model, export_model, example, dyn, inputs, kind in cases:
    pte = os.path.join(out, f"{name}.pte")
    program = tke.export(export_model, (example,), pte, dynamic_shapes=dyn)
    for j, x in enumerate(inputs):
        xin = os.path.join(out, f"{name}.{j}.in.f32")
        x.contiguous().numpy().tofile(xin)
        with torch.no_grad():
            eager = eager_model(x)
        for cpu in cpus:
            yout = os.path.join(out, f"{name}.{j}.{cpu}.out.f32")
            t0 = time.time()
            cmd = ["timeout", str(timeout), "qemu-aarch64", "-cpu", cpu, runner, pte, yout, xin,
                   ",".join(map(str, x.shape))]
            r = subprocess.run(cmd, capture_output=True, text=True)
            dt = time.time() - t0
            shape = "x".join(map(str, x.shape))
            if r.returncode != 0:
                failures += 1
                print(f"{name:22s} {cpu:12s} {shape:10s} FAILED (exit {r.returncode})")
                print("   ", " ".join(cmd), "\n", r.stdout[-1500:], r.stderr[-3000:])
                continue
            stats = re.search(r"torchao_kernels stats: (.*)", r.stdout)
            kernels = ",".join(sorted(json.loads(stats.group(1)))) if stats else "?"

            def load(i, like):
                path = yout if i == 0 else f"{yout}.{i}"
                return torch.from_file(path, size=like.numel(), dtype=torch.float32).view(like.shape)

            if kind == "exact":
                ok = torch.equal(load(0, eager), eager)
                result = "bit-exact" if ok else f"MISMATCH max {(load(0, eager) - eager).abs().max():.3g}"
            else:  # every linear bit for bit on the inputs the runtime fed it; the block within 1e-2
                ok, worst = True, []
                for i, lname in enumerate(LINEARS):
                    lin = getattr(eager_model, lname).inner
                    t = x.shape[1]
                    x_et = load(1 + 2 * i, torch.empty(2, t, lin.in_features))
                    y_et = load(2 + 2 * i, torch.empty(2, t, lin.out_features))
                    with torch.no_grad():
                        if not torch.equal(y_et, lin(x_et)):
                            ok = False
                            worst.append(lname)
                diff = (load(0, eager) - eager).abs().max().item()
                ok = ok and diff < 1e-2
                result = (f"7 linears bit-exact, out {diff:.1g}" if ok else
                          f"MISMATCH linears {worst} out {diff:.3g}")
            failures += not ok
            print(f"{name:22s} {cpu:12s} {shape:10s} {result:34s} {kernels:36s} {dt:.1f}s")
print("ARM ExecuTorch:", "all passed" if not failures else f"{failures} FAILED")
sys.exit(1 if failures else 0)
EOF
echo "total: $(( $(date +%s) - start ))s"
