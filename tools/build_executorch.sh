#!/usr/bin/env bash
# Builds the ExecuTorch kernel library (libtorchao_kernels_executorch.so) and
# the C++ .pte runner (tk_pte_runner) into build/executorch, against the
# executorch wheel installed in this Python, and copies the library into the
# torchao_kernels package folder, where torchao_kernels.executorch.load_kernels()
# finds it. Idempotent: a second run only rebuilds what changed.
#
#   bash tools/build_executorch.sh            # needs executorch==1.5.1, torch, cmake>=3.28, ninja
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python}
BUILD=build/executorch
JOBS=${JOBS:-2}

$PY - <<'EOF'
import importlib.util, sys
missing = [m for m in ("executorch", "torch") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"build_executorch.sh: missing Python packages: {missing} (pip install executorch==1.5.1)")
EOF
# The executorch wheel's CMake config defines its imported targets only with CMake >= 3.28.
CMAKE=$($PY -c "import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, 'cmake'))" 2>/dev/null || command -v cmake)
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
[ -f "$BUILD/CMakeCache.txt" ] && GEN=()   # keep the generator of an existing tree

"$CMAKE" -S ops/executorch -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DPython_EXECUTABLE="$(command -v "$PY")" >/dev/null
"$CMAKE" --build "$BUILD" -j "$JOBS"

PKG=$($PY -c "import importlib.util as u; print(list(u.find_spec('torchao_kernels').submodule_search_locations)[0])" 2>/dev/null || echo torchao_kernels)
"$CMAKE" -E copy_if_different "$BUILD/libtorchao_kernels_executorch.so" "$PKG/libtorchao_kernels_executorch.so"
echo "ExecuTorch kernel library: $PKG/libtorchao_kernels_executorch.so (runner: $BUILD/tk_pte_runner)"
