// Dotprod kernels for format n16k4 (compiled with -march=armv8.2-a+dotprod).
//
// One 16-byte quarter of a unit is 4 rows x 4 k: exactly the shape of SDOT
// (by element): lane r accumulates row r's 4-way dot product with one 4-byte
// activation chunk selected by lane index from a 16-byte register, so one
// activation load serves 4 k-steps. Weights up to 7 bits are < 128 and used
// as s8 directly; 8-bit weights are fed as u - 128 (one EOR).
#include <arm_neon.h>

#include <cstring>
#include <utility>

#include "kernels/generated/kernel_functions.h"
#include "kernels/format/layout_dispatch.h"
#include "kernels/format/plane_layout.h"

namespace torchao_kernels {

namespace {

struct Dot {
  static constexpr int kAccRegs = 4;
  static constexpr bool kSignedWeights = true;
  template <int L>
  static __attribute__((always_inline)) inline void dot(int32x4_t (&acc)[4], const uint8x16_t (&w)[4],
                                                        int8x16_t x) {
    for (int q = 0; q < 4; ++q) acc[q] = vdotq_laneq_s32(acc[q], vreinterpretq_s8_u8(w[q]), x, L);
  }
  static __attribute__((always_inline)) inline void finish(int32x4_t (&acc)[4], int32x4_t (&rows)[4]) {
    for (int q = 0; q < 4; ++q) rows[q] = acc[q];
  }
};

#include "kernels/aarch64/neon_gemm_impl.h"

}  // namespace

void qd8_f32_qbwn16k4_gemv_1x16__dotprod(const GemmArgs& a) { dispatch_layout<Tile<1, 1>>(a); }
void qd8_f32_qbwn16k4_gemm_4x16__dotprod(const GemmArgs& a) { dispatch_layout<Tile<4, 1>>(a); }

}  // namespace torchao_kernels
