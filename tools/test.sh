#!/usr/bin/env bash
# Runs the whole test suite (installing and building first, so it works on a
# fresh machine). The op tests run twice: with the CPU's best
# kernels, and capped at AVX2 so the AVX2 kernels are exercised on AVX512
# machines too.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/quiet.sh
bash tools/install.sh
# Selection under test is the static policy unless a test sets a tuning table
# itself: a table tuned on this machine (~/.cache/torchao_kernels/tuning)
# must not change which kernels the tests see.
export TORCHAO_KERNELS_TUNING=0
step "pytest: the whole suite"
python -m pytest -q test "$@"
step "pytest: the op tests again with the ISA capped at AVX2"
TORCHAO_KERNELS_MAX_ISA=avx2 python -m pytest -q test/test_ops.py "$@"
# ExecuTorch on aarch64 under qemu: cross build + .pte runs, ~45 s from scratch
# (~12 s when built), each qemu run under a timeout.
step "ExecuTorch on aarch64 under qemu"
bash tools/test_executorch_arm.sh
# The torch-free layer on aarch64 under qemu (five CPU models), the uarch policy
# with a fake /proc/cpuinfo, and the aarch64 cross-build of the ATen extension.
step "the torch-free layer on aarch64 under qemu"
bash tools/test_arm.sh
step "all tests passed"
