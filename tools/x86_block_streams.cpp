// How fast this core reads packed weights from DRAM when a kernel reads
// several 16-row blocks in step (the GEMV reads 4, the 4x32 / 8x32 tiles 2,
// the 4x16 tile 1), with and without software prefetch of the next column
// step (docs/benchmarks.md, "Reading blocks in step").
//
// A block is `block` contiguous bytes (an n16k4 block of a layer: 16 rows
// x k values, with their scales); a column step reads S consecutive blocks
// 256 bytes at a time from each in turn (a group of 32 4-bit values per
// block), as the tiles do. The buffer rotates over regions larger than the
// last-level cache, so every read comes from DRAM. Prefetch variants: every
// line of the next column step, spread over this step (the line at the same
// offset of the same block), with the T0 hint (into L1) or the T1 hint (into
// L2).
//
// Build and run (any x86-64 CPU with AVX2):
//   g++ -O2 -mavx2 tools/x86_block_streams.cpp -o /tmp/x86_block_streams && /tmp/x86_block_streams
// Options: [region MiB (default 24)] [regions (default 12)]
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

volatile int64_t g_sink;

enum class Prefetch { kNone, kT0, kT1 };

double read_in_step(const uint8_t* buf, size_t bytes, size_t block, int streams, Prefetch pf) {
  constexpr size_t kChunk = 256;
  const size_t blocks = bytes / block;
  const size_t step_bytes = static_cast<size_t>(streams) * block;
  __m256i acc = _mm256_setzero_si256();
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t b = 0; b + streams <= blocks; b += streams) {
    const uint8_t* step = buf + b * block;
    const bool has_next = b + 2 * streams <= blocks;
    for (size_t off = 0; off + kChunk <= block; off += kChunk) {
      for (int s = 0; s < streams; ++s) {
        const uint8_t* p = step + s * block + off;
        if (pf != Prefetch::kNone && has_next) {
          const char* q = reinterpret_cast<const char*>(p + step_bytes);
          for (size_t c = 0; c < kChunk; c += 64) {
            if (pf == Prefetch::kT0) {
              _mm_prefetch(q + c, _MM_HINT_T0);
            } else {
              _mm_prefetch(q + c, _MM_HINT_T1);
            }
          }
        }
        for (size_t c = 0; c < kChunk; c += 32)
          acc = _mm256_add_epi32(acc, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + c)));
      }
    }
  }
  const auto t1 = std::chrono::steady_clock::now();
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc);
  g_sink = lanes[0] + lanes[7];
  const size_t read = blocks / streams * streams * (block / kChunk * kChunk);
  return static_cast<double>(read) / std::chrono::duration<double>(t1 - t0).count() / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t region = (argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 24) << 20;
  const int regions = argc > 2 ? std::atoi(argv[2]) : 12;
  if (region == 0 || regions < 1) {
    std::fprintf(stderr, "usage: %s [region MiB > 0] [regions >= 1]\n", argv[0]);
    return 2;
  }
  uint8_t* buf = static_cast<uint8_t*>(std::aligned_alloc(4096, region * regions));
  if (!buf) {
    std::fprintf(stderr, "cannot allocate %zu MiB\n", (region * regions) >> 20);
    return 1;
  }
  std::memset(buf, 1, region * regions);
  // Block sizes of n16k4 layers at 4 bits, group 32 (values + float scales):
  // k = 576 (SmolLM2), 1536, 4096.
  const size_t block_sizes[] = {16 * 576 / 2 + 16 * 18 * 4, 16 * 1536 / 2 + 16 * 48 * 4,
                                16 * 4096 / 2 + 16 * 128 * 4};
  const struct { Prefetch pf; const char* name; } variants[] = {
      {Prefetch::kNone, "none"}, {Prefetch::kT0, "next step, T0"}, {Prefetch::kT1, "next step, T1"}};
  std::printf("DRAM read bandwidth, GB/s (median of %d passes over %zu MiB regions)\n\n", 2 * regions,
              region >> 20);
  std::printf("| block bytes | blocks in step | prefetch | GB/s |\n|---:|---:|---|---:|\n");
  for (size_t block : block_sizes)
    for (int streams : {1, 2, 4})
      for (const auto& v : variants) {
        std::vector<double> r;
        for (int rep = 0; rep < 2 * regions; ++rep)
          r.push_back(read_in_step(buf + (rep % regions) * region, region, block, streams, v.pf));
        std::sort(r.begin(), r.end());
        std::printf("| %zu | %d | %s | %.1f |\n", block, streams, v.name, r[r.size() / 2]);
      }
  std::free(buf);
  return 0;
}
