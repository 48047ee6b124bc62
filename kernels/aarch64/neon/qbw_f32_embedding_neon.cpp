// Embedding lookups, NEON: qbwn1k4_f32_embedding_1x1__neon (n1k4 buffers and
// weights-only tables) and qbwn16k4_f32_embedding_1x16__neon (n16k4 buffers,
// e.g. a tied output head), one function for any nr.
//
// The x86 loop's design (kernels/x86/embedding_lookup_impl.h): one loop per
// layout (nr = 1 or interleaved) with the bit planes, zero points and scale
// storage fixed at compile time, the row's scales walked group by group.
// Per superblock of KB = 32 (or 16) values and bit plane of p bits, block j
// (4 values) is the 4 bytes of plane unit (j * p) / 8 at bit shift
// (j * p) % 8: the plane's units are loaded once (their exact bytes for
// nr = 1, one lane per unit otherwise), a TBL puts each block's unit in its
// 32-bit lane, and one USHL by a signed per-lane count and a mask put the
// plane's bits at their place in the value. The bytes are then the stored
// values u in k order, out = scale * float(u - 2^(b-1) - zero) as the
// reference computes it:
//   - up to 4 bits, a value table per scale group (its 2^b floats computed
//     with the reference's operations) held as four byte planes: four TBL
//     per 16 values, and ST4 writes the floats (a little-endian float is
//     its 4 bytes in order, so the interleaved planes are the floats);
//   - 5-8 bits, widen, subtract, convert and multiply.
// Unlike the x86 loop it prefetches nothing: its speed is counted in
// instructions under qemu, where a prefetch shows only as a cost; whether
// one pays belongs to a measurement on ARM hardware.
// Instructions counted under qemu, 64 lookups of a 49152x576 table, group
// 32 (tk_insn_count, tools/count_arm_insns.py): docs/embeddings.md.
#include <arm_neon.h>

#include <cstdint>
#include <cstring>

#include "kernels/format/embedding_rows.h"
#include "kernels/format/plane_layout.h"
#include "kernels/generated/kernel_functions.h"

// The lane layouts below (byte 0 of a 32-bit lane is its low byte) and the
// ST4 of float bytes take the little-endian AArch64 every supported OS runs.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the NEON lookups assume little-endian AArch64");

namespace torchao_kernels {

namespace {

// Units a plane of PB bits holds per superblock of KB values.
template <int PB, int KB>
constexpr int plane_units() {
  return ((KB / 4) * PB + 7) / 8;
}

// TBL pattern placing, in lane t, the 4 bytes of the unit of block 4h + t.
template <int PB, int H>
__attribute__((always_inline)) inline uint8x16_t lane_pattern() {
  uint8_t b[16] = {};
  for (int t = 0; t < 4; ++t)
    for (int i = 0; i < 4; ++i) b[4 * t + i] = static_cast<uint8_t>(4 * (((4 * H + t) * PB) / 8) + i);
  return vld1q_u8(b);
}

// Per-lane USHL counts of blocks 4h .. 4h + 3 (negative: right) that move
// each block's field from its bit shift in the unit to bit `to` of the byte.
template <int PB, int H, int TO>
__attribute__((always_inline)) inline int32x4_t lane_shifts() {
  int32_t s[4];
  for (int t = 0; t < 4; ++t) s[t] = TO - (((4 * H + t) * PB) % 8);
  return vld1q_s32(s);
}

// The units of one plane, in order, in up to two registers (8-bit planes
// of 32-value superblocks hold 8 units). nr = 1: the units are contiguous,
// read with exactly their bytes; otherwise one lane load per unit,
// unit_bytes apart.
template <int PB, int KB, bool CONTIGUOUS>
__attribute__((always_inline)) inline uint8x16x2_t plane_units_of(const uint8_t* p, int unit_bytes) {
  constexpr int units = plane_units<PB, KB>();
  uint8x16x2_t r = {{vdupq_n_u8(0), vdupq_n_u8(0)}};
  if constexpr (CONTIGUOUS) {
    if constexpr (units == 1) {
      uint32_t v;
      std::memcpy(&v, p, 4);
      r.val[0] = vreinterpretq_u8_u32(vdupq_n_u32(v));
    } else if constexpr (units == 2) {
      r.val[0] = vcombine_u8(vld1_u8(p), vdup_n_u8(0));
    } else if constexpr (units == 4) {
      r.val[0] = vld1q_u8(p);
    } else {
      r.val[0] = vld1q_u8(p);
      r.val[1] = vld1q_u8(p + 16);
    }
  } else {
    // memcpy, not a uint32_t pointer: a buffer (a tensor view) need not be
    // 4-byte aligned, and the bytes are uint8_t.
    auto unit = [&](int j) {
      uint32_t v;
      std::memcpy(&v, p + j * unit_bytes, 4);
      return v;
    };
    uint32x4_t a = vdupq_n_u32(0), b = vdupq_n_u32(0);
    a = vsetq_lane_u32(unit(0), a, 0);
    if constexpr (units >= 2) a = vsetq_lane_u32(unit(1), a, 1);
    if constexpr (units >= 4) {
      a = vsetq_lane_u32(unit(2), a, 2);
      a = vsetq_lane_u32(unit(3), a, 3);
    }
    if constexpr (units == 8) {
      b = vsetq_lane_u32(unit(4), b, 0);
      b = vsetq_lane_u32(unit(5), b, 1);
      b = vsetq_lane_u32(unit(6), b, 2);
      b = vsetq_lane_u32(unit(7), b, 3);
    }
    r.val[0] = vreinterpretq_u8_u32(a);
    r.val[1] = vreinterpretq_u8_u32(b);
  }
  return r;
}

// Blocks 4h .. 4h + 3 of plane P, its bits at their place in the value:
// one shift of the 32-bit lane and a mask per byte (the bits a lane shift
// carries in from the neighbouring byte fall outside the mask).
template <int BITS, int KB, int P, int H>
__attribute__((always_inline)) inline uint32x4_t plane_lanes(const uint8x16x2_t& units) {
  constexpr plane_layout::Planes planes = plane_layout::planes_of(BITS, KB);
  constexpr int pb = planes.bits[P];
  if constexpr (pb == 8) return vreinterpretq_u32_u8(units.val[H]);  // block j is unit j
  constexpr int to = planes.shift[P];
  uint32x4_t v = vreinterpretq_u32_u8(vqtbl1q_u8(units.val[0], lane_pattern<pb, H>()));
  v = vshlq_u32(v, lane_shifts<pb, H, to>());
  return vandq_u32(v, vdupq_n_u32(0x01010101u * (((1u << pb) - 1u) << to)));
}

// Plane P of a superblock or-ed into its values (v: 16 values per register;
// plane 0 sets them).
template <int BITS, int KB, int P, bool CONTIGUOUS>
__attribute__((always_inline)) inline void add_plane(const uint8_t* sb, int unit_bytes, uint32x4_t (&v)[KB / 16]) {
  constexpr plane_layout::Planes planes = plane_layout::planes_of(BITS, KB);
  if constexpr (P < planes.count) {
    const uint8x16x2_t u =
        plane_units_of<planes.bits[P], KB, CONTIGUOUS>(sb + planes.unit_offset[P] * unit_bytes, unit_bytes);
    for (int h = 0; h < KB / 16; ++h) {
      // (KB / 32: a second register exists only for 32-value superblocks)
      const uint32x4_t w = h == 0 ? plane_lanes<BITS, KB, P, 0>(u) : plane_lanes<BITS, KB, P, KB / 32>(u);
      v[h] = P == 0 ? w : vorrq_u32(v[h], w);  // the first plane starts the values
    }
  }
}

// The KB values of a superblock as bytes in k order, 16 per register.
template <int BITS, int KB, bool CONTIGUOUS>
__attribute__((always_inline)) inline void superblock_values(const uint8_t* sb, int unit_bytes,
                                                             uint8x16_t (&out)[KB / 16]) {
  uint32x4_t v[KB / 16];
  add_plane<BITS, KB, 0, CONTIGUOUS>(sb, unit_bytes, v);
  add_plane<BITS, KB, 1, CONTIGUOUS>(sb, unit_bytes, v);
  add_plane<BITS, KB, 2, CONTIGUOUS>(sb, unit_bytes, v);
  for (int h = 0; h < KB / 16; ++h) out[h] = vreinterpretq_u8_u32(v[h]);
}

// One scale group's conversion of 16 stored values to floats.
template <int BITS>
struct Group {
  float32x4_t scale;
  int32x4_t off;
  // BITS <= 4: the group's value table, entry u = scale * float(u - off),
  // as four byte planes: planes.val[b][u] = byte b of entry u. One TBL per
  // plane gives that byte of 16 values' floats, and ST4 interleaves the
  // four planes into the floats in memory.
  uint8x16x4_t planes{};  // (zero and unused for BITS > 4)

  __attribute__((always_inline)) Group(float s, int zero)
      : scale(vdupq_n_f32(s)), off(vdupq_n_s32((1 << (BITS - 1)) + zero)) {
    if constexpr (BITS <= 4) {
      const int32x4_t iota = {0, 1, 2, 3};
      uint8x16_t f[4];
      for (int i = 0; i < 4; ++i) {
        const int32x4_t u = vaddq_s32(iota, vdupq_n_s32(4 * i));
        f[i] = vreinterpretq_u8_f32(vmulq_f32(scale, vcvtq_f32_s32(vsubq_s32(u, off))));
      }
      // Bytes 0 and 2 of entries 0-7 and 8-15, then of all 16; bytes 1, 3 likewise.
      const uint8x16_t even_lo = vuzp1q_u8(f[0], f[1]), even_hi = vuzp1q_u8(f[2], f[3]);
      const uint8x16_t odd_lo = vuzp2q_u8(f[0], f[1]), odd_hi = vuzp2q_u8(f[2], f[3]);
      planes.val[0] = vuzp1q_u8(even_lo, even_hi);
      planes.val[2] = vuzp2q_u8(even_lo, even_hi);
      planes.val[1] = vuzp1q_u8(odd_lo, odd_hi);
      planes.val[3] = vuzp2q_u8(odd_lo, odd_hi);
    }
  }

  // bytes: 16 stored values in k order.
  __attribute__((always_inline)) void store16(uint8x16_t bytes, float* out) const {
    if constexpr (BITS <= 4) {
      uint8x16x4_t b;
      for (int i = 0; i < 4; ++i) b.val[i] = vqtbl1q_u8(planes.val[i], bytes);
      vst4q_u8(reinterpret_cast<uint8_t*>(out), b);
    } else {
      float32x4x4_t f;
      const uint16x8_t lo = vmovl_u8(vget_low_u8(bytes)), hi = vmovl_u8(vget_high_u8(bytes));
      const uint16x4_t parts[4] = {vget_low_u16(lo), vget_high_u16(lo), vget_low_u16(hi), vget_high_u16(hi)};
      for (int t = 0; t < 4; ++t) {
        const int32x4_t w = vsubq_s32(vreinterpretq_s32_u32(vmovl_u16(parts[t])), off);
        f.val[t] = vmulq_f32(scale, vcvtq_f32_s32(w));
      }
      vst1q_f32_x4(out, f);
    }
  }
};

// Rows a.rows[0 .. count) of one layout: CONTIGUOUS (nr = 1), ZEROS (zero
// points), BF16 (bfloat16 scales), all fixed at compile time.
template <int BITS, int KB, bool CONTIGUOUS, bool ZEROS, bool BF16>
void lookup_rows(const EmbeddingArgs& a) {
  const PackedLayout& l = *a.w;
  const int nr = CONTIGUOUS ? 1 : l.nr;
  const int unit_bytes = nr * 4;
  const int64_t superblock_bytes = l.superblock_bytes;
  // From the end of a group's last superblock to the next group's first.
  const int64_t group_skip = l.group_bytes - l.superblocks * superblock_bytes;
  for (int64_t i = 0; i < a.count; ++i) {
    const EmbeddingRow row = EmbeddingRow::of<CONTIGUOUS>(a, a.rows[i]);
    ScaleGroups<ZEROS, BF16> groups(row.scales());
    auto group_at = [&] {
      float scale;
      int zero;
      groups.next(scale, zero);
      return Group<BITS>(scale, zero);
    };
    const uint8_t* sb = row.superblock(0) + 4 * row.row_slot();
    float* out = a.out + i * a.out_stride;
    const int gs = row.scale_group_size();
    uint8x16_t u[KB / 16];
    // From the end of one scale group's superblocks to the next group's.
    const int64_t skip = gs == l.group_size ? group_skip : 0;
    if (gs == KB) {
      // One superblock per scale group (group 32 or 16: the common case).
      for (int j = l.k / KB; j > 0; --j, out += KB, sb += superblock_bytes + skip) {
        const Group<BITS> cg = group_at();
        superblock_values<BITS, KB, CONTIGUOUS>(sb, unit_bytes, u);
        for (int h = 0; h < KB / 16; ++h) cg.store16(u[h], out + 16 * h);
      }
    } else if (gs % KB == 0) {
      // Scale groups of whole superblocks: every linear format, and tables
      // with groups of a multiple of KB values (one layout group).
      for (int j = l.k / gs; j > 0; --j, sb += skip) {
        const Group<BITS> cg = group_at();
        for (int s = gs / KB; s > 0; --s, out += KB, sb += superblock_bytes) {
          superblock_values<BITS, KB, CONTIGUOUS>(sb, unit_bytes, u);
          for (int h = 0; h < KB / 16; ++h) cg.store16(u[h], out + 16 * h);
        }
      }
    } else {
      // A table's scale groups of 16 * odd values in 32-value superblocks
      // (one layout group, nr = 1): the group is counted down 16 values at a
      // time.
      Group<BITS> cg = group_at();
      int left = gs;
      for (int t = l.k / KB; t > 0; --t, out += KB, sb += superblock_bytes) {
        superblock_values<BITS, KB, CONTIGUOUS>(sb, unit_bytes, u);
        for (int h = 0; h < KB / 16; ++h) {
          if (left == 0) {
            cg = group_at();
            left = gs;
          }
          left -= 16;
          cg.store16(u[h], out + 16 * h);
        }
      }
    }
  }
}

template <int BITS, int KB, bool CONTIGUOUS>
void lookup_scales(const EmbeddingArgs& a) {
  // A weights-only table's scales (float32) and zero points are the caller's.
  const bool zeros = a.ext_scales ? a.ext_zeros != nullptr : a.w->has_zeros;
  const bool bf16 = !a.ext_scales && a.w->scales_bf16;
  if (zeros) {
    if (bf16) return lookup_rows<BITS, KB, CONTIGUOUS, true, true>(a);
    return lookup_rows<BITS, KB, CONTIGUOUS, true, false>(a);
  }
  if (bf16) return lookup_rows<BITS, KB, CONTIGUOUS, false, true>(a);
  return lookup_rows<BITS, KB, CONTIGUOUS, false, false>(a);
}

template <int BITS, int KB>
void lookup_layout(const EmbeddingArgs& a) {
  if (a.w->nr == 1) {
    lookup_scales<BITS, KB, true>(a);
  } else {
    lookup_scales<BITS, KB, false>(a);
  }
}

template <int BITS>
void lookup_kb(const EmbeddingArgs& a) {
  if (a.w->kb == 32) {
    lookup_layout<BITS, 32>(a);
  } else {
    lookup_layout<BITS, 16>(a);
  }
}

}  // namespace

void qbw_f32_embedding_1xNR__neon(const EmbeddingArgs& a) {
  switch (a.w->bits) {
    case 1: return lookup_kb<1>(a);
    case 2: return lookup_kb<2>(a);
    case 3: return lookup_kb<3>(a);
    case 4: return lookup_kb<4>(a);
    case 5: return lookup_kb<5>(a);
    case 6: return lookup_kb<6>(a);
    case 7: return lookup_kb<7>(a);
    case 8: return lookup_kb<8>(a);
  }
}

}  // namespace torchao_kernels
