// AArch64 micro-kernels for format n16k4. Each ISA lives in its own
// translation unit with its own -march; nothing here may run unless the
// registry's ISA check passed.
#pragma once

#include "kernels/format/kernel_args.h"

namespace torchao_kernels {

// Plain NEON (armv8-a: Cortex-A53 / A72 class, no dot product instructions).
void qd8_f32_qbw_gemv_1x16c4__neon(const GemmArgs& a);
// Embedding lookups in any layout (kernels/aarch64/neon/qbw_f32_embedding_neon.cpp).
void qbw_f32_embedding_1xNRc4__neon(const EmbeddingArgs& a);
void quantize_activations__neon(const float* x, int64_t x_stride, int m_begin, int m_end,
                                QuantizedActivations& out);

// armv8.2-a dotprod (SDOT).
void qd8_f32_qbw_gemv_1x16c4__dotprod(const GemmArgs& a);
void qd8_f32_qbw_gemm_4x16c4__dotprod(const GemmArgs& a);

// armv8.6-a i8mm (USDOT: unsigned weights x signed activations).
void qd8_f32_qbw_gemm_4x16c4__i8mm(const GemmArgs& a);
// armv8.6-a i8mm (SMMLA: 2x8 by 8x2 int8 blocks; activations as 8-byte-chunk panels).
void qd8_f32_qbw_gemm_4x8c8__i8mm(const GemmArgs& a);
void qd8_f32_qbw_gemm_8x4c8__i8mm(const GemmArgs& a);

}  // namespace torchao_kernels
