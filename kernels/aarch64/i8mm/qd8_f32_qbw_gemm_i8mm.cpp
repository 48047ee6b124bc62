// i8mm kernels for format n16k4 (compiled with -march=armv8.6-a+i8mm).
//
// SMMLA tiles (the i8mm GEMM kernels) and a USDOT tile: USDOT (by element)
// multiplies the unsigned stored weights with the signed activations
// directly, one instruction per 4 rows x 4 k, as the dotprod tile does.
#include <arm_neon.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "kernels/generated/kernel_functions.h"
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

// ---------------------------------------------------------------------------
// SMMLA tiles. SMMLA multiplies a 2x8 by an 8x2 int8 block into a 2x2 int32
// block: 32 multiply-accumulates per instruction, twice SDOT's 16. Operand
// one is two activation rows x 8 k (an 8-byte-chunk panel gives it in one
// 16-byte load); operand two is two weight rows x 8 k, which the n16k4 layout
// yields from two consecutive 4-k blocks with one ZIP1/ZIP2 of 32-bit lanes
// (block 2j holds rows r..r+3 x k 8j..8j+3, block 2j+1 the same rows x k
// 8j+4..8j+7). Accumulator lanes are {m0 r0, m0 r1, m1 r0, m1 r1}, so one
// 64-bit load-and-duplicate of two consecutive per-row floats (scale, row
// sum, bias) gives the matching vector.
//
// Weights up to 7 bits are < 128 and used as s8 directly; 8-bit weights are
// fed as u - 128 (one EOR). The integer accumulators of a group start from
// -(weight zero + offset) * sum(x) (the panel stores -sum(x) * offset in
// accumulator layout: without zero points that is the start value itself),
// so they end at the exact I_g of the reference.

// Row pairs (2*QN of them) of weight rows 4*Q0 .. 4*(Q0+QN)-1, k-blocks J, J+1.
template <int BITS, int KB, int J, int Q0, int QN>
__attribute__((always_inline)) inline void weight_pairs(const uint8_t* sb, int8x16_t (&w)[2 * QN]) {
  for (int q = 0; q < QN; ++q) {
    uint8x16_t lo = unpack_q<BITS, KB, J>(sb, Q0 + q);
    uint8x16_t hi = unpack_q<BITS, KB, J + 1>(sb, Q0 + q);
    if constexpr (BITS == 8) {
      lo = veorq_u8(lo, vdupq_n_u8(0x80));
      hi = veorq_u8(hi, vdupq_n_u8(0x80));
    }
    const uint32x4_t l32 = vreinterpretq_u32_u8(lo), h32 = vreinterpretq_u32_u8(hi);
    w[2 * q] = vreinterpretq_s8_u32(vzip1q_u32(l32, h32));
    w[2 * q + 1] = vreinterpretq_s8_u32(vzip2q_u32(l32, h32));
  }
}

// MP consecutive 16-byte registers. (Separate loads, which the compiler
// pairs into LDP: the 4-register LD1 forces consecutive registers and cost
// register moves and spills around it.)
template <int MP, typename T>
__attribute__((always_inline)) inline void load_regs(const T* p, int8x16_t (&x)[MP]) {
  for (int i = 0; i < MP; ++i) x[i] = vld1q_s8(reinterpret_cast<const int8_t*>(p) + 16 * i);
}

// Activation row pairs of one 8-k step, loaded pairwise with LDP (the
// compiler otherwise splits some into single loads).
template <int MP, int OFF>
__attribute__((always_inline)) inline void load_acts(const int8_t* p, int8x16_t (&x)[MP]) {
  if constexpr (MP == 4) {
    // Four row pairs: left to the compiler, which schedules them better.
    for (int i = 0; i < MP; ++i) x[i] = vld1q_s8(p + OFF + 16 * i);
    return;
  }
  for (int i = 0; i + 1 < MP; i += 2) {
    // (No memory operand: the panels are written before the kernel is called.)
    asm("ldp %q0, %q1, [%2, %3]" : "=w"(x[i]), "=w"(x[i + 1]) : "r"(p), "i"(OFF + 16 * i));
  }
  if constexpr (MP % 2) x[MP - 1] = vld1q_s8(p + OFF + 16 * (MP - 1));
}

// One 8-k step: MP activation row pairs x 2*QN weight row pairs.
template <int BITS, int KB, int MP, int Q0, int QN, int P, int JP>
__attribute__((always_inline)) inline void mmla_step(const uint8_t* sb, const int8_t* xp,
                                                     int32x4_t (&acc)[MP][2 * QN]) {
  int8x16_t w[2 * QN];
  weight_pairs<BITS, KB, 2 * JP, Q0, QN>(sb, w);
  int8x16_t x[MP];
  load_acts<MP, JP * P * 8>(xp, x);
  for (int p = 0; p < MP; ++p)
    for (int rp = 0; rp < 2 * QN; ++rp) acc[p][rp] = vmmlaq_s32(acc[p][rp], x[p], w[rp]);
}

template <int BITS, int KB, int MP, int Q0, int QN, int P, int... JPs>
__attribute__((always_inline)) inline void mmla_superblock(const uint8_t* sb, const int8_t* xp,
                                                           int32x4_t (&acc)[MP][2 * QN],
                                                           std::integer_sequence<int, JPs...>) {
  (mmla_step<BITS, KB, MP, Q0, QN, P, JPs>(sb, xp, acc), ...);
}

__attribute__((always_inline)) inline float32x4_t dup_pair(const float* p) {
  return vreinterpretq_f32_f64(vld1q_dup_f64(reinterpret_cast<const double*>(p)));
}

// {p[0], p[1], p[0], p[1]} in one LD1R (the compiler turns vld1q_dup_f64
// into a load and a DUP).
// RP pairs of consecutive floats {p[0], p[1], p[0], p[1]}, {p[2], p[3], ...},
// one LD1R each (the compiler turns vld1q_dup_f64 into a load and a DUP),
// advancing p by `step` bytes in all.
template <int RP>
__attribute__((always_inline)) inline void load_scale_pairs(const float*& p, int64_t step,
                                                            float32x4_t (&v)[RP]) {
  static_assert(RP == 2 || RP == 4, "row pairs per tile");
  if constexpr (RP == 2) {
    asm("ld1r {%0.2d}, [%2], #8\n\t"
        "ld1r {%1.2d}, [%2], %3"
        : "=w"(v[0]), "=w"(v[1]), "+r"(p)
        : "r"(step));
  } else {
    // volatile: keeps the loads after the matmul body, where they are used
    // (hoisted, the four registers stay live through it and cause spills).
    asm volatile("ld1r {%0.2d}, [%4], #8\n\t"
        "ld1r {%1.2d}, [%4], #8\n\t"
        "ld1r {%2.2d}, [%4], #8\n\t"
        "ld1r {%3.2d}, [%4], %5"
        : "=w"(v[0]), "=w"(v[1]), "=w"(v[2]), "=w"(v[3]), "+r"(p)
        : "r"(step));
  }
}

// Integer accumulators of a group start from the panel's 2x2 blocks, the
// same block for every weight row pair: loaded once per accumulator with
// LDP (cheaper than one load and RP-1 register moves).
template <int MP, int RP>
__attribute__((always_inline)) inline void init_from_sums(const int32_t* sp, int32x4_t (&acc)[MP][RP]) {
  for (int rp = 0; rp < RP; ++rp) {
    for (int p = 0; p + 1 < MP; p += 2) {
      asm volatile("ldp %q0, %q1, [%2, %3]"
                   : "=w"(acc[p][rp]), "=w"(acc[p + 1][rp])
                   : "r"(sp), "i"(16 * p));
    }
    if constexpr (MP % 2) {
      asm volatile("ldr %q0, [%1, %2]" : "=w"(acc[MP - 1][rp]) : "r"(sp), "i"(16 * (MP - 1)));
    }
  }
}

// y = fma(fma(-zero_x, row_sum, acc), scale_x, bias), as the reference;
// computed for the whole tile, stored for the rows < m_end and columns < n.
template <int MP, int RP, int Q0>
__attribute__((always_inline)) inline void store_tile(const GemmArgs& a, const PackedLayout& l,
                                                      const QuantizedActivations& xq,
                                                      const float32x4_t (&facc)[MP][RP],
                                                      const uint8_t* blk, int m0, int pair0, int block) {
  const float* rsum = reinterpret_cast<const float*>(blk + l.row_sums_offset) + 4 * Q0;
  const float* bias = reinterpret_cast<const float*>(blk + l.bias_offset) + 4 * Q0;
  const int mt = m0 + 2 * pair0;
  float y[2 * MP][2 * RP];
#pragma GCC unroll 4
  for (int p = 0; p < MP; ++p) {
    float nz[2], sx[2];
    for (int i = 0; i < 2; ++i) {
      const int m = mt + 2 * p + i < a.m_end ? mt + 2 * p + i : a.m_begin;  // padding rows: any valid row
      nz[i] = static_cast<float>(-xq.zero[m]);
      sx[i] = xq.scale[m];
    }
    const float32x4_t nzv = vcombine_f32(vdup_n_f32(nz[0]), vdup_n_f32(nz[1]));
    const float32x4_t sxv = vcombine_f32(vdup_n_f32(sx[0]), vdup_n_f32(sx[1]));
#pragma GCC unroll 4
    for (int rp = 0; rp < RP; ++rp) {
      const float32x4_t t = vfmaq_f32(facc[p][rp], nzv, dup_pair(rsum + 2 * rp));
      const float32x4_t b = l.has_bias ? dup_pair(bias + 2 * rp) : vdupq_n_f32(0.0f);
      const float32x4_t v = vfmaq_f32(b, t, sxv);
      vst1_f32(&y[2 * p][2 * rp], vget_low_f32(v));
      vst1_f32(&y[2 * p + 1][2 * rp], vget_high_f32(v));
    }
  }
  const int col0 = block * 16 + 4 * Q0;
  const int cols = std::min(2 * RP, l.n - col0);
  const int rows = std::min(2 * MP, a.m_end - mt);
  for (int i = 0; i < rows; ++i) {
    float* dst = a.out + int64_t(mt + i) * a.out_stride + col0;
    if (cols == 2 * RP) {
      std::memcpy(dst, y[i], sizeof(y[i]));
    } else {
      for (int c = 0; c < cols; ++c) dst[c] = y[i][c];
    }
  }
}

// Hand-scheduled group loops for the common case: 4-bit weights, no zero
// points, group size 32 (one superblock per group), full tiles. Register
// allocation is explicit (v16-v23 integer accumulators, the rest scratch; the
// float accumulators stay wherever the compiler put them), every pointer
// advances through post-indexed loads, and the activation row pairs of the
// 8x4 tile come in one 4-register LD1: 98 (4x8) and 80 (8x4) instructions per
// 1024 multiply-accumulates against 101-103 and 88-93 for the intrinsics
// version, whose register allocation spills. Same operations, same order per
// output: bit-identical to the generic path.
//
// w: this tile's first weight quarter in the group (gp + 16 * Q0); the four
// 64-byte units end where the group's scales start (float32 storage,
// scales_offset == 256) or where the next group starts (bfloat16 storage,
// group_bytes == 256).
// a: activation panel row pairs; s: panel sums; f: float accumulators [p][rp].
// Shared by the 4x8 and 8x4 loops: the eight integer accumulators to float,
// and the clobbers of a loop that uses v16-v31.
#define TK_MMLA_SCVTF_V16_V23                                               \
  "scvtf v16.4s, v16.4s\n\t" "scvtf v17.4s, v17.4s\n\t"                   \
  "scvtf v18.4s, v18.4s\n\t" "scvtf v19.4s, v19.4s\n\t"                   \
  "scvtf v20.4s, v20.4s\n\t" "scvtf v21.4s, v21.4s\n\t"                   \
  "scvtf v22.4s, v22.4s\n\t" "scvtf v23.4s, v23.4s\n\t"
#define TK_MMLA_CLOBBERS                                                    \
  "cc", "memory", "v16", "v17", "v18", "v19", "v20", "v21", "v22", "v23", \
      "v24", "v25", "v26", "v27", "v28", "v29", "v30", "v31"
// Shared by the 4x8 and 2x8 loops: 8 weight rows x 8 k as four SMMLA row-pair
// operands v28..v31 (mask 0x0f in v24), and their 4 scale pairs in v25..v28.
#define TK_MMLA_8_WEIGHT_ROWS                       \
  "ldp q25, q26, [%[w]], #64\n\t"                   \
  "and v27.16b, v25.16b, v24.16b\n\t"               \
  "ushr v25.16b, v25.16b, #4\n\t"                   \
  "zip1 v28.4s, v27.4s, v25.4s\n\t"                 \
  "zip2 v29.4s, v27.4s, v25.4s\n\t"                 \
  "and v27.16b, v26.16b, v24.16b\n\t"               \
  "ushr v26.16b, v26.16b, #4\n\t"                   \
  "zip1 v30.4s, v27.4s, v26.4s\n\t"                 \
  "zip2 v31.4s, v27.4s, v26.4s\n\t"
#define TK_MMLA_8_ROW_SCALES                        \
  "ld1r {v25.2d}, [%[w]], #8\n\t"                   \
  "ld1r {v26.2d}, [%[w]], #8\n\t"                   \
  "ld1r {v27.2d}, [%[w]], #8\n\t"                   \
  "ld1r {v28.2d}, [%[w]], %[ss]\n\t"

// bfloat16 scale storage: the scales come from their own array (pointer sc;
// the groups are planes only, so w needs no step) and are widened with SHLL:
// {b0, b1, b0, b1} << 16 = {s_r0, s_r1, s_r0, s_r1}.
#define TK_MMLA_8_ROW_SCALES_BF16                   \
  "ld1r {v25.2s}, [%[sc]], #4\n\t"                  \
  "ld1r {v26.2s}, [%[sc]], #4\n\t"                  \
  "ld1r {v27.2s}, [%[sc]], #4\n\t"                  \
  "ld1r {v28.2s}, [%[sc]], %[ss]\n\t"               \
  "shll v25.4s, v25.4h, #16\n\t"                    \
  "shll v26.4s, v26.4h, #16\n\t"                    \
  "shll v27.4s, v27.4h, #16\n\t"                    \
  "shll v28.4s, v28.4h, #16\n\t"
#define TK_MMLA_4X8_STEP                            \
  TK_MMLA_8_WEIGHT_ROWS                             \
  "ldp q25, q26, [%[a]], #32\n\t"                   \
  "smmla v16.4s, v25.16b, v28.16b\n\t"              \
  "smmla v17.4s, v25.16b, v29.16b\n\t"              \
  "smmla v18.4s, v25.16b, v30.16b\n\t"              \
  "smmla v19.4s, v25.16b, v31.16b\n\t"              \
  "smmla v20.4s, v26.16b, v28.16b\n\t"              \
  "smmla v21.4s, v26.16b, v29.16b\n\t"              \
  "smmla v22.4s, v26.16b, v30.16b\n\t"              \
  "smmla v23.4s, v26.16b, v31.16b\n\t"
#define TK_MMLA_2X8_STEP                            \
  TK_MMLA_8_WEIGHT_ROWS                             \
  "ldr q25, [%[a]], #32\n\t"                        \
  "smmla v16.4s, v25.16b, v28.16b\n\t"              \
  "smmla v17.4s, v25.16b, v29.16b\n\t"              \
  "smmla v18.4s, v25.16b, v30.16b\n\t"              \
  "smmla v19.4s, v25.16b, v31.16b\n\t"
#define TK_MMLA_8X4_STEP                            \
  "ldr q28, [%[w]], #64\n\t"                        \
  "and v29.16b, v28.16b, v31.16b\n\t"               \
  "ushr v28.16b, v28.16b, #4\n\t"                   \
  "zip1 v30.4s, v29.4s, v28.4s\n\t"                 \
  "zip2 v29.4s, v29.4s, v28.4s\n\t"                 \
  "ld1 {v24.16b-v27.16b}, [%[a]], #64\n\t"          \
  "smmla v16.4s, v24.16b, v30.16b\n\t"              \
  "smmla v17.4s, v24.16b, v29.16b\n\t"              \
  "smmla v18.4s, v25.16b, v30.16b\n\t"              \
  "smmla v19.4s, v25.16b, v29.16b\n\t"              \
  "smmla v20.4s, v26.16b, v30.16b\n\t"              \
  "smmla v21.4s, v26.16b, v29.16b\n\t"              \
  "smmla v22.4s, v27.16b, v30.16b\n\t"              \
  "smmla v23.4s, v27.16b, v29.16b\n\t"
#define TK_MMLA_4_ROW_SCALES                        \
  "ld1r {v24.2d}, [%[w]], #8\n\t"                   \
  "ld1r {v25.2d}, [%[w]], %[ss]\n\t"
#define TK_MMLA_4_ROW_SCALES_BF16                   \
  "ld1r {v24.2s}, [%[sc]], #4\n\t"                  \
  "ld1r {v25.2s}, [%[sc]], %[ss]\n\t"               \
  "shll v24.4s, v24.4h, #16\n\t"                    \
  "shll v25.4s, v25.4h, #16\n\t"

// sc: the scales of this tile's rows in group 0 with bfloat16 storage (BF16),
// unused otherwise; scale_step: bytes from the last scale load to the next
// group's first.
template <bool BF16>
inline void mmla_4x8_b4_g32(const uint8_t* w, const uint8_t* sc, const int8_t* a, const int32_t* s,
                            int groups, int64_t scale_step, float32x4_t (&f)[2][4]) {
#define TK_MMLA_4X8_ASM(SCALES)                                                                  \
  asm volatile("movi v24.16b, #0x0f\n\t"                                                          \
               "1:\n\t"                                                                           \
               "ldp q16, q20, [%[s]]\n\t"                                                         \
               "ldp q17, q21, [%[s]]\n\t"                                                         \
               "ldp q18, q22, [%[s]]\n\t"                                                         \
               "ldp q19, q23, [%[s]], #32\n\t" TK_MMLA_4X8_STEP TK_MMLA_4X8_STEP TK_MMLA_4X8_STEP \
                   TK_MMLA_4X8_STEP SCALES TK_MMLA_SCVTF_V16_V23                                  \
               "fmla %[f00].4s, v16.4s, v25.4s\n\t"                                               \
               "fmla %[f01].4s, v17.4s, v26.4s\n\t"                                               \
               "fmla %[f02].4s, v18.4s, v27.4s\n\t"                                               \
               "fmla %[f03].4s, v19.4s, v28.4s\n\t"                                               \
               "fmla %[f10].4s, v20.4s, v25.4s\n\t"                                               \
               "fmla %[f11].4s, v21.4s, v26.4s\n\t"                                               \
               "fmla %[f12].4s, v22.4s, v27.4s\n\t"                                               \
               "fmla %[f13].4s, v23.4s, v28.4s\n\t"                                               \
               "subs %w[n], %w[n], #1\n\t"                                                        \
               "b.ne 1b\n\t"                                                                      \
               : [w] "+r"(w), [sc] "+r"(sc), [a] "+r"(a), [s] "+r"(s), [n] "+r"(groups),          \
                 [f00] "+w"(f[0][0]), [f01] "+w"(f[0][1]), [f02] "+w"(f[0][2]),                   \
                 [f03] "+w"(f[0][3]), [f10] "+w"(f[1][0]), [f11] "+w"(f[1][1]),                   \
                 [f12] "+w"(f[1][2]), [f13] "+w"(f[1][3])                                         \
               : [ss] "r"(scale_step)                                                             \
               : TK_MMLA_CLOBBERS)
  if constexpr (BF16) {
    TK_MMLA_4X8_ASM(TK_MMLA_8_ROW_SCALES_BF16);
  } else {
    TK_MMLA_4X8_ASM(TK_MMLA_8_ROW_SCALES);
  }
#undef TK_MMLA_4X8_ASM
}

// One activation row pair (m = 2, or the last two rows of a 4-row panel).
template <bool BF16>
inline void mmla_2x8_b4_g32(const uint8_t* w, const uint8_t* sc, const int8_t* a, const int32_t* s,
                            int groups, int64_t scale_step, float32x4_t (&f)[1][4]) {
#define TK_MMLA_2X8_ASM(SCALES)                                                                   \
  asm volatile("movi v24.16b, #0x0f\n\t"                                                          \
               "1:\n\t"                                                                           \
               "ldr q16, [%[s]], #32\n\t"                                                         \
               "mov v17.16b, v16.16b\n\t"                                                         \
               "mov v18.16b, v16.16b\n\t"                                                         \
               "mov v19.16b, v16.16b\n\t" TK_MMLA_2X8_STEP TK_MMLA_2X8_STEP TK_MMLA_2X8_STEP      \
                   TK_MMLA_2X8_STEP SCALES                                                        \
               "scvtf v16.4s, v16.4s\n\t"                                                         \
               "scvtf v17.4s, v17.4s\n\t"                                                         \
               "scvtf v18.4s, v18.4s\n\t"                                                         \
               "scvtf v19.4s, v19.4s\n\t"                                                         \
               "fmla %[f00].4s, v16.4s, v25.4s\n\t"                                               \
               "fmla %[f01].4s, v17.4s, v26.4s\n\t"                                               \
               "fmla %[f02].4s, v18.4s, v27.4s\n\t"                                               \
               "fmla %[f03].4s, v19.4s, v28.4s\n\t"                                               \
               "subs %w[n], %w[n], #1\n\t"                                                        \
               "b.ne 1b\n\t"                                                                      \
               : [w] "+r"(w), [sc] "+r"(sc), [a] "+r"(a), [s] "+r"(s), [n] "+r"(groups),          \
                 [f00] "+w"(f[0][0]), [f01] "+w"(f[0][1]), [f02] "+w"(f[0][2]),                   \
                 [f03] "+w"(f[0][3])                                                              \
               : [ss] "r"(scale_step)                                                             \
               : "cc", "memory", "v16", "v17", "v18", "v19", "v24", "v25", "v26", "v27", "v28",   \
                 "v29", "v30", "v31")
  if constexpr (BF16) {
    TK_MMLA_2X8_ASM(TK_MMLA_8_ROW_SCALES_BF16);
  } else {
    TK_MMLA_2X8_ASM(TK_MMLA_8_ROW_SCALES);
  }
#undef TK_MMLA_2X8_ASM
}

template <bool BF16>
inline void mmla_8x4_b4_g32(const uint8_t* w, const uint8_t* sc, const int8_t* a, const int32_t* s,
                            int groups, int64_t scale_step, float32x4_t (&f)[4][2]) {
#define TK_MMLA_8X4_ASM(SCALES)                                                                   \
  asm volatile("movi v31.16b, #0x0f\n\t"                                                          \
               "1:\n\t"                                                                           \
               "ldp q20, q22, [%[s], #32]\n\t"                                                    \
               "ldp q21, q23, [%[s], #32]\n\t"                                                    \
               "ldp q16, q18, [%[s]]\n\t"                                                         \
               "ldp q17, q19, [%[s]], #64\n\t" TK_MMLA_8X4_STEP TK_MMLA_8X4_STEP TK_MMLA_8X4_STEP \
                   TK_MMLA_8X4_STEP SCALES TK_MMLA_SCVTF_V16_V23                                  \
               "fmla %[f00].4s, v16.4s, v24.4s\n\t"                                               \
               "fmla %[f01].4s, v17.4s, v25.4s\n\t"                                               \
               "fmla %[f10].4s, v18.4s, v24.4s\n\t"                                               \
               "fmla %[f11].4s, v19.4s, v25.4s\n\t"                                               \
               "fmla %[f20].4s, v20.4s, v24.4s\n\t"                                               \
               "fmla %[f21].4s, v21.4s, v25.4s\n\t"                                               \
               "fmla %[f30].4s, v22.4s, v24.4s\n\t"                                               \
               "fmla %[f31].4s, v23.4s, v25.4s\n\t"                                               \
               "subs %w[n], %w[n], #1\n\t"                                                        \
               "b.ne 1b\n\t"                                                                      \
               : [w] "+r"(w), [sc] "+r"(sc), [a] "+r"(a), [s] "+r"(s), [n] "+r"(groups),          \
                 [f00] "+w"(f[0][0]), [f01] "+w"(f[0][1]), [f10] "+w"(f[1][0]),                   \
                 [f11] "+w"(f[1][1]), [f20] "+w"(f[2][0]), [f21] "+w"(f[2][1]),                   \
                 [f30] "+w"(f[3][0]), [f31] "+w"(f[3][1])                                         \
               : [ss] "r"(scale_step)                                                             \
               : TK_MMLA_CLOBBERS)
  if constexpr (BF16) {
    TK_MMLA_8X4_ASM(TK_MMLA_4_ROW_SCALES_BF16);
  } else {
    TK_MMLA_8X4_ASM(TK_MMLA_4_ROW_SCALES);
  }
#undef TK_MMLA_8X4_ASM
}

#undef TK_MMLA_4X8_STEP
#undef TK_MMLA_2X8_STEP
#undef TK_MMLA_8X4_STEP
#undef TK_MMLA_8_WEIGHT_ROWS
#undef TK_MMLA_8_ROW_SCALES
#undef TK_MMLA_8_ROW_SCALES_BF16
#undef TK_MMLA_4_ROW_SCALES
#undef TK_MMLA_4_ROW_SCALES_BF16
#undef TK_MMLA_SCVTF_V16_V23
#undef TK_MMLA_CLOBBERS

template <int MP, bool BF16, class F>
__attribute__((always_inline)) inline void mmla_asm_tile(const uint8_t* w, const uint8_t* sc, const int8_t* a,
                                                         const int32_t* s, int groups, int64_t step, F& facc) {
  if constexpr (MP == 1) {
    mmla_2x8_b4_g32<BF16>(w, sc, a, s, groups, step, facc);
  } else if constexpr (MP == 2) {
    mmla_4x8_b4_g32<BF16>(w, sc, a, s, groups, step, facc);
  } else {
    mmla_8x4_b4_g32<BF16>(w, sc, a, s, groups, step, facc);
  }
}

// Activation rows 2*PAIR0 .. 2*(PAIR0+MP)-1 of the P-row panel starting at row
// m0, weight rows 4*Q0 .. 4*(Q0+QN)-1 of `block`.
// ONE_SB: group_size == kb (straight-line code, no superblock loop).
// BF16: bfloat16 scale storage (scales and zero points in per-block arrays).
// ASM (the _asm rows): the hand-scheduled loops where they apply (4-bit,
// group 32, no zero points, the layouts below); intrinsics everywhere else.
template <int BITS, int KB, bool ZEROS, int MP, int Q0, int QN, int P, bool ONE_SB, bool BF16, bool ASM>
void mmla_tile_scales(const GemmArgs& a, int m0, int pair0, int block) {
  constexpr int RP = 2 * QN;
  const PackedLayout& l = *a.w;
  const QuantizedActivations& xq = *a.x;
  constexpr int kOffsetShift = BITS == 8 ? -1 : BITS - 1;  // offset 2^(BITS-1); none for 8-bit (fed as u - 128)
  const uint8_t* blk = a.body + int64_t(block) * l.block_bytes;
  const int8_t* xp = xq.panels + int64_t(m0 / P) * xq.panel_stride + 16 * pair0;
  const int32_t* sp = xq.panel_sums + int64_t(m0 / P) * xq.panel_sums_stride + 4 * pair0;
  const int64_t x_group_step = int64_t(l.group_size) * P;

  float32x4_t facc[MP][RP];
  for (int p = 0; p < MP; ++p)
    for (int rp = 0; rp < RP; ++rp) facc[p][rp] = vdupq_n_f32(0.0f);

  constexpr bool kAsm = ASM && BITS == 4 && KB == 32 && ONE_SB && !ZEROS &&
                        ((P == 4 && QN == 2) || (P == 8 && QN == 1 && MP == 4));
  if constexpr (kAsm) {
    // The planes of a group end where its scales start (float32: inside the
    // group; bfloat16: at the next group, scales in their own array).
    if (!BF16 && l.scales_offset == 256 && l.groups > 0) {
      const int64_t step = l.group_bytes - l.scales_offset - 8 * (RP - 1);
      mmla_asm_tile<MP, false>(blk + 16 * Q0, nullptr, xp, sp, l.groups, step, facc);
      store_tile<MP, RP, Q0>(a, l, xq, facc, blk, m0, pair0, block);
      return;
    }
    if (BF16 && l.group_bytes == 256 && l.groups > 0) {
      const int64_t step = 2 * int64_t{l.nr} - 4 * (RP - 1);
      mmla_asm_tile<MP, true>(blk + 16 * Q0, l.scales_of(blk, 0) + 8 * Q0, xp, sp, l.groups, step, facc);
      store_tile<MP, RP, Q0>(a, l, xq, facc, blk, m0, pair0, block);
      return;
    }
  }

  const uint8_t* gp = blk;
  const uint8_t* const gend = blk + int64_t(l.groups) * l.group_bytes;
  // Scales pointer: advanced by the scale loads themselves.
  const float* scales = reinterpret_cast<const float*>(blk + l.scales_offset) + 4 * Q0;
  const int64_t scales_step = l.group_bytes - 8 * (RP - 1);
  // bfloat16 storage: this tile's scales and zero points in the block's
  // arrays, one step per group.
  const uint8_t* scales16 = l.scales_of(blk, 0) + 8 * Q0;
  const int8_t* zeros16 = reinterpret_cast<const int8_t*>(l.zeros_of(blk, 0)) + 4 * Q0;
  for (; gp != gend;) {
    int32x4_t acc[MP][RP];
    {
      int32x4_t zp[RP];
      if constexpr (ZEROS) {
        // {z_r0, z_r1, z_r0, z_r1} + offset for each weight row pair.
        const int8_t* z = BF16 ? zeros16 : reinterpret_cast<const int8_t*>(gp + l.zeros_offset) + 4 * Q0;
        for (int q = 0; q < QN; ++q) {
          int8x8_t z8 = vreinterpret_s8_s32(vld1_dup_s32(reinterpret_cast<const int32_t*>(z + 4 * q)));
          int32x4_t z32 = vmovl_s16(vget_low_s16(vmovl_s8(z8)));
          if constexpr (kOffsetShift >= 0) z32 = vaddq_s32(z32, vdupq_n_s32(1 << kOffsetShift));
          const int64x2_t z64 = vreinterpretq_s64_s32(z32);
          zp[2 * q] = vreinterpretq_s32_s64(vdupq_laneq_s64(z64, 0));
          zp[2 * q + 1] = vreinterpretq_s32_s64(vdupq_laneq_s64(z64, 1));
        }
      }
      // {-s_m0, -s_m0, -s_m1, -s_m1} << offset shift, per activation row pair.
      if constexpr (ZEROS) {
        int8x16_t ns8[MP];
        load_regs<MP>(sp, ns8);
        for (int p = 0; p < MP; ++p) {
          // The shift is exact: the panel value is a multiple of 2^shift.
          int32x4_t ns = vreinterpretq_s32_s8(ns8[p]);
          if constexpr (kOffsetShift > 0) ns = vshrq_n_s32(ns, kOffsetShift > 0 ? kOffsetShift : 1);
          for (int rp = 0; rp < RP; ++rp) acc[p][rp] = vmulq_s32(ns, zp[rp]);
        }
      } else if constexpr (kOffsetShift >= 0) {
        init_from_sums(sp, acc);
      } else {
        for (int p = 0; p < MP; ++p)
          for (int rp = 0; rp < RP; ++rp) acc[p][rp] = vdupq_n_s32(0);
      }
    }
    if constexpr (ONE_SB) {
      mmla_superblock<BITS, KB, MP, Q0, QN, P>(gp, xp, acc, std::make_integer_sequence<int, KB / 8>{});
    } else {
      const uint8_t* sb = gp;
      const int8_t* xs = xp;
      for (int s = 0; s < l.superblocks; ++s) {
        mmla_superblock<BITS, KB, MP, Q0, QN, P>(sb, xs, acc, std::make_integer_sequence<int, KB / 8>{});
        sb += l.superblock_bytes;
        xs += KB * P;
      }
    }
    // Scales of this tile's rows as {s_r0, s_r1, s_r0, s_r1} per weight row pair.
    float32x4_t sc[RP];
    if constexpr (BF16) {
      // {s_r0, s_r1, s_r0, s_r1}: two bfloat16 halves duplicated, widened.
      for (int rp = 0; rp < RP; ++rp) {
        const uint32x2_t two = vld1_dup_u32(reinterpret_cast<const uint32_t*>(scales16 + 4 * rp));  // LD1R
        sc[rp] = vreinterpretq_f32_u32(vshll_n_u16(vreinterpret_u16_u32(two), 16));
      }
      scales16 += 2 * l.nr;
      if constexpr (ZEROS) zeros16 += 4 * ((l.nr + 3) / 4);
    } else {
      load_scale_pairs(scales, scales_step, sc);
    }
    for (int rp = 0; rp < RP; ++rp)
      for (int p = 0; p < MP; ++p) facc[p][rp] = vfmaq_f32(facc[p][rp], vcvtq_f32_s32(acc[p][rp]), sc[rp]);
    gp += l.group_bytes;
    xp += x_group_step;
    sp += 2 * P;
  }

  store_tile<MP, RP, Q0>(a, l, xq, facc, blk, m0, pair0, block);
}

// The scale storage chosen once per tile, not per group.
template <int BITS, int KB, bool ZEROS, int MP, int Q0, int QN, int P, bool ONE_SB, bool ASM>
void mmla_tile(const GemmArgs& a, int m0, int pair0, int block) {
  if (a.w->scales_bf16) {
    mmla_tile_scales<BITS, KB, ZEROS, MP, Q0, QN, P, ONE_SB, true, ASM>(a, m0, pair0, block);
  } else {
    mmla_tile_scales<BITS, KB, ZEROS, MP, Q0, QN, P, ONE_SB, false, ASM>(a, m0, pair0, block);
  }
}

// Tiles of P activation rows (a panel; the op's row ranges start on panel
// boundaries) x 4*QN weight rows. A panel's last rows past m are zero: the
// tile shrinks to whole row pairs (P=8: 8, 4+2, 4, 2; P=4: 4, 2).
template <int P, int QN, bool ASM>
struct MmlaTile {
  template <int BITS, int KB, bool ZEROS>
  static void run(const GemmArgs& a) {
    for (int b = a.block_begin; b < a.block_end; ++b) {
      quarters<BITS, KB, ZEROS>(a, b, std::make_integer_sequence<int, 4 / QN>{});
    }
  }
  template <int BITS, int KB, bool ZEROS, int... Is>
  static void quarters(const GemmArgs& a, int b, std::integer_sequence<int, Is...>) {
    (panels<BITS, KB, ZEROS, Is * QN>(a, b), ...);
  }
  template <int BITS, int KB, bool ZEROS, int Q0>
  static void panels(const GemmArgs& a, int b) {
    if (b * 16 + 4 * Q0 >= a.w->n) return;
    if (a.w->superblocks == 1) {
      panels_sb<BITS, KB, ZEROS, Q0, true>(a, b);
    } else {
      panels_sb<BITS, KB, ZEROS, Q0, false>(a, b);
    }
  }
  template <int BITS, int KB, bool ZEROS, int Q0, bool ONE_SB>
  static void panels_sb(const GemmArgs& a, int b) {
    for (int m0 = a.m_begin; m0 < a.m_end; m0 += P) {
      const int pairs = (std::min(P, a.m_end - m0) + 1) / 2;
      if (pairs == P / 2) {
        mmla_tile<BITS, KB, ZEROS, P / 2, Q0, QN, P, ONE_SB, ASM>(a, m0, 0, b);
        continue;
      }
      int pair = 0;
      if constexpr (P >= 8) {
        if (pairs - pair >= 2) {
          mmla_tile<BITS, KB, ZEROS, 2, Q0, QN, P, ONE_SB, ASM>(a, m0, pair, b);
          pair += 2;
        }
      }
      if (pairs - pair >= 1) mmla_tile<BITS, KB, ZEROS, 1, Q0, QN, P, ONE_SB, ASM>(a, m0, pair, b);
    }
  }
};

}  // namespace

void qd8_f32_qbwn16k4_gemm_4x16__i8mm(const GemmArgs& a) { dispatch_layout<Tile<4, 1>>(a); }
void qd8p4x8_f32_qbwn16k4_gemm_4x8__i8mm(const GemmArgs& a) { dispatch_layout<MmlaTile<4, 2, false>>(a); }
void qd8p4x8_f32_qbwn16k4_gemm_4x8_asm__i8mm(const GemmArgs& a) { dispatch_layout<MmlaTile<4, 2, true>>(a); }
void qd8p8x8_f32_qbwn16k4_gemm_8x4__i8mm(const GemmArgs& a) { dispatch_layout<MmlaTile<8, 1, false>>(a); }
void qd8p8x8_f32_qbwn16k4_gemm_8x4_asm__i8mm(const GemmArgs& a) { dispatch_layout<MmlaTile<8, 1, true>>(a); }

}  // namespace torchao_kernels
