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

struct ConvertAvx512 {
  template <int BITS>
  struct Group {
    __m512 scale;
    __m512i off;
    __m512 table;  // BITS <= 4: entry u = scale * float(u - off)
    Group(float s, int zero)
        : scale(_mm512_set1_ps(s)), off(_mm512_set1_epi32((1 << (BITS - 1)) + zero)) {
      if constexpr (BITS <= 4) {
        const __m512i u = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
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
        Group g(_mm512_set1_ps(s));
        g.table = _mm512_mul_ps(g.scale, _mm512_setr_ps(0 - o, 1 - o, 2 - o, 3 - o, 4 - o, 5 - o, 6 - o, 7 - o,
                                                        8 - o, 9 - o, 10 - o, 11 - o, 12 - o, 13 - o, 14 - o,
                                                        15 - o));
        return g;
      } else {
        return Group(s, 0);
      }
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
