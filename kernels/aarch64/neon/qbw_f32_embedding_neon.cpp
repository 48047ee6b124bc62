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
//   - up to 4 bits, a value table per scale group (its 2^b floats the
//     reference's values, see Group) held as four byte planes: four TBL
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
      // float(u - 2^(BITS-1)) are constants; subtracting float(zero) from
      // them is exact (small integers), so the entries are the reference's
      // scale * float(u - off) with one conversion per group, not four.
      constexpr float o = static_cast<float>(1 << (BITS - 1));
      const float32x4_t fz = vdupq_n_f32(static_cast<float>(zero));
      uint8x16_t f[4];
      for (int i = 0; i < 4; ++i) {
        const float32x4_t fu = {4 * i - o, 4 * i + 1 - o, 4 * i + 2 - o, 4 * i + 3 - o};
        f[i] = vreinterpretq_u8_f32(vmulq_f32(scale, vsubq_f32(fu, fz)));
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

  // A group without zero points (its table's constants fold at compile time).
  __attribute__((always_inline)) static Group symmetric(float s) { return Group(s, 0); }

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

// One row's values, scale group by scale group.
template <int BITS, int KB, bool CONTIGUOUS, bool ZEROS, bool BF16>
__attribute__((always_inline)) inline void convert_row(const RowStrides& st, const EmbeddingRow& row,
                                                       const RowScales& rs, float* out) {
  const int unit_bytes = st.unit_bytes;
  const int64_t superblock_bytes = st.superblock_bytes;
  const int64_t group_skip = st.group_skip;
  ScaleGroups<ZEROS, BF16> groups(rs);
  auto group_at = [&] { return groups.template next_group<Group<BITS>>(); };
  const uint8_t* sb = row.superblock(0) + 4 * row.row_slot();
  const int gs = row.scale_group_size();
  uint8x16_t u[KB / 16];
  // From the end of one scale group's superblocks to the next group's.
  const int64_t skip = gs == st.group_size ? group_skip : 0;
  if (gs == KB) {
    // One superblock per scale group (group 32 or 16: the common case).
    for (int j = st.k / KB; j > 0; --j, out += KB, sb += superblock_bytes + skip) {
      const Group<BITS> cg = group_at();
      superblock_values<BITS, KB, CONTIGUOUS>(sb, unit_bytes, u);
      for (int h = 0; h < KB / 16; ++h) cg.store16(u[h], out + 16 * h);
    }
  } else if (gs % KB == 0) {
    // Scale groups of whole superblocks: every linear format, and tables
    // with groups of a multiple of KB values (one layout group).
    for (int j = st.k / gs; j > 0; --j, sb += skip) {
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
    for (int t = st.k / KB; t > 0; --t, out += KB, sb += superblock_bytes) {
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

// Rows a.rows[begin .. end) of one layout: CONTIGUOUS (nr = 1), ZEROS (zero
// points), BF16 (bfloat16 scales), EXT (a weights-only table: the caller's
// scales and zero points), all fixed at compile time.
template <int BITS, int KB, bool CONTIGUOUS, bool ZEROS, bool BF16, bool EXT>
__attribute__((noinline)) void lookup_rows(const EmbeddingArgs& a, int64_t begin, int64_t end) {
  const PackedLayout& l = *a.w;
  const int64_t ext_groups = EXT ? l.k / a.ext_group_size : 0;
  const RowStrides st = RowStrides::of<CONTIGUOUS>(l);
  for (int64_t i = begin; i < end; ++i) {
    const EmbeddingRow row = EmbeddingRow::of<CONTIGUOUS>(a, a.rows[i]);
    float* out = a.out + i * a.out_stride;
    if constexpr (EXT) {
      convert_row<BITS, KB, CONTIGUOUS, ZEROS, BF16>(st, row, RowScales::of_table_row(a, a.rows[i], ext_groups), out);
    } else {
      convert_row<BITS, KB, CONTIGUOUS, ZEROS, BF16>(st, row, row.scales(), out);
    }
  }
}

// A weights-only table with zero points: rows whose zero points are all 0
// (torchao's ops pass such for symmetric weights) build each group's table
// from constants and the scale, without the zero point's subtract and
// convert. Each run of rows of one kind goes to its own loop: one loop that
// inlined both conversions hoisted the constants of both and spilled in each
// (qemu counts, 64 lookups of 2- and 4-bit rows with zero points: 1.55 ->
// 1.87 instructions per value), and a call per row rebuilt them per row.
// Whether n int8 values are all 0: all_zero (embedding_rows.h) 16 bytes at a
// time, the last 16 overlapping.
inline bool all_zero_neon(const int8_t* p, int64_t n) {
  if (n < 16) return all_zero(p, n);
  const uint8_t* b = reinterpret_cast<const uint8_t*>(p);
  uint8x16_t v = vld1q_u8(b + n - 16);
  for (int64_t i = 0; i + 16 <= n; i += 16) v = vorrq_u8(v, vld1q_u8(b + i));
  return vmaxvq_u8(v) == 0;
}

template <int BITS, int KB, bool CONTIGUOUS>
void lookup_table_rows_with_zeros(const EmbeddingArgs& a) {
  const int64_t groups = a.w->k / a.ext_group_size;
  auto symmetric = [&](int64_t i) { return all_zero_neon(a.ext_zeros + a.rows[i] * groups, groups); };
  for (int64_t i = 0; i < a.count;) {
    const bool sym = symmetric(i);
    int64_t j = i + 1;
    while (j < a.count && symmetric(j) == sym) ++j;
    if (sym) {
      lookup_rows<BITS, KB, CONTIGUOUS, false, false, true>(a, i, j);
    } else {
      lookup_rows<BITS, KB, CONTIGUOUS, true, false, true>(a, i, j);
    }
    i = j;
  }
}

template <int BITS, int KB, bool CONTIGUOUS>
void lookup_scales(const EmbeddingArgs& a) {
  // A weights-only table's scales (float32) and zero points are the caller's.
  if (a.ext_scales) {
    if (a.ext_zeros) return lookup_table_rows_with_zeros<BITS, KB, CONTIGUOUS>(a);
    return lookup_rows<BITS, KB, CONTIGUOUS, false, false, true>(a, 0, a.count);
  }
  const bool zeros = a.w->has_zeros, bf16 = a.w->scales_bf16;
  if (zeros) {
    if (bf16) return lookup_rows<BITS, KB, CONTIGUOUS, true, true, false>(a, 0, a.count);
    return lookup_rows<BITS, KB, CONTIGUOUS, true, false, false>(a, 0, a.count);
  }
  if (bf16) return lookup_rows<BITS, KB, CONTIGUOUS, false, true, false>(a, 0, a.count);
  return lookup_rows<BITS, KB, CONTIGUOUS, false, false, false>(a, 0, a.count);
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
