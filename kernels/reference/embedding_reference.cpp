#include "kernels/generated/kernel_functions.h"

#include "kernels/format/embedding_rows.h"

namespace torchao_kernels {

void qbw_f32_embedding_1xNR__scalar(const EmbeddingArgs& a) {
  const PackedLayout& l = *a.w;
  const BitPlanes planes = bit_planes(l.bits);
  const int64_t unit_bytes = int64_t{l.nr} * kKr;
  int64_t plane_offset[3] = {0, 0, 0};
  for (int i = 1; i < planes.count; ++i)
    plane_offset[i] = plane_offset[i - 1] + plane_units(planes.bits[i - 1], l.kb) * unit_bytes;
  const int offset = 1 << (l.bits - 1);  // stored values are w + 2^(bits-1)
  for (int64_t i = 0; i < a.count; ++i) {
    const EmbeddingRow row(a, a.rows[i]);
    const int gs = row.scale_group_size();
    float* out = a.out + i * a.out_stride;
    for (int kk = 0; kk < l.k; ++kk) {
      const uint8_t* sb = row.superblock(kk - kk % l.kb) + kKr * row.row_slot();
      const int j = (kk % l.kb) / kKr, t = kk % kKr;
      unsigned u = 0;
      for (int p = 0; p < planes.count; ++p) {
        const int pb = planes.bits[p];
        const uint8_t byte = sb[plane_offset[p] + ((j * pb) / 8) * unit_bytes + t];
        u |= ((byte >> ((j * pb) % 8)) & ((1u << pb) - 1u)) << planes.shift[p];
      }
      const int g = kk / gs;
      out[kk] = row.scale(g) * static_cast<float>(static_cast<int>(u) - offset - row.zero(g));
    }
  }
}

}  // namespace torchao_kernels
