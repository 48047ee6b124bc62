// Compile-time view of the bit planes of a packed b-bit superblock (see
// kernels/format/packed_format.h), shared by the SIMD kernels.
#pragma once

namespace torchao_kernels {
namespace plane_layout {

struct Planes {
  int count;
  int bits[3];
  int shift[3];       // position of the plane's bits in the value
  int unit_offset[3]; // first unit of the plane within the superblock
};

constexpr Planes planes_of(int bits, int kb) {
  Planes p{0, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}};
  if (bits == 8) {
    p.count = 1;
    p.bits[0] = 8;
    return p;
  }
  int shift = 0, unit = 0;
  const int sizes[3] = {4, 2, 1};
  for (int i = 0; i < 3; ++i) {
    if (bits - shift >= sizes[i]) {
      p.bits[p.count] = sizes[i];
      p.shift[p.count] = shift;
      p.unit_offset[p.count] = unit;
      unit += ((kb / 4) * sizes[i] + 7) / 8;
      shift += sizes[i];
      ++p.count;
    }
  }
  return p;
}

}  // namespace plane_layout
}  // namespace torchao_kernels
