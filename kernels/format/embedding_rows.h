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

// A row's scales and zero points: those of scale group g lie at base + g *
// stride bytes (in the packed groups, or in the caller's arrays), so a kernel
// walking the groups in order adds a stride per group.
struct RowScales {
  const uint8_t* scales;
  int64_t scale_stride;
  bool bf16;              // bfloat16 (upper 16 bits of the float32) or float32
  const uint8_t* zeros;   // int8 zero points, or null: none
  int64_t zero_stride;

  // The scale and zero point at a group's addresses (zeros null: 0).
  float scale_at(const uint8_t* p) const { return load_scale(p, bf16); }
  static int zero_at(const uint8_t* p) { return p ? static_cast<int8_t>(*p) : 0; }
  float scale(int g) const { return scale_at(scales + g * scale_stride); }
  int zero(int g) const { return zero_at(zeros ? zeros + g * zero_stride : nullptr); }

  // Row r of a weights-only table (a.ext_scales set) with `groups` scale
  // groups per row: the SIMD lookups compute `groups` once per call, where
  // EmbeddingRow divides k by the group size for every row.
  static RowScales of_table_row(const EmbeddingArgs& a, int64_t r, int64_t groups) {
    return {reinterpret_cast<const uint8_t*>(a.ext_scales + r * groups), 4, false,
            a.ext_zeros ? reinterpret_cast<const uint8_t*>(a.ext_zeros + r * groups) : nullptr, 1};
  }
};

// The layout's strides a SIMD lookup walks each row by, read once per call
// and kept in registers (the output stores could alias the layout as far as
// the compiler knows, so fields read in the row loop are reloaded per row).
struct RowStrides {
  int unit_bytes;  // a plane unit: nr * 4 bytes
  int64_t superblock_bytes, group_bytes;
  int64_t group_skip;  // from the end of a group's last superblock to the next group's first
  int k, group_size;
  template <bool CONTIGUOUS>  // nr = 1 known at compile time
  static RowStrides of(const PackedLayout& l) {
    return {(CONTIGUOUS ? 1 : l.nr) * 4, l.superblock_bytes, l.group_bytes,
            l.group_bytes - l.superblocks * l.superblock_bytes, l.k, l.group_size};
  }
};

// Whether n >= 1 int8 values are all 0 (8-byte words, the last one
// overlapping: never reads outside [p, p + n)). torchao's weights-only ops
// pass zero points even for symmetric weights, all 0: the SIMD lookups give
// such rows the conversion without zero points (the same values).
inline bool all_zero(const int8_t* p, int64_t n) {
  if (n < 8) {
    int v = 0;
    for (int64_t i = 0; i < n; ++i) v |= p[i];
    return v == 0;
  }
  uint64_t v = 0, w;
  for (int64_t i = 0; i + 8 <= n; i += 8) {
    __builtin_memcpy(&w, p + i, 8);
    v |= w;
  }
  __builtin_memcpy(&w, p + n - 8, 8);
  return (v | w) == 0;
}

// A row's scale groups in order, one per next(): the walk every SIMD lookup
// does, with the zero points (ZEROS) and the scales' storage (BF16) fixed at
// compile time so that a group costs no branch.
template <bool ZEROS, bool BF16>
class ScaleGroups {
 public:
  explicit ScaleGroups(const RowScales& rs)
      : sp_(rs.scales), zp_(rs.zeros), scale_stride_(rs.scale_stride), zero_stride_(rs.zero_stride) {}
  // The next group's scale and zero point (0 without zero points).
  __attribute__((always_inline)) void next(float& scale, int& zero) {
    scale = load_scale(sp_, BF16);
    sp_ += scale_stride_;
    zero = 0;
    if constexpr (ZEROS) {
      zero = static_cast<int8_t>(*zp_);
      zp_ += zero_stride_;
    }
  }
  // The next group as a kernel's conversion G: G(scale, zero), or without
  // zero points G::symmetric(scale) (whose constant part G may hoist).
  template <class G>
  __attribute__((always_inline)) G next_group() {
    float scale;
    int zero;
    next(scale, zero);
    if constexpr (ZEROS) {
      return G(scale, zero);
    } else {
      return G::symmetric(scale);
    }
  }

 private:
  const uint8_t* sp_;
  const uint8_t* zp_;
  int64_t scale_stride_, zero_stride_;
};

class EmbeddingRow {
 public:
  EmbeddingRow(const EmbeddingArgs& a, int64_t row)
      : EmbeddingRow(a, row, row / a.w->nr, static_cast<int>(row % a.w->nr)) {}
  // The same, with the row's block (row / nr) and slot (row % nr) already
  // known (a kernel that avoids the divisions for nr = 1).
  EmbeddingRow(const EmbeddingArgs& a, int64_t row, int64_t block, int slot)
      : l_(*a.w), a_(a), row_(row), block_(a.body + block * a.w->block_bytes), rr_(slot),
        scales_(find_scales()) {}

  // Row r of a layout whose nr is 1 (CONTIGUOUS: known at compile time, no
  // division) or any.
  template <bool CONTIGUOUS>
  static EmbeddingRow of(const EmbeddingArgs& a, int64_t r) {
    const int64_t b = CONTIGUOUS ? r : r / a.w->nr;
    return EmbeddingRow(a, r, b, static_cast<int>(r - b * (CONTIGUOUS ? 1 : a.w->nr)));
  }

  int row_slot() const { return rr_; }
  // Group size of the scales and zero points.
  int scale_group_size() const { return a_.ext_scales ? a_.ext_group_size : l_.group_size; }
  // First byte of the superblock holding k-position kk (a multiple of kb).
  const uint8_t* superblock(int kk) const {
    const int g = kk / l_.group_size;
    return block_ + int64_t{g} * l_.group_bytes +
           int64_t{(kk - g * l_.group_size) / l_.kb} * l_.superblock_bytes;
  }
  const RowScales& scales() const { return scales_; }
  float scale(int g) const { return scales_.scale(g); }
  int zero(int g) const { return scales_.zero(g); }

 private:
  RowScales find_scales() const {
    if (a_.ext_scales) {
      const int64_t first = row_ * (l_.k / a_.ext_group_size);
      return {reinterpret_cast<const uint8_t*>(a_.ext_scales + first), 4, false,
              a_.ext_zeros ? reinterpret_cast<const uint8_t*>(a_.ext_zeros + first) : nullptr, 1};
    }
    // Group g starts at block_ + g * group_bytes (PackedLayout::scales_of / zeros_of).
    const int esize = l_.scales_bf16 ? 2 : 4;
    return {l_.scales_of(block_, 0) + esize * rr_, l_.group_bytes + l_.scales_skew, l_.scales_bf16,
            l_.has_zeros ? l_.zeros_of(block_, 0) + rr_ : nullptr, l_.group_bytes + l_.zeros_skew};
  }

  const PackedLayout& l_;
  const EmbeddingArgs& a_;
  int64_t row_;
  const uint8_t* block_;
  int rr_;
  RowScales scales_;
};

}  // namespace torchao_kernels
