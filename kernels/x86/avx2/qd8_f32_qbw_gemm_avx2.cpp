// AVX2 kernels for format n16k4 (compiled with -mavx2 -mfma).
//
// The dot product is vpmaddubsw (u8 weights x s8 activations -> int16 pair
// sums) then vpmaddwd with ones (-> int32). vpmaddubsw saturates at int16:
// a pair sum is at most 2 * (2^b - 1) * 128, safe for b <= 7 (32512). For
// 8-bit weights each byte is split into nibbles, w = 16 * hi + lo, and the
// two halves are summed in int32 (the hi half scaled by vpmaddwd with 16),
// so the result stays exact.
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <utility>

#include "kernels/format/layout_dispatch.h"
#include "kernels/format/plane_layout.h"
#include "kernels/generated/kernel_functions.h"
#include "kernels/x86/stream_ahead.h"

namespace torchao_kernels {

namespace {

struct Dot {
  // Weights of at most 4 bits: |u * x| <= 15 * 128, so a vpmaddubsw lane
  // (2 products) stays within 3840 and 8 of them (a 32-k superblock) within
  // int16: accumulate in int16 (vpmaddubsw + vpaddw) and widen once per
  // superblock, instead of vpmaddwd + vpaddd for every 4 k-values.
  template <int BITS, int KB>
  static constexpr bool kPairSums = BITS <= 4 && KB <= 32;
  // Shared-unpack tiles (ymm_gemm_impl.h): pair sums for <= 4 bits; 8-bit
  // bytes split in nibbles once while unpacking, each nibble plane in int16
  // pair sums (15 * 128 * 2 * 8 = 30720 per superblock of 32: no
  // saturation); 5-7 bits: vpmaddubsw + vpmaddwd per block.
  template <int BITS, int KB>
  static constexpr int kPath = kPairSums<BITS, KB> ? 1 : (BITS == 8 ? 2 : 0);
  static inline __m256i dot16(__m256i acc16, __m256i w, __m256i x) {
    // vpaddw into the accumulator's own register: from the intrinsic GCC
    // put the sum in the product's register and copied it back, a move per
    // vpmaddubsw in the GEMM tiles.
    const __m256i p = _mm256_maddubs_epi16(w, x);
    asm("vpaddw %1, %0, %0" : "+x"(acc16) : "x"(p));
    return acc16;
  }
  static inline __m256i widen(__m256i acc16) { return _mm256_madd_epi16(acc16, _mm256_set1_epi16(1)); }
  template <int BITS>
  static inline __m256i dot(__m256i acc, __m256i w, __m256i x) {
    const __m256i ones = _mm256_set1_epi16(1);
    if constexpr (BITS <= 7) {
      return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), ones));
    } else {
      const __m256i nib = _mm256_set1_epi8(0x0F);
      const __m256i lo = _mm256_and_si256(w, nib);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), nib);
      const __m256i plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, x), ones);
      const __m256i phi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x), _mm256_set1_epi16(16));
      return _mm256_add_epi32(acc, _mm256_add_epi32(plo, phi));
    }
  }
};

#include "kernels/x86/ymm_gemm_impl.h"

// The tiles for 8-bit weights over int16 activation panels (Dot::kPath 3 in
// ymm_gemm_impl.h: SharedTile and WordTile): the same tile code compiled
// again with a Dot that takes path 3 for 8-bit weights. vpmaddubsw cannot multiply a full
// weight byte by an int8 activation without saturating, so path 2 splits the
// byte in nibbles: 2 vpmaddubsw per 32 products plus the widening. vpmaddwd
// on int16 operands is exact at 2 per 32 products and needs no widening
// (docs/benchmarks.md, "8-bit weights over int16 panels").
namespace int16_panels {
struct Dot : ::torchao_kernels::Dot {
  template <int BITS, int KB>
  static constexpr int kPath = BITS == 8 ? 3 : ::torchao_kernels::Dot::kPath<BITS, KB>;
};
#include "kernels/x86/ymm_gemm_impl.h"
}  // namespace int16_panels

}  // namespace

void qd8_f32_qbwn16k4_gemv_1x32__avx2(const GemmArgs& a) { dispatch_layout<Gemv<2, GemvFetch::kHardware>>(a); }
void qd8_f32_qbwn16k4_gemv_1x32_prefetch__avx2(const GemmArgs& a) { dispatch_layout<Gemv<2, GemvFetch::kNextStep>>(a); }
void qd8_f32_qbwn16k4_gemv_1x32_stream__avx2(const GemmArgs& a) { dispatch_layout<Gemv<2, GemvFetch::kStream>>(a); }
void qd8_f32_qbwn16k4_gemm_4x16__avx2(const GemmArgs& a) { dispatch_layout<Tile<4, 2>>(a); }
void qd8_f32_qbwn16k4_gemm_4x16_stream__avx2(const GemmArgs& a) { dispatch_layout<Tile<4, 2, true>>(a); }
void qd8p4x4_f32_qbwn16k4_gemm_4x16_shared__avx2(const GemmArgs& a) { dispatch_layout<SharedTile<4, 2>>(a); }
// 8-bit weights only (the row's bits): int16 panels hold no other path's operands.
void qd8p4x4i16_f32_qbwn16k4_gemm_4x16_shared__avx2(const GemmArgs& a) {
  dispatch_kb<int16_panels::SharedTile<4, 2>, 8>(a);
}
void qd8p4x4i16_f32_qbwn16k4_gemm_4x16__avx2(const GemmArgs& a) { dispatch_kb<int16_panels::WordTile<4, 2>, 8>(a); }

namespace {

// The row's quantization parameters (min / max over the row, with 0) and
// whether it is finite: x * 0 is NaN exactly for NaN and infinities, and
// OR-ing those products keeps a NaN's bits (finite x give +-0). An OR, not an
// add: the add's latency made this pass a third of the quantizer's time.
RowQuantParams row_params_avx2(const float* xr, int k) {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps(), probe = _mm256_setzero_ps();
  for (int i = 0; i < k; i += 8) {
    const __m256 v = _mm256_loadu_ps(xr + i);
    lo = _mm256_min_ps(lo, v);
    hi = _mm256_max_ps(hi, v);
    probe = _mm256_or_ps(probe, _mm256_mul_ps(v, _mm256_setzero_ps()));
  }
  alignas(32) float l8[8], h8[8], p8[8];
  _mm256_store_ps(l8, lo);
  _mm256_store_ps(h8, hi);
  _mm256_store_ps(p8, probe);
  float lmin = 0.0f, hmax = 0.0f;
  bool finite = true;
  for (int i = 0; i < 8; ++i) {
    lmin = l8[i] < lmin ? l8[i] : lmin;
    hmax = h8[i] > hmax ? h8[i] : hmax;
    if (std::isnan(p8[i])) finite = false;
  }
  return row_quant_params(lmin, hmax, finite);
}

// 16 values of a finite row: q = clamp(nearbyint(x * inv) + zero, -128, 127)
// as 16 bytes in k order; sum += the 16 q (in 8 int32 lanes).
__attribute__((always_inline)) inline __m128i quantize16(const float* x, __m256 inv, __m256i zero, __m256i& sum) {
  const __m256i qmin = _mm256_set1_epi32(-128), qmax = _mm256_set1_epi32(127);
  __m256i v0 = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), inv)), zero);
  __m256i v1 = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), inv)), zero);
  v0 = _mm256_min_epi32(_mm256_max_epi32(v0, qmin), qmax);
  v1 = _mm256_min_epi32(_mm256_max_epi32(v1, qmin), qmax);
  sum = _mm256_add_epi32(sum, _mm256_add_epi32(v0, v1));
  // packs work per 128-bit lane: [v0 0-3, v1 0-3 | v0 4-7, v1 4-7] as int16,
  // then bytes duplicated; the permute restores element order.
  const __m256i p16 = _mm256_packs_epi32(v0, v1);
  const __m256i p8 = _mm256_packs_epi16(p16, p16);
  return _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

// The 8 lanes of each of four sums added up: {sum(s0), sum(s1), sum(s2), sum(s3)}.
__attribute__((always_inline)) inline __m128i reduce4(__m256i s0, __m256i s1, __m256i s2, __m256i s3) {
  const __m256i t = _mm256_hadd_epi32(_mm256_hadd_epi32(s0, s1), _mm256_hadd_epi32(s2, s3));
  return _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
}

#include "kernels/x86/panel_transpose.h"

}  // namespace

void quantize_activations__avx2(const float* x, int64_t x_stride, int m_begin, int m_end,
                                QuantizedActivations& out) {
  // Same arithmetic as quantize_activations_scalar, 8 lanes at a time.
  const int k = out.k;
  for (int r = m_begin; r < m_end; ++r) {
    const float* xr = x + r * x_stride;
    const RowQuantParams p = row_params_avx2(xr, k);
    int8_t* q = out.q + r * out.row_stride;
    int32_t* sums = out.group_sums + int64_t(r) * out.groups;
    out.scale[r] = p.scale;
    out.zero[r] = p.zero;
    if (!p.finite) {
      std::memset(q, 0, k);
      for (int g = 0; g < out.groups; ++g) sums[g] = 0;
      continue;
    }
    const __m256 inv = _mm256_set1_ps(p.inv_scale);
    const __m256i zero = _mm256_set1_epi32(p.zero);
    for (int g = 0; g < out.groups; ++g) {
      __m256i s = _mm256_setzero_si256();
      for (int i = g * out.group_size; i < (g + 1) * out.group_size; i += 16)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), quantize16(xr + i, inv, zero, s));
      sums[g] = _mm_cvtsi128_si32(reduce4(s, s, s, s));
    }
  }
}

namespace {

// quantize_activation_panels__avx2 for int8 or (INT16) int16 panels.
template <bool INT16>
void quantize_panels_avx2(const float* x, int64_t x_stride, int m_begin, int m_end, QuantizedActivations& out) {
  const int k = out.k, gs = out.group_size, groups = out.groups, P = out.panel_rows;
  const int m_pad = m_end == out.m ? (out.m + P - 1) / P * P : m_end;
  for (int r0 = m_begin; r0 < m_pad; r0 += 4) {
    // Per row as scalars, broadcast where used (loads): four rows' vectors
    // and sums would not fit the 16 registers.
    float inv[4];
    int32_t zero[4];
    bool valid[4], live[4];  // live: a finite row below m (others quantize to zeros)
    const float* xr[4];
    for (int i = 0; i < 4; ++i) {
      const int r = r0 + i;
      valid[i] = r < out.m;
      live[i] = false;
      inv[i] = 0.0f;
      zero[i] = 0;
      xr[i] = x + (valid[i] ? r : m_begin) * x_stride;
      if (!valid[i]) continue;
      const RowQuantParams p = row_params_avx2(xr[i], k);
      out.scale[r] = p.scale;
      out.zero[r] = p.zero;
      if (p.finite) {
        live[i] = true;
        inv[i] = p.inv_scale;
        zero[i] = p.zero;
      }
    }
    int8_t* panel = out.panels + int64_t(r0 / P) * out.panel_stride + (INT16 ? 8 : 4) * (r0 % P);
    int32_t* psums = out.panel_sums + int64_t(r0 / P) * out.panel_sums_stride + (r0 % P);
    float* pfsums = out.panel_sums_f + int64_t(r0 / P) * out.panel_sums_stride + (r0 % P);
    for (int g = 0; g < groups; ++g) {
      __m256i s[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                      _mm256_setzero_si256()};
      for (int j = g * gs; j < (g + 1) * gs; j += 16) {
        __m128i b[4];
        for (int i = 0; i < 4; ++i) {
          b[i] = live[i] ? quantize16(xr[i] + j, _mm256_set1_ps(inv[i]), _mm256_set1_epi32(zero[i]), s[i])
                         : _mm_setzero_si128();
          if (valid[i]) _mm_storeu_si128(reinterpret_cast<__m128i*>(out.q + (r0 + i) * out.row_stride + j), b[i]);
        }
        __m128i c[4];
        transpose_4x4_dwords(b[0], b[1], b[2], b[3], c);
        // Chunk j/4 + t of these four rows: P * 4 bytes per chunk in the panel.
        for (int t = 0; t < 4; ++t) {
          if constexpr (INT16) {
            // Each row's chunk as (k0, k2, k1, k3) (quantized_activations.h), widened.
            const __m128i even_odd = _mm_setr_epi8(0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(panel + int64_t(j / 4 + t) * P * 8),
                                _mm256_cvtepi8_epi16(_mm_shuffle_epi8(c[t], even_odd)));
          } else {
            _mm_storeu_si128(reinterpret_cast<__m128i*>(panel + int64_t(j / 4 + t) * P * 4), c[t]);
          }
        }
      }
      // The four rows' sums sit side by side in the panel's sums (P is a
      // multiple of 4 and r0 starts a group of 4 rows).
      const __m128i sum = reduce4(s[0], s[1], s[2], s[3]);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(psums + int64_t(g) * P), sum);
      _mm_storeu_ps(pfsums + int64_t(g) * P, _mm_cvtepi32_ps(sum));
      alignas(16) int32_t s4[4];
      _mm_store_si128(reinterpret_cast<__m128i*>(s4), sum);
      for (int i = 0; i < 4; ++i)
        if (valid[i]) out.group_sums[int64_t(r0 + i) * groups + g] = s4[i];
    }
  }
}

}  // namespace

void quantize_activation_panels__avx2(const float* x, int64_t x_stride, int m_begin, int m_end,
                                      QuantizedActivations& out) {
  // quantize_activations__avx2 followed by pack_activation_panels, in one
  // pass: four rows at a time, their 16-byte chunks transposed in registers
  // and stored straight into the panel (no second pass over the bytes, no
  // 4-byte copies). Rows past m in the last panel become zero rows. Needs
  // panel_kr = 4 and panel_rows a multiple of 4; rows [m_begin, m_end) start
  // on a panel.
  if (out.panel_int16) {
    quantize_panels_avx2<true>(x, x_stride, m_begin, m_end, out);
  } else {
    quantize_panels_avx2<false>(x, x_stride, m_begin, m_end, out);
  }
}

}  // namespace torchao_kernels
