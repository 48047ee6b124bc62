// i8mm kernel for format n16k4 (compiled with -march=armv8.6-a+i8mm).
//
// USDOT (by element) multiplies the unsigned stored weights with the signed
// activations directly, so 8-bit weights need no sign fix-up and every bit
// width takes the same path: one instruction per 4 rows x 4 k.
#include <arm_neon.h>

#include <cstring>
#include <utility>

#include "kernels/aarch64/aarch64_kernels.h"
#include "kernels/format/layout_dispatch.h"
#include "kernels/format/plane_layout.h"

namespace torchao_kernels {

namespace {

struct Dot {
  static constexpr int kAccRegs = 4;
  static constexpr bool kSignedWeights = false;
  template <int L>
  static __attribute__((always_inline)) inline void dot(int32x4_t (&acc)[4], const uint8x16_t (&w)[4],
                                                        int8x16_t x) {
    for (int q = 0; q < 4; ++q) acc[q] = vusdotq_laneq_s32(acc[q], w[q], x, L);
  }
  static __attribute__((always_inline)) inline void finish(int32x4_t (&acc)[4], int32x4_t (&rows)[4]) {
    for (int q = 0; q < 4; ++q) rows[q] = acc[q];
  }
};

#include "kernels/aarch64/neon_gemm_impl.h"

}  // namespace

void qd8_f32_qbw_gemm_4x16c4__i8mm(const GemmArgs& a) { dispatch_layout<Tile<4, 1>>(a); }

}  // namespace torchao_kernels
