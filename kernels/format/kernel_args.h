// The call interface shared by every matmul micro-kernel (reference and SIMD).
//
// A kernel computes out[r, c] for activation rows r in [m_begin, m_end) and
// output columns c of blocks [block_begin, block_end) (a block is nr columns
// of the packed format; columns >= n are never written). Kernels are
// stateless: no allocation, no threads, no globals.
//
// Every kernel produces, bit for bit, the reference result
// (kernels/reference/gemm_reference.cpp):
//   acc = 0
//   for each group g:  I_g = sum_{i in g} xq_i * (w_i - wzero_g)        (exact int32)
//                      acc = fma(float(I_g), wscale_g, acc)
//   t = fma(float(-xzero), row_sum, acc)      row_sum: see packed_format.h
//   y = fma(t, xscale, bias)                  bias = 0 without bias
#pragma once

#include <cstdint>

#include "kernels/format/packed_format.h"
#include "kernels/quant/quantized_activations.h"

namespace torchao_kernels {

struct GemmArgs {
  const PackedLayout* w;
  const uint8_t* body;
  const QuantizedActivations* x;
  int m_begin, m_end;
  int block_begin, block_end;
  float* out;
  int64_t out_stride;  // elements between output rows
};

using GemmFn = void (*)(const GemmArgs&);

}  // namespace torchao_kernels

namespace torchao_kernels {

// The call interface of every embedding-lookup micro-kernel: for each of
// `count` rows (already validated to lie in [0, n)), writes the dequantized
// row  out[i, c] = scale * float(w - zero)  (k floats, docs/semantics.md),
// with scale and zero point of the row's group of c. They come from the
// packed buffer (linear formats) or, for weights-only tables
// (kFlagQvalsOnly), from ext_scales / ext_zeros: row-major
// [n][k / ext_group_size], ext_zeros may be null (zero points 0).
struct EmbeddingArgs {
  const PackedLayout* w;
  const uint8_t* body;
  const float* ext_scales;
  const int8_t* ext_zeros;
  int ext_group_size;
  const int64_t* rows;
  int64_t count;
  float* out;
  int64_t out_stride;  // elements between output rows
};

using EmbeddingFn = void (*)(const EmbeddingArgs&);

}  // namespace torchao_kernels
