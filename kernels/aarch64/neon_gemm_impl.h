// 128-bit kernels for format n16k4, shared by the NEON, dotprod and i8mm
// translation units. Include it inside an anonymous namespace of a TU
// compiled with the right -march, after defining `struct Dot` with:
//   static constexpr int kAccRegs;          // int32x4 accumulators per 16 rows
//   static constexpr bool kSignedWeights;   // weights fed as u - 128 (s8) when 8-bit
//   template <int J4> static void dot(int32x4_t (&acc)[kAccRegs],
//       const uint8x16_t (&w)[4], int8x16_t x16);   // x16: 4 chunks, use chunk J4
//   static void finish(int32x4_t (&acc)[kAccRegs], int32x4_t (&rows)[4]);
// A 64-byte unit of the format is 16 rows x 4 k: four q-registers of 4 rows.
// The integer part is exact and the float epilogue repeats the reference's
// fma sequence (kernels/format/kernel_args.h), so results are bit-identical.

// The 16 float32 scales at p, rows 4q .. 4q+3 in sc[q].
__attribute__((always_inline)) inline void load_scales(const uint8_t* p, float32x4_t (&sc)[4]) {
  for (int q = 0; q < 4; ++q) sc[q] = vld1q_f32(reinterpret_cast<const float*>(p) + 4 * q);
}

// Bits of plane I of block J, shifted into place (all shifts compile-time).
template <int BITS, int KB, int J, int I>
__attribute__((always_inline)) inline uint8x16_t plane_part(const uint8_t* sb, int q) {
  constexpr plane_layout::Planes P = plane_layout::planes_of(BITS, KB);
  constexpr int p = P.bits[I];
  constexpr int unit = P.unit_offset[I] + (J * p) / 8;
  constexpr int shift = (J * p) % 8;
  uint8x16_t u = vld1q_u8(sb + unit * 64 + 16 * q);
  if constexpr (shift != 0) u = vshrq_n_u8(u, shift);
  if constexpr (shift + p < 8) u = vandq_u8(u, vdupq_n_u8(static_cast<uint8_t>((1 << p) - 1)));
  if constexpr (P.shift[I] != 0) u = vshlq_n_u8(u, P.shift[I]);
  return u;
}

template <int BITS, int KB, int J>
__attribute__((always_inline)) inline uint8x16_t unpack_q(const uint8_t* sb, int q) {
  constexpr plane_layout::Planes P = plane_layout::planes_of(BITS, KB);
  if constexpr (BITS == 8) {
    return vld1q_u8(sb + J * 64 + 16 * q);
  } else {
    uint8x16_t v = plane_part<BITS, KB, J, 0>(sb, q);
    if constexpr (P.count > 1) v = vorrq_u8(v, plane_part<BITS, KB, J, 1>(sb, q));
    if constexpr (P.count > 2) v = vorrq_u8(v, plane_part<BITS, KB, J, 2>(sb, q));
    return v;
  }
}

template <int BITS, int KB, int MR, int NB, int J>
__attribute__((always_inline)) inline void dot_block(const uint8_t* const* sb, const int8_t* const* xr,
                                                     int32x4_t (&acc)[MR][NB][Dot::kAccRegs]) {
  // Activations are loaded as 16-byte (4-chunk) registers just before use, so
  // at most MR of them are live next to the accumulators.
  int8x16_t x[MR];
  for (int r = 0; r < MR; ++r) x[r] = vld1q_s8(xr[r] + 16 * (J / 4));
  for (int b = 0; b < NB; ++b) {
    uint8x16_t w[4];
    for (int q = 0; q < 4; ++q) {
      w[q] = unpack_q<BITS, KB, J>(sb[b], q);
      if constexpr (BITS == 8 && Dot::kSignedWeights) w[q] = veorq_u8(w[q], vdupq_n_u8(0x80));
    }
    for (int r = 0; r < MR; ++r) Dot::template dot<J % 4>(acc[r][b], w, x[r]);
  }
}

template <int BITS, int KB, int MR, int NB, int... Js>
__attribute__((always_inline)) inline void dot_superblock(const uint8_t* const* sb, const int8_t* const* xr,
                                                          int32x4_t (&acc)[MR][NB][Dot::kAccRegs],
                                                          std::integer_sequence<int, Js...>) {
  (dot_block<BITS, KB, MR, NB, Js>(sb, xr, acc), ...);
}

// MR rows x NB blocks (16 columns each), rows m0.., blocks from `block`.
// BF16: bfloat16 scale storage (scales and zero points in per-block arrays).
template <int BITS, int KB, int MR, int NB, bool ZEROS, bool BF16>
void tile_scales(const GemmArgs& a, int m0, int block) {
  const PackedLayout& l = *a.w;
  const QuantizedActivations& xq = *a.x;
  // 8-bit weights fed as signed (u - 128) need no offset term.
  constexpr int32_t kOffset = (BITS == 8 && Dot::kSignedWeights) ? 0 : (1 << (BITS - 1));
  const uint8_t* blk[NB];
  for (int b = 0; b < NB; ++b) blk[b] = a.body + int64_t(block + b) * l.block_bytes;
  // Float accumulators: a single-row, single-block tile keeps its four in
  // registers; larger tiles keep them in L1 (touched once per group), leaving
  // the registers to the integer accumulators.
  constexpr bool kRegs = MR == 1 && NB == 1;
  float32x4_t freg[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
  float fbuf[kRegs ? 1 : MR][kRegs ? 1 : NB][16];
  if constexpr (!kRegs) {
    for (int r = 0; r < MR; ++r)
      for (int b = 0; b < NB; ++b)
        for (int c = 0; c < 16; ++c) fbuf[r][b][c] = 0.0f;
  }

  // Pointers advance group by group (no per-group address arithmetic); with
  // bfloat16 storage, the scale and zero-point arrays' too.
  const uint8_t* gp0[NB];
  const uint8_t* sp0[NB];
  const uint8_t* zp0[NB];
  for (int b = 0; b < NB; ++b) {
    gp0[b] = blk[b];
    sp0[b] = l.scales_of(blk[b], 0);
    zp0[b] = l.zeros_of(blk[b], 0);
  }
  const int8_t* xg[MR];
  const int32_t* xsum[MR];
  for (int r = 0; r < MR; ++r) {
    xg[r] = xq.q + int64_t(m0 + r) * xq.row_stride;
    xsum[r] = xq.group_sums + int64_t(m0 + r) * xq.groups;
  }
  for (int g = 0; g < l.groups; ++g) {
    int32x4_t acc[MR][NB][Dot::kAccRegs];
    for (int r = 0; r < MR; ++r)
      for (int b = 0; b < NB; ++b)
        for (int i = 0; i < Dot::kAccRegs; ++i) acc[r][b][i] = vdupq_n_s32(0);
    {
      const int8_t* xr[MR];
      const uint8_t* sbs[NB];
      for (int r = 0; r < MR; ++r) xr[r] = xg[r];
      for (int b = 0; b < NB; ++b) sbs[b] = gp0[b];
      // Single-row tiles run straight-line code when group_size == kb (0.219
      // instructions/MAC against 0.232 with the loop, when measured; 0.211
      // since the scales load once per group and block); multi-row tiles keep
      // the loop, which their register allocation handles better (0.159 vs 0.178).
      if (MR == 1 && l.superblocks == 1) {
        dot_superblock<BITS, KB, MR, NB>(sbs, xr, acc, std::make_integer_sequence<int, KB / 4>{});
      } else {
        for (int s = 0; s < l.superblocks; ++s) {
          dot_superblock<BITS, KB, MR, NB>(sbs, xr, acc, std::make_integer_sequence<int, KB / 4>{});
          for (int r = 0; r < MR; ++r) xr[r] += KB;
          for (int b = 0; b < NB; ++b) sbs[b] += l.superblock_bytes;
        }
      }
    }
    for (int b = 0; b < NB; ++b) {
      const uint8_t* gp = gp0[b];
      // float32 scales are loaded once per group and block. bfloat16 ones are
      // widened where used in a single-row tile, and into a float32 copy on
      // the stack in a multi-row one: the compiler reloads (rather than
      // spills) values that come from memory while the rows' accumulators
      // hold the registers.
      constexpr bool kWidenInPlace = BF16 && MR == 1;
      alignas(16) float widened[16];
      if constexpr (BF16 && !kWidenInPlace) {
        const uint16x8_t lo = vld1q_u16(reinterpret_cast<const uint16_t*>(sp0[b]));
        const uint16x8_t hi = vld1q_u16(reinterpret_cast<const uint16_t*>(sp0[b]) + 8);
        vst1q_f32(widened, vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(lo), 16)));
        vst1q_f32(widened + 4, vreinterpretq_f32_u32(vshll_high_n_u16(lo, 16)));
        vst1q_f32(widened + 8, vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(hi), 16)));
        vst1q_f32(widened + 12, vreinterpretq_f32_u32(vshll_high_n_u16(hi, 16)));
      }
      const uint8_t* sp = !BF16          ? gp + l.scales_offset
                          : kWidenInPlace ? sp0[b]
                                          : reinterpret_cast<const uint8_t*>(widened);
      float32x4_t sc[4];
      if constexpr (!kWidenInPlace) load_scales(sp, sc);
      int32x4_t zq[4];
      const int8_t* zp = reinterpret_cast<const int8_t*>(BF16 ? zp0[b] : gp + l.zeros_offset);
      for (int q = 0; q < 4; ++q) {
        if constexpr (ZEROS) {
          const int8x8_t z8 = vld1_s8(zp + 4 * q);
          zq[q] = vaddq_s32(vmovl_s16(vget_low_s16(vmovl_s8(z8))), vdupq_n_s32(kOffset));
        } else {
          zq[q] = vdupq_n_s32(kOffset);
        }
      }
      for (int r = 0; r < MR; ++r) {
        int32x4_t rows[4];
        Dot::finish(acc[r][b], rows);
        const int32_t sx = xsum[r][g];
        for (int q = 0; q < 4; ++q) {
          // I_g = dot - (zero + offset) * sum(x), exact int32 (wrapping).
          const int32x4_t ig = vmlsq_s32(rows[q], zq[q], vdupq_n_s32(sx));
          const float32x4_t s =
              kWidenInPlace
                  ? vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(reinterpret_cast<const uint16_t*>(sp) + 4 * q), 16))
                  : sc[q];
          if constexpr (kRegs) {
            freg[q] = vfmaq_f32(freg[q], vcvtq_f32_s32(ig), s);
          } else {
            float* f = &fbuf[r][b][4 * q];
            vst1q_f32(f, vfmaq_f32(vld1q_f32(f), vcvtq_f32_s32(ig), s));
          }
        }
      }
    }
    for (int b = 0; b < NB; ++b) gp0[b] += l.group_bytes;
    if constexpr (BF16) {
      for (int b = 0; b < NB; ++b) sp0[b] += 2 * l.nr;
      if constexpr (ZEROS)
        for (int b = 0; b < NB; ++b) zp0[b] += 4 * ((l.nr + 3) / 4);
    }
    for (int r = 0; r < MR; ++r) xg[r] += l.group_size;
  }
  for (int b = 0; b < NB; ++b) {
    const int col = (block + b) * 16;
    if (col >= l.n) break;
    const int cols = l.n - col < 16 ? l.n - col : 16;
    for (int r = 0; r < MR; ++r) {
      const int m = m0 + r;
      const float32x4_t nz = vdupq_n_f32(static_cast<float>(-xq.zero[m]));
      const float32x4_t sx = vdupq_n_f32(xq.scale[m]);
      float y[16];
      for (int q = 0; q < 4; ++q) {
        const float32x4_t rs = vld1q_f32(reinterpret_cast<const float*>(blk[b] + l.row_sums_offset) + 4 * q);
        const float32x4_t bias =
            l.has_bias ? vld1q_f32(reinterpret_cast<const float*>(blk[b] + l.bias_offset) + 4 * q)
                       : vdupq_n_f32(0.0f);
        // vfmaq_f32(c, a, b) = c + a * b, fused: the reference's fma(a, b, c).
        float32x4_t acc_f;
        if constexpr (kRegs) {
          acc_f = freg[q];
        } else {
          acc_f = vld1q_f32(&fbuf[r][b][4 * q]);
        }
        const float32x4_t t = vfmaq_f32(acc_f, nz, rs);
        vst1q_f32(y + 4 * q, vfmaq_f32(bias, t, sx));
      }
      float* dst = a.out + int64_t(m) * a.out_stride + col;
      for (int c = 0; c < cols; ++c) dst[c] = y[c];
    }
  }
}

// The scale storage chosen once per tile, not per group.
template <int BITS, int KB, int MR, int NB, bool ZEROS>
void tile(const GemmArgs& a, int m0, int block) {
  if (a.w->scales_bf16) {
    tile_scales<BITS, KB, MR, NB, ZEROS, true>(a, m0, block);
  } else {
    tile_scales<BITS, KB, MR, NB, ZEROS, false>(a, m0, block);
  }
}

// Rows [m, m_end) of one column step: MR-row tiles, then a 2-row tile for a
// remainder of 2-3 rows (so m = 2..3 still shares each unpacked weight
// register between rows), then single rows.
template <int BITS, int KB, int MR, int NBS, bool ZEROS>
void rows(const GemmArgs& a, int b) {
  int m = a.m_begin;
  for (; m + MR <= a.m_end; m += MR) tile<BITS, KB, MR, NBS, ZEROS>(a, m, b);
  if constexpr (MR > 2) {
    for (; m + 2 <= a.m_end; m += 2) tile<BITS, KB, 2, NBS, ZEROS>(a, m, b);
  }
  for (; m < a.m_end; ++m) tile<BITS, KB, 1, NBS, ZEROS>(a, m, b);
}

template <int BITS, int KB, int MR, int NB, bool ZEROS>
void run_z(const GemmArgs& a) {
  int b = a.block_begin;
  for (; b + NB <= a.block_end; b += NB) rows<BITS, KB, MR, NB, ZEROS>(a, b);
  for (; b < a.block_end; ++b) rows<BITS, KB, MR, 1, ZEROS>(a, b);
}

template <int MR, int NB>
struct Tile {
  template <int BITS, int KB, bool ZEROS>
  static void run(const GemmArgs& a) {
    run_z<BITS, KB, MR, NB, ZEROS>(a);
  }
};
