// The floor of a streaming GEMV's time from DRAM: its memory access pattern
// with no dot products. A column step reads NB n16k4 blocks side by side, a
// group (16 rows x 32 k-values at `bits` bits, then 16 float32 scales) from
// each in turn, and requests every line of each block `ahead` bytes before it
// is read, into L1, the requests that pass a block's groups going to the same
// place in the next column step's block (kernels/x86/stream_ahead.h). One
// vector add per 32 bytes stands in for the work; the buffer rotates over
// copies of the layer spanning 1 GiB, so every read comes from DRAM.
//
// It answers whether a bit width's time can follow its bytes: if the pattern
// alone reads 2-bit layers at a lower rate than 4-bit ones, no kernel work
// can make 2-bit as much faster as its bytes say (docs/benchmarks.md, "The
// 4x16 tile streams").
//
// Build and run (any x86-64 CPU with AVX2):
//   g++ -O2 -mavx2 tools/x86_gemv_stream_pattern.cpp -o /tmp/x86_gemv_stream_pattern && /tmp/x86_gemv_stream_pattern
// Options: [NB (default 2)] [ahead bytes (default 2048; 0: no requests)] [n (4096)] [k (4096)]
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

volatile int32_t g_sink;

double pass_us(const uint8_t* buf, int64_t blocks, int64_t groups, int64_t group_bytes, int nb, int64_t ahead) {
  const int64_t block_bytes = groups * group_bytes + 64;  // + the row sums
  const int64_t groups_end = groups * group_bytes;
  const int64_t next_step = nb * block_bytes - groups_end;
  __m256i acc = _mm256_setzero_si256();
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t b0 = 0; b0 + nb <= blocks; b0 += nb) {
    const uint8_t* gp = buf + b0 * block_bytes;
    for (int64_t g = 0; g < groups; ++g, gp += group_bytes) {
      const int64_t pos = g * group_bytes;
      if (ahead > 0) {
        for (int b = 0; b < nb; ++b) {
          for (int64_t off = 0; off < group_bytes; off += 64) {
            const int64_t at = ahead + off;
            _mm_prefetch(reinterpret_cast<const char*>(gp + b * block_bytes + at + (pos + at >= groups_end ? next_step : 0)),
                         _MM_HINT_T0);
          }
        }
      }
      for (int b = 0; b < nb; ++b)
        for (int64_t off = 0; off < group_bytes; off += 32)
          acc = _mm256_add_epi32(acc, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(gp + b * block_bytes + off)));
    }
  }
  const auto t1 = std::chrono::steady_clock::now();
  g_sink = _mm256_extract_epi32(acc, 0);
  return std::chrono::duration<double>(t1 - t0).count() * 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  const int nb = argc > 1 ? std::atoi(argv[1]) : 2;
  const int64_t ahead = argc > 2 ? std::atoll(argv[2]) : 2048;
  const int64_t n = argc > 3 ? std::atoll(argv[3]) : 4096, k = argc > 4 ? std::atoll(argv[4]) : 4096;
  if (nb < 1 || ahead < 0 || n < 16 * nb || n % 16 != 0 || k < 32 || k % 32 != 0) {
    std::fprintf(stderr, "usage: %s [NB >= 1] [ahead bytes >= 0] [n: a multiple of 16, >= 16 NB] [k: a multiple of 32]\n",
                 argv[0]);
    return 2;
  }
  std::printf("NB = %d blocks in step, requests %lld bytes ahead, %lld x %lld, group 32, float32 scales\n", nb,
              static_cast<long long>(ahead), static_cast<long long>(n), static_cast<long long>(k));
  for (int bits : {2, 3, 4, 8}) {
    const int64_t group_bytes = 16 * 32 * bits / 8 + 64;
    const int64_t groups = k / 32, blocks = n / 16;
    const int64_t layer = blocks * (groups * group_bytes + 64);
    const int64_t copies = std::max<int64_t>(2, (int64_t(1) << 30) / layer);
    const size_t total = static_cast<size_t>(layer * copies);
    void* mem = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
      std::fprintf(stderr, "cannot map %zu MiB\n", total >> 20);
      return 1;
    }
    uint8_t* buf = static_cast<uint8_t*>(mem);
    madvise(buf, total, MADV_HUGEPAGE);
    std::memset(buf, 1, total);
    std::vector<double> us;
    for (int r = 0; r < 600; ++r) us.push_back(pass_us(buf + (r % copies) * layer, blocks, groups, group_bytes, nb, ahead));
    std::sort(us.begin(), us.end());
    const double med = us[us.size() / 2];
    std::printf("%d-bit  %6.2f MB  median %7.1f us  %5.1f GB/s\n", bits, layer / 1e6, med, layer / med / 1e3);
    munmap(mem, total);
  }
  return 0;
}
