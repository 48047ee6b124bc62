// x86 micro-kernels. Each ISA lives in its own translation unit compiled with
// its own flags; nothing here may be called unless the registry's ISA check
// passed (selection guarantees it).
#pragma once

#include "kernels/format/kernel_args.h"

namespace torchao_kernels {

// AVX2 + FMA (kernels/x86/avx2)
void qd8_f32_qbw_gemv_1x32c4__avx2(const GemmArgs& a);
void qd8_f32_qbw_gemm_4x16c4__avx2(const GemmArgs& a);
void quantize_activations__avx2(const float* x, int64_t x_stride, int m_begin, int m_end,
                                QuantizedActivations& out);
// Embedding lookups in any layout (kernels/x86/avx2/qbw_f32_embedding_avx2.cpp).
void qbw_f32_embedding_1xNRc4__avx2(const EmbeddingArgs& a);

// AVX512F/BW/VL (kernels/x86/avx512): embedding lookups in any layout.
void qbw_f32_embedding_1xNRc4__avx512(const EmbeddingArgs& a);

// AVX-VNNI (kernels/x86/avxvnni)
void qd8_f32_qbw_gemv_1x32c4__avxvnni(const GemmArgs& a);
void qd8_f32_qbw_gemm_4x16c4__avxvnni(const GemmArgs& a);

// AVX512F/BW/VL + AVX512-VNNI (kernels/x86/avx512vnni)
void qd8_f32_qbw_gemv_1x64c4__avx512vnni(const GemmArgs& a);
void qd8_f32_qbw_gemm_4x32c4__avx512vnni(const GemmArgs& a);
void qd8_f32_qbw_gemm_8x32c4__avx512vnni(const GemmArgs& a);
void quantize_activations__avx512(const float* x, int64_t x_stride, int m_begin, int m_end,
                                  QuantizedActivations& out);
// quantize_activations__avx512 and pack_activation_panels (panel_kr = 4) in one pass.
void quantize_activation_panels__avx512(const float* x, int64_t x_stride, int m_begin, int m_end,
                                        QuantizedActivations& out);

}  // namespace torchao_kernels
