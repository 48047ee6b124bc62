#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/quant/quantized_activations.h"

namespace torchao_kernels {

namespace {
constexpr size_t kAlign = 64;
size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }
}  // namespace

size_t QuantizedActivations::bytes_needed(int m, int k, int group_size, int panel_rows, bool panel_int16) {
  const size_t groups = k / group_size;
  const size_t row = round_up(k, kAlign);
  size_t bytes = kAlign + round_up(size_t(m) * row, kAlign) +
                 round_up(size_t(m) * groups * 4, kAlign) + round_up(size_t(m) * 4, kAlign) * 2;
  if (panel_rows > 0) {
    const size_t padded = (size_t(m) + panel_rows - 1) / panel_rows * panel_rows;
    bytes += round_up(padded * k * (panel_int16 ? 2 : 1), kAlign) + round_up(padded * groups * 8, kAlign);  // sums: up to 2 int32 per row
  }
  return bytes;
}

QuantizedActivations QuantizedActivations::carve(void* scratch, int m, int k, int group_size,
                                                 int panel_rows, int panel_kr, bool panel_int16) {
  QuantizedActivations a;
  a.m = m;
  a.k = k;
  a.group_size = group_size;
  a.groups = k / group_size;
  a.row_stride = static_cast<int64_t>(round_up(k, kAlign));
  auto p = reinterpret_cast<uintptr_t>(scratch);
  p = round_up(p, kAlign);
  a.q = reinterpret_cast<int8_t*>(p);
  p += round_up(size_t(m) * a.row_stride, kAlign);
  a.group_sums = reinterpret_cast<int32_t*>(p);
  p += round_up(size_t(m) * a.groups * 4, kAlign);
  a.scale = reinterpret_cast<float*>(p);
  p += round_up(size_t(m) * 4, kAlign);
  a.zero = reinterpret_cast<int32_t*>(p);
  p += round_up(size_t(m) * 4, kAlign);
  if (panel_rows > 0) {
    const size_t padded = (size_t(m) + panel_rows - 1) / panel_rows * panel_rows;
    a.panel_rows = panel_rows;
    a.panel_kr = panel_kr;
    a.panel_int16 = panel_int16;
    a.panel_stride = int64_t{panel_rows} * k * (panel_int16 ? 2 : 1);
    a.panel_sums_stride = int64_t{a.groups} * panel_rows * (panel_kr == 8 ? 2 : 1);
    a.panels = reinterpret_cast<int8_t*>(p);
    p += round_up(padded * k * (panel_int16 ? 2 : 1), kAlign);
    a.panel_sums = reinterpret_cast<int32_t*>(p);
    // The sums region holds 2 int32 per row and group: kr = 8 panels use both
    // (row-pair layout), kr = 4 panels put the float copies in the second half.
    if (panel_kr == 4) a.panel_sums_f = reinterpret_cast<float*>(a.panel_sums + padded * a.groups);
  }
  return a;
}

namespace {
template <int KR, bool INT16>
void pack_panels(QuantizedActivations& a, int m_begin, int m_end) {
  const int P = a.panel_rows;
  const int chunks = a.k / KR;
  for (int p0 = m_begin; p0 < m_end; p0 += P) {
    int8_t* panel = a.panels + (p0 / P) * a.panel_stride;
    int32_t* sums = a.panel_sums + int64_t(p0 / P) * a.panel_sums_stride;
    for (int r = 0; r < P; ++r) {
      const int row = p0 + r;
      const bool valid = row < a.m;
      const int8_t* src = a.q + int64_t(row) * a.row_stride;
      if constexpr (INT16) {
        // (k0, k2, k1, k3) per chunk (quantized_activations.h).
        int16_t* dst = reinterpret_cast<int16_t*>(panel) + r * KR;
        for (int c = 0; c < chunks; ++c, dst += P * KR) {
          for (int i = 0; i < KR; ++i) dst[i] = valid ? src[KR * c + (i % 2) * 2 + i / 2] : 0;
        }
      } else {
        int8_t* dst = panel + r * KR;
        if (valid) {
          for (int c = 0; c < chunks; ++c, dst += P * KR) std::memcpy(dst, src + KR * c, KR);
        } else {
          for (int c = 0; c < chunks; ++c, dst += P * KR) std::memset(dst, 0, KR);
        }
      }
      for (int g = 0; g < a.groups; ++g) {
        const int32_t s = valid ? a.group_sums[int64_t(row) * a.groups + g] : 0;
        if (KR == 8) {
          // {-s0, -s0, -s1, -s1} << shift per row pair (see quantized_activations.h).
          int32_t* pair = sums + int64_t(g) * 2 * P + (r / 2) * 4 + (r % 2) * 2;
          pair[0] = pair[1] = static_cast<int32_t>((0u - static_cast<uint32_t>(s)) << a.panel_sum_shift);
        } else {
          sums[int64_t(g) * P + r] = s;
          a.panel_sums_f[(p0 / P) * a.panel_sums_stride + int64_t(g) * P + r] = static_cast<float>(s);
        }
      }
    }
  }
}
}  // namespace

void pack_activation_panels(QuantizedActivations& a, int m_begin, int m_end) {
  if (a.panel_kr == 8) {
    pack_panels<8, false>(a, m_begin, m_end);
  } else if (a.panel_int16) {
    pack_panels<4, true>(a, m_begin, m_end);
  } else {
    pack_panels<4, false>(a, m_begin, m_end);
  }
}

RowQuantParams row_quant_params(float lo, float hi, bool finite) {
  RowQuantParams p;
  if (!finite) {
    p.scale = std::numeric_limits<float>::quiet_NaN();
    p.inv_scale = 0.0f;
    p.zero = 0;
    p.finite = false;
    return p;
  }
  float scale = (hi - lo) / 255.0f;
  if (!(scale > 0.0f) || !std::isfinite(1.0f / scale)) scale = 1.0f;
  p.scale = scale;
  p.inv_scale = 1.0f / scale;
  float z = -128.0f - std::nearbyint(lo / scale);
  z = z < -128.0f ? -128.0f : (z > 127.0f ? 127.0f : z);
  p.zero = static_cast<int32_t>(z);
  p.finite = true;
  return p;
}

void quantize_activations_scalar(const float* x, int64_t x_stride, int m_begin, int m_end,
                                 QuantizedActivations& out) {
  const int k = out.k;
  for (int r = m_begin; r < m_end; ++r) {
    const float* xr = x + r * x_stride;
    float lo = 0.0f, hi = 0.0f;
    bool finite = true;
    for (int i = 0; i < k; ++i) {
      const float v = xr[i];
      if (!std::isfinite(v)) finite = false;
      lo = v < lo ? v : lo;
      hi = v > hi ? v : hi;
    }
    const RowQuantParams p = row_quant_params(lo, hi, finite);
    int8_t* q = out.q + r * out.row_stride;
    int32_t* sums = out.group_sums + int64_t{r} * out.groups;
    for (int g = 0; g < out.groups; ++g) {
      int32_t s = 0;
      for (int i = g * out.group_size; i < (g + 1) * out.group_size; ++i) {
        int32_t v = 0;
        if (p.finite) {
          v = static_cast<int32_t>(std::nearbyint(xr[i] * p.inv_scale)) + p.zero;
          v = v < -128 ? -128 : (v > 127 ? 127 : v);
        }
        q[i] = static_cast<int8_t>(v);
        s += v;
      }
      sums[g] = s;
    }
    out.scale[r] = p.scale;
    out.zero[r] = p.zero;
  }
}

}  // namespace torchao_kernels
