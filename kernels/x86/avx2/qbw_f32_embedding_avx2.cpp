// Embedding lookups, AVX2 (qbwn1k4_f32_embedding_1x1__avx2, _1x16c4__avx2):
// the shared x86 lookup (kernels/x86/embedding_lookup_impl.h) converting 8
// values per instruction: widen the bytes, subtract 2^(bits-1) + zero point,
// convert, scale.
#include <immintrin.h>

#include "kernels/format/embedding_rows.h"
#include "kernels/format/plane_layout.h"
#include "kernels/generated/kernel_functions.h"

namespace torchao_kernels {

namespace {

#include "kernels/x86/embedding_lookup_impl.h"

struct ConvertAvx2 {
  static constexpr bool kPlaneChunks = false;  // every width through the bytes of a superblock
  template <int BITS>
  struct Group {
    __m256 scale;
    __m256i off;
    Group(float s, int zero) : scale(_mm256_set1_ps(s)), off(_mm256_set1_epi32((1 << (BITS - 1)) + zero)) {}
    static Group symmetric(float s) { return Group(s, 0); }
    __attribute__((always_inline)) void store16(__m128i bytes, float* out) const {
      const __m256i w0 = _mm256_sub_epi32(_mm256_cvtepu8_epi32(bytes), off);
      const __m256i w1 = _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8)), off);
      _mm256_storeu_ps(out, _mm256_mul_ps(scale, _mm256_cvtepi32_ps(w0)));
      _mm256_storeu_ps(out + 8, _mm256_mul_ps(scale, _mm256_cvtepi32_ps(w1)));
    }
  };
};

}  // namespace

void qbw_f32_embedding_1xNR__avx2(const EmbeddingArgs& a) { lookup<ConvertAvx2>(a); }

}  // namespace torchao_kernels
