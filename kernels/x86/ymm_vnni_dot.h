// The 256-bit VNNI dot product for kernels/x86/ymm_gemm_impl.h, shared by the
// VEX (AVX-VNNI) and EVEX (AVX512-VNNI + VL) translation units. Include it
// inside their anonymous namespace after defining TK_YMM_DPBUSD as the
// intrinsic of their encoding (_mm256_dpbusd_avx_epi32 / _mm256_dpbusd_epi32):
// u8 weights x s8 activations, 4 products per int32 lane, no saturation.
#pragma once

struct Dot {
  template <int BITS, int KB>
  static constexpr bool kPairSums = false;  // vpdpbusd already sums 4 products per lane
  template <int BITS, int KB>
  static constexpr int kPath = 0;
  static inline __m256i dot16(__m256i a, __m256i, __m256i) { return a; }
  static inline __m256i widen(__m256i a) { return a; }
  template <int BITS>
  static inline __m256i dot(__m256i acc, __m256i w, __m256i x) {
    return TK_YMM_DPBUSD(acc, w, x);
  }
};
