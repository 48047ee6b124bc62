// Reference kernel. Reads any format of the layout family (any nr) by decoding
// one group of nr rows at a time into plain int8 values, then does the exact
// integer dot products and the fixed float epilogue of kernel_args.h.
#include "kernels/generated/kernel_functions.h"

#include <cmath>
#include <cstring>
#include <vector>

namespace torchao_kernels {

namespace {

// Decodes group g of a block into w[nr * group_size] (signed weights, row-major).
void decode_group(const PackedLayout& l, const uint8_t* group, int8_t* w) {
  const BitPlanes planes = bit_planes(l.bits);
  const int qmin = -(1 << (l.bits - 1));
  const int64_t unit_bytes = int64_t{l.nr} * kKr;
  for (int s = 0; s < l.superblocks; ++s) {
    const uint8_t* sb = group + s * l.superblock_bytes;
    for (int rr = 0; rr < l.nr; ++rr) {
      for (int ks = 0; ks < l.kb; ++ks) {
        const int j = ks / kKr, t = ks % kKr;
        unsigned u = 0;
        const uint8_t* plane = sb;
        for (int i = 0; i < planes.count; ++i) {
          const int p = planes.bits[i];
          const uint8_t byte = plane[((j * p) / 8) * unit_bytes + rr * kKr + t];
          u |= ((byte >> ((j * p) % 8)) & ((1u << p) - 1u)) << planes.shift[i];
          plane += plane_units(p, l.kb) * unit_bytes;
        }
        w[int64_t{rr} * l.group_size + s * l.kb + ks] = static_cast<int8_t>(int(u) + qmin);
      }
    }
  }
}

}  // namespace

void qd8_f32_qbw_gemm_1xNR__scalar(const GemmArgs& a) {
  const PackedLayout& l = *a.w;
  const QuantizedActivations& x = *a.x;
  const int nr = l.nr;
  const int rows = a.m_end - a.m_begin;
  std::vector<int8_t> w(size_t(nr) * l.group_size);
  std::vector<float> acc(size_t(rows) * nr);
  for (int b = a.block_begin; b < a.block_end; ++b) {
    const uint8_t* block = a.body + b * l.block_bytes;
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int g = 0; g < l.groups; ++g) {
      const uint8_t* group = block + g * l.group_bytes;
      decode_group(l, group, w.data());
      for (int rr = 0; rr < nr; ++rr) {
        const float scale = l.scale(group, g, rr);
        const int32_t zero =
            l.has_zeros ? static_cast<int8_t>(l.zeros_of(group, g)[rr]) : 0;
        const int8_t* wr = &w[size_t(rr) * l.group_size];
        for (int r = 0; r < rows; ++r) {
          const int8_t* xq = x.q + (a.m_begin + r) * x.row_stride + g * l.group_size;
          int32_t dot = 0;
          for (int i = 0; i < l.group_size; ++i) dot += int32_t{xq[i]} * (int32_t{wr[i]} - zero);
          float& acc_rc = acc[size_t(r) * nr + rr];
          acc_rc = std::fma(static_cast<float>(dot), scale, acc_rc);
        }
      }
    }
    for (int rr = 0; rr < nr; ++rr) {
      const int c = b * nr + rr;
      if (c >= l.n) break;
      float row_sum, bias = 0.0f;
      std::memcpy(&row_sum, block + l.row_sums_offset + 4 * rr, 4);
      if (l.has_bias) std::memcpy(&bias, block + l.bias_offset + 4 * rr, 4);
      for (int r = 0; r < rows; ++r) {
        const int mr = a.m_begin + r;
        const float t =
            std::fma(static_cast<float>(-x.zero[mr]), row_sum, acc[size_t(r) * nr + rr]);
        a.out[mr * a.out_stride + c] = std::fma(t, x.scale[mr], bias);
      }
    }
  }
}

}  // namespace torchao_kernels
