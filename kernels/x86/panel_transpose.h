// The activation-panel transpose shared by the x86 panel quantizers
// (quantize_activation_panels__avx2 / __avx512): four rows' 16 quantized
// bytes become four panel chunks of kr = 4 bytes per row. SSE2 only, so each
// translation unit includes it with its own flags, inside its anonymous
// namespace, after <immintrin.h>.

// out[c] = {r0 chunk c, r1 chunk c, r2 chunk c, r3 chunk c} (4-byte chunks).
__attribute__((always_inline)) inline void transpose_4x4_dwords(__m128i r0, __m128i r1, __m128i r2, __m128i r3,
                                                                __m128i (&out)[4]) {
  const __m128i t0 = _mm_unpacklo_epi32(r0, r1), t1 = _mm_unpackhi_epi32(r0, r1);
  const __m128i t2 = _mm_unpacklo_epi32(r2, r3), t3 = _mm_unpackhi_epi32(r2, r3);
  out[0] = _mm_unpacklo_epi64(t0, t2);
  out[1] = _mm_unpackhi_epi64(t0, t2);
  out[2] = _mm_unpacklo_epi64(t1, t3);
  out[3] = _mm_unpackhi_epi64(t1, t3);
}
