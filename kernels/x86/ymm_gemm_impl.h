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

// Pins an accumulator to a register at this point of the chain: without it
// GCC reassociates a superblock's int16 additions into a tree, keeping every
// vpmaddubsw product live at once, and spills most of them to the stack.
__attribute__((always_inline)) inline void pin(__m256i& v) { asm("" : "+x"(v)); }

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

// load_scales with the storage known at compile time.
template <bool BF16>
__attribute__((always_inline)) inline __m256 load_scales_as(const PackedLayout& l, const uint8_t* group, int g,
                                                            int half) {
  const uint8_t* p = l.scales_of(group, g);
  if constexpr (BF16) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * half))), 16));
  }
  return _mm256_loadu_ps(reinterpret_cast<const float*>(p) + 8 * half);
}

// With bfloat16 scale storage a block's scales and zero points sit in arrays
// after its planes, and the hardware prefetchers stream that layout poorly
// from DRAM: with few m-tiles per column step (decode, small m), weights
// evicted, the 4x16 tile took 1.35x-2.5x its time with float32 scales
// (inside the groups: one unbroken stream) on a Zen 4, the more the shorter
// the rows (4-bit, m = 1: 4096 x 4096 649 against 466 us, 8192 x 1024 483
// against 204, 49152 x 576 1730 against 683), while the prefetching GEMV,
// which requests the next column step itself, was faster with bfloat16
// scales than with float32 ones. So for that layout the tile requests the
// next column step's bytes too, an even share per group (NextStep). Not with
// float32 scales: the same requests made the tile 1.1-1.4x slower there
// (2048 x 2048 114 -> 165 us, 49152 x 576 637 -> 808 us), where the hardware
// streams the groups best alone.
// A step of at most this many bytes is requested into L1, a longer one into
// L2 only (it would evict the step being read: 4096 x 4096, a 36 KB step,
// 558 us into L1 against 442 into L2; 8192 x 1024, 9 KB, 174 against 228).
constexpr int64_t kNextStepIntoL1Bytes = 16 << 10;
struct NextStep {
  const uint8_t* p = nullptr;  // the step's first byte; nullptr: nothing to request
  int64_t bytes = 0, share = 0;  // share: bytes per group, whole lines

  // Blocks [first, min(first + count, n_blocks)), up to the weights' end
  // rather than the task's: the op cuts the columns into many tasks, and a
  // thread runs its tasks' steps in order. Nothing unless the scales are
  // kept apart from the planes.
  static NextStep of(const PackedLayout& l, const uint8_t* body, int first, int count) {
    NextStep s;
    const int end = first + count < l.n_blocks ? first + count : l.n_blocks;
    if (l.scales_skew == 0 || first >= end) return s;
    s.p = body + int64_t(first) * l.block_bytes;
    s.bytes = int64_t(end - first) * l.block_bytes;
    s.share = ((s.bytes + l.groups - 1) / l.groups + 63) & ~int64_t(63);
    return s;
  }

  // Group g's share of the step.
  __attribute__((always_inline)) void request(int g) const {
    if (!p) return;
    const int64_t lo = int64_t(g) * share;
    const int64_t hi = lo + share < bytes ? lo + share : bytes;
    if (bytes <= kNextStepIntoL1Bytes) {
      for (int64_t off = lo; off < hi; off += 64) _mm_prefetch(reinterpret_cast<const char*>(p + off), _MM_HINT_T0);
    } else {
      for (int64_t off = lo; off < hi; off += 64) _mm_prefetch(reinterpret_cast<const char*>(p + off), _MM_HINT_T1);
    }
  }
};

// float(zero + 2^(b-1)) for rows 8 * hsel .. 8 * hsel + 7 of a block's
// group g (without zero points, the offset alone): the epilogues' multiplier
// of sum(x).
template <int BITS, bool ZEROS>
__attribute__((always_inline)) inline __m256 offset_floats(const PackedLayout& l, const uint8_t* group, int g,
                                                           int hsel) {
  constexpr int32_t kOffset = 1 << (BITS - 1);
  if constexpr (ZEROS) {
    return _mm256_cvtepi32_ps(_mm256_add_epi32(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(l.zeros_of(group, g) + 8 * hsel))),
        _mm256_set1_epi32(kOffset)));
  }
  return _mm256_set1_ps(static_cast<float>(kOffset));
}

template <int BITS, int KB, int J>
__attribute__((always_inline)) inline __m256i unpack_half(const uint8_t* sb) {
  constexpr plane_layout::Planes P = plane_layout::planes_of(BITS, KB);
  if constexpr (BITS == 8) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + J * 64));
  } else {
    // One 16-bit shift per plane moves its field from bit `shift` of the
    // byte straight to its place P.shift[i] in the value (bits crossing in
    // from the neighbouring byte land outside the field), then a mask and an
    // or: no second shift for the upper planes.
    __m256i v = _mm256_setzero_si256();
#pragma GCC unroll 3
    for (int i = 0; i < P.count; ++i) {
      const int p = P.bits[i];
      const int unit = P.unit_offset[i] + (J * p) / 8;
      const int move = (J * p) % 8 - P.shift[i];
      __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + unit * 64));
      if (move > 0) u = _mm256_srli_epi16(u, move);
      if (move < 0) u = _mm256_slli_epi16(u, -move);
      u = _mm256_and_si256(u, _mm256_set1_epi8(static_cast<char>(((1 << p) - 1) << P.shift[i])));
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
    for (int h = 0; h < NH; ++h) {
      acc[r][h] = Dot::template dot<BITS>(acc[r][h], w[h], xb);
      pin(acc[r][h]);
    }
  }
}

template <int BITS, int KB, int MR, int NH, int J>
__attribute__((always_inline)) inline void dot16_block(const uint8_t* const* sb, const int8_t* const* xs,
                                                       __m256i (&acc)[MR][NH]) {
  __m256i w[NH];
  for (int h = 0; h < NH; ++h) w[h] = unpack_half<BITS, KB, J>(sb[h]);
  for (int h = 0; h < NH; ++h) pin(w[h]);  // unpacked once for all MR rows
  for (int r = 0; r < MR; ++r) {
    const __m256i xb = _mm256_set1_epi32(load_i32(xs[r] + 4 * J));
    for (int h = 0; h < NH; ++h) {
      if constexpr (J == 0) {
        acc[r][h] = _mm256_maddubs_epi16(w[h], xb);  // the superblock's sums start at zero
      } else {
        acc[r][h] = Dot::dot16(acc[r][h], w[h], xb);
      }
      pin(acc[r][h]);
    }
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
// stream: requests each block's lines kGemvStreamAheadBytes ahead into L1 as
// the groups are read (the stream rows' first m-tile of a step; then the
// next column step's bytes are not requested whole), or nullptr.
template <int BITS, int KB, int MR, int NH>
void tile(const GemmArgs& a, int m0, int half, const StreamAhead* stream = nullptr) {
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
  // The next column step's blocks, requested by the step's last m-tile when
  // the scales sit apart from the planes (NextStep).
  NextStep next;
  if (!stream && m0 + MR >= a.m_end) {
    const int first = (half + NH) >> 1, last = (half + 2 * NH - 1) >> 1;  // blocks of the next step
    next = NextStep::of(l, a.body, first, last + 1 - first);
  }

  for (int g = 0; g < l.groups; ++g) {
    const uint8_t* gp[NH];
    for (int h = 0; h < NH; ++h) gp[h] = blk[h] + int64_t(g) * l.group_bytes;
    next.request(g);
    if (stream) {
      // The tile's blocks: NH halves from `half`, whole blocks when it is even.
      constexpr int NB = (NH + 1) / 2;
      if (l.has_zeros)
        stream->request<NB, true>(gp[0], g);
      else
        stream->request<NB, false>(gp[0], g);
    }
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

// The rows of a column step past its last whole MR-row tile, as one tile of
// that many rows (run row by row, each row would unpack the step's weights
// again: m = 3 made three passes over them where one does).
template <int BITS, int KB, int MR, int NH>
void tail_tile(const GemmArgs& a, int m, int rows, int h, const StreamAhead* stream) {
  if constexpr (MR > 1) {
    if (rows == MR - 1) return tile<BITS, KB, MR - 1, NH>(a, m, h, stream);
    tail_tile<BITS, KB, MR - 1, NH>(a, m, rows, h, stream);
  }
}

// stream: the first m-tile of each column step requests the step's lines
// ahead as it reads them (StreamAhead), for weights streamed from DRAM at
// m = 2-3, where the rows of a GEMV would each unpack them again.
template <int BITS, int KB, int MR, int NH>
void run_tile_steps(const GemmArgs& a, const StreamAhead* stream) {
  int h = 2 * a.block_begin;
  const int h_end = 2 * a.block_end;
  for (; h + NH <= h_end; h += NH) {
    int m = a.m_begin;
    for (; m + MR <= a.m_end; m += MR) tile<BITS, KB, MR, NH>(a, m, h, m == a.m_begin ? stream : nullptr);
    if (m < a.m_end) tail_tile<BITS, KB, MR, NH>(a, m, a.m_end - m, h, m == a.m_begin ? stream : nullptr);
  }
  for (; h < h_end; h += 2) {
    int m = a.m_begin;
    for (; m + MR <= a.m_end; m += MR) tile<BITS, KB, MR, 2>(a, m, h, m == a.m_begin ? stream : nullptr);
    if (m < a.m_end) tail_tile<BITS, KB, MR, 2>(a, m, a.m_end - m, h, m == a.m_begin ? stream : nullptr);
  }
}

template <int BITS, int KB, int MR, int NH, bool STREAM = false>
void run_tiles(const GemmArgs& a) {
  if constexpr (STREAM) {
    const StreamAhead stream(*a.w);
    run_tile_steps<BITS, KB, MR, NH>(a, &stream);
  } else {
    run_tile_steps<BITS, KB, MR, NH>(a, nullptr);
  }
}

// Declared once in kernels/manifest.toml ([shared_unpack]).
constexpr int kChunkBytes = kSharedUnpackChunkBytes;  // unpacked weights per chunk: L1-resident
constexpr int kMaxChunkGroupSize = kSharedUnpackMaxGroupSize;  // the float epilogue's exactness bound
constexpr int kPassRows = kSharedUnpackPassRows256;  // [shared_unpack] pass_rows_256

// Dot::kPath<BITS, KB>: 0 = int32 dot per 4-k block (Dot::dot); 1 = int16
// pair sums per superblock (Dot::dot16 / widen); 2 = the byte split in
// nibbles, each accumulated as int16 pair sums, hi widened with weight 16;
// 3 (8-bit weights, shared-unpack tiles only) = the bytes widened to int16
// and multiplied by int16 activation panels (QuantizedActivations::
// panel_int16) with vpmaddwd into int32: exact, and 2 multiplies per 32
// products where path 2 issues 2.25.
template <int BITS, int KB>
constexpr int path_of() {
  return Dot::template kPath<BITS, KB>;
}
template <int BITS, int KB>
constexpr int vectors_per_half() {
  return path_of<BITS, KB>() >= 2 ? 2 : 1;
}
// Bytes per activation value in the panels the shared-unpack tiles read.
template <int BITS, int KB>
constexpr int panel_value_bytes() {
  return path_of<BITS, KB>() == 3 ? 2 : 1;
}

// ---- GEMV: one row, NB blocks streamed side by side -------------------------
// The decode path (m = 1..3, one row at a time) is bound by how fast the
// weights arrive, so its loop is the tile's with nothing else: one base
// pointer (the blocks sit block_bytes apart), the scale storage and zero
// points as template arguments instead of per-group branches, and the float
// accumulators in registers.
//
// GemvFetch::kNextStep: while a column step runs, its groups also prefetch
// the next column step's bytes into L2 (one even share per superblock). The
// kHardware rows do it too when the scales are bfloat16 (see NextStep; 4096
// x 4096 4-bit from DRAM, m = 1, Zen 4 capped to AVX2: 509 us without it, 395
// with it, 462 with float32 scales). In decode the weights come
// from DRAM and a layer is short (a 576 x 576 4-bit layer is 220 KB), so the
// hardware prefetchers, which learn each 4 KB page anew, leave most of the
// DRAM latency exposed; a whole column step ahead hides it. Zen 4 core capped
// to AVX2, 4-bit, weights evicted before each call: 1536 x 576 63 -> 30 us,
// 576 x 576 24 -> 13 us; with the weights in L3 it costs 0-10% (the hardware
// streams alone do better there), so both forms are registry rows; a third,
// kStream, requests lines a short distance ahead into L1 (gemv_row).
// Path 2 (8-bit weights, AVX2) splits the activation instead of the weight:
// x = 16 * xh + xl with xl = x & 15 (0..15) and xh = x >> 4 (-8..7), so the
// weight byte enters vpmaddubsw whole (no masks or shifts per weight vector)
// and each activation broadcast is split once for all NH weight vectors.
// int16 pair sums stay exact: w * xh pairs lie in [-4080, 3570], eight of
// them (a 32-k superblock) in [-32640, 28560]; w * xl pairs reach 7650, so
// even and odd blocks take separate accumulators (t, t3: four each).
template <int BITS, int KB, int NH, int J>
__attribute__((always_inline)) inline void gemv_block(const uint8_t* sb, int64_t bs, const int8_t* xs,
                                                      __m256i (&t)[NH], __m256i (&t2)[NH], __m256i (&t3)[NH]) {
  constexpr int kPath = path_of<BITS, KB>();
  const __m256i xb = _mm256_set1_epi32(load_i32(xs + 4 * J));
  __m256i xl = xb, xh = xb;
  if constexpr (kPath == 2) {
    const __m256i nib = _mm256_set1_epi8(0x0F), eight = _mm256_set1_epi8(8);
    xl = _mm256_and_si256(xb, nib);
    xh = _mm256_sub_epi8(_mm256_xor_si256(_mm256_and_si256(_mm256_srli_epi16(xb, 4), nib), eight), eight);
  }
  for (int h = 0; h < NH; ++h) {
    const __m256i w = unpack_half<BITS, KB, J>(sb + (h >> 1) * bs + 32 * (h & 1));
    if constexpr (kPath == 1 && J == 0) {
      t[h] = _mm256_maddubs_epi16(w, xb);  // the superblock's sums start at zero
    } else if constexpr (kPath == 1) {
      t[h] = Dot::dot16(t[h], w, xb);
    } else if constexpr (kPath == 2) {
      if constexpr (J % 2 == 0) {
        t[h] = Dot::dot16(t[h], w, xl);
      } else {
        t3[h] = Dot::dot16(t3[h], w, xl);
        pin(t3[h]);
      }
      t2[h] = Dot::dot16(t2[h], w, xh);
      pin(t2[h]);
    } else {
      t[h] = Dot::template dot<BITS>(t[h], w, xb);
    }
    pin(t[h]);
  }
}

template <int BITS, int KB, int NH, int... Js>
__attribute__((always_inline)) inline void gemv_superblock(const uint8_t* sb, int64_t bs, const int8_t* xs,
                                                           __m256i (&t)[NH], __m256i (&t2)[NH], __m256i (&t3)[NH],
                                                           std::integer_sequence<int, Js...>) {
  (gemv_block<BITS, KB, NH, Js>(sb, bs, xs, t, t2, t3), ...);
}

// How a GEMV row gets its weights ahead of use (each form is a registry row):
//   kHardware  the hardware prefetchers alone (with bfloat16 scales, the
//              next column step too: NextStep);
//   kNextStep  the next column step requested into L2 while a step runs
//              (short layers from DRAM, whose pages the prefetchers learn
//              too late);
//   kStream    each block's lines requested into L1 kGemvStreamAheadBytes ahead
//              of the group being read. Over long rows from DRAM the
//              256-bit GEMVs otherwise take about the stream's time plus
//              their own work: on a Granite Rapids-class core capped to
//              AVX-VNNI, 4096 x 4096 2-bit 583 -> 486 us, where 4-bit
//              gained 737 -> 707 (docs/benchmarks.md); with the weights in
//              L2 the requests cost 9-14%, so it is the DRAM (decode) row.
enum class GemvFetch { kHardware, kNextStep, kStream };

// prefetch: whether this row brings the weights in (the first row of a step
// does; rows 2-3 of the same step find them in cache); stream: the kStream
// form's requests.
template <int BITS, int KB, int NB, bool ZEROS, bool BF16, GemvFetch PF>
void gemv_row(const GemmArgs& a, int m, int block, bool prefetch, const StreamAhead& stream) {
  constexpr int NH = 2 * NB;
  constexpr int kPath = path_of<BITS, KB>();
  constexpr int32_t kOffset = 1 << (BITS - 1);
  const PackedLayout& l = *a.w;
  const QuantizedActivations& x = *a.x;
  const uint8_t* base = a.body + int64_t(block) * l.block_bytes;
  const int64_t bs = l.block_bytes;
  const int8_t* xr = x.q + int64_t(m) * x.row_stride;
  const int32_t* xsum = x.group_sums + int64_t(m) * x.groups;
  __m256 f[NH];
  for (int h = 0; h < NH; ++h) f[h] = _mm256_setzero_ps();
  // The next column step's bytes (the blocks that follow, up to the last
  // block of the weights), an even share of them per superblock: per group,
  // a per-channel group (one group per row) sent the whole step's requests
  // in one burst.
  const int next_block = block + NB;
  constexpr bool kNext = PF == GemvFetch::kNextStep || (BF16 && PF == GemvFetch::kHardware);
  const int next_blocks = !kNext || !prefetch || next_block >= l.n_blocks ? 0 : (l.n_blocks - next_block < NB ? l.n_blocks - next_block : NB);
  const uint8_t* next = a.body + int64_t(next_blocks ? next_block : 0) * bs;
  const int64_t span = int64_t(next_blocks) * bs;
  const int64_t per_share = (span / (int64_t(l.groups) * l.superblocks) + 63) & ~int64_t(63);
  int64_t share_lo = 0;
  for (int g = 0; g < l.groups; ++g) {
    const uint8_t* gp = base + int64_t(g) * l.group_bytes;
    const int8_t* xs = xr + int64_t(g) * l.group_size;
    const uint8_t* sb = gp;
    __m256i acc[NH];
    if constexpr (PF == GemvFetch::kStream) {
      if (prefetch) stream.request<NB, ZEROS>(gp, g);
    }
    for (int s = 0; s < l.superblocks; ++s) {
      if constexpr (kNext) {
        const int64_t hi = share_lo + per_share < span ? share_lo + per_share : span;
        for (int64_t off = share_lo; off < hi; off += 64)
          _mm_prefetch(reinterpret_cast<const char*>(next + off), _MM_HINT_T1);
        share_lo = hi;
      }
      __m256i t[NH], t2[NH], t3[NH];
      for (int h = 0; h < NH; ++h) t[h] = t2[h] = t3[h] = _mm256_setzero_si256();
      gemv_superblock<BITS, KB, NH>(sb, bs, xs, t, t2, t3, std::make_integer_sequence<int, KB / 4>{});
      for (int h = 0; h < NH; ++h) {
        __m256i v = t[h];
        if constexpr (kPath == 1) v = Dot::widen(t[h]);
        if constexpr (kPath == 2)
          v = _mm256_add_epi32(_mm256_add_epi32(_mm256_madd_epi16(t[h], _mm256_set1_epi16(1)),
                                                _mm256_madd_epi16(t3[h], _mm256_set1_epi16(1))),
                               _mm256_madd_epi16(t2[h], _mm256_set1_epi16(16)));
        acc[h] = s == 0 ? v : _mm256_add_epi32(acc[h], v);
      }
      sb += l.superblock_bytes;
      xs += KB;
    }
    if (l.group_size <= kMaxChunkGroupSize) {
      // As in tile(): float(I_g) exactly with one fnmadd.
      const __m256 fs = _mm256_set1_ps(static_cast<float>(xsum[g]));
      for (int h = 0; h < NH; ++h) {
        const uint8_t* grp = gp + (h >> 1) * bs;
        const __m256 zf = offset_floats<BITS, ZEROS>(l, grp, g, h & 1);
        const __m256 ig = _mm256_fnmadd_ps(zf, fs, _mm256_cvtepi32_ps(acc[h]));
        f[h] = _mm256_fmadd_ps(ig, load_scales_as<BF16>(l, grp, g, h & 1), f[h]);
      }
    } else {
      for (int h = 0; h < NH; ++h) {
        const uint8_t* grp = gp + (h >> 1) * bs;
        __m256i v = acc[h];
        if constexpr (ZEROS) {
          const __m256i z = _mm256_add_epi32(
              _mm256_cvtepi8_epi32(
                  _mm_loadl_epi64(reinterpret_cast<const __m128i*>(l.zeros_of(grp, g) + 8 * (h & 1)))),
              _mm256_set1_epi32(kOffset));
          v = _mm256_add_epi32(v, _mm256_mullo_epi32(z, _mm256_set1_epi32(-xsum[g])));
        } else {
          v = _mm256_add_epi32(v, _mm256_set1_epi32(-kOffset * xsum[g]));
        }
        f[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), load_scales_as<BF16>(l, grp, g, h & 1), f[h]);
      }
    }
  }
  for (int h = 0; h < NH; ++h) {
    const int col = (2 * block + h) * 8;
    if (col >= l.n) break;
    const int cols = l.n - col < 8 ? l.n - col : 8;
    const uint8_t* bp = base + (h >> 1) * bs;
    const __m256 rs = _mm256_loadu_ps(reinterpret_cast<const float*>(bp + l.row_sums_offset) + 8 * (h & 1));
    const __m256 bias = l.has_bias
                            ? _mm256_loadu_ps(reinterpret_cast<const float*>(bp + l.bias_offset) + 8 * (h & 1))
                            : _mm256_setzero_ps();
    const __m256 t = _mm256_fmadd_ps(_mm256_set1_ps(static_cast<float>(-x.zero[m])), rs, f[h]);
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

template <int BITS, int KB, int NB, bool ZEROS, bool BF16, GemvFetch PF>
void run_gemv_rows(const GemmArgs& a) {
  const StreamAhead stream(*a.w);
  int b = a.block_begin;
  for (; b + NB <= a.block_end; b += NB)
    for (int m = a.m_begin; m < a.m_end; ++m)
      gemv_row<BITS, KB, NB, ZEROS, BF16, PF>(a, m, b, m == a.m_begin, stream);
  if constexpr (NB > 1) {
    for (; b < a.block_end; ++b)
      for (int m = a.m_begin; m < a.m_end; ++m)
        gemv_row<BITS, KB, 1, ZEROS, BF16, PF>(a, m, b, m == a.m_begin, stream);
  }
}

// Row by row over NB-block column steps (the GEMV rows); PF: how the weights
// are requested ahead.
template <int NB, GemvFetch PF>
struct Gemv {
  template <int BITS, int KB, bool ZEROS>
  static void run(const GemmArgs& a) {
    if (a.w->scales_bf16) {
      run_gemv_rows<BITS, KB, NB, ZEROS, true, PF>(a);
    } else {
      run_gemv_rows<BITS, KB, NB, ZEROS, false, PF>(a);
    }
  }
};

// ---- Unpack once per column step, reuse across m-tiles ----------------------
// With more than one m-tile per column step, every tile would repeat the
// step's shifts and masks. Instead a k-chunk of the step's NB blocks is
// unpacked once into an L1 buffer and every m-tile of a pass of up to
// kPassRows rows reads it: the inner loop is then loads, broadcasts and dot
// products only. Activations come from row panels (one pointer for the MR
// rows; their float sums feed the epilogue). For the AVX2 8-bit paths the
// buffer holds two vectors per half: each byte's two nibbles, which the
// inner loop accumulates in int16 pair sums (path 2), or the even and the
// odd k-values' bytes as int16, less the group's offset (path 3; see Dot::kPath
// and folds_offset).
// Path 3's weight vectors: the 16-bit lanes (k0 | k1 << 8, k2 | k3 << 8) of
// each row's 4 bytes become (k0, k2) in `even` (a mask) and (k1, k3) in
// `odd` (a shift), zero-extended: the order of the int16 panels' values.
__attribute__((always_inline)) inline void split_words(__m256i v, __m256i& even, __m256i& odd) {
  even = _mm256_and_si256(v, _mm256_set1_epi16(0x00FF));
  odd = _mm256_srli_epi16(v, 8);
}

// Path 3's L1 buffer holds each weight minus its group's (zero + 2^(b-1))
// as int16 (|u - zero - 128| <= 255): the dot products are then the
// reference's I_g itself (equal modulo 2^32, the reference's int32 wrapping),
// and the epilogues drop the offset term, a multiply-add and a broadcast per
// row and half of every group. One vpsubw per unpacked vector, shared by
// every m-tile of the column step.
template <int BITS, int KB>
constexpr bool folds_offset() {
  return path_of<BITS, KB>() == 3;
}

// Path 0 without zero points (every VNNI width, AVX2's 5-7 bits): the offset
// term of I_g, 2^(b-1) * sum(x), depends on the row and group only, so the
// two-pass tiles start each group's int32 dot products at its negation
// instead of zero and the dots are I_g itself: the epilogue's fnmadd (a
// port-0/1 op per row and half of every group, beside the dot products' own)
// goes (docs/benchmarks.md, "The offset term in the dot products' start").
template <int BITS, int KB, bool ZEROS>
constexpr bool starts_at_offset() {
  return path_of<BITS, KB>() == 0 && !ZEROS;
}

// The words (zero + 2^(b-1)) of rows 8 * s .. 8 * s + 7 of a block's group g,
// each in both 16-bit lanes of the row's dword (path 3's even and odd
// vectors): zoff[2 * b + s] for the NB blocks at blk (groups start at
// blk[b] + g * group_bytes).
template <int BITS, int NB>
__attribute__((always_inline)) inline void offset_words(const PackedLayout& l, const uint8_t* const* blk, int g,
                                                        __m256i* zoff) {
  constexpr int32_t kOffset = 1 << (BITS - 1);
  for (int b = 0; b < NB; ++b) {
    for (int s = 0; s < 2; ++s) {
      if (!l.has_zeros) {
        zoff[2 * b + s] = _mm256_set1_epi16(kOffset);
        continue;
      }
      const uint8_t* group = blk[b] + int64_t(g) * l.group_bytes;
      const __m256i z = _mm256_add_epi32(
          _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(l.zeros_of(group, g) + 8 * s))),
          _mm256_set1_epi32(kOffset));
      zoff[2 * b + s] = _mm256_or_si256(z, _mm256_slli_epi32(z, 16));
    }
  }
}

// zoff: offset_words of the superblock's group (path 3 only).
template <int BITS, int KB, int NB, int J>
__attribute__((always_inline)) inline void unpack_store(const uint8_t* const* sb, const __m256i* zoff, uint8_t* out) {
  constexpr int V = vectors_per_half<BITS, KB>();
  for (int b = 0; b < NB; ++b) {
    for (int s = 0; s < 2; ++s) {
      const __m256i v = unpack_half<BITS, KB, J>(sb[b] + 32 * s);
      uint8_t* o = out + ((J * NB + b) * 2 + s) * V * 32;
      if constexpr (path_of<BITS, KB>() == 3) {
        __m256i even, odd;
        split_words(v, even, odd);
        _mm256_store_si256(reinterpret_cast<__m256i*>(o), _mm256_sub_epi16(even, zoff[2 * b + s]));
        _mm256_store_si256(reinterpret_cast<__m256i*>(o + 32), _mm256_sub_epi16(odd, zoff[2 * b + s]));
      } else if constexpr (V == 2) {
        const __m256i nib = _mm256_set1_epi8(0x0F);
        _mm256_store_si256(reinterpret_cast<__m256i*>(o), _mm256_and_si256(v, nib));
        _mm256_store_si256(reinterpret_cast<__m256i*>(o + 32), _mm256_and_si256(_mm256_srli_epi16(v, 4), nib));
      } else {
        _mm256_store_si256(reinterpret_cast<__m256i*>(o), v);
      }
    }
  }
}

template <int BITS, int KB, int NB, int... Js>
__attribute__((always_inline)) inline void unpack_superblock(const uint8_t* const* sb, const __m256i* zoff,
                                                             uint8_t* out, std::integer_sequence<int, Js...>) {
  (unpack_store<BITS, KB, NB, Js>(sb, zoff, out), ...);
}

template <int BITS, int KB, int NB>
constexpr int64_t unpacked_superblock_bytes() {
  return int64_t(KB / 4) * NB * 2 * vectors_per_half<BITS, KB>() * 32;
}

// Groups in a chunk when a group is one superblock: the size of the per-chunk
// buffers of the two-pass tiles (chunk_dots, chunk_constants).
template <int BITS, int KB, int NB>
constexpr int max_chunk_groups() {
  constexpr int64_t g = kChunkBytes / unpacked_superblock_bytes<BITS, KB, NB>();
  return g > 0 ? static_cast<int>(g) : 1;
}

// Groups [g0, g1) of blocks blk[0..NB) -> ubuf.
template <int BITS, int KB, int NB>
void unpack_chunk(const PackedLayout& l, const uint8_t* const* blk, int g0, int g1, uint8_t* ubuf) {
  for (int g = g0; g < g1; ++g) {
    const uint8_t* sb[NB];
    for (int b = 0; b < NB; ++b) sb[b] = blk[b] + int64_t(g) * l.group_bytes;
    __m256i zoff[2 * NB];
    if constexpr (folds_offset<BITS, KB>()) offset_words<BITS, NB>(l, blk, g, zoff);
    for (int s = 0; s < l.superblocks; ++s) {
      unpack_superblock<BITS, KB, NB>(sb, zoff, ubuf, std::make_integer_sequence<int, KB / 4>{});
      ubuf += unpacked_superblock_bytes<BITS, KB, NB>();
      for (int b = 0; b < NB; ++b) sb[b] += l.superblock_bytes;
    }
  }
}

// One 4-k block of unpacked weights into an MR x NH int32 (path 0) or int16
// (path 1) accumulator tile; xp: the panel's chunk of 4 k for MR rows.
template <int BITS, int KB, int MR, int NH, int J>
__attribute__((always_inline)) inline void dot_unpacked(const uint8_t* u, const int8_t* xp, __m256i (&acc)[MR][NH]) {
  __m256i w[NH];
  for (int h = 0; h < NH; ++h) {
    w[h] = _mm256_load_si256(reinterpret_cast<const __m256i*>(u + (J * NH + h) * 32));
    pin(w[h]);  // one load per block for all MR rows, not a memory operand of each row's vpmaddubsw
  }
  for (int r = 0; r < MR; ++r) {
    const __m256i xb = _mm256_set1_epi32(load_i32(xp + 4 * (J * MR + r)));
    for (int h = 0; h < NH; ++h) {
      if constexpr (path_of<BITS, KB>() == 1 && J == 0) {
        acc[r][h] = _mm256_maddubs_epi16(w[h], xb);  // the accumulators start at zero
      } else if constexpr (path_of<BITS, KB>() == 1) {
        acc[r][h] = Dot::dot16(acc[r][h], w[h], xb);
      } else {
        acc[r][h] = Dot::template dot<BITS>(acc[r][h], w[h], xb);
      }
      pin(acc[r][h]);
    }
  }
}

template <int BITS, int KB, int MR, int NH, int... Js>
__attribute__((always_inline)) inline void dot_unpacked_superblock(const uint8_t* u, const int8_t* xp,
                                                                   __m256i (&acc)[MR][NH],
                                                                   std::integer_sequence<int, Js...>) {
  (dot_unpacked<BITS, KB, MR, NH, Js>(u, xp, acc), ...);
}

// Path 2: the int32 sums of a superblock from its two nibble planes' int16
// pair sums, w = 16 * hi + lo.
__attribute__((always_inline)) inline __m256i widen_nibbles(__m256i lo, __m256i hi) {
  return _mm256_add_epi32(_mm256_madd_epi16(lo, _mm256_set1_epi16(1)), _mm256_madd_epi16(hi, _mm256_set1_epi16(16)));
}

// Path 2, one half h: both nibble planes of each block into int16 pair sums.
template <int MR, int NH, int J>
__attribute__((always_inline)) inline void dot_nibbles(const uint8_t* u, int h, const int8_t* xp, __m256i (&lo)[MR],
                                                       __m256i (&hi)[MR]) {
  const uint8_t* p = u + (J * NH + h) * 64;
  const __m256i wl = _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i wh = _mm256_load_si256(reinterpret_cast<const __m256i*>(p + 32));
  for (int r = 0; r < MR; ++r) {
    const __m256i xb = _mm256_set1_epi32(load_i32(xp + 4 * (J * MR + r)));
    if constexpr (J == 0) {  // the superblock's sums start at zero
      lo[r] = _mm256_maddubs_epi16(wl, xb);
      hi[r] = _mm256_maddubs_epi16(wh, xb);
    } else {
      lo[r] = Dot::dot16(lo[r], wl, xb);
      hi[r] = Dot::dot16(hi[r], wh, xb);
    }
    pin(lo[r]);
    pin(hi[r]);
  }
}

template <int MR, int NH, int... Js>
__attribute__((always_inline)) inline void dot_nibbles_superblock(const uint8_t* u, int h, const int8_t* xp,
                                                                  __m256i (&lo)[MR], __m256i (&hi)[MR],
                                                                  std::integer_sequence<int, Js...>) {
  (dot_nibbles<MR, NH, Js>(u, h, xp, lo, hi), ...);
}

// Path 3, one 4-k block: acc[r][h] += the int32 dot products of the even
// k-values' int16 weights we[h] with row r's (x0, x2) and of the odd ones'
// wo[h] with (x1, x3); xp: the block's chunk of the int16 panel.
template <int MR, int NH, int J>
__attribute__((always_inline)) inline void dot_word_halves(const __m256i (&we)[NH], const __m256i (&wo)[NH],
                                                           const int16_t* xp, __m256i (&acc)[MR][NH]) {
  for (int r = 0; r < MR; ++r) {
    const int16_t* xr = xp + 4 * (J * MR + r);
    int32_t e, o;
    std::memcpy(&e, xr, 4);
    std::memcpy(&o, xr + 2, 4);
    const __m256i xe = _mm256_set1_epi32(e), xo = _mm256_set1_epi32(o);
    for (int h = 0; h < NH; ++h) {
      acc[r][h] = _mm256_add_epi32(acc[r][h], _mm256_madd_epi16(we[h], xe));
      acc[r][h] = _mm256_add_epi32(acc[r][h], _mm256_madd_epi16(wo[h], xo));
      pin(acc[r][h]);
    }
  }
}

// Path 3 from the L1 buffer (unpack_store's even and odd halves).
template <int MR, int NH, int J>
__attribute__((always_inline)) inline void dot_words(const uint8_t* u, const int16_t* xp, __m256i (&acc)[MR][NH]) {
  __m256i we[NH], wo[NH];
  for (int h = 0; h < NH; ++h) {
    const uint8_t* p = u + (J * NH + h) * 64;
    we[h] = _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
    wo[h] = _mm256_load_si256(reinterpret_cast<const __m256i*>(p + 32));
  }
  dot_word_halves<MR, NH, J>(we, wo, xp, acc);
}

template <int MR, int NH, int... Js>
__attribute__((always_inline)) inline void dot_words_superblock(const uint8_t* u, const int16_t* xp,
                                                                __m256i (&acc)[MR][NH],
                                                                std::integer_sequence<int, Js...>) {
  (dot_words<MR, NH, Js>(u, xp, acc), ...);
}

// fbuf[r] += scale * float(I_g) for half h of the tile (I_g = acc - (zero +
// 2^(b-1)) * sum(x), formed exactly in float as in tile(); group_size <= 512;
// FOLDED: acc is I_g already, folds_offset).
template <int BITS, int MR, int NH, bool ZEROS, bool FOLDED = false>
__attribute__((always_inline)) inline void add_half(const PackedLayout& l, const float* fsums, int g,
                                                    const uint8_t* group, int h, const __m256i* acc,
                                                    float (*fbuf)[NH][8]) {
  const int hsel = h & 1;
  const __m256 sc = load_scales(l, group, g, hsel);
  if constexpr (FOLDED) {
    for (int r = 0; r < MR; ++r)
      _mm256_store_ps(fbuf[r][h], _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r]), sc, _mm256_load_ps(fbuf[r][h])));
    return;
  }
  const __m256 zf = offset_floats<BITS, ZEROS>(l, group, g, hsel);
  for (int r = 0; r < MR; ++r) {
    const __m256 ig = _mm256_fnmadd_ps(zf, _mm256_set1_ps(fsums[r]), _mm256_cvtepi32_ps(acc[r]));
    _mm256_store_ps(fbuf[r][h], _mm256_fmadd_ps(ig, sc, _mm256_load_ps(fbuf[r][h])));
  }
}

// Groups of one superblock (group size 16 or 32, the common case) take two
// passes per chunk. First every group's dot products go to an int32 buffer
// in L1, in a loop of loads, broadcasts and dot products only: with the
// float work of each group interleaved, GCC's schedule of the same loop ran
// ~40% slower on a Zen 3 core. Then the float epilogue runs over the
// buffer with the tile's float accumulators in registers instead of L1.
// isums (START_AT_OFFSET, starts_at_offset): the panel's int32 sums of the
// first group, MR per group.
template <int BITS, int KB, int MR, int NH, bool START_AT_OFFSET = false>
__attribute__((noinline)) void chunk_dots(const uint8_t* u, const int8_t* xp, int groups, const int32_t* isums,
                                          __m256i* out) {
  constexpr int64_t kStep = unpacked_superblock_bytes<BITS, KB, NH / 2>();
  constexpr int32_t kOffset = 1 << (BITS - 1);
  for (int g = 0; g < groups; ++g, out += MR * NH, u += kStep, xp += KB * MR * panel_value_bytes<BITS, KB>(),
           isums += MR) {
    if constexpr (path_of<BITS, KB>() == 3) {
      __m256i t[MR][NH];
      for (int r = 0; r < MR; ++r)
        for (int h = 0; h < NH; ++h) t[r][h] = _mm256_setzero_si256();
      dot_words_superblock<MR, NH>(u, reinterpret_cast<const int16_t*>(xp), t, std::make_integer_sequence<int, KB / 4>{});
      for (int r = 0; r < MR; ++r)
        for (int h = 0; h < NH; ++h) _mm256_store_si256(out + r * NH + h, t[r][h]);
    } else if constexpr (path_of<BITS, KB>() == 2) {
      for (int h = 0; h < NH; ++h) {
        __m256i lo[MR], hi[MR];
        dot_nibbles_superblock<MR, NH>(u, h, xp, lo, hi, std::make_integer_sequence<int, KB / 4>{});
        for (int r = 0; r < MR; ++r) _mm256_store_si256(out + r * NH + h, widen_nibbles(lo[r], hi[r]));
      }
    } else {
      __m256i t[MR][NH];
      for (int r = 0; r < MR; ++r) {
        // Groups of at most kMaxChunkGroupSize here: 2^(b-1) * |sum(x)| fits int32.
        const __m256i start = START_AT_OFFSET ? _mm256_set1_epi32(-kOffset * isums[r]) : _mm256_setzero_si256();
        for (int h = 0; h < NH; ++h) t[r][h] = start;
      }
      dot_unpacked_superblock<BITS, KB, MR, NH>(u, xp, t, std::make_integer_sequence<int, KB / 4>{});
      for (int r = 0; r < MR; ++r)
        for (int h = 0; h < NH; ++h)
          _mm256_store_si256(out + r * NH + h, path_of<BITS, KB>() == 1 ? Dot::widen(t[r][h]) : t[r][h]);
    }
  }
}

// The float constants of the epilogue for groups [g0, g1) of a column step
// of NH halves, once for all its m-tiles: per group and half, 8 scales as
// float32 and (ZEROS) 8 times float(zero + 2^(b-1)), 16 floats in all.
template <int BITS, int NH, bool ZEROS>
void chunk_constants(const PackedLayout& l, const uint8_t* const* blk, int g0, int g1, float* ebuf) {
  constexpr int32_t kOffset = 1 << (BITS - 1);
  for (int g = g0; g < g1; ++g) {
    for (int h = 0; h < NH; ++h, ebuf += 16) {
      const uint8_t* group = blk[h >> 1] + int64_t(g) * l.group_bytes;
      _mm256_store_ps(ebuf, load_scales(l, group, g, h & 1));
      if constexpr (ZEROS) {
        _mm256_store_ps(ebuf + 8, _mm256_cvtepi32_ps(_mm256_add_epi32(
                                      _mm256_cvtepi8_epi32(_mm_loadl_epi64(
                                          reinterpret_cast<const __m128i*>(l.zeros_of(group, g) + 8 * (h & 1)))),
                                      _mm256_set1_epi32(kOffset))));
      }
    }
  }
}

// fbuf += sum over groups [g0, g1) of scale * float(I_g), I_g formed from
// dots (chunk_dots' layout) as add_half forms it, in the same order; ebuf:
// chunk_constants of the same groups (FOLDED: the dots are I_g, and only the
// scales are read).
template <int BITS, int MR, int NH, bool ZEROS, bool FOLDED>
void chunk_epilogue(const float* psums, int g0, int g1, const __m256i* dots, const float* ebuf,
                    float (*fbuf)[NH][8]) {
  constexpr int32_t kOffset = 1 << (BITS - 1);
  __m256 acc[MR][NH];
  for (int r = 0; r < MR; ++r)
    for (int h = 0; h < NH; ++h) acc[r][h] = _mm256_load_ps(fbuf[r][h]);
  for (int g = g0; g < g1; ++g, dots += MR * NH, ebuf += 16 * NH) {
    const float* fs = psums + int64_t(g) * MR;
    for (int h = 0; h < NH; ++h) {
      const __m256 sc = _mm256_load_ps(ebuf + 16 * h);
      const __m256 zf = ZEROS ? _mm256_load_ps(ebuf + 16 * h + 8) : _mm256_set1_ps(static_cast<float>(kOffset));
      for (int r = 0; r < MR; ++r) {
        const __m256 d = _mm256_cvtepi32_ps(_mm256_load_si256(dots + r * NH + h));
        const __m256 ig = FOLDED ? d : _mm256_fnmadd_ps(zf, _mm256_set1_ps(fs[r]), d);
        acc[r][h] = _mm256_fmadd_ps(ig, sc, acc[r][h]);
      }
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int h = 0; h < NH; ++h) _mm256_store_ps(fbuf[r][h], acc[r][h]);
}

// Superblocks [s0, s1) of group g, unpacked at u, into one m-tile's int32
// sums (first: the group's first chunk, the sums start at zero): a whole
// group of several superblocks (tile_chunk), or a chunk of a long group
// (column_step_long_groups).
template <int BITS, int KB, int MR, int NH>
__attribute__((always_inline)) inline void tile_superblocks(const GemmArgs& a, int m0, const uint8_t* u, int g, int s0, int s1, bool first,
                      __m256i (*isum)[NH]) {
  constexpr int kPath = path_of<BITS, KB>();
  constexpr int64_t kSuperblockBytes = unpacked_superblock_bytes<BITS, KB, NH / 2>();
  const PackedLayout& l = *a.w;
  const QuantizedActivations& x = *a.x;
  constexpr int kValueBytes = panel_value_bytes<BITS, KB>();
  const int8_t* xg =
      x.panels + int64_t(m0 / MR) * x.panel_stride + (int64_t(g) * l.group_size + s0 * KB) * MR * kValueBytes;
  if constexpr (kPath == 3) {
    __m256i acc[MR][NH];
    for (int r = 0; r < MR; ++r)
      for (int h = 0; h < NH; ++h) acc[r][h] = first ? _mm256_setzero_si256() : _mm256_load_si256(&isum[r][h]);
    const uint8_t* us = u;
    const int16_t* xp = reinterpret_cast<const int16_t*>(xg);
    for (int s = s0; s < s1; ++s, us += kSuperblockBytes, xp += KB * MR)
      dot_words_superblock<MR, NH>(us, xp, acc, std::make_integer_sequence<int, KB / 4>{});
    for (int r = 0; r < MR; ++r)
      for (int h = 0; h < NH; ++h) _mm256_store_si256(&isum[r][h], acc[r][h]);
  } else if constexpr (kPath == 2) {
    for (int h = 0; h < NH; ++h) {
      __m256i acc[MR];
      for (int r = 0; r < MR; ++r) acc[r] = first ? _mm256_setzero_si256() : _mm256_load_si256(&isum[r][h]);
      const uint8_t* us = u;
      const int8_t* xp = xg;
      for (int s = s0; s < s1; ++s, us += kSuperblockBytes, xp += KB * MR) {
        __m256i lo[MR], hi[MR];
        for (int r = 0; r < MR; ++r) lo[r] = hi[r] = _mm256_setzero_si256();
        dot_nibbles_superblock<MR, NH>(us, h, xp, lo, hi, std::make_integer_sequence<int, KB / 4>{});
        for (int r = 0; r < MR; ++r) acc[r] = _mm256_add_epi32(acc[r], widen_nibbles(lo[r], hi[r]));
      }
      for (int r = 0; r < MR; ++r) _mm256_store_si256(&isum[r][h], acc[r]);
    }
  } else {
    __m256i acc[MR][NH];
    for (int r = 0; r < MR; ++r)
      for (int h = 0; h < NH; ++h) acc[r][h] = first ? _mm256_setzero_si256() : _mm256_load_si256(&isum[r][h]);
    const uint8_t* us = u;
    const int8_t* xp = xg;
    for (int s = s0; s < s1; ++s, us += kSuperblockBytes, xp += KB * MR) {
      __m256i t[MR][NH];
      for (int r = 0; r < MR; ++r)
        for (int h = 0; h < NH; ++h) t[r][h] = _mm256_setzero_si256();
      dot_unpacked_superblock<BITS, KB, MR, NH>(us, xp, t, std::make_integer_sequence<int, KB / 4>{});
      for (int r = 0; r < MR; ++r)
        for (int h = 0; h < NH; ++h) acc[r][h] = _mm256_add_epi32(acc[r][h], kPath == 1 ? Dot::widen(t[r][h]) : t[r][h]);
    }
    for (int r = 0; r < MR; ++r)
      for (int h = 0; h < NH; ++h) _mm256_store_si256(&isum[r][h], acc[r][h]);
  }
}

// Groups [g0, g1) of one MR x (16 NB) tile from unpacked weights; fbuf:
// [MR][2 NB][8] float accumulators. prefetch: packed bytes of the next
// chunk (group i at prefetch + i * group_bytes) to bring into L2, or null;
// with one superblock per group only bytes [pf_lo, pf_hi) of each block's
// chunk (this tile's share, see column_step_unpacked), otherwise all of
// them, group by group.
template <int BITS, int KB, int MR, int NB, bool ZEROS>
void tile_chunk(const GemmArgs& a, int m0, const uint8_t* const* blk, const uint8_t* ubuf, const float* ebuf,
                int g0, int g1, float (*fbuf)[2 * NB][8], const uint8_t* prefetch, int64_t pf_lo,
                int64_t pf_hi) {
  constexpr int NH = 2 * NB;
  const PackedLayout& l = *a.w;
  const QuantizedActivations& x = *a.x;
  const int8_t* panel = x.panels + int64_t(m0 / MR) * x.panel_stride;
  const float* psums = x.panel_sums_f + int64_t(m0 / MR) * x.panel_sums_stride;
  constexpr int64_t kSuperblockBytes = unpacked_superblock_bytes<BITS, KB, NB>();
  if (l.superblocks == 1) {
    if (prefetch) {
      for (int b = 0; b < NB; ++b)
        for (int64_t off = pf_lo; off < pf_hi; off += 64)
          _mm_prefetch(reinterpret_cast<const char*>(prefetch + b * l.block_bytes + off), _MM_HINT_T1);
    }
    constexpr bool kStart = starts_at_offset<BITS, KB, ZEROS>();
    alignas(32) __m256i dots[max_chunk_groups<BITS, KB, NB>() * MR * NH];
    chunk_dots<BITS, KB, MR, NH, kStart>(ubuf, panel + int64_t(g0) * KB * MR * panel_value_bytes<BITS, KB>(), g1 - g0,
                                         x.panel_sums + int64_t(m0 / MR) * x.panel_sums_stride + int64_t(g0) * MR,
                                         dots);
    chunk_epilogue<BITS, MR, NH, ZEROS, folds_offset<BITS, KB>() || kStart>(psums, g0, g1, dots, ebuf, fbuf);
    return;
  }
  for (int g = g0; g < g1; ++g) {
    if (prefetch) {
      for (int b = 0; b < NB; ++b)
        for (int64_t off = 0; off < l.group_bytes; off += 64)
          _mm_prefetch(reinterpret_cast<const char*>(prefetch + b * l.block_bytes + int64_t(g - g0) * l.group_bytes + off),
                       _MM_HINT_T1);
    }
    const uint8_t* u0 = ubuf + int64_t(g - g0) * l.superblocks * kSuperblockBytes;
    const float* fs = psums + int64_t(g) * MR;
    alignas(32) __m256i isum[MR][NH];
    tile_superblocks<BITS, KB, MR, NH>(a, m0, u0, g, 0, l.superblocks, true, isum);
    for (int h = 0; h < NH; ++h) {
      __m256i col[MR];
      for (int r = 0; r < MR; ++r) col[r] = isum[r][h];
      add_half<BITS, MR, NH, ZEROS, folds_offset<BITS, KB>()>(l, fs, g, blk[h >> 1] + int64_t(g) * l.group_bytes, h,
                                                             col, launder(fbuf));
    }
  }
}

// The reference's final step for rows [m0, m0 + valid) of a tile whose
// float accumulators are fbuf: y = (acc - zero_x * row_sum) * scale_x + bias.
template <int MR, int NB>
void store_tile(const GemmArgs& a, int m0, int valid, const uint8_t* const* blk, int block,
                const float (*fbuf)[2 * NB][8]) {
  const PackedLayout& l = *a.w;
  const QuantizedActivations& x = *a.x;
  for (int h = 0; h < 2 * NB; ++h) {
    const int col = (2 * block + h) * 8;
    if (col >= l.n) break;
    const int cols = l.n - col < 8 ? l.n - col : 8;
    const int hsel = h & 1;
    const uint8_t* bp = blk[h >> 1];
    const __m256 rs = _mm256_loadu_ps(reinterpret_cast<const float*>(bp + l.row_sums_offset) + 8 * hsel);
    const __m256 bias = l.has_bias ? _mm256_loadu_ps(reinterpret_cast<const float*>(bp + l.bias_offset) + 8 * hsel)
                                   : _mm256_setzero_ps();
    for (int r = 0; r < valid; ++r) {
      const int m = m0 + r;
      const __m256 t = _mm256_fmadd_ps(_mm256_set1_ps(static_cast<float>(-x.zero[m])), rs, _mm256_load_ps(fbuf[r][h]));
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

// The output lines store_tile writes for rows [mt, mt + rows) of the column
// step at `block`, requested when the step starts: a fresh output buffer is
// not in cache, and its rows are too many streams for the hardware
// prefetchers, so each store would wait for its line with the store buffer
// full.
template <int NB>
__attribute__((always_inline)) inline void prefetch_output(const GemmArgs& a, int mt, int rows, int block) {
  for (int r = 0; r < rows; ++r) {
    const float* dst = a.out + int64_t(mt + r) * a.out_stride + block * 16;
    _mm_prefetch(reinterpret_cast<const char*>(dst), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(dst + 16 * NB - 1), _MM_HINT_T0);
  }
}

// ---- Shared unpacking of groups longer than a chunk -------------------------
// Per-channel weights (one group of k values) and other groups over
// kMaxChunkGroupSize neither fit one L1 chunk nor stay below the float
// epilogue's exactness bound (add_half: |I_g| < 2^24). Their superblocks are
// unpacked chunk by chunk; every m-tile of the pass keeps its int32 sums of
// the group in L1 across the chunks, and at the group's end takes tile()'s
// integer epilogue (I_g in int32, exact for any group size). Without this
// the 8-bit nibble split ran once per m-tile (the in-register tiles): 1.3x
// slower at m = 32 on 4096x4096 per-channel weights.

// fbuf += scale * float(I_g) for one m-tile at the end of group g, I_g =
// isum - (zero + 2^(b-1)) * sum(x) in int32, as tile() forms it (FOLDED:
// isum is I_g, folds_offset).
template <int BITS, int MR, int NH, bool ZEROS, bool FOLDED = false>
void long_group_epilogue(const GemmArgs& a, int m0, const uint8_t* const* blk, int g, const __m256i (*isum)[NH],
                         float (*fbuf)[NH][8]) {
  const PackedLayout& l = *a.w;
  const QuantizedActivations& x = *a.x;
  constexpr int32_t kOffset = 1 << (BITS - 1);
  const int32_t* xs = x.panel_sums + int64_t(m0 / MR) * x.panel_sums_stride + int64_t(g) * MR;
  for (int h = 0; h < NH; ++h) {
    const uint8_t* group = blk[h >> 1] + int64_t(g) * l.group_bytes;
    const __m256 sc = load_scales(l, group, g, h & 1);
    __m256i z = _mm256_set1_epi32(kOffset);
    if constexpr (ZEROS)
      z = _mm256_add_epi32(
          _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(l.zeros_of(group, g) + 8 * (h & 1)))),
          z);
    for (int r = 0; r < MR; ++r) {
      const __m256i ig = FOLDED ? _mm256_load_si256(&isum[r][h])
                                : _mm256_add_epi32(_mm256_load_si256(&isum[r][h]),
                                                   _mm256_mullo_epi32(z, _mm256_set1_epi32(-xs[r])));
      _mm256_store_ps(fbuf[r][h], _mm256_fmadd_ps(_mm256_cvtepi32_ps(ig), sc, _mm256_load_ps(fbuf[r][h])));
    }
  }
}

// column_step_unpacked for groups over kMaxChunkGroupSize.
template <int BITS, int KB, int MR, int NB, bool ZEROS>
void column_step_long_groups(const GemmArgs& a, int block, const uint8_t* next) {
  constexpr int NH = 2 * NB;
  const PackedLayout& l = *a.w;
  const uint8_t* blk[NB];
  for (int b = 0; b < NB; ++b) blk[b] = a.body + int64_t(block + b) * l.block_bytes;
  constexpr int64_t kSuperblockBytes = unpacked_superblock_bytes<BITS, KB, NB>();
  constexpr int kChunkSuperblocks = kChunkBytes / kSuperblockBytes > 0 ? int(kChunkBytes / kSuperblockBytes) : 1;
  constexpr int kTiles = kPassRows / MR;
  alignas(64) uint8_t ubuf[kChunkSuperblocks * kSuperblockBytes];
  alignas(64) __m256i isum[kTiles][MR][NH];
  alignas(64) float fbuf[kTiles][MR][NH][8];
  for (int m0 = a.m_begin; m0 < a.m_end; m0 += kTiles * MR) {
    const int m1 = a.m_end - m0 < kTiles * MR ? a.m_end : m0 + kTiles * MR;
    const int tiles = (m1 - m0 + MR - 1) / MR;
    const bool last_pass = m1 == a.m_end;
    for (int t = 0; t < tiles; ++t) {
      for (int r = 0; r < MR; ++r)
        for (int h = 0; h < NH; ++h) _mm256_store_ps(fbuf[t][r][h], _mm256_setzero_ps());
      const int mt = m0 + t * MR;
      prefetch_output<NB>(a, mt, m1 - mt < MR ? m1 - mt : MR, block);
    }
    for (int g = 0; g < l.groups; ++g) {
      __m256i zoff[2 * NB];
      if constexpr (folds_offset<BITS, KB>()) offset_words<BITS, NB>(l, blk, g, zoff);
      for (int s0 = 0; s0 < l.superblocks; s0 += kChunkSuperblocks) {
        const int s1 = l.superblocks - s0 < kChunkSuperblocks ? l.superblocks : s0 + kChunkSuperblocks;
        const uint8_t* sb[NB];
        for (int b = 0; b < NB; ++b) sb[b] = blk[b] + int64_t(g) * l.group_bytes + int64_t(s0) * l.superblock_bytes;
        uint8_t* u = ubuf;
        for (int s = s0; s < s1; ++s, u += kSuperblockBytes) {
          unpack_superblock<BITS, KB, NB>(sb, zoff, u, std::make_integer_sequence<int, KB / 4>{});
          for (int b = 0; b < NB; ++b) sb[b] += l.superblock_bytes;
        }
        // The next chunk's packed bytes into L2 while the tiles run: the
        // bytes that follow in each block (the group's scales and the next
        // group), or at the block's end the next column step's; as many as
        // the next chunk unpacks (a full chunk after a group's short last one).
        const bool group_end = s1 == l.superblocks;
        const int left = group_end ? l.superblocks : l.superblocks - s1;
        const int next_superblocks = left < kChunkSuperblocks ? left : kChunkSuperblocks;
        const int64_t chunk_bytes = int64_t(next_superblocks) * l.superblock_bytes;
        const bool block_end = g == l.groups - 1 && group_end;
        if (!block_end || (last_pass && next)) {
          for (int b = 0; b < NB; ++b) {
            const uint8_t* p = block_end ? next + int64_t(b) * l.block_bytes : sb[b];
            for (int64_t off = 0; off < chunk_bytes; off += 64)
              _mm_prefetch(reinterpret_cast<const char*>(p + off), _MM_HINT_T1);
          }
        }
        for (int t = 0; t < tiles; ++t)
          tile_superblocks<BITS, KB, MR, NH>(a, m0 + t * MR, ubuf, g, s0, s1, s0 == 0, isum[t]);
      }
      for (int t = 0; t < tiles; ++t)
        long_group_epilogue<BITS, MR, NH, ZEROS, folds_offset<BITS, KB>()>(a, m0 + t * MR, blk, g, isum[t], fbuf[t]);
    }
    for (int t = 0; t < tiles; ++t) {
      const int mt = m0 + t * MR;
      store_tile<MR, NB>(a, mt, m1 - mt < MR ? m1 - mt : MR, blk, block, fbuf[t]);
    }
  }
}

// Rows [a.m_begin, a.m_end) (panels of MR rows) x the NB blocks at `block`.
// next: the packed weights of the next column step (prefetched into L2 by
// the last m-tile of the last pass), or null.
template <int BITS, int KB, int MR, int NB, bool ZEROS>
void column_step_unpacked(const GemmArgs& a, int block, const uint8_t* next) {
  const PackedLayout& l = *a.w;
  const uint8_t* blk[NB];
  for (int b = 0; b < NB; ++b) blk[b] = a.body + int64_t(block + b) * l.block_bytes;
  constexpr int64_t kSuperblockBytes = unpacked_superblock_bytes<BITS, KB, NB>();
  const int64_t group_unpacked = l.superblocks * kSuperblockBytes;
  const int chunk_groups = group_unpacked >= kChunkBytes ? 1 : static_cast<int>(kChunkBytes / group_unpacked);
  constexpr int kTiles = kPassRows / MR;
  // Up to kChunkBytes, or one whole group of up to kMaxChunkGroupSize k.
  constexpr int64_t kMaxGroup = kMaxChunkGroupSize / KB * kSuperblockBytes;
  constexpr int64_t kUbufBytes = kChunkBytes > kMaxGroup ? kChunkBytes : kMaxGroup;
  alignas(64) uint8_t ubuf[kUbufBytes];
  alignas(64) float ebuf[max_chunk_groups<BITS, KB, NB>() * 2 * NB * 16];  // chunk_constants of a chunk
  alignas(64) float fbuf[kTiles][MR][2 * NB][8];
  for (int m0 = a.m_begin; m0 < a.m_end; m0 += kTiles * MR) {
    const int m1 = a.m_end - m0 < kTiles * MR ? a.m_end : m0 + kTiles * MR;
    const int tiles = (m1 - m0 + MR - 1) / MR;
    const bool last_pass = m1 == a.m_end;
    for (int t = 0; t < tiles; ++t)
      for (int r = 0; r < MR; ++r)
        for (int h = 0; h < 2 * NB; ++h) _mm256_store_ps(fbuf[t][r][h], _mm256_setzero_ps());
    for (int g0 = 0; g0 < l.groups; g0 += chunk_groups) {
      const int g1 = l.groups - g0 < chunk_groups ? l.groups : g0 + chunk_groups;
      unpack_chunk<BITS, KB, NB>(l, blk, g0, g1, ubuf);
      if (l.superblocks == 1) chunk_constants<BITS, 2 * NB, ZEROS>(l, blk, g0, g1, ebuf);
      // What the next unpack reads (this step's next chunk, or on the last
      // pass the next step's first one), requested into L2 while this
      // chunk's tiles run. With a superblock per group every tile requests
      // an even share of its lines: the last tile requesting all of them in
      // one burst before its dot products waited for free miss buffers
      // (8-bit, 4096 x 4096, m = 32, Zen 4 capped to AVX2: 7.08-7.52 ->
      // 6.87-7.01 ms; docs/benchmarks.md). Longer groups: the last tile,
      // group by group.
      const uint8_t* pf = g1 < l.groups ? blk[0] + int64_t(g1) * l.group_bytes : (last_pass ? next : nullptr);
      const bool shares = l.superblocks == 1;
      const int64_t pf_bytes = (g1 - g0) * l.group_bytes;
      const int64_t share = (((pf_bytes + 63) / 64 + tiles - 1) / tiles) * 64;  // whole lines
      for (int t = 0; t < tiles; ++t) {
        if (g0 == 0) {
          const int mt = m0 + t * MR;
          prefetch_output<NB>(a, mt, m1 - mt < MR ? m1 - mt : MR, block);
        }
        tile_chunk<BITS, KB, MR, NB, ZEROS>(a, m0 + t * MR, blk, ubuf, ebuf, g0, g1, fbuf[t],
                                            shares || t == tiles - 1 ? pf : nullptr, t * share,
                                            t * share + share < pf_bytes ? t * share + share : pf_bytes);
      }
    }
    for (int t = 0; t < tiles; ++t) {
      const int mt = m0 + t * MR;
      store_tile<MR, NB>(a, mt, m1 - mt < MR ? m1 - mt : MR, blk, block, fbuf[t]);
    }
  }
}

// ZEROS: the epilogues add the zero points' term (false where folds_offset
// put the zero points in the unpacked weights).
template <int BITS, int KB, int MR, int NB, bool ZEROS>
void run_shared(const GemmArgs& a) {
  // Counted against the layer's blocks, not this call's: the op calls a
  // kernel once per column step (see run_z of the 512-bit tiles).
  const bool long_groups = a.w->group_size > kMaxChunkGroupSize;
  int b = a.block_begin;
  for (; b + NB <= a.block_end; b += NB) {
    const uint8_t* next = b + 2 * NB <= a.w->n_blocks ? a.body + int64_t(b + NB) * a.w->block_bytes : nullptr;
    if (long_groups)
      column_step_long_groups<BITS, KB, MR, NB, ZEROS>(a, b, next);
    else
      column_step_unpacked<BITS, KB, MR, NB, ZEROS>(a, b, next);
  }
  if constexpr (NB > 1) {
    for (; b < a.block_end; ++b) {
      if (long_groups)
        column_step_long_groups<BITS, KB, MR, 1, ZEROS>(a, b, nullptr);
      else
        column_step_unpacked<BITS, KB, MR, 1, ZEROS>(a, b, nullptr);
    }
  }
}

// In-register tiles: each m-tile unpacks the weights it reads (STREAM: the
// stream rows, run_tiles).
template <int MR, int NH, bool STREAM = false>
struct Tile {
  template <int BITS, int KB, bool ZEROS>
  static void run(const GemmArgs& a) {
    run_tiles<BITS, KB, MR, NH, STREAM>(a);  // zero points are a run-time branch here
  }
};

// Shared unpacking: a column step's weights unpacked once into L1 for every
// m-tile of the task (activation panels of MR rows), for every group size
// (groups over kMaxChunkGroupSize chunk by chunk: column_step_long_groups).
template <int MR, int NH>
struct SharedTile {
  template <int BITS, int KB, bool ZEROS>
  static void run(const GemmArgs& a) {
    run_shared<BITS, KB, MR, NH / 2, ZEROS && !folds_offset<BITS, KB>()>(a);
  }
};

// ---- In-register tile over int16 panels (path 3) ----------------------------
// With one to three m-tiles per column step (m = 2-15) there is little to
// share, and the L1 buffer only adds its stores and loads: each 4-k block's
// weight bytes are split into their even and odd k-values' int16 vectors in
// registers (one mask, one shift per 8 rows), then dot_word_halves' products.

// The 4x16 tile's int32 sums of `groups` consecutive groups of `blocks` 4-k
// blocks each (a multiple of 4): w, the first group's 64-byte units (a
// group's units are consecutive; `skip` bytes of scales and zero points
// follow them); xp, the panel's chunks of 4 rows x 4 int16 from the first
// group on; out[8 * g + 2 * r + h], row r and half h of group g. Written out
// in registers: 8 accumulators, the 4 int16 halves of one unit, the 0x00FF
// mask, two broadcasts and one product are exactly the 16 ymm registers.
// Compiled from intrinsics (dot_word_halves on split_words), GCC kept a weight
// vector of the next block live early, spilled an accumulator (its chain then
// ran through a store and a load every block) and reloaded the mask from the
// stack; and the float
// epilogue of each group between the groups' dot products slowed them too
// (docs/benchmarks.md, "The 8-bit in-register tile in registers").
template <int ROWS>
__attribute__((noinline)) void group_dots_4x16(const uint8_t* w, int64_t skip, const int16_t* xp, int64_t blocks,
                                               int64_t groups, __m256i* out) {
  static_assert(ROWS >= 1 && ROWS <= 4, "1-4 rows of a 4-row panel");
  // One row: (x0, x2) and (x1, x3) broadcast, times the even (ymm8, ymm10)
  // and odd (ymm9, ymm11) k-values' weights of both halves.
#define TAK_WORDS_ROW(R, A0, A1)                                \
  "vpbroadcastd \\j*32+" #R "*8(%[x]), %%ymm13\n\t"             \
  "vpbroadcastd \\j*32+" #R "*8+4(%[x]), %%ymm14\n\t"           \
  "vpmaddwd %%ymm8, %%ymm13, %%ymm15\n\t"                       \
  "vpaddd %%ymm15, %%ymm" #A0 ", %%ymm" #A0 "\n\t"              \
  "vpmaddwd %%ymm9, %%ymm14, %%ymm15\n\t"                       \
  "vpaddd %%ymm15, %%ymm" #A0 ", %%ymm" #A0 "\n\t"              \
  "vpmaddwd %%ymm10, %%ymm13, %%ymm15\n\t"                      \
  "vpaddd %%ymm15, %%ymm" #A1 ", %%ymm" #A1 "\n\t"              \
  "vpmaddwd %%ymm11, %%ymm14, %%ymm15\n\t"                      \
  "vpaddd %%ymm15, %%ymm" #A1 ", %%ymm" #A1 "\n\t"
  int64_t left;
#define TAK_GROUP_DOTS(ROW_1, ROW_2, ROW_3)                                                  \
  asm volatile( \
      "vpcmpeqw %%ymm12, %%ymm12, %%ymm12\n\t" \
      "vpsrlw $8, %%ymm12, %%ymm12\n\t" \
      "2:\n\t" \
      "vpxor %%xmm0, %%xmm0, %%xmm0\n\t" \
      "vpxor %%xmm1, %%xmm1, %%xmm1\n\t" \
      "vpxor %%xmm2, %%xmm2, %%xmm2\n\t" \
      "vpxor %%xmm3, %%xmm3, %%xmm3\n\t" \
      "vpxor %%xmm4, %%xmm4, %%xmm4\n\t" \
      "vpxor %%xmm5, %%xmm5, %%xmm5\n\t" \
      "vpxor %%xmm6, %%xmm6, %%xmm6\n\t" \
      "vpxor %%xmm7, %%xmm7, %%xmm7\n\t" \
      "mov %[blocks], %[left]\n\t" \
      "1:\n\t" \
      ".irp j,0,1,2,3\n\t" \
      /* The unit 4 KiB ahead into L1: the hardware prefetchers bring the  */ \
      /* stream to L2 but not on to L1 in time (4096 x 4096, m = 4, Zen 4  */ \
      /* capped to AVX2: 1.2-1.3 ms without, 0.94-0.97 ms with; 0.96-0.97  */ \
      /* at 8 and 16 KiB; into L2 only, 1.27-1.40). vpsrlw takes a memory  */ \
      /* operand only in its EVEX form: each unit is loaded first.         */ \
      "prefetcht0 \\j*64+4096(%[w])\n\t" \
      "vmovdqu \\j*64(%[w]), %%ymm9\n\t" \
      "vpand %%ymm9, %%ymm12, %%ymm8\n\t" \
      "vpsrlw $8, %%ymm9, %%ymm9\n\t" \
      "vmovdqu \\j*64+32(%[w]), %%ymm11\n\t" \
      "vpand %%ymm11, %%ymm12, %%ymm10\n\t" \
      "vpsrlw $8, %%ymm11, %%ymm11\n\t" \
      TAK_WORDS_ROW(0, 0, 1) ROW_1 ROW_2 ROW_3 \
      ".endr\n\t" \
      "add $256, %[w]\n\t" \
      "add $128, %[x]\n\t" \
      "sub $4, %[left]\n\t" \
      "jnz 1b\n\t" \
      "vmovdqu %%ymm0, 0(%[out])\n\t" \
      "vmovdqu %%ymm1, 32(%[out])\n\t" \
      "vmovdqu %%ymm2, 64(%[out])\n\t" \
      "vmovdqu %%ymm3, 96(%[out])\n\t" \
      "vmovdqu %%ymm4, 128(%[out])\n\t" \
      "vmovdqu %%ymm5, 160(%[out])\n\t" \
      "vmovdqu %%ymm6, 192(%[out])\n\t" \
      "vmovdqu %%ymm7, 224(%[out])\n\t" \
      "add $256, %[out]\n\t" \
      "add %[skip], %[w]\n\t" \
      "dec %[groups]\n\t" \
      "jnz 2b\n\t" \
      "vzeroupper\n\t" \
      : [w] "+r"(w), [x] "+r"(xp), [out] "+r"(out), [groups] "+r"(groups), [left] "=&r"(left) \
      : [blocks] "r"(blocks), [skip] "r"(skip) \
      : "memory", "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", \
        "xmm11", "xmm12", "xmm13", "xmm14", "xmm15")
  // Rows past ROWS: their accumulators stay zero and are stored as such.
  if constexpr (ROWS == 4) {
    TAK_GROUP_DOTS(TAK_WORDS_ROW(1, 2, 3), TAK_WORDS_ROW(2, 4, 5), TAK_WORDS_ROW(3, 6, 7));
  } else if constexpr (ROWS == 3) {
    TAK_GROUP_DOTS(TAK_WORDS_ROW(1, 2, 3), TAK_WORDS_ROW(2, 4, 5), "");
  } else if constexpr (ROWS == 2) {
    TAK_GROUP_DOTS(TAK_WORDS_ROW(1, 2, 3), "", "");
  } else {
    TAK_GROUP_DOTS("", "", "");
  }
#undef TAK_GROUP_DOTS
#undef TAK_WORDS_ROW
}

// Rows [a.m_begin, a.m_end) (panels of 4 rows) x the block at `block`, in two
// passes per chunk of kWordGroups groups: group_dots_4x16's int32 sums into an L1 buffer, then
// add_half's float epilogue over them with the tile's float sums in
// registers (groups over kMaxChunkGroupSize: one group at a time and
// long_group_epilogue's integer one).
constexpr int kWordGroups = 8;

template <int BITS, int KB, bool ZEROS>
void column_step_words(const GemmArgs& a, int block) {
  static_assert(path_of<BITS, KB>() == 3, "int16 panels: 8-bit weights only");
  constexpr int MR = 4, NH = 2;
  const PackedLayout& l = *a.w;
  const QuantizedActivations& x = *a.x;
  const uint8_t* blk[1] = {a.body + int64_t(block) * l.block_bytes};
  const int64_t blocks = int64_t(l.superblocks) * (KB / 4);  // per group
  const int64_t skip = l.group_bytes - blocks * 64;
  const bool long_groups = l.group_size > kMaxChunkGroupSize;
  // With bfloat16 scales the last m-tile requests the next column step (NextStep).
  const NextStep next = NextStep::of(l, a.body, block + 1, 1);
  alignas(64) __m256i isum[kWordGroups][MR][NH];
  for (int m0 = a.m_begin; m0 < a.m_end; m0 += MR) {
    const NextStep none;
    const NextStep& pf = m0 + MR >= a.m_end ? next : none;
    const int16_t* xp = reinterpret_cast<const int16_t*>(x.panels + int64_t(m0 / MR) * x.panel_stride);
    const float* psums = x.panel_sums_f + int64_t(m0 / MR) * x.panel_sums_stride;
    // A last tile of 1-3 rows (m = 3, 5-7, ...) skips the panel's padding rows.
    const int rows = a.m_end - m0 < MR ? a.m_end - m0 : MR;
    auto* const dots = rows == 4   ? &group_dots_4x16<4>
                       : rows == 3 ? &group_dots_4x16<3>
                       : rows == 2 ? &group_dots_4x16<2>
                                   : &group_dots_4x16<1>;
    alignas(32) float fbuf[MR][NH][8];
    if (long_groups) {
      for (int r = 0; r < MR; ++r)
        for (int h = 0; h < NH; ++h) _mm256_store_ps(fbuf[r][h], _mm256_setzero_ps());
      for (int g = 0; g < l.groups; ++g, xp += blocks * 16) {
        pf.request(g);
        dots(blk[0] + int64_t(g) * l.group_bytes, skip, xp, blocks, 1, &isum[0][0][0]);
        long_group_epilogue<BITS, MR, NH, ZEROS>(a, m0, blk, g, isum[0], fbuf);
      }
    } else {
      __m256 f[MR][NH];
      for (int r = 0; r < MR; ++r)
        for (int h = 0; h < NH; ++h) f[r][h] = _mm256_setzero_ps();
      for (int g0 = 0; g0 < l.groups; g0 += kWordGroups) {
        const int g1 = l.groups - g0 < kWordGroups ? l.groups : g0 + kWordGroups;
        for (int g = g0; g < g1; ++g) pf.request(g);
        dots(blk[0] + int64_t(g0) * l.group_bytes, skip, xp, blocks, g1 - g0, &isum[0][0][0]);
        xp += (g1 - g0) * blocks * 16;
        // add_half's float formula, group after group.
        for (int g = g0; g < g1; ++g) {
          const uint8_t* group = blk[0] + int64_t(g) * l.group_bytes;
          for (int h = 0; h < NH; ++h) {
            const __m256 sc = load_scales(l, group, g, h);
            const __m256 zf = offset_floats<BITS, ZEROS>(l, group, g, h);
            for (int r = 0; r < MR; ++r) {
              const __m256 ig = _mm256_fnmadd_ps(zf, _mm256_set1_ps(psums[int64_t(g) * MR + r]),
                                                 _mm256_cvtepi32_ps(_mm256_load_si256(&isum[g - g0][r][h])));
              f[r][h] = _mm256_fmadd_ps(ig, sc, f[r][h]);
            }
          }
        }
      }
      for (int r = 0; r < MR; ++r)
        for (int h = 0; h < NH; ++h) _mm256_store_ps(fbuf[r][h], f[r][h]);
    }
    store_tile<MR, 1>(a, m0, rows, blk, block, fbuf);
  }
}

// The in-register tile over int16 panels, column step by column step.
template <int MR, int NH>
struct WordTile {
  template <int BITS, int KB, bool ZEROS>
  static void run(const GemmArgs& a) {
    static_assert(MR == 4 && NH == 2, "the 4x16 tile of group_dots_4x16");
    for (int b = a.block_begin; b < a.block_end; ++b) column_step_words<BITS, KB, ZEROS>(a, b);
  }
};
