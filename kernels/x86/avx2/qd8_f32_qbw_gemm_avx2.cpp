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

}  // namespace

void qd8_f32_qbwn16k4_gemv_1x32__avx2(const GemmArgs& a) { dispatch_layout<Gemv<2, false>>(a); }
void qd8_f32_qbwn16k4_gemv_1x32_prefetch__avx2(const GemmArgs& a) { dispatch_layout<Gemv<2, true>>(a); }
void qd8_f32_qbwn16k4_gemm_4x16__avx2(const GemmArgs& a) { dispatch_layout<Tile<4, 2>>(a); }
void qd8p4x4_f32_qbwn16k4_gemm_4x16_shared__avx2(const GemmArgs& a) { dispatch_layout<SharedTile<4, 2>>(a); }

void quantize_activations__avx2(const float* x, int64_t x_stride, int m_begin, int m_end,
                                QuantizedActivations& out) {
  // Same arithmetic as quantize_activations_scalar, 8 lanes at a time.
  const int k = out.k;
  for (int r = m_begin; r < m_end; ++r) {
    const float* xr = x + r * x_stride;
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps(), probe = _mm256_setzero_ps();
    for (int i = 0; i < k; i += 8) {
      const __m256 v = _mm256_loadu_ps(xr + i);
      lo = _mm256_min_ps(lo, v);
      hi = _mm256_max_ps(hi, v);
      probe = _mm256_add_ps(probe, _mm256_mul_ps(v, _mm256_setzero_ps()));
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
    const RowQuantParams p = row_quant_params(lmin, hmax, finite);
    int8_t* q = out.q + r * out.row_stride;
    int32_t* sums = out.group_sums + int64_t(r) * out.groups;
    const __m256 inv = _mm256_set1_ps(p.inv_scale);
    const __m256i zero = _mm256_set1_epi32(p.zero);
    const __m256i qmin = _mm256_set1_epi32(-128), qmax = _mm256_set1_epi32(127);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int g = 0; g < out.groups; ++g) {
      __m256i s = _mm256_setzero_si256();
      for (int i = g * out.group_size; i < (g + 1) * out.group_size; i += 16) {
        __m256i v0 = _mm256_setzero_si256(), v1 = _mm256_setzero_si256();
        if (p.finite) {
          v0 = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xr + i), inv)), zero);
          v1 = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xr + i + 8), inv)), zero);
          v0 = _mm256_min_epi32(_mm256_max_epi32(v0, qmin), qmax);
          v1 = _mm256_min_epi32(_mm256_max_epi32(v1, qmin), qmax);
        }
        // packs work per 128-bit lane: [v0 0-3, v1 0-3 | v0 4-7, v1 4-7] as int16,
        // then bytes duplicated; the permute restores element order.
        const __m256i p16 = _mm256_packs_epi32(v0, v1);
        const __m256i p8 = _mm256_packs_epi16(p16, p16);
        const __m256i ordered = _mm256_permutevar8x32_epi32(p8, order);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm256_castsi256_si128(ordered));
        s = _mm256_add_epi32(s, _mm256_add_epi32(v0, v1));
      }
      alignas(32) int32_t s8[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(s8), s);
      sums[g] = s8[0] + s8[1] + s8[2] + s8[3] + s8[4] + s8[5] + s8[6] + s8[7];
    }
    out.scale[r] = p.scale;
    out.zero[r] = p.zero;
  }
}

}  // namespace torchao_kernels
