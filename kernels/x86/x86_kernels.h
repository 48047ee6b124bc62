// x86 micro-kernels. Each ISA lives in its own translation unit compiled with
// its own flags; nothing here may be called unless the registry's ISA check
// passed (selection guarantees it).
#pragma once

#include "kernels/format/kernel_args.h"

namespace torchao_kernels {

// AVX2 + FMA (kernels/x86/avx2)
void qd8_f32_qbw_gemv_1x32c4__avx2(const GemmArgs& a);
void qd8_f32_qbw_gemv_1x32c4_prefetch__avx2(const GemmArgs& a);
void qd8_f32_qbw_gemm_4x16c4__avx2(const GemmArgs& a);
void qd8_f32_qbw_gemm_4x16c4_shared__avx2(const GemmArgs& a);
void quantize_activations__avx2(const float* x, int64_t x_stride, int m_begin, int m_end,
                                QuantizedActivations& out);
// Embedding lookups in any layout (kernels/x86/avx2/qbw_f32_embedding_avx2.cpp).
void qbw_f32_embedding_1xNRc4__avx2(const EmbeddingArgs& a);

// AVX512F/BW/VL (kernels/x86/avx512): embedding lookups in any layout.
void qbw_f32_embedding_1xNRc4__avx512(const EmbeddingArgs& a);

// AVX-VNNI (kernels/x86/avxvnni)
void qd8_f32_qbw_gemv_1x32c4__avxvnni(const GemmArgs& a);
void qd8_f32_qbw_gemv_1x32c4_prefetch__avxvnni(const GemmArgs& a);
void qd8_f32_qbw_gemm_4x16c4__avxvnni(const GemmArgs& a);
void qd8_f32_qbw_gemm_4x16c4_shared__avxvnni(const GemmArgs& a);

// AVX512F/BW/VL + AVX512-VNNI (kernels/x86/avx512vnni)
// The AVX-VNNI loops in EVEX form (256-bit vpdpbusd).
void qd8_f32_qbw_gemv_1x32c4__avx512vnni(const GemmArgs& a);
void qd8_f32_qbw_gemv_1x32c4_prefetch__avx512vnni(const GemmArgs& a);
void qd8_f32_qbw_gemm_4x16c4__avx512vnni(const GemmArgs& a);
void qd8_f32_qbw_gemm_4x16c4_shared__avx512vnni(const GemmArgs& a);
// 512-bit tiles.
void qd8_f32_qbw_gemv_1x64c4__avx512vnni(const GemmArgs& a);
void qd8_f32_qbw_gemv_1x64c4_prefetch__avx512vnni(const GemmArgs& a);
void qd8_f32_qbw_gemm_4x32c4__avx512vnni(const GemmArgs& a);
void qd8_f32_qbw_gemm_8x32c4__avx512vnni(const GemmArgs& a);
void quantize_activations__avx512(const float* x, int64_t x_stride, int m_begin, int m_end,
                                  QuantizedActivations& out);
// quantize_activations__avx512 and pack_activation_panels (panel_kr = 4) in one pass.
void quantize_activation_panels__avx512(const float* x, int64_t x_stride, int m_begin, int m_end,
                                        QuantizedActivations& out);

// One core's int8 dot-product ceiling in GOPS (2 ops per multiply-accumulate)
// for the exact instruction sequence each kernel family uses, measured with
// every operand in registers (kernels/x86/<isa>/int8_peak_<isa>.cpp). The
// benchmark states its GEMM rows as a percentage of these.
double int8_peak_gops__avx2_pairsum();  // vpmaddubsw + vpaddw (int16 pair sums)
double int8_peak_gops__avx2_madd();     // vpmaddubsw + vpmaddwd + vpaddd
double int8_peak_gops__avxvnni();       // 256-bit vpdpbusd
double int8_peak_gops__avx512vnni();    // 512-bit vpdpbusd

}  // namespace torchao_kernels
