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
// contiguous, nr = 1; otherwise one load per unit, nr * 4 bytes apart,
// broadcast and blended into its lane, then the same vpermd: cheaper than one
// vpgatherdd per plane, whose lanes read most units twice),
// shifts right by its own count (vpsrlvd), masks and moves the plane's bits to
// their place in the value. The bytes are then the stored values in k order;
// the ISA's Convert policy turns each 16 into out = scale * float(w - zero),
// exactly the reference. The next rows' lines are prefetched: random rows of
// a large table are latency-bound, and no hardware prefetcher can guess an index.
//
// Everything the inner loop needs is in locals or known at compile time (the
// planes, the unit stride for nr = 1, zero points or not, the scales'
// storage). A loop that kept the general layout in view (a branch per plane
// and per 16 values, the layout's fields reloaded after every store, a
// division per row) took 2x as long on rows already in cache. The helpers
// below are always_inline: GCC kept plane_values out of line (a call per
// superblock and plane), which cost ~12% of an n16k4 lookup (49152x576
// 4-bit, 128 rows: 17.4-19.6 -> 15.4-15.7 us on a Zen 4 core) and ~6% of an
// n1k4 one.
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
// Rows of a weights-only table whose zero points are requested ahead (see
// lookup_rows).
constexpr int64_t kPrefetchZeroRows = 8;


template <int P, int KB>
__attribute__((always_inline)) inline __m256i lane_shifts() {
  int s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int j = 0; j < KB / 4; ++j) s[j] = (j * P) % 8;
  return _mm256_setr_epi32(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]);
}

template <int P, int KB>
__attribute__((always_inline)) inline __m256i lane_units() {
  int u[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int j = 0; j < KB / 4; ++j) u[j] = (j * P) / 8;
  return _mm256_setr_epi32(u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7]);
}

// The plane's units of this row, nr = 1: exactly the bytes the plane holds
// (never past the end of the buffer).
template <int P, int KB>
__attribute__((always_inline)) inline __m256i load_contiguous(const uint8_t* p) {
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
__attribute__((always_inline)) inline int32_t load_dword(const uint8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return v;
}
template <int P, int KB>
__attribute__((always_inline)) inline __m256i load_strided(const uint8_t* p, int stride) {
  constexpr int units = ((KB / 4) * P + 7) / 8;
  // Each unit broadcast straight from memory (a load, no shuffle) and
  // blended into its lane: cheaper than vpinsrd (two uops on AMD cores).
  auto unit = [&](int j) { return _mm_set1_epi32(load_dword(p + j * stride)); };
  __m128i lo = _mm_cvtsi32_si128(load_dword(p));
  if constexpr (units >= 2) lo = _mm_blend_epi32(lo, unit(1), 0x2);
  if constexpr (units >= 4) {
    lo = _mm_blend_epi32(lo, unit(2), 0x4);
    lo = _mm_blend_epi32(lo, unit(3), 0x8);
  }
  if constexpr (units == 8) {
    __m256i v = _mm256_castsi128_si256(lo);
    for (int j = 4; j < 8; ++j)
      v = _mm256_blend_epi32(v, _mm256_set1_epi32(load_dword(p + j * stride)), 1 << j);
    return v;
  }
  return _mm256_castsi128_si256(lo);
}

// One plane of a superblock (this row's units) in the lanes of its values,
// its bits at their place in the value; everything but the address known at
// compile time.
template <int BITS, int KB, int P, bool CONTIGUOUS>
__attribute__((always_inline)) inline __m256i plane_values(const uint8_t* sb, int unit_bytes) {
  constexpr plane_layout::Planes planes = plane_layout::planes_of(BITS, KB);
  constexpr int pb = planes.bits[P];
  const uint8_t* plane = sb + planes.unit_offset[P] * unit_bytes;
  __m256i raw;
  if constexpr (CONTIGUOUS) {
    raw = load_contiguous<pb, KB>(plane);
  } else {
    raw = load_strided<pb, KB>(plane, unit_bytes);
  }
  __m256i v = _mm256_permutevar8x32_epi32(raw, lane_units<pb, KB>());
  if constexpr (pb != 8) {
    v = _mm256_srlv_epi32(v, lane_shifts<pb, KB>());
    v = _mm256_and_si256(v, _mm256_set1_epi8(static_cast<char>((1 << pb) - 1)));
    if constexpr (planes.shift[P] != 0) v = _mm256_slli_epi32(v, planes.shift[P]);
  }
  return v;
}

// The KB values of a superblock as bytes in k order.
template <int BITS, int KB, bool CONTIGUOUS>
__attribute__((always_inline)) inline __m256i superblock_values(const uint8_t* sb, int unit_bytes) {
  constexpr plane_layout::Planes planes = plane_layout::planes_of(BITS, KB);
  __m256i u = plane_values<BITS, KB, 0, CONTIGUOUS>(sb, unit_bytes);
  if constexpr (planes.count > 1) u = _mm256_or_si256(u, plane_values<BITS, KB, 1, CONTIGUOUS>(sb, unit_bytes));
  if constexpr (planes.count > 2) u = _mm256_or_si256(u, plane_values<BITS, KB, 2, CONTIGUOUS>(sb, unit_bytes));
  return u;
}

__attribute__((always_inline)) inline void prefetch_lines(const uint8_t* p, int64_t bytes) {
  for (int64_t off = 0; off < bytes; off += 64)
    _mm_prefetch(reinterpret_cast<const char*>(p + off), _MM_HINT_T0);
}

// Every line of [p, p + bytes), wherever p starts.
__attribute__((always_inline)) inline void prefetch_span(const void* p, int64_t bytes) {
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63};
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes);
  for (uintptr_t q = first; q < end; q += 64) _mm_prefetch(reinterpret_cast<const char*>(q), _MM_HINT_T0);
}

// The scale groups every row of a call walks: their size (the layout's, or
// a weights-only table's own) and count per row, computed once per call (a
// division per row cost ~3% of a 4-bit lookup in cache).
struct ScaleWalk {
  int group_size, groups;
  ScaleWalk(const EmbeddingArgs& a, const RowStrides& st)
      : group_size(a.ext_scales ? a.ext_group_size : st.group_size), groups(st.k / group_size) {}
};

// One row's values, scale group by scale group. next_group (nr > 1): the
// next row's first group, whose lines are requested group by group as this
// row's groups start (see lookup_rows).
template <class Convert, int BITS, int KB, bool CONTIGUOUS, bool ZEROS, bool BF16>
__attribute__((always_inline)) inline void convert_row(const RowStrides& st, const ScaleWalk& walk,
                                                       const uint8_t* sb, const RowScales& rs, float* out,
                                                       const uint8_t* next_group) {
  using Group = typename Convert::template Group<BITS, ZEROS>;
  const int unit_bytes = st.unit_bytes;
  const int64_t superblock_bytes = st.superblock_bytes, group_bytes = st.group_bytes;
  const int64_t group_skip = st.group_skip;
  ScaleGroups<ZEROS, BF16> groups(rs);
  auto group_at = [&] { return groups.template next_group<Group>(); };
  // One plane of 1, 2 or 4 bits in 32-value superblocks of a contiguous row:
  // the ISA turns its units into floats straight (Convert::store32_plane).
  constexpr bool kStraight = Convert::kPlaneChunks && CONTIGUOUS && KB == 32 &&
                             plane_layout::planes_of(BITS, KB).count == 1 && BITS < 8;
  const int gs = walk.group_size;
  if (gs % KB == 0) {
    // Scale groups of whole superblocks: every linear format (a scale group
    // is a layout group, whose scales follow its superblocks), and tables
    // with groups of a multiple of 32 values (one layout group).
    const int64_t skip = gs == st.group_size ? group_skip : 0;
    if constexpr (kStraight) {
      if (gs == KB) {
        // A scale group per superblock (groups of 32, the common case): one
        // flat loop whose only scalar work is its pointers (the nested loop
        // below adds a counter, a test and two jumps per group).
        const int64_t step = superblock_bytes + skip;
        for (float* const end = out + int64_t(walk.groups) * KB; out != end; out += KB, sb += step)
          group_at().store32_plane(sb, out);
        return;
      }
    }
    for (int j = walk.groups; j > 0; --j, sb += skip) {
      if (!CONTIGUOUS && next_group) {
        prefetch_lines(next_group, group_bytes);
        next_group += group_bytes;
      }
      const Group cg = group_at();
      for (int s = gs / KB; s > 0; --s, out += KB, sb += superblock_bytes) {
        if constexpr (kStraight) {
          cg.store32_plane(sb, out);
        } else {
          const __m256i u = superblock_values<BITS, KB, CONTIGUOUS>(sb, unit_bytes);
          cg.store16(_mm256_castsi256_si128(u), out);
          if constexpr (KB == 32) cg.store16(_mm256_extracti128_si256(u, 1), out + 16);
        }
      }
    }
  } else {
    // A table's scale groups of 16 * odd values in 32-value superblocks
    // (one layout group, nr = 1): the group is counted down 16 values at a
    // time.
    Group cg = group_at();
    int left = gs;
    for (int t = st.k / KB; t > 0; --t, out += KB) {
      const __m256i u = superblock_values<BITS, KB, CONTIGUOUS>(sb, unit_bytes);
      for (int h = 0; h < KB / 16; ++h) {
        if (left == 0) {
          cg = group_at();
          left = gs;
        }
        left -= 16;
        cg.store16(h == 0 ? _mm256_castsi256_si128(u) : _mm256_extracti128_si256(u, 1), out + 16 * h);
      }
      sb += superblock_bytes;
    }
  }
}

// Convert: the ISA's policy for turning the unpacked bytes of a 16-value
// chunk into floats (Convert::Group<BITS, ZEROS>(scale, zero) holds what one
// scale group needs; Group<BITS, false>::symmetric(scale) is a group without
// a zero point, whose constant part the policy may hoist). CONTIGUOUS: nr = 1. ZEROS: the
// rows have zero points; BF16: bfloat16 scales. Both fixed at compile time,
// so a scale group costs no branch: with four predictable branches per
// superblock (two of them taken, into out-of-line paths) the loop ran ~1.2x
// slower on rows in cache.
template <class Convert, int BITS, int KB, bool CONTIGUOUS, bool ZEROS, bool BF16, bool EXT = false>
void lookup_rows(const EmbeddingArgs& a) {
  const PackedLayout& l = *a.w;
  const int nr = CONTIGUOUS ? 1 : l.nr;
  const int64_t block_bytes = l.block_bytes;
  const RowStrides st = RowStrides::of<CONTIGUOUS>(l);
  const ScaleWalk walk(a, st);
  // The bytes of a row: its block's groups (for nr > 1 every line of the
  // block holds a part of the row), without row sums and bias.
  const int64_t row_span = l.row_sums_offset;
  const int64_t* rows = a.rows;
  auto block_of = [&](int64_t r) { return a.body + (CONTIGUOUS ? r : r / nr) * block_bytes; };
  // Random rows of a large table: keep the next rows' lines in flight while
  // this one is unpacked (no hardware prefetcher can guess an index). A
  // contiguous row is a few lines: whole rows, kPrefetchRows ahead. An
  // interleaved row spans its whole block (dozens of lines): the next row's
  // group is requested as this row's group starts, so the requests are spread
  // over the row instead of queueing behind each other at its start.
  // EXT (a weights-only table): the row's scales and zero points sit in the
  // caller's arrays, one or two more random lines per row, requested with it.
  const int64_t ext_groups = EXT ? walk.groups : 0;
  auto prefetch_ext = [&](int64_t r) {
    if constexpr (EXT) prefetch_span(a.ext_scales + r * ext_groups, ext_groups * 4);
  };
  // Its zero points (a line or two per row, read by the check below before
  // anything else of the row) are requested further ahead, and before the
  // rows' lines: requested with them, 3 rows ahead, they still missed (128
  // lookups, 2-bit, Zen 4: 6.2 us, against 4.6 us this way; the scales sent
  // 8 ahead as well brought it back to 6.2 us).
  auto prefetch_zeros = [&](int64_t r) {
    if constexpr (EXT && ZEROS) prefetch_span(a.ext_zeros + r * ext_groups, ext_groups);
  };
  for (int64_t i = 0; i < a.count && i < kPrefetchZeroRows; ++i) prefetch_zeros(rows[i]);
  if (CONTIGUOUS) {
    for (int64_t i = 0; i < a.count && i < kPrefetchRows; ++i) {
      prefetch_lines(block_of(rows[i]), row_span);
      prefetch_ext(rows[i]);
    }
  } else if (a.count) {
    prefetch_lines(block_of(rows[0]), row_span);
  }
  auto row_zeros_all_zero = [&](int64_t r) {
    if constexpr (EXT && ZEROS) return all_zero(a.ext_zeros + r * ext_groups, ext_groups);
    return false;
  };
  bool zero_next = a.count > 0 && row_zeros_all_zero(rows[0]);
  for (int64_t i = 0; i < a.count; ++i) {
    const uint8_t* next_group = nullptr;
    if (CONTIGUOUS) {
      if (i + kPrefetchZeroRows < a.count) prefetch_zeros(rows[i + kPrefetchZeroRows]);
      if (i + kPrefetchRows < a.count) {
        prefetch_lines(block_of(rows[i + kPrefetchRows]), row_span);
        prefetch_ext(rows[i + kPrefetchRows]);
      }
    } else if (i + 1 < a.count) {
      next_group = block_of(rows[i + 1]);
    }
    const EmbeddingRow row = EmbeddingRow::of<CONTIGUOUS>(a, rows[i]);
    const uint8_t* sb = row.superblock(0) + 4 * row.row_slot();
    float* out = a.out + i * a.out_stride;
    if constexpr (EXT) {
      const RowScales rs = RowScales::of_table_row(a, rows[i], ext_groups);
      if constexpr (ZEROS) {
        // torchao's weights-only ops always pass zero points, all 0 for
        // symmetric weights: such a row takes the symmetric conversion (the
        // same values: scale * float(u - 2^(b-1) - 0)), which builds a
        // group's table from its scale alone. The next row is checked now:
        // a row's work about fills the reorder buffer, so a check at its
        // start would wait for the zero points' load.
        const bool zero_row = zero_next;
        if (i + 1 < a.count) zero_next = row_zeros_all_zero(rows[i + 1]);
        if (zero_row) {
          convert_row<Convert, BITS, KB, CONTIGUOUS, false, BF16>(st, walk, sb, rs, out, next_group);
          continue;
        }
      }
      convert_row<Convert, BITS, KB, CONTIGUOUS, ZEROS, BF16>(st, walk, sb, rs, out, next_group);
    } else {
      convert_row<Convert, BITS, KB, CONTIGUOUS, ZEROS, BF16>(st, walk, sb, row.scales(), out, next_group);
    }
  }
}

template <class Convert, int BITS, int KB, bool CONTIGUOUS>
void lookup_scales(const EmbeddingArgs& a) {
  // A weights-only table's scales (always float32) and zero points are the caller's.
  if (a.ext_scales) {
    if (a.ext_zeros) return lookup_rows<Convert, BITS, KB, CONTIGUOUS, true, false, true>(a);
    return lookup_rows<Convert, BITS, KB, CONTIGUOUS, false, false, true>(a);
  }
  const bool zeros = a.w->has_zeros, bf16 = a.w->scales_bf16;
  if (zeros) {
    if (bf16) return lookup_rows<Convert, BITS, KB, CONTIGUOUS, true, true>(a);
    return lookup_rows<Convert, BITS, KB, CONTIGUOUS, true, false>(a);
  }
  if (bf16) return lookup_rows<Convert, BITS, KB, CONTIGUOUS, false, true>(a);
  return lookup_rows<Convert, BITS, KB, CONTIGUOUS, false, false>(a);
}

template <class Convert, int BITS, int KB>
void lookup_layout(const EmbeddingArgs& a) {
  if (a.w->nr == 1) {
    lookup_scales<Convert, BITS, KB, true>(a);
  } else {
    lookup_scales<Convert, BITS, KB, false>(a);
  }
}

template <class Convert, int BITS>
void lookup_kb(const EmbeddingArgs& a) {
  if (a.w->kb == 32) {
    lookup_layout<Convert, BITS, 32>(a);
  } else {
    lookup_layout<Convert, BITS, 16>(a);
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
