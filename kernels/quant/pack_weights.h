// Weight packing: int8 qvals + per-group scales (+ zero points, + bias) into a
// packed buffer of a given format (layout in kernels/format/packed_format.h),
// and the inverse, used to repack a buffer into another format without the
// original weights.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/format/packed_format.h"

namespace torchao_kernels {

struct WeightsView {
  int bits, n, k, group_size;
  const int8_t* qvals;   // n x k, each in [-2^(bits-1), 2^(bits-1) - 1]
  const float* scales;   // n x (k / group_size)
  const int8_t* zeros;   // n x (k / group_size), or null
  const float* bias;     // n, or null
  // Storage of the scales; kBFloat16 requires every scale to be a bfloat16
  // value (lossless_scale_type), else pack_weights throws.
  ScaleType scale_type = ScaleType::kFloat32;
};

size_t packed_size(FormatId format, int bits, int n, int k, int group_size, bool has_zeros,
                   bool has_bias, ScaleType scale_type = ScaleType::kFloat32);

// Writes header + body to out (packed_size bytes). Throws std::invalid_argument
// if a qval lies outside the bit range (naming its position and value).
void pack_weights(FormatId format, const WeightsView& w, void* out);

// Weights-only tables (kFlagQvalsOnly, format n1k4) for embedding lookups
// whose scales and zero points come with each call (torchao's
// _pack_embedding_{b}bit): header + the bit planes of each row.
size_t qvals_only_size(int bits, int n, int k);
void pack_qvals_only(int bits, int n, int k, const int8_t* qvals, void* out);

// Reads a packed buffer back into qvals / scales / zeros / bias (arrays sized
// as in WeightsView; zeros / bias may be null when the buffer has none).
void unpack_weights(const PackedView& v, int8_t* qvals, float* scales, int8_t* zeros, float* bias);

}  // namespace torchao_kernels
