#include "kernels/quant/pack_weights.h"

#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>

namespace torchao_kernels {

namespace {

// Byte offset, within a block, of the plane unit holding block j of plane i
// of superblock s of group g; plus the shift of that block's bits.
struct ValueSlot {
  int64_t byte;  // relative to the start of the nr-row block
  int shift;     // bit shift in the byte
};

class LayoutAddress {
 public:
  explicit LayoutAddress(const PackedLayout& l) : l_(l), planes_(bit_planes(l.bits)) {
    int64_t off = 0;
    for (int i = 0; i < planes_.count; ++i) {
      plane_offset_[i] = off;
      off += int64_t{plane_units(planes_.bits[i], l.kb)} * l.nr * kKr;
    }
  }
  const BitPlanes& planes() const { return planes_; }
  // Slot of plane i for value (row rr within block, k index kk).
  ValueSlot slot(int plane, int rr, int kk) const {
    const int g = kk / l_.group_size;
    const int kg = kk % l_.group_size;
    const int s = kg / l_.kb;
    const int ks = kg % l_.kb;
    const int j = ks / kKr;
    const int t = ks % kKr;
    const int p = planes_.bits[plane];
    const int unit = (j * p) / 8;
    ValueSlot v;
    v.shift = (j * p) % 8;
    v.byte = g * l_.group_bytes + s * l_.superblock_bytes + plane_offset_[plane] +
             int64_t{unit} * l_.nr * kKr + rr * kKr + t;
    return v;
  }

 private:
  const PackedLayout& l_;
  BitPlanes planes_;
  int64_t plane_offset_[3] = {0, 0, 0};
};

}  // namespace

size_t packed_size(FormatId format, int bits, int n, int k, int group_size, bool has_zeros,
                   bool has_bias, ScaleType scale_type) {
  return kPackedHeaderBytes +
         PackedLayout::make(format, bits, n, k, group_size, has_zeros, has_bias, scale_type)
             .body_bytes;
}

namespace {
// Writes the bit planes of every row (the part every layout shares).
void write_planes(const PackedLayout& l, const int8_t* qvals, uint8_t* body) {
  const int qmin = -(1 << (l.bits - 1));
  const int qmax = (1 << (l.bits - 1)) - 1;
  const LayoutAddress addr(l);
  const BitPlanes& planes = addr.planes();
  for (int r = 0; r < l.n; ++r) {
    uint8_t* block = body + (r / l.nr) * l.block_bytes;
    const int rr = r % l.nr;
    const int8_t* qrow = qvals + int64_t{r} * l.k;
    for (int kk = 0; kk < l.k; ++kk) {
      const int q = qrow[kk];
      if (q < qmin || q > qmax) {
        std::ostringstream os;
        os << "weight_qvals[" << r << ", " << kk << "] = " << q << " is outside the " << l.bits
           << "-bit range [" << qmin << ", " << qmax << "]";
        throw std::invalid_argument(os.str());
      }
      const unsigned u = static_cast<unsigned>(q - qmin);
      for (int i = 0; i < planes.count; ++i) {
        const ValueSlot s = addr.slot(i, rr, kk);
        const unsigned bits = (u >> planes.shift[i]) & ((1u << planes.bits[i]) - 1u);
        block[s.byte] = static_cast<uint8_t>(block[s.byte] | (bits << s.shift));
      }
    }
  }
}
}  // namespace

size_t qvals_only_size(int bits, int n, int k) {
  return kPackedHeaderBytes + PackedLayout::make_qvals_only(bits, n, k).body_bytes;
}

void pack_qvals_only(int bits, int n, int k, const int8_t* qvals, void* out) {
  const PackedLayout l = PackedLayout::make_qvals_only(bits, n, k);
  const PackedHeader h = make_header(FormatId::kN1K4, l);
  auto* dst = static_cast<uint8_t*>(out);
  std::memcpy(dst, &h, sizeof(h));
  uint8_t* body = dst + kPackedHeaderBytes;
  std::memset(body, 0, l.body_bytes);
  write_planes(l, qvals, body);
}

void pack_weights(FormatId format, const WeightsView& w, void* out) {
  const PackedLayout l = PackedLayout::make(format, w.bits, w.n, w.k, w.group_size,
                                            w.zeros != nullptr, w.bias != nullptr, w.scale_type);
  if (l.scales_bf16 &&
      lossless_scale_type(w.scales, int64_t{w.n} * l.groups) != ScaleType::kBFloat16) {
    throw std::invalid_argument(
        "weight_scales: bfloat16 storage needs every scale to be a bfloat16 value");
  }
  const PackedHeader h = make_header(format, l);
  auto* dst = static_cast<uint8_t*>(out);
  std::memcpy(dst, &h, sizeof(h));
  uint8_t* body = dst + kPackedHeaderBytes;
  std::memset(body, 0, l.body_bytes);

  write_planes(l, w.qvals, body);
  for (int r = 0; r < w.n; ++r) {
    uint8_t* block = body + (r / l.nr) * l.block_bytes;
    const int rr = r % l.nr;
    const int8_t* qrow = w.qvals + int64_t{r} * w.k;
    // Per-group scales / zeros, then the per-row sum used for the activation
    // zero-point correction: sum_g scale_g * (sum_{i in g} w_i - G * zero_g),
    // accumulated group by group with fma (a fixed order: part of the format).
    float row_sum = 0.0f;
    for (int g = 0; g < l.groups; ++g) {
      const float scale = w.scales[int64_t{r} * l.groups + g];
      const int zero = w.zeros ? w.zeros[int64_t{r} * l.groups + g] : 0;
      const uint8_t* group = block + g * l.group_bytes;
      uint8_t* scale_at = block + (l.scales_of(group, g) - block);
      if (l.scales_bf16) {
        uint32_t bits;
        std::memcpy(&bits, &scale, 4);
        const uint16_t hi = static_cast<uint16_t>(bits >> 16);
        std::memcpy(scale_at + 2 * rr, &hi, 2);
      } else {
        std::memcpy(scale_at + 4 * rr, &scale, 4);
      }
      if (w.zeros) block[(l.zeros_of(group, g) - block) + rr] = static_cast<uint8_t>(zero);
      int32_t sum = 0;
      for (int i = g * w.group_size; i < (g + 1) * w.group_size; ++i) sum += qrow[i];
      sum -= w.group_size * zero;
      row_sum = std::fma(scale, static_cast<float>(sum), row_sum);
    }
    std::memcpy(block + l.row_sums_offset + 4 * rr, &row_sum, 4);
    if (w.bias) std::memcpy(block + l.bias_offset + 4 * rr, &w.bias[r], 4);
  }
}

void unpack_weights(const PackedView& v, int8_t* qvals, float* scales, int8_t* zeros,
                    float* bias) {
  const PackedLayout& l = v.layout;
  if (l.qvals_only && scales)
    throw std::invalid_argument(
        "packed_weights hold weight values only (an embedding table packed by "
        "_pack_embedding_{b}bit): they carry no scales to unpack");
  const int qmin = -(1 << (l.bits - 1));
  const LayoutAddress addr(l);
  const BitPlanes& planes = addr.planes();
  for (int r = 0; r < l.n; ++r) {
    const uint8_t* block = v.body + (r / l.nr) * l.block_bytes;
    const int rr = r % l.nr;
    for (int kk = 0; kk < l.k; ++kk) {
      unsigned u = 0;
      for (int i = 0; i < planes.count; ++i) {
        const ValueSlot s = addr.slot(i, rr, kk);
        u |= ((block[s.byte] >> s.shift) & ((1u << planes.bits[i]) - 1u)) << planes.shift[i];
      }
      qvals[int64_t{r} * l.k + kk] = static_cast<int8_t>(static_cast<int>(u) + qmin);
    }
    for (int g = 0; g < l.groups && scales; ++g) {
      const uint8_t* group = block + g * l.group_bytes;
      scales[int64_t{r} * l.groups + g] = l.scale(group, g, rr);
      if (zeros)
        zeros[int64_t{r} * l.groups + g] =
            l.has_zeros ? static_cast<int8_t>(l.zeros_of(group, g)[rr]) : 0;
    }
    if (bias) {
      float b = 0.0f;
      if (l.has_bias) std::memcpy(&b, block + l.bias_offset + 4 * rr, 4);
      bias[r] = b;
    }
  }
}

}  // namespace torchao_kernels
