#!/usr/bin/env bash
# Builds the ExecuTorch kernel library (libtorchao_kernels_executorch.so) and
# the C++ .pte runner (tk_pte_runner) into build/executorch, against the
# executorch wheel installed in this Python, and copies the library into the
# torchao_kernels package folder this Python imports (an installed package, or
# this checkout's with an editable install), where
# torchao_kernels.executorch.load_kernels() finds it. Without an installed
# package the library stays in build/executorch, where load_kernels() also
# looks for a source checkout. Idempotent: a second run only rebuilds what changed.
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

# The package folder Python imports from outside this checkout: run from /
# with -I (isolated: neither the current directory nor PYTHONPATH on sys.path),
# so this checkout's torchao_kernels/ folder is found only when an editable
# install points Python at it. Nothing is imported (find_spec only).
PY_ABS=$(command -v "$PY")
PKG=$(cd / && "$PY_ABS" -I -c "
import importlib.util as u
s = u.find_spec('torchao_kernels')
print(list(s.submodule_search_locations)[0] if s and s.submodule_search_locations else '')
" 2>/dev/null || true)
if [ -n "$PKG" ] && [ -d "$PKG" ]; then
  "$CMAKE" -E copy_if_different "$BUILD/libtorchao_kernels_executorch.so" "$PKG/libtorchao_kernels_executorch.so"
  echo "ExecuTorch kernel library: $PKG/libtorchao_kernels_executorch.so (runner: $BUILD/tk_pte_runner)"
else
  echo "ExecuTorch kernel library: $PWD/$BUILD/libtorchao_kernels_executorch.so (runner: $BUILD/tk_pte_runner);"
  echo "  torchao_kernels is not installed in this Python: load_kernels() finds the library there"
  echo "  when importing torchao_kernels from this checkout (or set TORCHAO_KERNELS_EXECUTORCH_LIB)"
fi
