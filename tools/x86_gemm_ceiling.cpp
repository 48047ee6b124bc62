// What the AVX512-VNNI GEMM tiles can reach on this core, measured without
// memory effects: every operand is L1-resident and the loop body is the
// kernel's inner loop for one group of 32 k-values (docs/benchmarks.md).
//
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
// Build and run (any x86-64 CPU with AVX512-VNNI):
//   g++ -O3 -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mfma \
//       tools/x86_gemm_ceiling.cpp -o /tmp/x86_gemm_ceiling && /tmp/x86_gemm_ceiling
// The clock is measured with a chain of dependent imuls (3 cycles each).
#include <immintrin.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace {

constexpr int kBlocks = 8;  // 4-k blocks per group of 32
constexpr int kRot = 16;    // groups of operands the loop rotates through

alignas(64) uint8_t g_weights[kRot][kBlocks][8][64];
alignas(64) int8_t g_act[kRot][kBlocks][16][4];
alignas(64) float g_fsum[kRot][16];
alignas(64) float g_scale[kRot][8][16];
alignas(64) float g_facc[16][8][16];

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

void dpbusd_peak(long n) {
  asm volatile(
      "vpternlogd $0xff, %%zmm30, %%zmm30, %%zmm30\n\t"
      "vmovdqa64 %%zmm30, %%zmm29\n\t"
      "1:\n\t"
      ".irp r,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15\n\t"
      "vpdpbusd %%zmm30, %%zmm29, %%zmm\\r\n\t"
      ".endr\n\t"
      "dec %0\n\t"
      "jnz 1b"
      : "+r"(n)
      :
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
        "xmm12", "xmm13", "xmm14", "xmm15", "xmm29", "xmm30", "cc");
}

// Keeps the float accumulators in memory (as the kernels do) instead of
// letting the compiler carry them in registers across groups.
template <class T>
T* opaque(T* p) {
  asm("" : "+r"(p));
  return p;
}

// EPILOGUE: 0 = store the int32 accumulators, 2 = cvt + fma, 3 = cvt +
// fnmadd + fma.
template <int MR, int NB, int EPILOGUE>
__attribute__((noinline)) void group_loop(long groups) {
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

template <int MR, int NB>
void row(double cycle, double dpbusd_cycles) {
  const double dots = MR * NB * kBlocks;  // vpdpbusd per group
  const double c0 = seconds_per(200000, group_loop<MR, NB, 0>) / cycle;
  const double c3 = seconds_per(200000, group_loop<MR, NB, 3>) / cycle;
  const double c2 = seconds_per(200000, group_loop<MR, NB, 2>) / cycle;
  const double ideal = dots * dpbusd_cycles;
  std::printf("| %dx%-3d | %3d | %6.1f (%3.0f%%) | %6.1f (%3.0f%%) | %6.1f (%3.0f%%) |\n", MR, 16 * NB, MR * NB, c0,
              100 * ideal / c0, c3, 100 * ideal / c3, c2, 100 * ideal / c2);
}

}  // namespace

int main() {
  std::memset(g_weights, 1, sizeof(g_weights));
  std::memset(g_act, 2, sizeof(g_act));
  const double cycle = seconds_per(20000000, imul_chain) / 12.0;  // 4 imuls x 3 cycles
  const double per_dpbusd = seconds_per(2000000, dpbusd_peak) / 16.0;
  const double dpbusd_cycles = per_dpbusd / cycle;
  std::printf("clock %.2f GHz; vpdpbusd zmm: %.2f per cycle = %.0f int8 GOPS per core\n\n", 1e-9 / cycle,
              1.0 / dpbusd_cycles, 128.0 / per_dpbusd * 1e-9);
  std::printf("cycles per group of 32 k (%% of the VNNI peak):\n\n");
  std::printf("| tile  | acc | dot only      | +epilogue     | +2-op epilogue |\n");
  std::printf("|-------|----:|--------------:|--------------:|---------------:|\n");
  row<4, 2>(cycle, dpbusd_cycles);
  row<8, 2>(cycle, dpbusd_cycles);
  row<4, 4>(cycle, dpbusd_cycles);
  row<8, 3>(cycle, dpbusd_cycles);
  row<6, 4>(cycle, dpbusd_cycles);
  row<4, 6>(cycle, dpbusd_cycles);
  return 0;
}
