// Embedding lookups, AVX-512 (qbwn1k4_f32_embedding_1x1__avx512,
// _1x16c4__avx512): the shared x86 lookup (kernels/x86/embedding_lookup_impl.h)
// converting 16 values per instruction. Weights of up to 4 bits take a
// value table per scale group: its 2^bits entries scale * float(u - 2^(bits-1)
// - zero) computed once (the same float operations as the reference, so the
// same bits), then one vpermps per 16 values replaces widen + subtract +
// convert + multiply. Wider weights convert directly.
#include <immintrin.h>

#include "kernels/format/embedding_rows.h"
#include "kernels/format/plane_layout.h"
#include "kernels/generated/kernel_functions.h"

namespace torchao_kernels {

namespace {

#include "kernels/x86/embedding_lookup_impl.h"

// Shuffle control and shift counts of store16_plane: 16 values (chunk C of a
// 32-value superblock) of a single P-bit plane, block L (4 values) in the
// 128-bit lane L. Block j = 4C + L lives in unit (j * P) / 8 at bit (j * P) % 8;
// the units are broadcast from the chunk's first byte (P = 4: 8 bytes from
// byte 8C; P = 2: 4 bytes from 4C; P = 1: 4 bytes from 0), so dword i of lane
// L takes byte 4 * ((j * P) / 8 - first unit) + i.
template <int P, int C>
__m512i plane_shuffle() {
  alignas(64) int8_t b[64];
  const int first_unit = (4 * C * P) / 8;
  for (int L = 0; L < 4; ++L)
    for (int i = 0; i < 4; ++i)
      for (int k = 0; k < 4; ++k)
        b[16 * L + 4 * i + k] = k == 0 ? static_cast<int8_t>(4 * (((4 * C + L) * P) / 8 - first_unit) + i)
                                       : static_cast<int8_t>(-128);  // zero
  return _mm512_load_si512(b);
}
template <int P, int C>
__m512i plane_shifts() {
  alignas(64) int32_t s[16];
  for (int L = 0; L < 4; ++L)
    for (int i = 0; i < 4; ++i) s[4 * L + i] = ((4 * C + L) * P) % 8;
  return _mm512_load_si512(s);
}

struct ConvertAvx512 {
  // Single-plane weights of up to 4 bits are converted straight from their
  // units (store16_plane): broadcast, vpshufb, vpsrlvd and the table's
  // vpermps per 16 values, where the general path rebuilds the bytes first.
  static constexpr bool kPlaneChunks = true;

  template <int BITS, bool ZEROS = true>  // ZEROS: the rows have zero points
  struct Group {
    __m512 scale;
    __m512i off;
    // BITS <= 4: entry u = scale * float((u mod 2^BITS) - off). vpermps reads
    // only an index's low 4 bits, so the bits above a value's own (its
    // neighbours', in store16_plane) land on a copy of the same entry.
    __m512 table;
    Group(float s, int zero)
        : scale(_mm512_set1_ps(s)), off(_mm512_set1_epi32((1 << (BITS - 1)) + zero)) {
      if constexpr (BITS <= 4) {
        constexpr int m = (1 << BITS) - 1;
        const __m512i u = _mm512_setr_epi32(0 & m, 1 & m, 2 & m, 3 & m, 4 & m, 5 & m, 6 & m, 7 & m, 8 & m,
                                            9 & m, 10 & m, 11 & m, 12 & m, 13 & m, 14 & m, 15 & m);
        table = _mm512_mul_ps(scale, _mm512_cvtepi32_ps(_mm512_sub_epi32(u, off)));
      } else {
        table = scale;
      }
    }
    explicit Group(__m512 s) : scale(s), off(_mm512_set1_epi32(1 << (BITS - 1))), table(s) {}
    // No zero point: the table's values float(u - 2^(BITS-1)) are constants,
    // so the group costs one broadcast and one multiply.
    static Group symmetric(float s) {
      if constexpr (BITS <= 4) {
        constexpr float o = static_cast<float>(1 << (BITS - 1));
        constexpr int m = (1 << BITS) - 1;
        Group g(_mm512_set1_ps(s));
        g.table = _mm512_mul_ps(
            g.scale, _mm512_setr_ps((0 & m) - o, (1 & m) - o, (2 & m) - o, (3 & m) - o, (4 & m) - o, (5 & m) - o,
                                    (6 & m) - o, (7 & m) - o, (8 & m) - o, (9 & m) - o, (10 & m) - o,
                                    (11 & m) - o, (12 & m) - o, (13 & m) - o, (14 & m) - o, (15 & m) - o));
        return g;
      } else {
        return Group(s, 0);
      }
    }
    // Chunk C (values 16C..16C+15) of a superblock whose only plane (BITS =
    // 1, 2 or 4 bits) starts at `plane`; reads only the plane's bytes.
    template <int C>
    __attribute__((always_inline)) void store16_plane(const uint8_t* plane, float* out) const {
      static_assert(BITS == 1 || BITS == 2 || BITS == 4, "single-plane widths only");
      __m512i units;
      if constexpr (BITS == 4) {
        int64_t q;
        __builtin_memcpy(&q, plane + 8 * C, 8);
        units = _mm512_set1_epi64(q);
      } else {
        int32_t d;
        __builtin_memcpy(&d, plane + (BITS == 2 ? 4 * C : 0), 4);
        units = _mm512_set1_epi32(d);
      }
      const __m512i v = _mm512_srlv_epi32(_mm512_shuffle_epi8(units, plane_shuffle<BITS, C>()),
                                          plane_shifts<BITS, C>());
      _mm512_storeu_ps(out, _mm512_permutexvar_ps(v, table));
    }
    // The 32 values of a superblock whose only plane (BITS = 1, 2 or 4 bits)
    // starts at `plane`. Loading and shifting the 4-bit superblock once for
    // both chunks (3 instructions per 16 values instead of 4, as the AVX2
    // lookup does) made no difference here: 128 n1k4 lookups 3.60-3.62 us in
    // cache either way on a Zen 4 core, the loop bound by its stores.
    __attribute__((always_inline)) void store32_plane(const uint8_t* plane, float* out) const {
      store16_plane<0>(plane, out);
      store16_plane<1>(plane, out + 16);
    }
    __attribute__((always_inline)) void store16(__m128i bytes, float* out) const {
      const __m512i u = _mm512_cvtepu8_epi32(bytes);
      if constexpr (BITS <= 4) {
        _mm512_storeu_ps(out, _mm512_permutexvar_ps(u, table));
      } else {
        _mm512_storeu_ps(out, _mm512_mul_ps(scale, _mm512_cvtepi32_ps(_mm512_sub_epi32(u, off))));
      }
    }
  };
};

}  // namespace

void qbw_f32_embedding_1xNR__avx512(const EmbeddingArgs& a) { lookup<ConvertAvx512>(a); }

}  // namespace torchao_kernels
