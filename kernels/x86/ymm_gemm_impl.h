// 256-bit kernels for format n16k4, shared by the AVX2 and AVX-VNNI
// translation units. Include it inside an anonymous namespace of a TU compiled
// with the right ISA flags, after defining `struct Dot` with
//   template <int BITS> static __m256i dot(__m256i acc, __m256i w_u8, __m256i x_s8);
// which adds the 4-way u8 x s8 dot products of each 32-bit lane to acc, exactly,
// and optionally (kPairSums<BITS, KB> true) a cheaper form for narrow weights:
//   dot16(acc16, w, x): adds the 2-way products to 16 int16 lanes (vpmaddubsw
//                       + vpaddw), exact for one superblock of KB k-values;
//   widen(acc16):       the 4-way int32 sums of those lanes (one vpmaddwd).
//
// A 64-byte unit of the format is 16 rows x 4 k; a ymm holds one half
// (8 rows). A tile is MR activation rows x NH halves (8 * NH columns).
// Integer and float arithmetic follow the reference exactly (see
// avx512vnni/qd8_f32_qbw_gemm_avx512vnni.cpp for the derivation).

inline int32_t load_i32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Scales of rows 8*half .. 8*half+7 of a block's group as float32 (bfloat16
// storage: the stored halves are the upper 16 bits).
__attribute__((always_inline)) inline __m256 load_scales(const PackedLayout& l, const uint8_t* group,
                                                         int g, int half) {
  const uint8_t* p = l.scales_of(group, g);
  if (l.scales_bf16) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * half))), 16));
  }
  return _mm256_loadu_ps(reinterpret_cast<const float*>(p) + 8 * half);
}

template <int BITS, int KB, int J>
__attribute__((always_inline)) inline __m256i unpack_half(const uint8_t* sb) {
  constexpr plane_layout::Planes P = plane_layout::planes_of(BITS, KB);
  if constexpr (BITS == 8) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + J * 64));
  } else {
    __m256i v = _mm256_setzero_si256();
#pragma GCC unroll 3
    for (int i = 0; i < P.count; ++i) {
      const int p = P.bits[i];
      const int unit = P.unit_offset[i] + (J * p) / 8;
      const int shift = (J * p) % 8;
      __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + unit * 64));
      if (shift) u = _mm256_srli_epi16(u, shift);
      u = _mm256_and_si256(u, _mm256_set1_epi8(static_cast<char>((1 << p) - 1)));
      if (P.shift[i]) u = _mm256_slli_epi16(u, P.shift[i]);
      v = (i == 0) ? u : _mm256_or_si256(v, u);
    }
    return v;
  }
}

template <int BITS, int KB, int MR, int NH, int J>
__attribute__((always_inline)) inline void dot_block(const uint8_t* const* sb, const int8_t* const* xs, __m256i (&acc)[MR][NH]) {
  __m256i w[NH];
  for (int h = 0; h < NH; ++h) w[h] = unpack_half<BITS, KB, J>(sb[h]);
  for (int r = 0; r < MR; ++r) {
    const __m256i xb = _mm256_set1_epi32(load_i32(xs[r] + 4 * J));
    for (int h = 0; h < NH; ++h) acc[r][h] = Dot::template dot<BITS>(acc[r][h], w[h], xb);
  }
}

template <int BITS, int KB, int MR, int NH, int J>
__attribute__((always_inline)) inline void dot16_block(const uint8_t* const* sb, const int8_t* const* xs,
                                                       __m256i (&acc)[MR][NH]) {
  __m256i w[NH];
  for (int h = 0; h < NH; ++h) w[h] = unpack_half<BITS, KB, J>(sb[h]);
  for (int r = 0; r < MR; ++r) {
    const __m256i xb = _mm256_set1_epi32(load_i32(xs[r] + 4 * J));
    for (int h = 0; h < NH; ++h) acc[r][h] = Dot::dot16(acc[r][h], w[h], xb);
  }
}

template <int BITS, int KB, int MR, int NH, int... Js>
__attribute__((always_inline)) inline void dot16_superblock(const uint8_t* const* sb, const int8_t* const* xs,
                                                            __m256i (&acc)[MR][NH], std::integer_sequence<int, Js...>) {
  (dot16_block<BITS, KB, MR, NH, Js>(sb, xs, acc), ...);
}

template <class T>
__attribute__((always_inline)) inline T* launder(T* p) {
  asm("" : "+r"(p));
  return p;
}

template <int BITS, int KB, int MR, int NH, int... Js>
__attribute__((always_inline)) inline void dot_superblock(const uint8_t* const* sb, const int8_t* const* xs,
                           __m256i (&acc)[MR][NH], std::integer_sequence<int, Js...>) {
  (dot_block<BITS, KB, MR, NH, Js>(sb, xs, acc), ...);
}

// MR rows x NH halves starting at half index `half` (= 2 * block + {0, 1}).
template <int BITS, int KB, int MR, int NH>
void tile(const GemmArgs& a, int m0, int half) {
  const PackedLayout& l = *a.w;
  const QuantizedActivations& x = *a.x;
  const uint8_t* blk[NH];  // start of the half's block, plus 32 bytes for odd halves
  int hsel[NH];
  for (int h = 0; h < NH; ++h) {
    hsel[h] = (half + h) & 1;
    blk[h] = a.body + int64_t((half + h) >> 1) * l.block_bytes;
  }
  const int8_t* xrow[MR];
  const int32_t* xsum[MR];
  for (int r = 0; r < MR; ++r) {
    xrow[r] = x.q + int64_t(m0 + r) * x.row_stride;
    xsum[r] = x.group_sums + int64_t(m0 + r) * x.groups;
  }
  constexpr int32_t kOffset = 1 << (BITS - 1);
  // Float accumulators in L1, touched once per group: AVX2 has 16 vector
  // registers, which the tile's integer accumulators, weights and broadcasts
  // already fill.
  alignas(32) float fbuf[MR][NH][8];
  for (int r = 0; r < MR; ++r)
    for (int h = 0; h < NH; ++h) _mm256_store_ps(fbuf[r][h], _mm256_setzero_ps());

  for (int g = 0; g < l.groups; ++g) {
    const uint8_t* gp[NH];
    for (int h = 0; h < NH; ++h) gp[h] = blk[h] + int64_t(g) * l.group_bytes;
    const int8_t* xs[MR];
    for (int r = 0; r < MR; ++r) xs[r] = xrow[r] + int64_t(g) * l.group_size;
    const uint8_t* sb[NH];
    for (int h = 0; h < NH; ++h) sb[h] = gp[h] + 32 * hsel[h];
    // acc = the group's dot products, then plus the offset / zero-point term
    // -(zero + 2^(b-1)) * sum(x): the reference's int32 (wrapping) I_g.
    __m256i acc[MR][NH];
    if constexpr (Dot::template kPairSums<BITS, KB>) {
      for (int s = 0; s < l.superblocks; ++s) {
        __m256i a16[MR][NH];
        for (int r = 0; r < MR; ++r)
          for (int h = 0; h < NH; ++h) a16[r][h] = _mm256_setzero_si256();
        dot16_superblock<BITS, KB, MR, NH>(sb, xs, a16, std::make_integer_sequence<int, KB / 4>{});
        for (int r = 0; r < MR; ++r)
          for (int h = 0; h < NH; ++h)
            acc[r][h] = s == 0 ? Dot::widen(a16[r][h]) : _mm256_add_epi32(acc[r][h], Dot::widen(a16[r][h]));
        for (int h = 0; h < NH; ++h) sb[h] += l.superblock_bytes;
        for (int r = 0; r < MR; ++r) xs[r] += KB;
      }
    } else {
      for (int r = 0; r < MR; ++r)
        for (int h = 0; h < NH; ++h) acc[r][h] = _mm256_setzero_si256();
      for (int s = 0; s < l.superblocks; ++s) {
        dot_superblock<BITS, KB, MR, NH>(sb, xs, acc, std::make_integer_sequence<int, KB / 4>{});
        for (int h = 0; h < NH; ++h) sb[h] += l.superblock_bytes;
        for (int r = 0; r < MR; ++r) xs[r] += KB;
      }
    }
    float(*f)[NH][8] = launder(fbuf);
    if (l.has_zeros && l.group_size <= 512) {
      // As in the AVX512 tiles: dot, (zero + offset) * sum(x) and their
      // difference are integers below 2^24, so one fnmadd in float gives
      // exactly float(I_g) (vpmulld would be two uops per accumulator).
      __m256 fs[MR];
      for (int r = 0; r < MR; ++r) fs[r] = _mm256_set1_ps(static_cast<float>(xsum[r][g]));
      for (int h = 0; h < NH; ++h) {
        const __m256 zf = _mm256_cvtepi32_ps(_mm256_add_epi32(
            _mm256_cvtepi8_epi32(_mm_loadl_epi64(
                reinterpret_cast<const __m128i*>(l.zeros_of(gp[h], g) + 8 * hsel[h]))),
            _mm256_set1_epi32(kOffset)));
        const __m256 sc =
            load_scales(l, gp[h], g, hsel[h]);
        for (int r = 0; r < MR; ++r) {
          const __m256 ig = _mm256_fnmadd_ps(zf, fs[r], _mm256_cvtepi32_ps(acc[r][h]));
          _mm256_store_ps(f[r][h], _mm256_fmadd_ps(ig, sc, _mm256_load_ps(f[r][h])));
        }
      }
      continue;
    }
    if (l.has_zeros) {
      for (int h = 0; h < NH; ++h) {
        const __m256i z = _mm256_add_epi32(
            _mm256_cvtepi8_epi32(_mm_loadl_epi64(
                reinterpret_cast<const __m128i*>(l.zeros_of(gp[h], g) + 8 * hsel[h]))),
            _mm256_set1_epi32(kOffset));
        for (int r = 0; r < MR; ++r)
          acc[r][h] = _mm256_add_epi32(acc[r][h], _mm256_mullo_epi32(z, _mm256_set1_epi32(-xsum[r][g])));
      }
    } else {
      for (int r = 0; r < MR; ++r) {
        const __m256i off = _mm256_set1_epi32(-kOffset * xsum[r][g]);
        for (int h = 0; h < NH; ++h) acc[r][h] = _mm256_add_epi32(acc[r][h], off);
      }
    }
    for (int h = 0; h < NH; ++h) {
      const __m256 sc =
          load_scales(l, gp[h], g, hsel[h]);
      for (int r = 0; r < MR; ++r)
        _mm256_store_ps(f[r][h], _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][h]), sc, _mm256_load_ps(f[r][h])));
    }
  }
  for (int h = 0; h < NH; ++h) {
    const int col = (half + h) * 8;
    if (col >= l.n) break;
    const int cols = l.n - col < 8 ? l.n - col : 8;
    const __m256 rs =
        _mm256_loadu_ps(reinterpret_cast<const float*>(blk[h] + l.row_sums_offset) + 8 * hsel[h]);
    const __m256 bias =
        l.has_bias ? _mm256_loadu_ps(reinterpret_cast<const float*>(blk[h] + l.bias_offset) + 8 * hsel[h])
                   : _mm256_setzero_ps();
    for (int r = 0; r < MR; ++r) {
      const int m = m0 + r;
      const __m256 t =
          _mm256_fmadd_ps(_mm256_set1_ps(static_cast<float>(-x.zero[m])), rs, _mm256_load_ps(fbuf[r][h]));
      const __m256 y = _mm256_fmadd_ps(t, _mm256_set1_ps(x.scale[m]), bias);
      float* dst = a.out + int64_t(m) * a.out_stride + col;
      if (cols == 8) {
        _mm256_storeu_ps(dst, y);
      } else {
        alignas(32) float tmp[8];
        _mm256_store_ps(tmp, y);
        for (int c = 0; c < cols; ++c) dst[c] = tmp[c];
      }
    }
  }
}

template <int BITS, int KB, int MR, int NH>
void run_tiles(const GemmArgs& a) {
  int h = 2 * a.block_begin;
  const int h_end = 2 * a.block_end;
  for (; h + NH <= h_end; h += NH) {
    int m = a.m_begin;
    for (; m + MR <= a.m_end; m += MR) tile<BITS, KB, MR, NH>(a, m, h);
    for (; m < a.m_end; ++m) tile<BITS, KB, 1, NH>(a, m, h);
  }
  for (; h < h_end; h += 2) {
    int m = a.m_begin;
    for (; m + MR <= a.m_end; m += MR) tile<BITS, KB, MR, 2>(a, m, h);
    for (; m < a.m_end; ++m) tile<BITS, KB, 1, 2>(a, m, h);
  }
}

template <int MR, int NH>
struct Tile {
  template <int BITS, int KB, bool ZEROS>
  static void run(const GemmArgs& a) {
    run_tiles<BITS, KB, MR, NH>(a);  // zero points are a run-time branch here
  }
};
