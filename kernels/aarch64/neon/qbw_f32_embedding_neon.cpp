// Embedding lookups, NEON: qbwn1k4_f32_embedding_1x1__neon (n1k4 buffers and
// weights-only tables) and qbwn16k4_f32_embedding_1x16__neon (n16k4 buffers,
// e.g. a tied output head), one function for any nr.
//
// As the AVX2 rows: per superblock of KB = 32 (or 16) values and bit plane of
// p bits, the row's 4-value blocks j are gathered into 32-bit lanes (block j
// is in plane unit (j * p) / 8 at bit shift (j * p) % 8: 4 bytes at 4 * rr of
// that unit), shifted right by a per-lane count (USHL by a negative vector),
// masked and moved to the plane's place in the value. The bytes are then the
// stored values in k order; each 4 are widened, offset by 2^(bits-1) + zero
// point, converted and scaled: out = scale * float(w - zero).
#include <arm_neon.h>

#include <cstring>

#include "kernels/generated/kernel_functions.h"
#include "kernels/format/embedding_rows.h"
#include "kernels/format/plane_layout.h"

namespace torchao_kernels {

namespace {

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

struct Lookup {
  template <int BITS, int KB>
  static void run(const EmbeddingArgs& a) {
    constexpr plane_layout::Planes planes = plane_layout::planes_of(BITS, KB);
    constexpr int kBlocks = KB / 4;
    const PackedLayout& l = *a.w;
    const int64_t unit_bytes = int64_t{l.nr} * 4;
    for (int64_t i = 0; i < a.count; ++i) {
      const EmbeddingRow row(a, a.rows[i]);
      const int gs = row.scale_group_size();
      const int slot = 4 * row.row_slot();
      float* out = a.out + i * a.out_stride;
      for (int kk = 0; kk < l.k; kk += KB) {
        const uint8_t* sb = row.superblock(kk) + slot;
        uint32x4_t u[2] = {vdupq_n_u32(0), vdupq_n_u32(0)};
        for (int p = 0; p < planes.count; ++p) {
          const int pb = planes.bits[p];
          const uint8_t* plane = sb + planes.unit_offset[p] * unit_bytes;
          for (int h = 0; h < kBlocks / 4; ++h) {
            uint32_t lanes[4];
            int32_t shifts[4];
            for (int t = 0; t < 4; ++t) {
              const int j = 4 * h + t;
              lanes[t] = load_u32(plane + ((j * pb) / 8) * unit_bytes);
              shifts[t] = -((j * pb) % 8);
            }
            uint32x4_t v = vld1q_u32(lanes);
            if (pb != 8) {
              v = vshlq_u32(v, vld1q_s32(shifts));
              v = vandq_u32(v, vdupq_n_u32(0x01010101u * ((1u << pb) - 1u)));
              if (planes.shift[p]) v = vshlq_u32(v, vdupq_n_s32(planes.shift[p]));
            }
            u[h] = vorrq_u32(u[h], v);
          }
        }
        for (int h = 0; h < kBlocks / 4; ++h) {
          const int g = (kk + 16 * h) / gs;
          const float32x4_t scale = vdupq_n_f32(row.scale(g));
          const int32x4_t off = vdupq_n_s32((1 << (BITS - 1)) + row.zero(g));
          const uint8x16_t bytes = vreinterpretq_u8_u32(u[h]);
          const uint16x8_t lo = vmovl_u8(vget_low_u8(bytes)), hi = vmovl_u8(vget_high_u8(bytes));
          const uint16x4_t parts[4] = {vget_low_u16(lo), vget_high_u16(lo), vget_low_u16(hi),
                                       vget_high_u16(hi)};
          for (int t = 0; t < 4; ++t) {
            const int32x4_t w = vsubq_s32(vreinterpretq_s32_u32(vmovl_u16(parts[t])), off);
            vst1q_f32(out + kk + 16 * h + 4 * t, vmulq_f32(scale, vcvtq_f32_s32(w)));
          }
        }
      }
    }
  }
};

template <int BITS>
void dispatch_kb(const EmbeddingArgs& a) {
  if (a.w->kb == 32) {
    Lookup::run<BITS, 32>(a);
  } else {
    Lookup::run<BITS, 16>(a);
  }
}

}  // namespace

void qbw_f32_embedding_1xNR__neon(const EmbeddingArgs& a) {
  switch (a.w->bits) {
    case 1: return dispatch_kb<1>(a);
    case 2: return dispatch_kb<2>(a);
    case 3: return dispatch_kb<3>(a);
    case 4: return dispatch_kb<4>(a);
    case 5: return dispatch_kb<5>(a);
    case 6: return dispatch_kb<6>(a);
    case 7: return dispatch_kb<7>(a);
    case 8: return dispatch_kb<8>(a);
  }
}

}  // namespace torchao_kernels
