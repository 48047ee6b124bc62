// The AVX-VNNI kernels (kernels/x86/ymm_gemm_impl.h with 256-bit vpdpbusd) in
// their EVEX encoding, compiled with -mavx512vl -mavx512vnni: AVX512-VNNI
// CPUs without AVX-VNNI (Zen 4, Ice Lake, Cascade Lake) run the same 256-bit
// loops, so those loops can be measured, and selected, on every VNNI CPU.
// EVEX also gives the compiler ymm16-31, which the VEX form lacks.
#include <immintrin.h>

#include <cstring>
#include <utility>

#include "kernels/format/layout_dispatch.h"
#include "kernels/format/plane_layout.h"
#include "kernels/generated/kernel_functions.h"
#include "kernels/x86/stream_ahead.h"

namespace torchao_kernels {

namespace {

#define TK_YMM_DPBUSD _mm256_dpbusd_epi32
#include "kernels/x86/ymm_vnni_dot.h"
#include "kernels/x86/ymm_gemm_impl.h"

}  // namespace

void qd8_f32_qbwn16k4_gemv_1x32__avx512vnni(const GemmArgs& a) { dispatch_layout<Gemv<2, GemvFetch::kHardware>>(a); }
void qd8_f32_qbwn16k4_gemv_1x32_prefetch__avx512vnni(const GemmArgs& a) { dispatch_layout<Gemv<2, GemvFetch::kNextStep>>(a); }
void qd8_f32_qbwn16k4_gemv_1x32_stream__avx512vnni(const GemmArgs& a) { dispatch_layout<Gemv<2, GemvFetch::kStream>>(a); }
void qd8_f32_qbwn16k4_gemm_4x16__avx512vnni(const GemmArgs& a) { dispatch_layout<Tile<4, 2>>(a); }
void qd8_f32_qbwn16k4_gemm_4x16_stream__avx512vnni(const GemmArgs& a) { dispatch_layout<Tile<4, 2, true>>(a); }
void qd8p4x4_f32_qbwn16k4_gemm_4x16_shared__avx512vnni(const GemmArgs& a) { dispatch_layout<SharedTile<4, 2>>(a); }

}  // namespace torchao_kernels
