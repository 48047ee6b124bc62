// The streaming GEMVs' requests (registry variant "stream"; ymm_gemm_impl.h
// GemvFetch::kStream and the 512-bit gemv_1x64_stream): each block's lines
// are requested into L1 kGemvStreamAheadBytes (kernels/manifest.toml [gemv])
// ahead of the group being read.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/format/packed_format.h"
#include "kernels/generated/kernel_functions.h"

namespace torchao_kernels {

// A block is its groups, then its constants (row sums, bias; with bfloat16
// storage the scale and zero-point arrays first). The groups of the NB
// blocks of a column step are read side by side, so the requests follow
// three streams per block:
// - the groups: a request that passes the last group goes to the same place
//   in the next column step's block of the same index. (Past a block's end
//   lie the blocks b + 1 .. NB - 1 of this step, which their own streams are
//   reading: requests left there made every step begin with its first 2 KiB
//   per block unrequested. Granite Rapids-class core capped to AVX-VNNI,
//   4096 x 4096 from DRAM, m = 1: 2-bit 468 -> 438 us, 4-bit 704 -> 644,
//   docs/benchmarks.md.)
// - the row sums and bias, read after the last group: requested by the group
//   whose window reaches the groups' end;
// - bfloat16 scales and zero points (arrays after the groups): as many groups
//   ahead as the distance spans, continuing into the next column step.
// Past the buffer's last block a request is harmless: a prefetch never faults.
// Made once per kernel call (the distance in groups costs a division).
struct StreamAhead {
  const PackedLayout& l;
  int64_t groups_end;  // bytes of a block's groups
  int ahead_groups;    // the distance in groups, rounded up (bfloat16 scales)

  explicit StreamAhead(const PackedLayout& layout)
      : l(layout),
        groups_end(int64_t(layout.groups) * layout.group_bytes),
        ahead_groups(layout.scales_skew == 0
                         ? 0
                         : static_cast<int>((kGemvStreamAheadBytes + layout.group_bytes - 1) / layout.group_bytes)) {}

  // gp: group g of the first of the step's NB blocks (the others sit
  // block_bytes apart).
  template <int NB, bool ZEROS>
  __attribute__((always_inline)) void request(const uint8_t* gp, int g) const {
    const int64_t bs = l.block_bytes, gb = l.group_bytes;
    const int64_t pos = int64_t(g) * gb;
    const int64_t next_step = int64_t(NB) * bs - groups_end;
    for (int b = 0; b < NB; ++b) {
      for (int64_t off = 0; off < gb; off += 64) {
        const int64_t at = kGemvStreamAheadBytes + off;
        _mm_prefetch(reinterpret_cast<const char*>(gp + b * bs + at + (pos + at >= groups_end ? next_step : 0)),
                     _MM_HINT_T0);
      }
    }
    const int64_t window = pos + kGemvStreamAheadBytes;
    if (window <= groups_end ? groups_end < window + gb : g == 0) {
      for (int b = 0; b < NB; ++b) {
        const uint8_t* block = gp + b * bs - pos;
        _mm_prefetch(reinterpret_cast<const char*>(block + l.row_sums_offset), _MM_HINT_T0);
        if (l.has_bias) _mm_prefetch(reinterpret_cast<const char*>(block + l.bias_offset), _MM_HINT_T0);
      }
    }
    if (l.scales_skew != 0) {
      int ga_index = g + ahead_groups;
      const uint8_t* ga = gp + int64_t(ahead_groups) * gb;
      while (ga_index >= l.groups) {  // more than once only when the distance spans a whole block
        ga_index -= l.groups;
        ga += next_step;
      }
      for (int b = 0; b < NB; ++b) {
        _mm_prefetch(reinterpret_cast<const char*>(l.scales_of(ga + b * bs, ga_index)), _MM_HINT_T0);
        if constexpr (ZEROS) _mm_prefetch(reinterpret_cast<const char*>(l.zeros_of(ga + b * bs, ga_index)), _MM_HINT_T0);
      }
    }
  }
};

}  // namespace torchao_kernels
