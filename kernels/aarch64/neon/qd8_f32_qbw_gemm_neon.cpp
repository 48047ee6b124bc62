// Plain NEON kernels for format n16k4 (armv8-a baseline: Cortex-A53/A72 class).
//
// No dot-product instruction: each 4-row quarter of a unit is multiplied with
// the row's 4 activation bytes (duplicated to 8) by SMULL (s8 x s8 -> s16,
// at most 128 * 128, no overflow) and summed pairwise into int32 by SADALP;
// the two pair-sums of a row are folded by ADDP once per group. 8-bit weights
// are fed as u - 128 so they fit s8.
#include <arm_neon.h>

#include <cmath>
#include <cstring>
#include <utility>

#include "kernels/generated/kernel_functions.h"
#include "kernels/format/layout_dispatch.h"
#include "kernels/format/plane_layout.h"

namespace torchao_kernels {

namespace {

struct Dot {
  static constexpr int kAccRegs = 8;
  static constexpr bool kSignedWeights = true;
  template <int L>
  static __attribute__((always_inline)) inline void dot(int32x4_t (&acc)[8], const uint8x16_t (&w)[4],
                                                        int8x16_t x) {
    const int8x8_t x8 = vreinterpret_s8_s32(vdup_laneq_s32(vreinterpretq_s32_s8(x), L));
    for (int q = 0; q < 4; ++q) {
      const int8x16_t ws = vreinterpretq_s8_u8(w[q]);
      acc[2 * q] = vpadalq_s16(acc[2 * q], vmull_s8(vget_low_s8(ws), x8));
      acc[2 * q + 1] = vpadalq_s16(acc[2 * q + 1], vmull_s8(vget_high_s8(ws), x8));
    }
  }
  static __attribute__((always_inline)) inline void finish(int32x4_t (&acc)[8], int32x4_t (&rows)[4]) {
    for (int q = 0; q < 4; ++q) rows[q] = vpaddq_s32(acc[2 * q], acc[2 * q + 1]);
  }
};

#include "kernels/aarch64/neon_gemm_impl.h"

}  // namespace

void qd8_f32_qbwn16k4_gemv_1x16__neon(const GemmArgs& a) { dispatch_layout<Tile<1, 1>>(a); }

void quantize_activations__neon(const float* x, int64_t x_stride, int m_begin, int m_end,
                                QuantizedActivations& out) {
  // Same arithmetic as quantize_activations_scalar, 4 lanes at a time
  // (k is a multiple of 16). FCVTNS rounds to nearest-even like nearbyint.
  const int k = out.k;
  for (int r = m_begin; r < m_end; ++r) {
    const float* xr = x + r * x_stride;
    float32x4_t lo = vdupq_n_f32(0.0f), hi = vdupq_n_f32(0.0f), probe = vdupq_n_f32(0.0f);
    for (int i = 0; i < k; i += 4) {
      const float32x4_t v = vld1q_f32(xr + i);
      lo = vminq_f32(lo, v);
      hi = vmaxq_f32(hi, v);
      probe = vaddq_f32(probe, vmulq_n_f32(v, 0.0f));
    }
    float pr[4];
    vst1q_f32(pr, probe);
    const bool finite = !(std::isnan(pr[0]) || std::isnan(pr[1]) || std::isnan(pr[2]) || std::isnan(pr[3]));
    // vminq/vmaxq propagate NaN, but a NaN row is handled by `finite` anyway.
    const RowQuantParams p = row_quant_params(vminvq_f32(lo), vmaxvq_f32(hi), finite);
    int8_t* q = out.q + r * out.row_stride;
    int32_t* sums = out.group_sums + int64_t(r) * out.groups;
    const float32x4_t inv = vdupq_n_f32(p.inv_scale);
    const int32x4_t zero = vdupq_n_s32(p.zero);
    const int32x4_t qmin = vdupq_n_s32(-128), qmax = vdupq_n_s32(127);
    for (int g = 0; g < out.groups; ++g) {
      int32x4_t s = vdupq_n_s32(0);
      for (int i = g * out.group_size; i < (g + 1) * out.group_size; i += 8) {
        int32x4_t v0 = vdupq_n_s32(0), v1 = vdupq_n_s32(0);
        if (p.finite) {
          v0 = vaddq_s32(vcvtnq_s32_f32(vmulq_f32(vld1q_f32(xr + i), inv)), zero);
          v1 = vaddq_s32(vcvtnq_s32_f32(vmulq_f32(vld1q_f32(xr + i + 4), inv)), zero);
          v0 = vminq_s32(vmaxq_s32(v0, qmin), qmax);
          v1 = vminq_s32(vmaxq_s32(v1, qmin), qmax);
        }
        const int16x8_t v16 = vcombine_s16(vmovn_s32(v0), vmovn_s32(v1));
        vst1_s8(q + i, vmovn_s16(v16));
        s = vaddq_s32(s, vaddq_s32(v0, v1));
      }
      sums[g] = vaddvq_s32(s);
    }
    out.scale[r] = p.scale;
    out.zero[r] = p.zero;
  }
}

}  // namespace torchao_kernels
