// Embedding lookups on x86, shared by the AVX2 and AVX-512 translation units
// (each includes it inside its own anonymous namespace, compiled with its
// own flags): qbw_f32_embedding_1x1c4__<isa> (n1k4 buffers and weights-only
// tables) and qbw_f32_embedding_1x16c4__<isa> (n16k4 buffers, e.g. a tied
// output head), one template for any nr.
//
// Per superblock of KB = 32 (or 16) values and per bit plane of p bits, the
// row's 8 (or 4) 4-value blocks are rebuilt in the dword lanes of one ymm:
// block j lives in plane unit (j * p) / 8 at bit shift (j * p) % 8, so lane j
// takes that unit's 4 bytes of this row (one load + vpermd when units are
// contiguous, nr = 1; otherwise one scalar load per unit, nr * 4 bytes apart,
// inserted into a vector, then the same vpermd: cheaper than one vpgatherdd
// per plane, whose lanes read most units twice),
// shifts right by its own count (vpsrlvd), masks and moves the plane's bits to
// their place in the value. The bytes are then the stored values in k order;
// the ISA's Convert policy turns each 16 into out = scale * float(w - zero),
// exactly the reference. The next rows' lines are prefetched: random rows of
// a large table are latency-bound, and no hardware prefetcher can guess an index.
//
// Include after <immintrin.h>, kernels/format/embedding_rows.h and
// kernels/format/plane_layout.h, inside an anonymous namespace.

// Rows of n1k4 tables whose lines are requested ahead of the one being
// unpacked (an n16k4 row spans its whole 16-row block: the next row only,
// group by group).
#ifndef TK_EMBEDDING_PREFETCH_ROWS
#define TK_EMBEDDING_PREFETCH_ROWS 3
#endif
constexpr int64_t kPrefetchRows = TK_EMBEDDING_PREFETCH_ROWS;


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

// The plane's units of this row, nr > 1: one dword per unit, `stride` bytes
// apart (scalar loads and inserts: cheaper than a gather on Zen 3,
// and no lane reads a unit twice).
inline int32_t load_dword(const uint8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return v;
}
template <int P, int KB>
inline __m256i load_strided(const uint8_t* p, int stride) {
  constexpr int units = ((KB / 4) * P + 7) / 8;
  __m128i lo = _mm_cvtsi32_si128(load_dword(p));
  if constexpr (units >= 2) lo = _mm_insert_epi32(lo, load_dword(p + stride), 1);
  if constexpr (units >= 4) {
    lo = _mm_insert_epi32(lo, load_dword(p + 2 * stride), 2);
    lo = _mm_insert_epi32(lo, load_dword(p + 3 * stride), 3);
  }
  if constexpr (units == 8) {
    __m128i hi = _mm_cvtsi32_si128(load_dword(p + 4 * stride));
    hi = _mm_insert_epi32(hi, load_dword(p + 5 * stride), 1);
    hi = _mm_insert_epi32(hi, load_dword(p + 6 * stride), 2);
    hi = _mm_insert_epi32(hi, load_dword(p + 7 * stride), 3);
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
  }
  return _mm256_castsi128_si256(lo);
}

// Convert: the ISA's policy for turning the unpacked bytes of a 16-value
// chunk into floats (Convert::Group<BITS> holds what one scale group needs).
template <class Convert>
struct Lookup {
  template <int BITS, int KB>
  static void run(const EmbeddingArgs& a) {
    constexpr plane_layout::Planes planes = plane_layout::planes_of(BITS, KB);
    const PackedLayout& l = *a.w;
    const int unit_bytes = l.nr * 4;
    const bool contiguous = l.nr == 1;
    __m256i shifts[3], perm[3];
    for (int p = 0; p < planes.count; ++p) {
      const int pb = planes.bits[p];
      const __m256i units = pb == 4 ? lane_units<4, KB>() : pb == 2 ? lane_units<2, KB>()
                            : pb == 1 ? lane_units<1, KB>() : lane_units<8, KB>();
      shifts[p] = pb == 4 ? lane_shifts<4, KB>() : pb == 2 ? lane_shifts<2, KB>()
                  : pb == 1 ? lane_shifts<1, KB>() : lane_shifts<8, KB>();
      perm[p] = units;
    }
    // The bytes of a row: its block's groups (for nr > 1 every line of the
    // block holds a part of the row), without row sums and bias.
    const int64_t row_span = l.row_sums_offset;
    auto block_of = [&](int64_t i) { return a.body + (a.rows[i] / l.nr) * l.block_bytes; };
    auto prefetch = [](const uint8_t* p, int64_t bytes) {
      for (int64_t off = 0; off < bytes; off += 64)
        _mm_prefetch(reinterpret_cast<const char*>(p + off), _MM_HINT_T0);
    };
    // Random rows of a large table: keep the next rows' lines in flight while
    // this one is unpacked (no hardware prefetcher can guess an index). An
    // n1k4 row is a few lines: whole rows, kPrefetchRows ahead. An n16k4 row
    // spans its whole block (dozens of lines): the next row's group is
    // requested as this row's group starts, so the requests are spread over
    // the row instead of queueing behind each other at its start.
    if (contiguous) {
      for (int64_t i = 0; i < a.count && i < kPrefetchRows; ++i) prefetch(block_of(i), row_span);
    } else if (a.count) {
      prefetch(block_of(0), row_span);
    }
    for (int64_t i = 0; i < a.count; ++i) {
      if (contiguous && i + kPrefetchRows < a.count) prefetch(block_of(i + kPrefetchRows), row_span);
      const uint8_t* next_group = !contiguous && i + 1 < a.count ? block_of(i + 1) : nullptr;
      const EmbeddingRow row(a, a.rows[i]);
      const int gs = row.scale_group_size();
      const int slot = 4 * row.row_slot();
      float* out = a.out + i * a.out_stride;
      // The scale group advances every gs values (a multiple of 16), counted
      // down instead of divided; its scale and zero point by a stride.
      const RowScales& rs = row.scales();
      const uint8_t* sp = rs.scales;
      const uint8_t* zp = rs.zeros;
      auto group_at = [&] { return typename Convert::template Group<BITS>(rs.scale_at(sp), rs.zero_at(zp)); };
      int left = gs;
      auto cg = group_at();
      const uint8_t* group = row.superblock(0) + slot;
      int kk = 0;
      for (int g = 0; g < l.groups; ++g, group += l.group_bytes) {
        if (next_group) {
          prefetch(next_group, l.group_bytes);
          next_group += l.group_bytes;
        }
        const uint8_t* sb = group;
        for (int s = 0; s < l.superblocks; ++s, sb += l.superblock_bytes, kk += KB) {
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
              const __m256i raw = pb == 4 ? load_strided<4, KB>(plane, unit_bytes)
                                  : pb == 2 ? load_strided<2, KB>(plane, unit_bytes)
                                  : pb == 1 ? load_strided<1, KB>(plane, unit_bytes)
                                            : load_strided<8, KB>(plane, unit_bytes);
              v = _mm256_permutevar8x32_epi32(raw, perm[p]);
            }
            if (pb != 8) {
              v = _mm256_srlv_epi32(v, shifts[p]);
              v = _mm256_and_si256(v, _mm256_set1_epi8(static_cast<char>((1 << pb) - 1)));
              if (planes.shift[p]) v = _mm256_slli_epi32(v, planes.shift[p]);
            }
            u = _mm256_or_si256(u, v);
          }
          for (int h = 0; h < KB / 16; ++h) {
            if (left == 0) {
              left = gs;
              sp += rs.scale_stride;
              if (zp) zp += rs.zero_stride;
              cg = group_at();
            }
            left -= 16;
            cg.store16(h == 0 ? _mm256_castsi256_si128(u) : _mm256_extracti128_si256(u, 1),
                       out + kk + 16 * h);
          }
        }
      }
    }
  }
};


template <class Convert, int BITS>
void lookup_kb(const EmbeddingArgs& a) {
  if (a.w->kb == 32) {
    Lookup<Convert>::template run<BITS, 32>(a);
  } else {
    Lookup<Convert>::template run<BITS, 16>(a);
  }
}

template <class Convert>
void lookup(const EmbeddingArgs& a) {
  switch (a.w->bits) {
    case 1: return lookup_kb<Convert, 1>(a);
    case 2: return lookup_kb<Convert, 2>(a);
    case 3: return lookup_kb<Convert, 3>(a);
    case 4: return lookup_kb<Convert, 4>(a);
    case 5: return lookup_kb<Convert, 5>(a);
    case 6: return lookup_kb<Convert, 6>(a);
    case 7: return lookup_kb<Convert, 7>(a);
    case 8: return lookup_kb<Convert, 8>(a);
  }
}
