import os

# Kernel selection in the tests must not depend on a tuning table the user
# made on this machine (~/.cache/torchao_kernels/tuning): the static policy,
# unless a test chooses a table itself (test_tuning.py).
os.environ.setdefault("TORCHAO_KERNELS_TUNING", "0")
