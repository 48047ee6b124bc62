#!/usr/bin/env bash
# ARM without ARM hardware: cross-compiles the torch-free layer (kernels,
# selection, gtest suite) for aarch64 and runs it under qemu-aarch64 on five
# CPU models: NEON only (cortex-a53, cortex-a72), dotprod (cortex-a76,
# neoverse-n1), and dotprod + i8mm (max). On each, selection must pick only
# kernels the model supports (checked against the auxv hwcaps), every kernel
# the model can run must be bit-exact against the reference, and kernels it
# cannot run must trap (SIGILL) when called directly while forcing them is
# refused. Then the uarch-dependent policy end to end with a fake
# /proc/cpuinfo, and the cross-build of the ATen op library against the
# aarch64 torch wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/quiet.sh

need=()
command -v aarch64-linux-gnu-g++ >/dev/null || need+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
[ -d /usr/src/googletest ] || need+=(googletest)
[ -e /usr/lib/aarch64-linux-gnu/libstdc++.so.6 ] || need+=(libc6:arm64 libstdc++6:arm64)
if [ ${#need[@]} -gt 0 ]; then
  step "apt: installing ${need[*]} (cross compiler, qemu, gtest)"
  dpkg --print-foreign-architectures | grep -q arm64 || dpkg --add-architecture arm64
  quietly apt-update apt-get update
  DEBIAN_FRONTEND=noninteractive quietly apt-install-arm apt-get install -y "${need[@]}"
fi

# CMake's and the compiler's own output (googletest's CMake deprecation
# notes, warnings of the cross compiler) go to build/logs/, shown on failure.
quietly arm-cmake cmake -Wno-dev -S . -B build/aarch64 -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_TOOLCHAIN_FILE=third_party/toolchain-aarch64-linux-gnu.cmake \
  -DTORCHAO_KERNELS_BUILD_ATEN=OFF -DTORCHAO_KERNELS_BUILD_TESTS=ON
with_progress arm-build ninja -C build/aarch64 tk_kernel_tests
bin=build/aarch64/kernels/tests/tk_kernel_tests

# gtest_summary NAME CMD...: runs a gtest binary with its output in
# build/logs/NAME.log (a line per test skipped for an ISA the model lacks,
# gtest's fork() notes) and prints its totals; on failure, the end of the log.
gtest_summary() {
  local name=$1
  shift
  if quietly "$name" "$@"; then
    local log="$TK_LOG_DIR/$name.log"
    local passed skipped
    passed=$(grep -E '^\[  PASSED  \]' "$log" | sed -E 's/^\[  PASSED  \] //; s/\.$//')
    skipped=$(grep -E '^\[  SKIPPED \]' "$log" | sed -E 's/^\[  SKIPPED \] //; s/ tests?\.$//' || echo 0)
    echo "  $name: $passed passed, $skipped skipped"
  else
    return 1
  fi
}

step "gtest suite under qemu-aarch64 (output: $TK_LOG_DIR/qemu-*.log)"
# qemu-user runs the binary against the arm64 multiarch libc (never
# -L /usr/aarch64-linux-gnu: fork() deadlocks there under qemu 7.2).
for cpu in cortex-a53 cortex-a72 cortex-a76 neoverse-n1 max; do
  gtest_summary "qemu-$cpu" timeout 900 qemu-aarch64 -cpu "$cpu" "$bin" --gtest_brief=1
done

gtest_summary qemu-fake-cpuinfo-a76-a55 unshare -m sh -c \
  "mount --bind kernels/tests/data/cpuinfo_a76_a55.txt /proc/cpuinfo && \
  TAK_EXPECT_UARCH=cortex-a76,cortex-a55 exec timeout 300 qemu-aarch64 -cpu cortex-a76 $bin \
  --gtest_filter='DetectedUarch*:FakeCpuPolicy*' --gtest_brief=1"

if [ "${TORCHAO_KERNELS_SKIP_ATEN_CROSS:-0}" != 1 ]; then
  bash tools/build_aten_aarch64.sh
fi
echo "ARM tests passed"
