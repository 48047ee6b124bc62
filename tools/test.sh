#!/usr/bin/env bash
# Runs the whole test suite (installing and building first, so it works on a
# fresh machine). The op tests run twice: with the CPU's best
# kernels, and capped at AVX2 so the AVX2 kernels are exercised on AVX512
# machines too.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install.sh
python -m pytest -q test "$@"
TORCHAO_KERNELS_MAX_ISA=avx2 python -m pytest -q test/test_ops.py "$@"
# ExecuTorch on aarch64 under qemu (cross build + .pte runs; about a minute once the
# apt packages and the aarch64 executorch wheel are cached, bounded by timeouts).
bash tools/test_executorch_arm.sh
