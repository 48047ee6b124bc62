#!/usr/bin/env bash
# Cross-compiles the whole extension (ATen op library, torchao_kernels._C)
# for aarch64 against the aarch64 torch 2.13.0 wheel, so ARM users can build
# from source. Running it needs an aarch64 Python; here the build is checked.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/quiet.sh
wheels=build/wheels
whl=$wheels/torch-2.13.0-cp311-cp311-manylinux_2_28_aarch64.whl
if [ ! -f "$whl" ]; then
  mkdir -p "$wheels"
  python -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_28_aarch64 \
    --python-version 3.11 torch==2.13.0 -d "$wheels"
fi
root=build/torch-aarch64
if [ ! -f "$root/torch/lib/libtorch_cpu.so" ]; then
  rm -rf "$root" && mkdir -p "$root"
  python -c "import zipfile, sys; z = zipfile.ZipFile(sys.argv[1]); \
[z.extract(n, sys.argv[2]) for n in z.namelist() if n.startswith(('torch/include/', 'torch/lib/'))]" "$whl" "$root"
fi
py_inc=$(python -c "import sysconfig; print(sysconfig.get_paths()['include'])")
quietly aten-aarch64-cmake cmake -Wno-dev -S . -B build/aarch64-aten -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_TOOLCHAIN_FILE=third_party/toolchain-aarch64-linux-gnu.cmake \
  -DTORCH_ROOT="$PWD/$root/torch" -DPython_EXECUTABLE="$(command -v python)" \
  -DPython_INCLUDE_DIR="$py_inc" -DPython_SOABI=cpython-311-aarch64-linux-gnu
# The compiler's output (GCC's -Wunused-but-set-variable on the static
# torch::Library pointers its lambdas use) stays in build/logs/aten-aarch64.log.
with_progress aten-aarch64 ninja -C build/aarch64-aten _C
so=$(ls build/aarch64-aten/_C*.so)
file "$so" | grep -q "ARM aarch64" || { echo "not an aarch64 binary: $so"; exit 1; }
echo "cross-built $so"
