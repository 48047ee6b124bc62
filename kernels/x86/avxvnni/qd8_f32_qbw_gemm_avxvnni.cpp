// AVX-VNNI kernels for format n16k4 (compiled with -mavx2 -mfma -mavxvnni):
// the AVX2 tiles with 256-bit vpdpbusd (u8 weights x s8 activations, no
// saturation), for client cores with VNNI but no AVX512 (Alder Lake, ...).
#include <immintrin.h>

#include <cstring>
#include <utility>

#include "kernels/format/layout_dispatch.h"
#include "kernels/format/plane_layout.h"
#include "kernels/generated/kernel_functions.h"
#include "kernels/x86/stream_ahead.h"

namespace torchao_kernels {

namespace {

#define TK_YMM_DPBUSD _mm256_dpbusd_avx_epi32
#include "kernels/x86/ymm_vnni_dot.h"
#include "kernels/x86/ymm_gemm_impl.h"

}  // namespace

void qd8_f32_qbwn16k4_gemv_1x32__avxvnni(const GemmArgs& a) { dispatch_layout<Gemv<2, GemvFetch::kHardware>>(a); }
void qd8_f32_qbwn16k4_gemv_1x32_prefetch__avxvnni(const GemmArgs& a) { dispatch_layout<Gemv<2, GemvFetch::kNextStep>>(a); }
void qd8_f32_qbwn16k4_gemv_1x32_stream__avxvnni(const GemmArgs& a) { dispatch_layout<Gemv<2, GemvFetch::kStream>>(a); }
void qd8_f32_qbwn16k4_gemm_4x16__avxvnni(const GemmArgs& a) { dispatch_layout<Tile<4, 2>>(a); }
void qd8_f32_qbwn16k4_gemm_4x16_stream__avxvnni(const GemmArgs& a) { dispatch_layout<Tile<4, 2, true>>(a); }
void qd8p4x4_f32_qbwn16k4_gemm_4x16_shared__avxvnni(const GemmArgs& a) { dispatch_layout<SharedTile<4, 2>>(a); }

}  // namespace torchao_kernels
