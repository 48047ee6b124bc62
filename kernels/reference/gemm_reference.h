#pragma once
#include "kernels/format/kernel_args.h"

namespace torchao_kernels {
// Portable scalar kernel for every format (any nr): the ground truth of the
// semantics, and the fallback on any CPU.
void qd8_f32_qbw_gemm_1xNRc4__scalar(const GemmArgs& a);
}  // namespace torchao_kernels
