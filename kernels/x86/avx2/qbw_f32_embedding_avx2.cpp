// Embedding lookups, AVX2 (qbwn1k4_f32_embedding_1x1__avx2, _1x16c4__avx2):
// the shared x86 lookup (kernels/x86/embedding_lookup_impl.h) converting 8
// values per instruction. Contiguous rows of a single bit plane (1, 2 or 4
// bits: n1k4 buffers and weights-only tables) are converted straight from
// their units (store32_plane); other rows go through the superblock's bytes:
// widen, subtract 2^(bits-1) + zero point, convert, scale.
#include <immintrin.h>

#include "kernels/format/embedding_rows.h"
#include "kernels/format/plane_layout.h"
#include "kernels/generated/kernel_functions.h"

namespace torchao_kernels {

namespace {

#include "kernels/x86/embedding_lookup_impl.h"

// Shift counts of store8_plane's half H (values 8H..8H+7 of chunk C): lane
// l holds value l % 4 of block 4C + 2H + l / 4, which sits in byte l % 4 of
// its unit at bit ((4C + 2H + l / 4) * P) % 8. Both blocks of a half share
// one unit.
template <int P, int C, int H>
__attribute__((always_inline)) inline __m256i half_shifts() {
  constexpr int b = 4 * C + 2 * H;
  constexpr int s0 = (b * P) % 8, s1 = ((b + 1) * P) % 8;
  return _mm256_setr_epi32(s0, 8 + s0, 16 + s0, 24 + s0, s1, 8 + s1, 16 + s1, 24 + s1);
}

// Shuffle control of store32_plane's unit U at 4 bits: dword lane l of either
// 128-bit half takes byte l of unit U (its low nibbles in the low half, its
// high nibbles in the high half), the bytes above it zero.
template <int U>
__attribute__((always_inline)) inline __m256i nibble_unit_shuffle() {
  constexpr char b = static_cast<char>(4 * U), z = static_cast<char>(0x80);
  return _mm256_setr_epi8(b, z, z, z, b + 1, z, z, z, b + 2, z, z, z, b + 3, z, z, z,  //
                          b, z, z, z, b + 1, z, z, z, b + 2, z, z, z, b + 3, z, z, z);
}

struct ConvertAvx2 {
  // Single-plane weights of up to 4 bits are converted straight from their
  // units. 1 and 2 bits: per 8 values one broadcast load and one vpsrlvd put
  // each value's bits at the bottom of its dword, which index the group's
  // value table (vpermps reads an index's low 3 bits: the table repeats its
  // 2^bits entries, so the neighbours' bits above select a copy of the same
  // entry). 4 bits: the superblock's 16 bytes are loaded once into both
  // halves of a ymm, the high half shifted right by 4 and both masked, so the
  // low half holds every byte's low nibble and the high half its high one;
  // per 8 values (one unit: 4 low nibbles, then the same bytes' 4 high ones)
  // a vpshufb moves the unit's bytes into the dword lanes. The vector
  // instructions per 8 values drop from 5 (broadcast, shift, mask, convert,
  // scale) to 3.75: 128 n1k4 lookups 4.8 -> 4.3-4.4 us in cache and 5.7-5.9
  // -> 5.5 us on fresh rows, on a Zen 4 core capped to AVX2 (the loop alone,
  // in a micro-benchmark, 0.56 -> 0.39 ns per 8 values; the op's stores to L2
  // take the rest).
  // Without zero points the values are scaled by fma(float(u), scale,
  // -8 * scale): -8 * scale is exact, so the one rounding gives scale *
  // float(u - 8), the reference's bits, one instruction fewer per 8 values
  // than subtract, convert, multiply (5.05 -> 4.67 us in the same setting).
  static constexpr bool kPlaneChunks = true;

  // ZEROS: the lookup's rows have zero points (known at compile time).
  template <int BITS, bool ZEROS = true>
  struct Group {
    __m256 scale;
    __m256i off;
    // BITS <= 2: entry u = scale * float((u mod 2^BITS) - off), the
    // reference's operations, so the same bits.
    __m256 table;
    // -2^(BITS-1) * scale (groups without a zero point).
    __m256 bias;
    Group(float s, int zero) : scale(_mm256_set1_ps(s)), off(_mm256_set1_epi32((1 << (BITS - 1)) + zero)) {
      if constexpr (BITS <= 2) {
        constexpr int m = (1 << BITS) - 1;
        const __m256i u = _mm256_setr_epi32(0 & m, 1 & m, 2 & m, 3 & m, 4 & m, 5 & m, 6 & m, 7 & m);
        table = _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_sub_epi32(u, off)));
      } else {
        table = scale;
      }
    }
    explicit Group(__m256 s)
        : scale(opaque(s)), off(_mm256_set1_epi32(1 << (BITS - 1))), table(scale),
          bias(_mm256_mul_ps(scale, _mm256_set1_ps(-static_cast<float>(1 << (BITS - 1))))) {}
    // The broadcast scale as the compiler must keep it: otherwise GCC forms
    // the bias with a scalar multiply and broadcasts scale and bias from
    // registers (three vector-pipe instructions per group, where a broadcast
    // from memory and a vmulps are two; a 4-bit group's other work is 15).
    static __m256 opaque(__m256 s) {
      asm("" : "+x"(s));
      return s;
    }
    // No zero point: the table's values are constants times the scale.
    static Group symmetric(float s) {
      if constexpr (BITS <= 2) {
        constexpr float o = static_cast<float>(1 << (BITS - 1));
        constexpr int m = (1 << BITS) - 1;
        Group g(_mm256_set1_ps(s));
        g.table = _mm256_mul_ps(g.scale, _mm256_setr_ps((0 & m) - o, (1 & m) - o, (2 & m) - o, (3 & m) - o,
                                                        (4 & m) - o, (5 & m) - o, (6 & m) - o, (7 & m) - o));
        return g;
      } else {
        return Group(_mm256_set1_ps(s));
      }
    }
    template <int C, int H>
    __attribute__((always_inline)) void store8_plane(const uint8_t* plane, float* out) const {
      constexpr int unit = ((4 * C + 2 * H) * BITS) / 8;
      int32_t d;
      __builtin_memcpy(&d, plane + 4 * unit, 4);
      const __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32(d), half_shifts<BITS, C, H>());
      if constexpr (BITS <= 2) {
        _mm256_storeu_ps(out, _mm256_permutevar8x32_ps(table, v));
      } else {
        store8_values(_mm256_and_si256(v, _mm256_set1_epi32((1 << BITS) - 1)), out);
      }
    }
    // 8 stored values u (dwords) as scale * float(u - 2^(BITS-1) - zero).
    __attribute__((always_inline)) void store8_values(__m256i u, float* out) const {
      if constexpr (ZEROS) {
        _mm256_storeu_ps(out, _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_sub_epi32(u, off))));
      } else {
        _mm256_storeu_ps(out, _mm256_fmadd_ps(_mm256_cvtepi32_ps(u), scale, bias));
      }
    }
    // The 32 values of a superblock whose only plane (BITS = 1, 2 or 4 bits)
    // starts at `plane`; reads only the plane's bytes.
    __attribute__((always_inline)) void store32_plane(const uint8_t* plane, float* out) const {
      static_assert(BITS == 1 || BITS == 2 || BITS == 4, "single-plane widths only");
      if constexpr (BITS == 4) {
        const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(plane)));
        const __m256i nibbles = _mm256_and_si256(_mm256_srlv_epi32(both, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)),
                                                 _mm256_set1_epi8(0x0F));
        store8_values(_mm256_shuffle_epi8(nibbles, nibble_unit_shuffle<0>()), out);
        store8_values(_mm256_shuffle_epi8(nibbles, nibble_unit_shuffle<1>()), out + 8);
        store8_values(_mm256_shuffle_epi8(nibbles, nibble_unit_shuffle<2>()), out + 16);
        store8_values(_mm256_shuffle_epi8(nibbles, nibble_unit_shuffle<3>()), out + 24);
      } else {
        store8_plane<0, 0>(plane, out);
        store8_plane<0, 1>(plane, out + 8);
        store8_plane<1, 0>(plane, out + 16);
        store8_plane<1, 1>(plane, out + 24);
      }
    }
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
