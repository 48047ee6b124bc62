// The streaming GEMVs' requests (registry variant "stream"; ymm_gemm_impl.h
// GemvFetch::kStream and the 512-bit gemv_1x64_stream): each block's lines
// are requested into L1 kGemvStreamAheadBytes (kernels/manifest.toml [gemv])
// ahead of the group being read.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/generated/kernel_functions.h"

namespace torchao_kernels {

// The requests of one group of the NB blocks of a column step, which sit
// block_bytes apart from gp (the group in the step's first block; pos: its
// offset in its block). A request that passes a block's end is moved to the
// same place in the next column step's block of the same index: past block b
// lie the blocks b + 1 .. NB - 1 of this step, which their own streams are
// reading. Left there, every step began with each block's first lines
// unrequested: on a Granite Rapids-class core capped to AVX-VNNI, 4096 x 4096
// from DRAM, m = 1, 2-bit 468 -> 438 us and 4-bit 704 -> 644 us
// (docs/benchmarks.md). Past the buffer's last block a request is harmless:
// a prefetch never faults.
template <int NB>
__attribute__((always_inline)) inline void request_stream_ahead(const uint8_t* gp, int64_t block_bytes, int64_t pos,
                                                                int64_t group_bytes) {
  for (int b = 0; b < NB; ++b) {
    for (int64_t off = 0; off < group_bytes; off += 64) {
      const int64_t at = kGemvStreamAheadBytes + off;
      const int64_t next_step = pos + at >= block_bytes ? int64_t(NB - 1) * block_bytes : 0;
      _mm_prefetch(reinterpret_cast<const char*>(gp + b * block_bytes + at + next_step), _MM_HINT_T0);
    }
  }
}

}  // namespace torchao_kernels
