// What the x86 GEMM tiles can reach on this core, measured without memory
// effects: every operand is L1-resident and the loop body is the kernel's
// inner loop for one group of 32 k-values (docs/benchmarks.md).
//
// 512-bit (AVX512-VNNI tiles, MR x (16 NB)):
//   peak:     16 independent vpdpbusd chains, no loads: the VNNI peak.
//   dot only: an MR x (16 NB) tile's dot products for one group (weights
//             already unpacked, activations broadcast 4 bytes at a time),
//             accumulators stored without any float work.
//   +epilogue: the same plus the per-group float epilogue of the kernels
//             (cvt, fnmadd of the zero-point/offset term, fma with the
//             scale into L1 float accumulators): 3 ops per accumulator.
//   +2-op epilogue: as if the offset term came with the accumulators'
//             initial value (cvt, fma).
//
// 256-bit (AVX2 and AVX-VNNI tiles, MR x (8 NH); VEX code has 16 ymm
// registers: MR * NH accumulators + NH weights + the broadcast (+ the
// vpmaddubsw product for pair sums) fit for 1x32, 2x32, 4x16, 6x16 and, with
// VNNI, 4x24; 3x32, and 4x24 with pair sums, spill or reload):
//   peaks:    ymm vpmaddubsw + vpaddw (int16 pair sums), ymm vpmaddubsw +
//             vpmaddwd + vpaddd, 2 x (vpmaddwd + vpaddd) on int16 operands
//             (the exact 8-bit step of the AVX2 tile over int16 panels), and
//             ymm {vex} vpdpbusd (AVX-VNNI).
//   pair sums: the AVX2 tiles of weights of <= 4 bits: the 8 blocks of 4 k of
//             a group accumulate in int16 (vpmaddubsw + vpaddw), then one
//             vpmaddwd per accumulator widens the group to int32; % of the
//             pair-sum peak (the widen is overhead on top of it).
//   VNNI ymm: the AVX-VNNI tiles ({vex} vpdpbusd); % of the ymm VNNI peak.
//   The columns are those of the 512-bit table.
//
// Build and run (any x86-64 CPU with AVX2 + FMA; the 512-bit section runs
// only where __builtin_cpu_supports reports AVX512F/BW/VL/VNNI, the AVX-VNNI
// one only with AVX-VNNI, each printing a note instead otherwise):
//   g++ -O3 -mavx2 -mfma tools/x86_gemm_ceiling.cpp -o /tmp/x86_gemm_ceiling && /tmp/x86_gemm_ceiling
// The AVX-512 and AVX-VNNI instructions are enabled per function (ZMM_TARGET,
// VNNI256_TARGET) rather than with -mavx512* / -mavxvnni: those flags let GCC
// use EVEX encodings and ymm16-31 anywhere in the file (the 256-bit loops,
// main), which an AVX2-only CPU cannot run. The file still builds with them
// (g++ -O3 -mavx2 -mfma -mavxvnni -mavx512f -mavx512bw -mavx512vl
// -mavx512vnni ...), but that binary is for AVX-512 CPUs only.
// X86_GEMM_CEILING_DISABLE=avx512vnni,avxvnni (or avx2) skips those sections
// as on a CPU without them. The clock is measured with a chain of dependent
// imuls (3 cycles each).
#include <immintrin.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#define ZMM_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define VNNI256_TARGET __attribute__((target("avxvnni")))

namespace {

constexpr int kBlocks = 8;  // 4-k blocks per group of 32
constexpr int kRot = 16;    // groups of operands the loop rotates through

alignas(64) uint8_t g_weights[kRot][kBlocks][8][64];
alignas(64) int8_t g_act[kRot][kBlocks][16][4];
alignas(64) float g_fsum[kRot][16];
alignas(64) float g_scale[kRot][8][16];
alignas(64) float g_facc[16][8][16];

// 256-bit tiles: NH <= 4 halves of 8 columns, MR <= 8 rows.
alignas(64) uint8_t g_wy[kRot][kBlocks][4][32];
alignas(64) float g_scale_y[kRot][4][8];
alignas(64) float g_facc_y[8][4][8];

double seconds_per(long reps, void (*f)(long)) {
  f(reps / 50 + 1);
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f(reps);
    const auto t1 = std::chrono::steady_clock::now();
    const double s = std::chrono::duration<double>(t1 - t0).count() / reps;
    if (s < best) best = s;
  }
  return best;
}

void imul_chain(long n) {
  uint64_t v = 3;
  for (long i = 0; i < n; ++i) asm volatile("imul %0, %0\n\timul %0, %0\n\timul %0, %0\n\timul %0, %0" : "+r"(v));
}

ZMM_TARGET void dpbusd_peak(long n) {
  asm volatile(
      "vpternlogd $0xff, %%zmm30, %%zmm30, %%zmm30\n\t"
      "vmovdqa64 %%zmm30, %%zmm29\n\t"
      "1:\n\t"
      ".irp r,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15\n\t"
      "vpdpbusd %%zmm30, %%zmm29, %%zmm\\r\n\t"
      ".endr\n\t"
      "dec %0\n\t"
      "jnz 1b\n\t"
      "vzeroupper"
      : "+r"(n)
      :
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
        "xmm12", "xmm13", "xmm14", "xmm15", "xmm29", "xmm30", "cc");
}

// The loop of the 256-bit peaks: 6 accumulator chains (ymm0-5, from zero);
// each step computes 6 products into ymm6-11 (STEP, with r the register
// number), which depend on nothing carried, and ADDs them into the chains.
#define PEAK256_LOOP(STEP, ADD)              \
  ".irp r,0,1,2,3,4,5\n\t"                   \
  "vpxor %%ymm\\r, %%ymm\\r, %%ymm\\r\n\t"   \
  ".endr\n\t"                                \
  "1:\n\t"                                   \
  ".irp r,6,7,8,9,10,11\n\t" STEP ".endr\n\t" \
  ADD " %%ymm6, %%ymm0, %%ymm0\n\t"          \
  ADD " %%ymm7, %%ymm1, %%ymm1\n\t"          \
  ADD " %%ymm8, %%ymm2, %%ymm2\n\t"          \
  ADD " %%ymm9, %%ymm3, %%ymm3\n\t"          \
  ADD " %%ymm10, %%ymm4, %%ymm4\n\t"         \
  ADD " %%ymm11, %%ymm5, %%ymm5\n\t"         \
  "dec %0\n\t"                               \
  "jnz 1b\n\t"                               \
  "vzeroupper"
#define PEAK256_CLOBBERS                                                                                \
  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm13", \
      "xmm14", "xmm15", "cc"

// vpmaddubsw + vpaddw: int16 pair sums.
void pairsum_peak(long n) {
  asm volatile(
      "vpcmpeqb %%ymm14, %%ymm14, %%ymm14\n\t"
      "vpabsb %%ymm14, %%ymm14\n\t"
      "vmovdqa %%ymm14, %%ymm15\n\t" PEAK256_LOOP("vpmaddubsw %%ymm15, %%ymm14, %%ymm\\r\n\t", "vpaddw")
      : "+r"(n)
      :
      : PEAK256_CLOBBERS);
}

// vpmaddubsw + vpmaddwd (ones) + vpaddd: int32 lanes every step.
void madd_peak(long n) {
  asm volatile(
      "vpcmpeqb %%ymm14, %%ymm14, %%ymm14\n\t"
      "vpabsb %%ymm14, %%ymm14\n\t"
      "vmovdqa %%ymm14, %%ymm15\n\t"
      "vpcmpeqw %%ymm13, %%ymm13, %%ymm13\n\t"
      "vpsrlw $15, %%ymm13, %%ymm13\n\t" PEAK256_LOOP(
          "vpmaddubsw %%ymm15, %%ymm14, %%ymm\\r\n\t"
          "vpmaddwd %%ymm13, %%ymm\\r, %%ymm\\r\n\t",
          "vpaddd")
      : "+r"(n)
      :
      : PEAK256_CLOBBERS);
}

// The exact 8-bit step over int16 operands (the AVX2 8-bit tile over int16
// panels): 32 multiply-accumulates = 2 vpmaddwd + 2 vpaddd.
void madd16_peak(long n) {
  asm volatile(
      "vpcmpeqw %%ymm14, %%ymm14, %%ymm14\n\t"
      "vpsrlw $8, %%ymm14, %%ymm14\n\t"
      "vmovdqa %%ymm14, %%ymm15\n\t" PEAK256_LOOP("vpmaddwd %%ymm15, %%ymm14, %%ymm\\r\n\t", "vpaddd")
      : "+r"(n)
      :
      : PEAK256_CLOBBERS);
}

// 12 independent {vex} vpdpbusd ymm chains (VEX encoding: ymm0-15 only).
VNNI256_TARGET void dpbusd_ymm_peak(long n) {
  asm volatile(
      "vpcmpeqb %%ymm14, %%ymm14, %%ymm14\n\t"
      "vmovdqa %%ymm14, %%ymm15\n\t"
      "1:\n\t"
      ".irp r,0,1,2,3,4,5,6,7,8,9,10,11\n\t"
      "%{vex%} vpdpbusd %%ymm15, %%ymm14, %%ymm\\r\n\t"
      ".endr\n\t"
      "dec %0\n\t"
      "jnz 1b\n\t"
      "vzeroupper"
      : "+r"(n)
      :
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
        "xmm14", "xmm15", "cc");
}

// Keeps the float accumulators in memory (as the kernels do) instead of
// letting the compiler carry them in registers across groups.
template <class T>
T* opaque(T* p) {
  asm("" : "+r"(p));
  return p;
}

// Pins a value to a register at this point: the accumulators of a chain, as
// the 256-bit kernels do (GCC would otherwise reassociate the int16
// additions), and each block's weights (GCC would otherwise interleave the
// blocks, reload the weights per row and spill).
__attribute__((always_inline)) inline void pin(__m256i& v) { asm("" : "+x"(v)); }

// EPILOGUE: 0 = store the int32 accumulators, 2 = cvt + fma, 3 = cvt +
// fnmadd + fma.
template <int MR, int NB, int EPILOGUE>
ZMM_TARGET __attribute__((noinline)) void group_loop(long groups) {
  for (long g = 0; g < groups; ++g) {
    const int i = static_cast<int>(g % kRot);
    __m512i acc[MR][NB];
    for (int r = 0; r < MR; ++r)
      for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int j = 0; j < kBlocks; ++j) {
      __m512i w[NB];
      for (int b = 0; b < NB; ++b) w[b] = _mm512_load_si512(g_weights[i][j][b]);
      for (int r = 0; r < MR; ++r) {
        int32_t x;
        std::memcpy(&x, g_act[i][j][r], 4);
        const __m512i xb = _mm512_set1_epi32(x);
        for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_dpbusd_epi32(acc[r][b], w[b], xb);
      }
    }
    float(*f)[8][16] = opaque(g_facc);
    for (int b = 0; b < NB; ++b) {
      const __m512 sc = _mm512_load_ps(g_scale[i][b]);
      for (int r = 0; r < MR; ++r) {
        if (EPILOGUE == 0) {
          _mm512_store_si512(f[r][b], acc[r][b]);
          continue;
        }
        __m512 v = _mm512_cvtepi32_ps(acc[r][b]);
        if (EPILOGUE == 3) v = _mm512_fnmadd_ps(_mm512_set1_ps(8.0f), _mm512_set1_ps(g_fsum[i][r]), v);
        _mm512_store_ps(f[r][b], _mm512_fmadd_ps(v, sc, _mm512_load_ps(f[r][b])));
      }
    }
  }
}

// The per-group end of a 256-bit tile: int32 accumulators stored, or the
// float epilogue into L1 accumulators (as group_loop's).
template <int MR, int NH, int EPILOGUE>
__attribute__((always_inline)) inline void ymm_epilogue(int i, __m256i (&acc)[MR][NH]) {
  float(*f)[4][8] = opaque(g_facc_y);
  for (int h = 0; h < NH; ++h) {
    const __m256 sc = _mm256_load_ps(g_scale_y[i][h]);
    for (int r = 0; r < MR; ++r) {
      if (EPILOGUE == 0) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(f[r][h]), acc[r][h]);
        continue;
      }
      __m256 v = _mm256_cvtepi32_ps(acc[r][h]);
      if (EPILOGUE == 3) v = _mm256_fnmadd_ps(_mm256_set1_ps(8.0f), _mm256_set1_ps(g_fsum[i][r]), v);
      _mm256_store_ps(f[r][h], _mm256_fmadd_ps(v, sc, _mm256_load_ps(f[r][h])));
    }
  }
}

// AVX2 pair sums: dot16 = vpmaddubsw + vpaddw into int16 lanes over the 8
// blocks, then one vpmaddwd (ones) per accumulator.
template <int MR, int NH, int EPILOGUE>
__attribute__((noinline)) void pairsum_group_loop(long groups) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (long g = 0; g < groups; ++g) {
    const int i = static_cast<int>(g % kRot);
    __m256i a16[MR][NH];
    for (int r = 0; r < MR; ++r)
      for (int h = 0; h < NH; ++h) a16[r][h] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int j = 0; j < kBlocks; ++j) {
      __m256i w[NH];
      for (int h = 0; h < NH; ++h) {
        w[h] = _mm256_load_si256(reinterpret_cast<const __m256i*>(g_wy[i][j][h]));
        pin(w[h]);  // loaded once per block, as the kernels do (not reloaded per row)
      }
      for (int r = 0; r < MR; ++r) {
        int32_t x;
        std::memcpy(&x, g_act[i][j][r], 4);
        const __m256i xb = _mm256_set1_epi32(x);
        for (int h = 0; h < NH; ++h) {
          a16[r][h] = _mm256_add_epi16(a16[r][h], _mm256_maddubs_epi16(w[h], xb));
          pin(a16[r][h]);
        }
      }
    }
    __m256i acc[MR][NH];
    for (int r = 0; r < MR; ++r)
      for (int h = 0; h < NH; ++h) acc[r][h] = _mm256_madd_epi16(a16[r][h], ones);
    ymm_epilogue<MR, NH, EPILOGUE>(i, acc);
  }
}

// AVX-VNNI: {vex} vpdpbusd straight into int32 lanes.
template <int MR, int NH, int EPILOGUE>
VNNI256_TARGET __attribute__((noinline)) void vnni256_group_loop(long groups) {
  for (long g = 0; g < groups; ++g) {
    const int i = static_cast<int>(g % kRot);
    __m256i acc[MR][NH];
    for (int r = 0; r < MR; ++r)
      for (int h = 0; h < NH; ++h) acc[r][h] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int j = 0; j < kBlocks; ++j) {
      __m256i w[NH];
      for (int h = 0; h < NH; ++h) {
        w[h] = _mm256_load_si256(reinterpret_cast<const __m256i*>(g_wy[i][j][h]));
        pin(w[h]);  // loaded once per block, as the kernels do (not reloaded per row)
      }
      for (int r = 0; r < MR; ++r) {
        int32_t x;
        std::memcpy(&x, g_act[i][j][r], 4);
        const __m256i xb = _mm256_set1_epi32(x);
        // The VEX form whatever the flags (the intrinsic becomes the EVEX
        // AVX512-VNNI instruction where that is enabled); "x" = ymm0-15.
        for (int h = 0; h < NH; ++h) asm("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc[r][h]) : "x"(w[h]), "x"(xb));
      }
    }
    ymm_epilogue<MR, NH, EPILOGUE>(i, acc);
  }
}

// One table row: cycles per group of the three loop variants and their
// share of `ideal` (dot instructions per group x cycles of one at the peak).
void print_row(int mr, int cols, int acc, double ideal, double c0, double c3, double c2) {
  std::printf("| %dx%-3d | %3d | %6.1f (%3.0f%%) | %6.1f (%3.0f%%) | %6.1f (%3.0f%%) |\n", mr, cols, acc, c0,
              100 * ideal / c0, c3, 100 * ideal / c3, c2, 100 * ideal / c2);
}

void table_header() {
  std::printf("| tile  | acc | dot only      | +epilogue     | +2-op epilogue |\n");
  std::printf("|-------|----:|--------------:|--------------:|---------------:|\n");
}

template <int MR, int NB>
void row(double cycle, double dpbusd_cycles) {
  const double dots = MR * NB * kBlocks;  // vpdpbusd per group
  const double c0 = seconds_per(200000, group_loop<MR, NB, 0>) / cycle;
  const double c3 = seconds_per(200000, group_loop<MR, NB, 3>) / cycle;
  const double c2 = seconds_per(200000, group_loop<MR, NB, 2>) / cycle;
  print_row(MR, 16 * NB, MR * NB, dots * dpbusd_cycles, c0, c3, c2);
}

// dot_cycles: cycles of one dot step (vpmaddubsw + vpaddw, or vpdpbusd) at its peak.
template <int MR, int NH, bool VNNI>
void row256(double cycle, double dot_cycles) {
  const double dots = MR * NH * kBlocks;  // dot steps per group
  void (*f0)(long) = VNNI ? vnni256_group_loop<MR, NH, 0> : pairsum_group_loop<MR, NH, 0>;
  void (*f3)(long) = VNNI ? vnni256_group_loop<MR, NH, 3> : pairsum_group_loop<MR, NH, 3>;
  void (*f2)(long) = VNNI ? vnni256_group_loop<MR, NH, 2> : pairsum_group_loop<MR, NH, 2>;
  const double c0 = seconds_per(200000, f0) / cycle;
  const double c3 = seconds_per(200000, f3) / cycle;
  const double c2 = seconds_per(200000, f2) / cycle;
  print_row(MR, 8 * NH, MR * NH, dots * dot_cycles, c0, c3, c2);
}

template <bool VNNI>
void table256(double cycle, double dot_cycles) {
  table_header();
  row256<1, 4, VNNI>(cycle, dot_cycles);
  row256<2, 4, VNNI>(cycle, dot_cycles);
  row256<3, 4, VNNI>(cycle, dot_cycles);
  row256<4, 2, VNNI>(cycle, dot_cycles);
  row256<6, 2, VNNI>(cycle, dot_cycles);
  row256<4, 3, VNNI>(cycle, dot_cycles);
}

// X86_GEMM_CEILING_DISABLE=avx512vnni,avxvnni runs as if the CPU lacked them
// (to see the notes of a CPU without them).
bool disabled(const char* isa) {
  const char* env = std::getenv("X86_GEMM_CEILING_DISABLE");
  if (!env) return false;
  const size_t n = std::strlen(isa);
  for (const char* p = std::strstr(env, isa); p; p = std::strstr(p + 1, isa))
    if ((p == env || p[-1] == ',') && (p[n] == '\0' || p[n] == ',')) return true;
  return false;
}

}  // namespace

int main() {
  __builtin_cpu_init();
  const bool has_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && !disabled("avx2");
  const bool has_zmm = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
                       !disabled("avx512vnni");
  const bool has_vnni256 = has_avx2 && __builtin_cpu_supports("avxvnni") && !disabled("avxvnni");
  std::memset(g_weights, 1, sizeof(g_weights));
  std::memset(g_act, 2, sizeof(g_act));
  std::memset(g_wy, 1, sizeof(g_wy));
  const double cycle = seconds_per(20000000, imul_chain) / 12.0;  // 4 imuls x 3 cycles

  // 512-bit: the AVX512-VNNI tiles.
  if (has_zmm) {
    const double per_dpbusd = seconds_per(2000000, dpbusd_peak) / 16.0;
    const double dpbusd_cycles = per_dpbusd / cycle;
    std::printf("clock %.2f GHz; vpdpbusd zmm: %.2f per cycle = %.0f int8 GOPS per core\n\n", 1e-9 / cycle,
                1.0 / dpbusd_cycles, 128.0 / per_dpbusd * 1e-9);
    std::printf("cycles per group of 32 k (%% of the VNNI peak):\n\n");
    table_header();
    row<4, 2>(cycle, dpbusd_cycles);
    row<8, 2>(cycle, dpbusd_cycles);
    row<4, 4>(cycle, dpbusd_cycles);
    row<8, 3>(cycle, dpbusd_cycles);
    row<6, 4>(cycle, dpbusd_cycles);
    row<4, 6>(cycle, dpbusd_cycles);
  } else {
    std::printf("clock %.2f GHz; vpdpbusd zmm: skipped (this CPU has no AVX512-VNNI)\n", 1e-9 / cycle);
    std::printf("\nnote: 512-bit (AVX512-VNNI) section skipped: this CPU has no AVX512-VNNI\n");
  }

  // 256-bit: the AVX2 and AVX-VNNI tiles.
  if (!has_avx2) {
    std::printf("\nnote: 256-bit sections skipped: this CPU has no AVX2 + FMA\n");
    return 0;
  }
  const double per_pairsum = seconds_per(2000000, pairsum_peak) / 6.0;   // one vpmaddubsw + vpaddw
  const double per_madd = seconds_per(2000000, madd_peak) / 6.0;         // one vpmaddubsw + vpmaddwd + vpaddd
  std::printf("\n256-bit peaks (one core, no loads; 32 multiply-accumulates per step):\n\n");
  std::printf("ymm vpmaddubsw + vpaddw (int16 pair sums): %.2f per cycle = %.0f int8 GOPS per core\n",
              cycle / per_pairsum, 64.0 / per_pairsum * 1e-9);
  std::printf("ymm vpmaddubsw + vpmaddwd + vpaddd: %.2f per cycle = %.0f int8 GOPS per core\n", cycle / per_madd,
              64.0 / per_madd * 1e-9);
  // Two of these steps (16 products each) per 32 products.
  const double per_madd16 = 2.0 * seconds_per(2000000, madd16_peak) / 6.0;
  std::printf("ymm 2 x (vpmaddwd + vpaddd), int16 operands (exact 8-bit): %.2f per cycle = %.0f int8 GOPS per core\n",
              cycle / per_madd16, 64.0 / per_madd16 * 1e-9);
  double per_vnni256 = 0;
  if (has_vnni256) {
    per_vnni256 = seconds_per(2000000, dpbusd_ymm_peak) / 12.0;
    std::printf("ymm {vex} vpdpbusd (AVX-VNNI): %.2f per cycle = %.0f int8 GOPS per core\n", cycle / per_vnni256,
                64.0 / per_vnni256 * 1e-9);
  } else {
    std::printf("ymm {vex} vpdpbusd (AVX-VNNI): skipped (this CPU has no AVX-VNNI)\n");
  }

  std::printf("\n256-bit pair sums, cycles per group of 32 k (%% of the pair-sum peak; the vpmaddwd widen is "
              "on top of it):\n\n");
  table256<false>(cycle, per_pairsum / cycle);
  if (has_vnni256) {
    std::printf("\n256-bit AVX-VNNI, cycles per group of 32 k (%% of the ymm VNNI peak):\n\n");
    table256<true>(cycle, per_vnni256 / cycle);
  } else {
    std::printf("\nnote: 256-bit AVX-VNNI section skipped: this CPU has no AVX-VNNI\n");
  }
  return 0;
}
