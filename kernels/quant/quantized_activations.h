// Activations quantized per row to int8, asymmetric: the left-hand operand of
// every kernel. Produced once per call by an activation quantizer (scalar or
// SIMD; all produce identical bytes), then read by any kernel.
//
// Exact definition (the reference, kernels/quant/quantize_activations.cpp):
//   lo = min(0, min_i x_i), hi = max(0, max_i x_i)
//   scale = (hi - lo) / 255            (scale = 1 when hi == lo)
//   zero  = clamp(-128 - nearbyint(lo / scale), -128, 127)
//   q_i   = clamp(nearbyint(x_i * (1 / scale)) + zero, -128, 127)
//   A row holding a NaN or infinity gets scale = NaN, zero = 0, q = 0, so its
//   outputs are NaN (as a float matmul would give) instead of silently finite.
// Per group g the quantizer also stores sum_{i in g} q_i, which kernels need to
// apply the weight zero points in integer arithmetic.
#pragma once

#include <cstddef>
#include <cstdint>

namespace torchao_kernels {

struct QuantizedActivations {
  int m = 0, k = 0, group_size = 0, groups = 0;
  int64_t row_stride = 0;       // bytes between rows of q
  int8_t* q = nullptr;          // m x row_stride
  int32_t* group_sums = nullptr;  // m x groups
  float* scale = nullptr;       // m
  int32_t* zero = nullptr;      // m

  // Optional row panels for GEMM tiles (panel_rows > 0): rows grouped by
  // panel_rows, and within a panel the panel_kr-byte k-chunks of its rows
  // interleaved, [k / panel_kr][panel_rows][panel_kr], so a tile reads all its
  // rows through one pointer with constant offsets (no per-row pointers to
  // keep in registers). Rows past m are zero.
  //   panel_kr = 4 (dot-product tiles): sums [groups][panel_rows], and the
  //   same as floats in panel_sums_f (exact: |sum| <= 128 * group_size), so
  //   a tile broadcasts them straight from memory into its float epilogue.
  //   panel_kr = 8 (matrix-multiply tiles, 2 rows x 8 k per operand): sums
  //   [groups][panel_rows / 2][4] = {-s0, -s0, -s1, -s1} << panel_sum_shift
  //   for each row pair: the layout of a 2x2 int32 accumulator block
  //   (row-major, rows = the two activation rows), negated and scaled by the
  //   weight storage offset because the accumulators start from
  //   -(offset + weight zero point) * sum (wrapping int32 arithmetic).
  //   panel_int16 (with panel_kr = 4): the values widened to int16, each
  //   row's chunk of 4 stored as (k0, k2, k1, k3): the even k-values' pair,
  //   then the odd ones', the order in which the AVX2 8-bit tile splits its
  //   weight bytes (one mask and one shift per vector) for vpmaddwd, which
  //   multiplies int16 pairs exactly where vpmaddubsw would saturate.
  int panel_rows = 0;
  int panel_kr = 4;
  int panel_sum_shift = 0;
  bool panel_int16 = false;
  int8_t* panels = nullptr;        // ceil(m / panel_rows) * panel_stride bytes (int16_t values if panel_int16)
  int64_t panel_stride = 0;        // bytes per panel = panel_rows * k (* 2 if panel_int16)
  int32_t* panel_sums = nullptr;   // ceil(m / panel_rows) * panel_sums_stride
  int64_t panel_sums_stride = 0;   // int32 per panel: groups * panel_rows (* 2 when panel_kr = 8)
  float* panel_sums_f = nullptr;   // panel_kr = 4: float sums, indexed like panel_sums

  // Bytes of scratch needed for m rows (with alignment slack), with room for
  // panels of panel_rows rows when panel_rows > 0.
  static size_t bytes_needed(int m, int k, int group_size, int panel_rows = 0, bool panel_int16 = false);
  // Carves the arrays out of scratch (at least bytes_needed bytes).
  static QuantizedActivations carve(void* scratch, int m, int k, int group_size,
                                    int panel_rows = 0, int panel_kr = 4, bool panel_int16 = false);
};

// Fills the panels of rows [m_begin, m_end) (multiples of panel_rows, m_end
// may be m) from the row-major quantized rows.
void pack_activation_panels(QuantizedActivations& a, int m_begin, int m_end);

// Quantizes rows [m_begin, m_end) of x (float, row stride x_stride elements).
using QuantizeActivationsFn = void (*)(const float* x, int64_t x_stride, int m_begin, int m_end,
                                       QuantizedActivations& out);

void quantize_activations_scalar(const float* x, int64_t x_stride, int m_begin, int m_end,
                                 QuantizedActivations& out);

// Shared by every quantizer so all agree bit for bit.
struct RowQuantParams {
  float scale;
  float inv_scale;
  int32_t zero;
  bool finite;
};
RowQuantParams row_quant_params(float lo, float hi, bool finite);

}  // namespace torchao_kernels
