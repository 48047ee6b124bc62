// Embedding lookups, AVX2: qbw_f32_embedding_1x1c4__avx2 (n1k4 buffers and
// weights-only tables) and qbw_f32_embedding_1x16c4__avx2 (n16k4 buffers,
// e.g. a tied output head), one function for any nr.
//
// Per superblock of KB = 32 (or 16) values and per bit plane of p bits, the
// row's 8 (or 4) 4-value blocks are rebuilt in the dword lanes of one ymm:
// block j lives in plane unit (j * p) / 8 at bit shift (j * p) % 8, so lane j
// takes that unit's 4 bytes of this row (one load + vpermd when units are
// contiguous, nr = 1; one vpgatherdd with a stride of nr * 4 bytes otherwise),
// shifts right by its own count (vpsrlvd), masks and moves the plane's bits to
// their place in the value. The bytes are then the stored values in k order;
// each group of 8 is widened, offset by 2^(bits-1) + zero point, converted
// and scaled: out = scale * float(w - zero), exactly the reference.
#include <immintrin.h>

#include "kernels/format/embedding_rows.h"
#include "kernels/format/plane_layout.h"
#include "kernels/x86/x86_kernels.h"

namespace torchao_kernels {

namespace {

template <int P, int KB>
inline __m256i lane_shifts() {
  int s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int j = 0; j < KB / 4; ++j) s[j] = (j * P) % 8;
  return _mm256_setr_epi32(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]);
}

template <int P, int KB>
inline __m256i lane_units() {
  int u[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int j = 0; j < KB / 4; ++j) u[j] = (j * P) / 8;
  return _mm256_setr_epi32(u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7]);
}

// The plane's units of this row, nr = 1: exactly the bytes the plane holds
// (never past the end of the buffer).
template <int P, int KB>
inline __m256i load_contiguous(const uint8_t* p) {
  constexpr int bytes = (((KB / 4) * P + 7) / 8) * 4;
  if constexpr (bytes == 4) {
    int32_t v;
    __builtin_memcpy(&v, p, 4);
    return _mm256_castsi128_si256(_mm_cvtsi32_si128(v));
  } else if constexpr (bytes == 8) {
    return _mm256_castsi128_si256(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  } else if constexpr (bytes == 16) {
    return _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
}

struct Lookup {
  template <int BITS, int KB>
  static void run(const EmbeddingArgs& a) {
    constexpr plane_layout::Planes planes = plane_layout::planes_of(BITS, KB);
    const PackedLayout& l = *a.w;
    const int unit_bytes = l.nr * 4;
    const bool contiguous = l.nr == 1;
    __m256i gather_index[3], shifts[3], perm[3];
    for (int p = 0; p < planes.count; ++p) {
      const int pb = planes.bits[p];
      const __m256i units = pb == 4 ? lane_units<4, KB>() : pb == 2 ? lane_units<2, KB>()
                            : pb == 1 ? lane_units<1, KB>() : lane_units<8, KB>();
      shifts[p] = pb == 4 ? lane_shifts<4, KB>() : pb == 2 ? lane_shifts<2, KB>()
                  : pb == 1 ? lane_shifts<1, KB>() : lane_shifts<8, KB>();
      perm[p] = units;
      gather_index[p] = _mm256_mullo_epi32(units, _mm256_set1_epi32(unit_bytes));
    }
    for (int64_t i = 0; i < a.count; ++i) {
      const EmbeddingRow row(a, a.rows[i]);
      const int gs = row.scale_group_size();
      const int slot = 4 * row.row_slot();
      float* out = a.out + i * a.out_stride;
      for (int kk = 0; kk < l.k; kk += KB) {
        const uint8_t* sb = row.superblock(kk) + slot;
        __m256i u = _mm256_setzero_si256();
        for (int p = 0; p < planes.count; ++p) {
          const int pb = planes.bits[p];
          const uint8_t* plane = sb + planes.unit_offset[p] * unit_bytes;
          __m256i v;
          if (contiguous) {
            const __m256i raw = pb == 4 ? load_contiguous<4, KB>(plane)
                                : pb == 2 ? load_contiguous<2, KB>(plane)
                                : pb == 1 ? load_contiguous<1, KB>(plane)
                                          : load_contiguous<8, KB>(plane);
            v = _mm256_permutevar8x32_epi32(raw, perm[p]);
          } else {
            v = _mm256_i32gather_epi32(reinterpret_cast<const int*>(plane), gather_index[p], 1);
          }
          if (pb != 8) {
            v = _mm256_srlv_epi32(v, shifts[p]);
            v = _mm256_and_si256(v, _mm256_set1_epi8(static_cast<char>((1 << pb) - 1)));
            if (planes.shift[p]) v = _mm256_slli_epi32(v, planes.shift[p]);
          }
          u = _mm256_or_si256(u, v);
        }
        for (int h = 0; h < KB / 16; ++h) {
          const int g = (kk + 16 * h) / gs;
          const __m256 scale = _mm256_set1_ps(row.scale(g));
          const __m256i off = _mm256_set1_epi32((1 << (BITS - 1)) + row.zero(g));
          const __m128i bytes = h == 0 ? _mm256_castsi256_si128(u) : _mm256_extracti128_si256(u, 1);
          const __m256i w0 = _mm256_sub_epi32(_mm256_cvtepu8_epi32(bytes), off);
          const __m256i w1 = _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8)), off);
          _mm256_storeu_ps(out + kk + 16 * h, _mm256_mul_ps(scale, _mm256_cvtepi32_ps(w0)));
          _mm256_storeu_ps(out + kk + 16 * h + 8, _mm256_mul_ps(scale, _mm256_cvtepi32_ps(w1)));
        }
      }
    }
  }
};

template <int BITS>
void dispatch_kb(const EmbeddingArgs& a) {
  if (a.w->kb == 32) {
    Lookup::run<BITS, 32>(a);
  } else {
    Lookup::run<BITS, 16>(a);
  }
}

}  // namespace

void qbw_f32_embedding_1xNRc4__avx2(const EmbeddingArgs& a) {
  switch (a.w->bits) {
    case 1: return dispatch_kb<1>(a);
    case 2: return dispatch_kb<2>(a);
    case 3: return dispatch_kb<3>(a);
    case 4: return dispatch_kb<4>(a);
    case 5: return dispatch_kb<5>(a);
    case 6: return dispatch_kb<6>(a);
    case 7: return dispatch_kb<7>(a);
    case 8: return dispatch_kb<8>(a);
  }
}

}  // namespace torchao_kernels
