// AVX512-VNNI kernels for format n16k4 (compiled with -mavx512f -mavx512bw
// -mavx512vl -mavx512vnni -mfma; only reached when the CPU has them).
//
// One 64-byte unit of the format is 16 output rows x 4 k-values, exactly the
// shape of vpdpbusd: lane r accumulates the 4-way dot product of row r. The
// unpacked weights (unsigned, 0..2^b-1) are vpdpbusd's unsigned operand and
// the int8 activations, broadcast 4 bytes at a time, its signed operand, so no
// sign fix-up and no saturation (vpdpbusd does not saturate; |sum| < 2^31 is
// guaranteed by group_size <= 32768). The weight offset 2^(b-1) and the zero
// points enter as one integer term per group, -(zero + 2^(b-1)) * sum(x),
// used as the accumulator's initial value, so the group result is the exact
// int32 the reference computes; the float epilogue then repeats the
// reference's fma sequence, so results are bit-identical.
//
// On Intel cores with 512-bit ops only two vector ports execute them, so the
// GEMM tiles are bound by vector-ALU uops: 8 vpdpbusd per group per
// accumulator, against unpacking (amortised over the tile's rows) and the
// per-group epilogue (cvt + fma). GEMM tiles therefore read activations from
// row panels (one pointer for all rows, see QuantizedActivations::panels) and
// keep float accumulators in L1, leaving the registers to the dot products.
//
//   gemv_1x64: 1 row x 4 blocks: four independent weight streams per step.
//   gemm_4x32: 4 rows x 2 blocks: each unpacked weight vector feeds 4 dots.
//   gemm_8x32: 8 rows x 2 blocks: halves the unpacking per dot product; the
//              16 float accumulators spill to L1, touched once per group.
//              With more than one m-tile per column step, the step's weights
//              are unpacked once per k-chunk into L1 and shared by the tiles
//              (column_step_unpacked).
// tools/x86_gemm_ceiling.cpp measures what these loops can reach on a core.
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kernels/format/layout_dispatch.h"
#include "kernels/format/plane_layout.h"
#include "kernels/generated/kernel_functions.h"
#include "kernels/x86/stream_ahead.h"

namespace torchao_kernels {

namespace {

using plane_layout::Planes;
using plane_layout::planes_of;

inline int32_t load_i32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Block j (4 k-values x 16 rows) of a superblock, as unsigned bytes.
template <int BITS, int KB, int J>
__attribute__((always_inline)) inline __m512i unpack_block(const uint8_t* sb) {
  constexpr Planes P = planes_of(BITS, KB);
  if constexpr (BITS == 8) {
    return _mm512_loadu_si512(sb + J * 64);
  } else {
    // Each plane costs at most two ops: one 16-bit shift moving its field
    // from bit `shift` of the byte to its place P.shift[i] in the value
    // (bits crossing in from the neighbouring byte land outside the field),
    // then a mask, merged into the value by one vpternlogd (v | (u & mask)).
    __m512i v = _mm512_setzero_si512();
#pragma GCC unroll 3
    for (int i = 0; i < P.count; ++i) {
      const int p = P.bits[i];
      const int unit = P.unit_offset[i] + (J * p) / 8;
      const int shift = (J * p) % 8;
      const int move = shift - P.shift[i];
      __m512i u = _mm512_loadu_si512(sb + unit * 64);
      if (move > 0) u = _mm512_srli_epi16(u, move);
      if (move < 0) u = _mm512_slli_epi16(u, -move);
      const __m512i mask = _mm512_set1_epi8(static_cast<char>(((1 << p) - 1) << P.shift[i]));
      if (i == 0) {
        v = shift + p < 8 || shift ? _mm512_and_si512(u, mask) : u;
      } else {
        v = _mm512_ternarylogic_epi32(v, u, mask, 0xF8);  // v | (u & mask)
      }
    }
    return v;
  }
}

// Where a tile's activation rows come from. RowPointers: the row-major
// quantized rows (one pointer per row). Panel: rows interleaved in 4-byte
// chunks (QuantizedActivations::panels), one pointer for all MR rows, which
// frees general registers in the GEMM tiles.
template <int MR>
struct RowPointers {
  const int8_t* row[MR];
  const int32_t* sums[MR];
  int valid;  // rows to store
  RowPointers(const QuantizedActivations& x, int m0, int rows) : valid(rows) {
    for (int r = 0; r < MR; ++r) {
      row[r] = x.q + int64_t(m0 + r) * x.row_stride;
      sums[r] = x.group_sums + int64_t(m0 + r) * x.groups;
    }
  }
  struct Cursor {
    const int8_t* p[MR];
    __attribute__((always_inline)) int32_t load(int r, int j) const { return load_i32(p[r] + 4 * j); }
    __attribute__((always_inline)) void advance(int k) {
      for (int r = 0; r < MR; ++r) p[r] += k;
    }
  };
  Cursor at_group(int g, int group_size) const {
    Cursor c;
    for (int r = 0; r < MR; ++r) c.p[r] = row[r] + int64_t(g) * group_size;
    return c;
  }
  int32_t sum(int r, int g) const { return sums[r][g]; }
  __m512 fsum(int r, int g) const { return _mm512_set1_ps(static_cast<float>(sums[r][g])); }
};

template <int MR>
struct Panel {
  const int8_t* base;
  const int32_t* sums;
  const float* fsums;
  int valid;
  Panel(const QuantizedActivations& x, int m0, int rows) : valid(rows) {
    base = x.panels + int64_t(m0 / MR) * x.panel_stride;
    sums = x.panel_sums + int64_t(m0 / MR) * x.panel_sums_stride;
    fsums = x.panel_sums_f + int64_t(m0 / MR) * x.panel_sums_stride;
  }
  struct Cursor {
    const int8_t* p;
    __attribute__((always_inline)) int32_t load(int r, int j) const { return load_i32(p + 4 * (j * MR + r)); }
    __attribute__((always_inline)) void advance(int k) { p += k * MR; }
  };
  Cursor at_group(int g, int group_size) const { return Cursor{base + int64_t(g) * group_size * MR}; }
  int32_t sum(int r, int g) const { return sums[int64_t(g) * MR + r]; }
  // A broadcast load: no convert, no shuffle on the vector ports.
  __m512 fsum(int r, int g) const { return _mm512_set1_ps(fsums[int64_t(g) * MR + r]); }
};

template <int BITS, int KB, int MR, int NB, int J, class Cursor>
__attribute__((always_inline)) inline void dot_block(const uint8_t* const* sb, const Cursor& xs,
                                                     __m512i (&acc)[MR][NB]) {
  __m512i w[NB];
  for (int b = 0; b < NB; ++b) w[b] = unpack_block<BITS, KB, J>(sb[b]);
  for (int r = 0; r < MR; ++r) {
    const __m512i xb = _mm512_set1_epi32(xs.load(r, J));
    for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_dpbusd_epi32(acc[r][b], w[b], xb);
  }
}

template <int BITS, int KB, int MR, int NB, class Cursor, int... Js>
__attribute__((always_inline)) inline void dot_superblock(const uint8_t* const* sb, const Cursor& xs,
                                                          __m512i (&acc)[MR][NB],
                                                          std::integer_sequence<int, Js...>) {
  (dot_block<BITS, KB, MR, NB, Js>(sb, xs, acc), ...);
}

// The same pointer, opaque to the optimiser: the float accumulators are
// meant to live in L1 (a load and a store per group, both on load/store
// ports). Without this GCC keeps them in registers across groups, runs out,
// and spills them next to the stores it must still do.
template <class T>
__attribute__((always_inline)) inline T* launder(T* p) {
  asm("" : "+r"(p));
  return p;
}

// Adds group g's integer accumulators to the float accumulators fbuf:
// fbuf += scale * float(dot - (zero + 2^(b-1)) * sum(x)), the reference's
// sequence. gp[b]: group g of block b.
// The 16 scales of a block's group as float32 (bfloat16 storage: the stored
// halves are the upper 16 bits; one widening load and a shift).
__attribute__((always_inline)) inline __m512 load_scales(const PackedLayout& l, const uint8_t* group, int g) {
  const uint8_t* p = l.scales_of(group, g);
  if (l.scales_bf16) {
    // One vpermw: 16-bit element i to the upper half of lane i, lower halves
    // zeroed by the mask (instead of a widening load plus a shift).
    const __m512i idx = _mm512_set_epi16(15, 0, 14, 0, 13, 0, 12, 0, 11, 0, 10, 0, 9, 0, 8, 0, 7, 0, 6, 0,
                                         5, 0, 4, 0, 3, 0, 2, 0, 1, 0, 0, 0);
    const __m512i h = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(0xAAAAAAAAu, idx, h));
  }
  return _mm512_loadu_ps(reinterpret_cast<const float*>(p));
}

template <int BITS, int MR, int NB, bool ZEROS, class Act>
__attribute__((always_inline)) inline void add_group(const PackedLayout& l, const Act& act, int g,
                                                     const uint8_t* const* gp, __m512i (&acc)[MR][NB],
                                                     float (*fbuf)[NB][16]) {
  constexpr int32_t kOffset = 1 << (BITS - 1);
  // I_g = dot - (zero + 2^(b-1)) * sum(x): exact in int32 (wrapping).
  if (l.group_size <= 512) {
    // dot, (zero + offset) * sum(x) and their difference are integers below
    // 2^24 in magnitude (|.| <= 255 * 128 * group_size), so float holds each
    // exactly and fma(-(zero + offset), sum(x), float(dot)) rounds to exactly
    // float(I_g): one uop per accumulator (with zero points: instead of
    // vpmulld, two, plus vpsubd), and the float sums of panels are broadcast
    // from memory. (Starting the accumulators from a broadcast of the integer
    // offset term instead measured no faster.)
    for (int b = 0; b < NB; ++b) {
      __m512 zf = _mm512_set1_ps(static_cast<float>(kOffset));
      if constexpr (ZEROS) {
        zf = _mm512_cvtepi32_ps(_mm512_add_epi32(
            _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(l.zeros_of(gp[b], g)))),
            _mm512_set1_epi32(kOffset)));
      }
      const __m512 sc = load_scales(l, gp[b], g);
      for (int r = 0; r < MR; ++r) {
        const __m512 ig = _mm512_fnmadd_ps(zf, act.fsum(r, g), _mm512_cvtepi32_ps(acc[r][b]));
        _mm512_store_ps(fbuf[r][b], _mm512_fmadd_ps(ig, sc, _mm512_load_ps(fbuf[r][b])));
      }
    }
    return;
  }
  if constexpr (ZEROS) {
    for (int b = 0; b < NB; ++b) {
      const __m512i z = _mm512_add_epi32(
          _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(l.zeros_of(gp[b], g)))),
          _mm512_set1_epi32(kOffset));
      for (int r = 0; r < MR; ++r)
        acc[r][b] = _mm512_sub_epi32(acc[r][b], _mm512_mullo_epi32(z, _mm512_set1_epi32(act.sum(r, g))));
    }
  } else {
    for (int r = 0; r < MR; ++r) {
      const __m512i off = _mm512_set1_epi32(-kOffset * act.sum(r, g));
      for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_add_epi32(acc[r][b], off);
    }
  }
  for (int b = 0; b < NB; ++b) {
    const __m512 sc = load_scales(l, gp[b], g);
    for (int r = 0; r < MR; ++r)
      _mm512_store_ps(fbuf[r][b], _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][b]), sc,
                                                   _mm512_load_ps(fbuf[r][b])));
  }
}

// The reference's final step for the tile's valid rows: y = (acc - zero_x *
// row_sum) * scale_x + bias, stored to the output.
template <int MR, int NB, class Act>
inline void store_tile(const GemmArgs& a, const Act& act, int m0, int block, const uint8_t* const* blk,
                       const float (*fbuf)[NB][16]) {
  const PackedLayout& l = *a.w;
  const QuantizedActivations& x = *a.x;
  for (int b = 0; b < NB; ++b) {
    const int col = (block + b) * 16;
    if (col >= l.n) break;
    const int cols = l.n - col < 16 ? l.n - col : 16;
    const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1u);
    const __m512 rs = _mm512_loadu_ps(reinterpret_cast<const float*>(blk[b] + l.row_sums_offset));
    const __m512 bias = l.has_bias
                            ? _mm512_loadu_ps(reinterpret_cast<const float*>(blk[b] + l.bias_offset))
                            : _mm512_setzero_ps();
    for (int r = 0; r < MR && r < act.valid; ++r) {
      const int m = m0 + r;
      const __m512 t = _mm512_fmadd_ps(_mm512_set1_ps(static_cast<float>(-x.zero[m])), rs,
                                       _mm512_load_ps(fbuf[r][b]));
      const __m512 y = _mm512_fmadd_ps(t, _mm512_set1_ps(x.scale[m]), bias);
      _mm512_mask_storeu_ps(a.out + int64_t(m) * a.out_stride + col, mask, y);
    }
  }
}

// [p, p + bytes) of each of NB blocks into L2.
template <int NB>
__attribute__((always_inline)) inline void prefetch_span(const PackedLayout& l, const uint8_t* p, int64_t bytes) {
  for (int b = 0; b < NB; ++b)
    for (int64_t off = 0; off < bytes; off += 64)
      _mm_prefetch(reinterpret_cast<const char*>(p + b * l.block_bytes + off), _MM_HINT_T1);
}

// Group g's scales and zero points when they sit apart from its values
// (scales_skew != 0), for each of NB blocks (pg: the group in block 0).
template <int NB>
__attribute__((always_inline)) inline void prefetch_group_constants(const PackedLayout& l, const uint8_t* pg, int g) {
  if (l.scales_skew == 0) return;
  for (int b = 0; b < NB; ++b) {
    const uint8_t* p = pg + b * l.block_bytes;
    _mm_prefetch(reinterpret_cast<const char*>(l.scales_of(p, g)), _MM_HINT_T1);
    if (l.has_zeros) _mm_prefetch(reinterpret_cast<const char*>(l.zeros_of(p, g)), _MM_HINT_T1);
  }
}

// Issues L2 prefetches of group g of NB blocks (pg: the group in block 0),
// with its scales and zero points when they sit outside the group (g >= 0;
// their sequential stream is left to the hardware prefetcher when g < 0).
template <int NB>
__attribute__((always_inline)) inline void prefetch_group(const PackedLayout& l, const uint8_t* pg, int g) {
  prefetch_span<NB>(l, pg, l.group_bytes);
  if (g >= 0) prefetch_group_constants<NB>(l, pg, g);
}

// Computes an MR x (16 * NB) tile: activation rows from `act` (m0..), blocks
// starting at `block`; stores rows < m0 + act.valid.
// prefetch: the weights of the next column step (their group g is prefetched
// while group g of this one is computed), or nullptr.
// stream: requests each block's lines kGemvStreamAheadBytes ahead into L1 as
// the groups are read (the GEMV's decode row; ymm_gemm_impl.h, GemvFetch),
// or nullptr.
template <int BITS, int KB, int MR, int NB, bool ZEROS, class Act>
void tile(const GemmArgs& a, const Act& act, int m0, int block, const uint8_t* prefetch = nullptr,
          const StreamAhead* stream = nullptr) {
  const PackedLayout& l = *a.w;
  const uint8_t* blk[NB];
  for (int b = 0; b < NB; ++b) blk[b] = a.body + int64_t(block + b) * l.block_bytes;
  // Float accumulators live in L1 (touched once per group): this keeps the
  // vector registers for the MR x NB integer accumulators of the inner loop.
  alignas(64) float fbuf[MR][NB][16];
  for (int r = 0; r < MR; ++r)
    for (int b = 0; b < NB; ++b) _mm512_store_ps(fbuf[r][b], _mm512_setzero_ps());

  for (int g = 0; g < l.groups; ++g) {
    const uint8_t* gp[NB];
    for (int b = 0; b < NB; ++b) gp[b] = blk[b] + int64_t(g) * l.group_bytes;
    if (prefetch && l.superblocks == 1) prefetch_group<NB>(l, prefetch + int64_t(g) * l.group_bytes, g);
    if (stream) stream->request<NB, ZEROS>(gp[0], g);
    // Accumulators start at zero (a zeroing idiom: no copies of a shared
    // initial value); the weight-offset term is added after the dot products.
    __m512i acc[MR][NB];
    for (int r = 0; r < MR; ++r)
      for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_setzero_si512();
    auto xs = act.at_group(g, l.group_size);
    const uint8_t* sb[NB];
    for (int b = 0; b < NB; ++b) sb[b] = gp[b];
    if (l.superblocks == 1) {
      // The common case (group_size == kb): no loop-carried register shuffles.
      dot_superblock<BITS, KB, MR, NB>(sb, xs, acc, std::make_integer_sequence<int, KB / 4>{});
    } else {
      // A long group's next-step bytes are requested superblock by
      // superblock as this step reads its own (the last one with the rest of
      // the group: scales, zero points): requested all at the group's start,
      // a per-channel group of 4096 8-bit values sent 2048 prefetches in one
      // burst and the 4x32 tile ran 1.2-1.3x slower than with groups of 32.
      const uint8_t* pf = prefetch ? prefetch + int64_t(g) * l.group_bytes : nullptr;
      if (pf) prefetch_group_constants<NB>(l, pf, g);
      for (int s = 0; s < l.superblocks; ++s) {
        if (pf) {
          const int64_t end = s + 1 < l.superblocks ? l.superblock_bytes : l.group_bytes - s * l.superblock_bytes;
          prefetch_span<NB>(l, pf + s * l.superblock_bytes, end);
        }
        dot_superblock<BITS, KB, MR, NB>(sb, xs, acc, std::make_integer_sequence<int, KB / 4>{});
        for (int b = 0; b < NB; ++b) sb[b] += l.superblock_bytes;
        xs.advance(KB);
      }
    }
    add_group<BITS, MR, NB, ZEROS>(l, act, g, gp, acc, fbuf);
  }
  store_tile<MR, NB>(a, act, m0, block, blk, fbuf);
}

// ---- Unpack once, reuse across m-tiles -------------------------------------
// With several m-tiles per column step, unpacking the weights in every tile
// repeats the same shifts and masks on the two vector ports. Instead a chunk
// of k of the step's NB blocks (about kChunkBytes once unpacked, whole groups)
// is unpacked once into an L1 buffer, [k / 4][NB][64] bytes, and every m-tile
// of a pass of up to kPassRows rows runs its inner loop on it: vpdpbusd and
// loads, nothing else, between the group epilogues.
// Declared once in kernels/manifest.toml ([shared_unpack]).
constexpr int kChunkBytes = kSharedUnpackChunkBytes;  // unpacked weights per chunk: L1-resident
constexpr int kMaxChunkGroupSize = kSharedUnpackMaxGroupSize;  // the float epilogue's exactness bound
constexpr int kPassRows = kSharedUnpackPassRows;

template <int BITS, int KB, int NB, int J>
__attribute__((always_inline)) inline void unpack_store(const uint8_t* const* sb, uint8_t* out) {
  for (int b = 0; b < NB; ++b) _mm512_store_si512(out + (J * NB + b) * 64, unpack_block<BITS, KB, J>(sb[b]));
}

template <int BITS, int KB, int NB, int... Js>
__attribute__((always_inline)) inline void unpack_superblock(const uint8_t* const* sb, uint8_t* out,
                                                             std::integer_sequence<int, Js...>) {
  (unpack_store<BITS, KB, NB, Js>(sb, out), ...);
}

// Groups [g0, g1) of blocks blk[0..NB) -> ubuf.
template <int BITS, int KB, int NB>
void unpack_chunk(const PackedLayout& l, const uint8_t* const* blk, int g0, int g1, uint8_t* ubuf) {
  for (int g = g0; g < g1; ++g) {
    const uint8_t* sb[NB];
    for (int b = 0; b < NB; ++b) sb[b] = blk[b] + int64_t(g) * l.group_bytes;
    for (int s = 0; s < l.superblocks; ++s) {
      unpack_superblock<BITS, KB, NB>(sb, ubuf, std::make_integer_sequence<int, KB / 4>{});
      ubuf += (KB / 4) * NB * 64;
      for (int b = 0; b < NB; ++b) sb[b] += l.superblock_bytes;
    }
  }
}

// One 4-k block of unpacked weights (u: [NB][64] bytes) into the tile.
template <int MR, int NB, int J>
__attribute__((always_inline)) inline void dot_unpacked(const uint8_t* u, const int8_t* xp,
                                                        __m512i (&acc)[MR][NB]) {
  __m512i w[NB];
  for (int b = 0; b < NB; ++b) w[b] = _mm512_load_si512(u + (J * NB + b) * 64);
  for (int r = 0; r < MR; ++r) {
    const __m512i xb = _mm512_set1_epi32(load_i32(xp + 4 * (J * MR + r)));
    for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_dpbusd_epi32(acc[r][b], w[b], xb);
  }
}

template <int MR, int NB, int... Js>
__attribute__((always_inline)) inline void dot_unpacked_superblock(const uint8_t* u, const int8_t* xp,
                                                                   __m512i (&acc)[MR][NB],
                                                                   std::integer_sequence<int, Js...>) {
  (dot_unpacked<MR, NB, Js>(u, xp, acc), ...);
}

// Groups [g0, g1) of one MR x (16 * NB) tile from unpacked weights.
// prefetch: packed bytes to bring into L2 (group i at prefetch + i *
// group_bytes, i < g1 - g0), or nullptr.
template <int BITS, int KB, int MR, int NB, bool ZEROS, bool ONE_SUPERBLOCK>
void tile_chunk(const PackedLayout& l, const Panel<MR>& act, const uint8_t* const* blk, const uint8_t* ubuf,
                int g0, int g1, float (*fbuf)[NB][16], const uint8_t* prefetch) {
  constexpr int64_t kSuperblockBytes = (KB / 4) * NB * 64;  // unpacked
  for (int g = g0; g < g1; ++g) {
    if (prefetch) prefetch_group<NB>(l, prefetch + int64_t(g - g0) * l.group_bytes, -1);
    const uint8_t* gp[NB];
    for (int b = 0; b < NB; ++b) gp[b] = blk[b] + int64_t(g) * l.group_bytes;
    __m512i acc[MR][NB];
    for (int r = 0; r < MR; ++r)
      for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_setzero_si512();
    const int8_t* xp = act.at_group(g, l.group_size).p;
    const uint8_t* u = ubuf + int64_t(g - g0) * l.superblocks * kSuperblockBytes;
    if constexpr (ONE_SUPERBLOCK) {
      dot_unpacked_superblock<MR, NB>(u, xp, acc, std::make_integer_sequence<int, KB / 4>{});
    } else {
      for (int s = 0; s < l.superblocks; ++s) {
        dot_unpacked_superblock<MR, NB>(u, xp, acc, std::make_integer_sequence<int, KB / 4>{});
        u += kSuperblockBytes;
        xp += KB * MR;
      }
    }
    add_group<BITS, MR, NB, ZEROS>(l, act, g, gp, acc, launder(fbuf));
  }
}

// Rows [a.m_begin, a.m_end) (panels of MR rows) x one column step of NB
// blocks at `block`. next: the packed weights of the next column step (to
// prefetch), or nullptr.
template <int BITS, int KB, int MR, int NB, bool ZEROS>
void column_step_unpacked(const GemmArgs& a, int block, const uint8_t* next) {
  const PackedLayout& l = *a.w;
  const QuantizedActivations& x = *a.x;
  const uint8_t* blk[NB];
  for (int b = 0; b < NB; ++b) blk[b] = a.body + int64_t(block + b) * l.block_bytes;
  const int chunk_k = kChunkBytes / (NB * 16);
  const int chunk_groups = l.group_size >= chunk_k ? 1 : chunk_k / l.group_size;
  constexpr int kTiles = kPassRows / MR;
  constexpr int kUbufBytes =
      kChunkBytes > kMaxChunkGroupSize * NB * 16 ? kChunkBytes : kMaxChunkGroupSize * NB * 16;
  alignas(64) uint8_t ubuf[kUbufBytes];
  alignas(64) float fbuf[kTiles][MR][NB][16];
  for (int m0 = a.m_begin; m0 < a.m_end; m0 += kTiles * MR) {
    const int m1 = a.m_end - m0 < kTiles * MR ? a.m_end : m0 + kTiles * MR;
    const int tiles = (m1 - m0 + MR - 1) / MR;
    const bool last_pass = m1 == a.m_end;
    for (int t = 0; t < tiles; ++t)
      for (int r = 0; r < MR; ++r)
        for (int b = 0; b < NB; ++b) _mm512_store_ps(fbuf[t][r][b], _mm512_setzero_ps());
    for (int g0 = 0; g0 < l.groups; g0 += chunk_groups) {
      const int g1 = l.groups - g0 < chunk_groups ? l.groups : g0 + chunk_groups;
      unpack_chunk<BITS, KB, NB>(l, blk, g0, g1, ubuf);
      // The last tile prefetches what the next unpack reads: this step's
      // next chunk, or (last pass) the next step's first chunk.
      const uint8_t* pf = g1 < l.groups ? blk[0] + int64_t(g1) * l.group_bytes : (last_pass ? next : nullptr);
      for (int t = 0; t < tiles; ++t) {
        const int mt = m0 + t * MR;
        const int valid = m1 - mt < MR ? m1 - mt : MR;
        const uint8_t* tpf = t == tiles - 1 ? pf : nullptr;
        if (l.superblocks == 1) {
          tile_chunk<BITS, KB, MR, NB, ZEROS, true>(l, Panel<MR>(x, mt, valid), blk, ubuf, g0, g1, fbuf[t], tpf);
        } else {
          tile_chunk<BITS, KB, MR, NB, ZEROS, false>(l, Panel<MR>(x, mt, valid), blk, ubuf, g0, g1, fbuf[t], tpf);
        }
      }
    }
    for (int t = 0; t < tiles; ++t) {
      const int mt = m0 + t * MR;
      const int valid = m1 - mt < MR ? m1 - mt : MR;
      store_tile<MR, NB>(a, Panel<MR>(x, mt, valid), mt, block, blk, fbuf[t]);
    }
  }
}

// PF (rows without panels, the GEMV): each step also prefetches the next
// column step's weights into L2, a group per group (a superblock per
// superblock in long groups), across kernel calls (the
// op calls a kernel once per step). See the 256-bit GEMV in ymm_gemm_impl.h:
// decode streams short layers from DRAM, where the hardware prefetchers
// alone leave most of the latency exposed.
// SHARED (the _shared rows): when a call covers more than one m-tile, the
// weights of a column step are unpacked once into L1 k-chunks that every
// m-tile reads; with a single m-tile there is nothing to share and the tile
// unpacks in registers. Without SHARED every m-tile unpacks in registers.
// Groups over kMaxChunkGroupSize: selection never gives them to the SHARED
// rows (manifest groups = "short"); run directly, such a row computes them
// as the in-register tile does.
template <int BITS, int KB, int MR, int NB, bool ZEROS, bool PF = false, bool SHARED = false, bool STREAM = false>
void run_z(const GemmArgs& a) {
  // Weights of NB blocks stay in cache while all m-tiles pass over them.
  const QuantizedActivations& x = *a.x;
  const bool panels = MR > 1 && x.panel_rows == MR;
  // The next column step is prefetched if the layer has one, not only if this
  // call covers it: the op calls a kernel once per column step, so a bound of
  // a.block_end would never prefetch (it did not, until the 4x32 tile at
  // m = 4 on 49152x576 8-bit took 1.7x the time of the 4x16 tile's single
  // stream: two 16-row blocks read in step over short rows leave the
  // hardware prefetchers half the DRAM bandwidth, docs/benchmarks.md).
  if (SHARED && panels && a.m_end - a.m_begin > MR && a.w->group_size <= kMaxChunkGroupSize) {
    int b = a.block_begin;
    for (; b + NB <= a.block_end; b += NB) {
      const uint8_t* next = b + 2 * NB <= a.w->n_blocks ? a.body + int64_t(b + NB) * a.w->block_bytes : nullptr;
      column_step_unpacked<BITS, KB, MR, NB, ZEROS>(a, b, next);
    }
    // Column tail (fewer than NB blocks): two blocks, then one, at a time.
    if constexpr (NB > 2) {
      for (; b + 2 <= a.block_end; b += 2) column_step_unpacked<BITS, KB, MR, 2, ZEROS>(a, b, nullptr);
    }
    for (; b < a.block_end; ++b) column_step_unpacked<BITS, KB, MR, 1, ZEROS>(a, b, nullptr);
    return;
  }
  const StreamAhead stream(*a.w);
  auto rows = [&](int b, auto nb) {
    constexpr int NBS = decltype(nb)::value;
    int m = a.m_begin;
    if (panels) {
      // Panels hold MR rows each (padded with zero rows): no row tail.
      for (; m < a.m_end; m += MR) {
        const int valid = a.m_end - m < MR ? a.m_end - m : MR;
        // The last m-tile of a column step prefetches the next step's weights
        // (STREAM: the first one requests the step's own lines ahead instead).
        const uint8_t* next = !STREAM && m + MR >= a.m_end && b + 2 * NBS <= a.w->n_blocks
                                  ? a.body + int64_t(b + NBS) * a.w->block_bytes
                                  : nullptr;
        tile<BITS, KB, MR, NBS, ZEROS>(a, Panel<MR>(x, m, valid), m, b, next,
                                       STREAM && m == a.m_begin ? &stream : nullptr);
      }
      return;
    }
    const uint8_t* next = PF && b + 2 * NBS <= a.w->n_blocks ? a.body + int64_t(b + NBS) * a.w->block_bytes
                                                           : nullptr;
    for (; m + MR <= a.m_end; m += MR)
      tile<BITS, KB, MR, NBS, ZEROS>(a, RowPointers<MR>(x, m, MR), m, b, m == a.m_begin ? next : nullptr,
                                     STREAM && m == a.m_begin ? &stream : nullptr);
    for (; m < a.m_end; ++m) tile<BITS, KB, 1, NBS, ZEROS>(a, RowPointers<1>(x, m, 1), m, b);
  };
  int b = a.block_begin;
  for (; b + NB <= a.block_end; b += NB) rows(b, std::integral_constant<int, NB>{});
  for (; b < a.block_end; ++b) rows(b, std::integral_constant<int, 1>{});
}

template <int MR, int NB, bool PF = false, bool SHARED = false, bool STREAM = false>
struct Tile {
  template <int BITS, int KB, bool ZEROS>
  static void run(const GemmArgs& a) {
    run_z<BITS, KB, MR, NB, ZEROS, PF, SHARED, STREAM>(a);
  }
};

}  // namespace

void qd8_f32_qbwn16k4_gemv_1x64__avx512vnni(const GemmArgs& a) { dispatch_layout<Tile<1, 4>>(a); }
void qd8_f32_qbwn16k4_gemv_1x64_prefetch__avx512vnni(const GemmArgs& a) { dispatch_layout<Tile<1, 4, true>>(a); }
void qd8_f32_qbwn16k4_gemv_1x64_stream__avx512vnni(const GemmArgs& a) {
  dispatch_layout<Tile<1, 4, false, false, true>>(a);
}
void qd8p4x4_f32_qbwn16k4_gemm_4x32__avx512vnni(const GemmArgs& a) { dispatch_layout<Tile<4, 2>>(a); }
void qd8p4x4_f32_qbwn16k4_gemm_4x32_stream__avx512vnni(const GemmArgs& a) {
  dispatch_layout<Tile<4, 2, false, false, true>>(a);
}
void qd8p4x4_f32_qbwn16k4_gemm_4x32_shared__avx512vnni(const GemmArgs& a) {
  dispatch_layout<Tile<4, 2, false, true>>(a);
}
void qd8p8x4_f32_qbwn16k4_gemm_8x32__avx512vnni(const GemmArgs& a) { dispatch_layout<Tile<8, 2>>(a); }
void qd8p8x4_f32_qbwn16k4_gemm_8x32_shared__avx512vnni(const GemmArgs& a) {
  dispatch_layout<Tile<8, 2, false, true>>(a);
}

namespace {

// The row's quantization parameters (one pass over its k floats, k a
// multiple of 16), as quantize_activations_scalar computes them.
inline RowQuantParams row_params_avx512(const float* xr, int k) {
  __m512 lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps(), probe = _mm512_setzero_ps();
  for (int i = 0; i < k; i += 16) {
    const __m512 v = _mm512_loadu_ps(xr + i);
    lo = _mm512_min_ps(lo, v);
    hi = _mm512_max_ps(hi, v);
    probe = _mm512_fmadd_ps(v, _mm512_setzero_ps(), probe);  // NaN if any inf/NaN
  }
  const bool finite = !std::isnan(_mm512_reduce_add_ps(probe));
  return row_quant_params(_mm512_reduce_min_ps(lo), _mm512_reduce_max_ps(hi), finite);
}

// 16 quantized values as int32 (clamped to int8). cvtps rounds to
// nearest-even like nearbyint.
__attribute__((always_inline)) inline __m512i quantize16(const float* x, __m512 inv, __m512i zero) {
  const __m512i v = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x), inv)), zero);
  return _mm512_min_epi32(_mm512_max_epi32(v, _mm512_set1_epi32(-128)), _mm512_set1_epi32(127));
}

}  // namespace

void quantize_activations__avx512(const float* x, int64_t x_stride, int m_begin, int m_end,
                                  QuantizedActivations& out) {
  // Same arithmetic as quantize_activations_scalar, 16 lanes at a time
  // (k is a multiple of 16).
  const int k = out.k;
  const int gs = out.group_size;
  for (int r = m_begin; r < m_end; ++r) {
    const float* xr = x + r * x_stride;
    const RowQuantParams p = row_params_avx512(xr, k);
    int8_t* q = out.q + r * out.row_stride;
    int32_t* sums = out.group_sums + int64_t(r) * out.groups;
    out.scale[r] = p.scale;
    out.zero[r] = p.zero;
    if (!p.finite) {
      std::memset(q, 0, k);
      for (int g = 0; g < out.groups; ++g) sums[g] = 0;
      continue;
    }
    const __m512 inv = _mm512_set1_ps(p.inv_scale);
    const __m512i zero = _mm512_set1_epi32(p.zero);
    for (int g = 0; g < out.groups; ++g) {
      __m512i a = _mm512_setzero_si512();
      for (int i = g * gs; i < (g + 1) * gs; i += 16) {
        const __m512i v = quantize16(xr + i, inv, zero);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm512_cvtepi32_epi8(v));
        a = _mm512_add_epi32(a, v);
      }
      sums[g] = _mm512_reduce_add_epi32(a);
    }
  }
}

}  // namespace torchao_kernels

namespace torchao_kernels {

namespace {

#include "kernels/x86/panel_transpose.h"

}  // namespace

void quantize_activation_panels__avx512(const float* x, int64_t x_stride, int m_begin, int m_end,
                                        QuantizedActivations& out) {
  // quantize_activations__avx512 followed by pack_activation_panels, in one
  // pass: four rows at a time, their 16-byte chunks transposed in registers
  // and stored straight into the panel (no second pass over the bytes).
  // Rows past m in the last panel become zero rows. Needs panel_kr = 4 and
  // panel_rows a multiple of 4; rows [m_begin, m_end) start on a panel.
  const int k = out.k, gs = out.group_size, groups = out.groups, P = out.panel_rows;
  const int m_pad = m_end == out.m ? (out.m + P - 1) / P * P : m_end;
  for (int r0 = m_begin; r0 < m_pad; r0 += 4) {
    __m512 inv[4];
    __m512i zero[4];
    bool valid[4], live[4];  // live: a finite row below m (others quantize to zeros)
    for (int i = 0; i < 4; ++i) {
      const int r = r0 + i;
      valid[i] = r < out.m;
      live[i] = false;
      inv[i] = _mm512_setzero_ps();
      zero[i] = _mm512_setzero_si512();
      if (!valid[i]) continue;
      const RowQuantParams p = row_params_avx512(x + r * x_stride, k);
      out.scale[r] = p.scale;
      out.zero[r] = p.zero;
      if (p.finite) {
        live[i] = true;
        inv[i] = _mm512_set1_ps(p.inv_scale);
        zero[i] = _mm512_set1_epi32(p.zero);
      }
    }
    const float* xr[4];
    for (int i = 0; i < 4; ++i) xr[i] = x + (valid[i] ? r0 + i : m_begin) * x_stride;
    int8_t* panel = out.panels + int64_t(r0 / P) * out.panel_stride + 4 * (r0 % P);
    int32_t* psums = out.panel_sums + int64_t(r0 / P) * out.panel_sums_stride + (r0 % P);
    float* pfsums = out.panel_sums_f + int64_t(r0 / P) * out.panel_sums_stride + (r0 % P);
    for (int g = 0; g < groups; ++g) {
      __m512i s[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                      _mm512_setzero_si512()};
      for (int j = g * gs; j < (g + 1) * gs; j += 16) {
        __m128i b[4];
        for (int i = 0; i < 4; ++i) {
          if (!live[i]) {
            b[i] = _mm_setzero_si128();
            if (valid[i]) _mm_storeu_si128(reinterpret_cast<__m128i*>(out.q + (r0 + i) * out.row_stride + j), b[i]);
            continue;
          }
          const __m512i v = quantize16(xr[i] + j, inv[i], zero[i]);
          s[i] = _mm512_add_epi32(s[i], v);
          b[i] = _mm512_cvtepi32_epi8(v);
          if (valid[i]) _mm_storeu_si128(reinterpret_cast<__m128i*>(out.q + (r0 + i) * out.row_stride + j), b[i]);
        }
        __m128i c[4];
        transpose_4x4_dwords(b[0], b[1], b[2], b[3], c);
        // Chunk j/4 + t of these four rows: P * 4 bytes per chunk in the panel.
        for (int t = 0; t < 4; ++t)
          _mm_storeu_si128(reinterpret_cast<__m128i*>(panel + int64_t(j / 4 + t) * P * 4), c[t]);
      }
      for (int i = 0; i < 4; ++i) {
        const int32_t sum = _mm512_reduce_add_epi32(s[i]);
        if (valid[i]) out.group_sums[int64_t(r0 + i) * groups + g] = sum;
        psums[int64_t(g) * P + i] = sum;
        pfsums[int64_t(g) * P + i] = static_cast<float>(sum);
      }
    }
  }
}

}  // namespace torchao_kernels
