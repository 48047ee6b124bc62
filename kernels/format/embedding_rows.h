// Where one row of a packed buffer lives, for embedding lookups: the shared
// addressing of the reference and SIMD lookup kernels.
//
// A row r sits in block r / nr at row slot rr = r % nr: in every plane unit
// (nr * 4 bytes) its 4-value block is the 4 bytes at 4 * rr. Superblocks of
// kb values follow each other within a group; scales and zero points come
// from the group (linear formats) or from the caller's arrays (weights-only
// tables), each with its own group size.
#pragma once

#include <cstdint>

#include "kernels/format/kernel_args.h"

namespace torchao_kernels {

class EmbeddingRow {
 public:
  EmbeddingRow(const EmbeddingArgs& a, int64_t row)
      : l_(*a.w), a_(a), row_(row),
        block_(a.body + (row / a.w->nr) * a.w->block_bytes),
        rr_(static_cast<int>(row % a.w->nr)) {}

  int row_slot() const { return rr_; }
  // Group size of the scales and zero points.
  int scale_group_size() const { return a_.ext_scales ? a_.ext_group_size : l_.group_size; }
  // First byte of the superblock holding k-position kk (a multiple of kb).
  const uint8_t* superblock(int kk) const {
    const int g = kk / l_.group_size;
    return block_ + int64_t{g} * l_.group_bytes +
           int64_t{(kk - g * l_.group_size) / l_.kb} * l_.superblock_bytes;
  }
  float scale(int g) const {
    if (a_.ext_scales) return a_.ext_scales[row_ * (l_.k / a_.ext_group_size) + g];
    return l_.scale(block_ + int64_t{g} * l_.group_bytes, g, rr_);
  }
  int zero(int g) const {
    if (a_.ext_scales)
      return a_.ext_zeros ? a_.ext_zeros[row_ * (l_.k / a_.ext_group_size) + g] : 0;
    if (!l_.has_zeros) return 0;
    return static_cast<int8_t>(l_.zeros_of(block_ + int64_t{g} * l_.group_bytes, g)[rr_]);
  }

 private:
  const PackedLayout& l_;
  const EmbeddingArgs& a_;
  int64_t row_;
  const uint8_t* block_;
  int rr_;
};

}  // namespace torchao_kernels
