// Helpers shared by the torch-free tests: random weights, packing, running
// one kernel on one thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/quant/pack_weights.h"
#include "kernels/quant/quantized_activations.h"
#include "kernels/select/kernel_registry.h"

namespace torchao_kernels {
namespace testing {

struct Problem {
  int bits, n, k, group_size;
  bool zeros, bias;
  std::vector<int8_t> q, z;
  std::vector<float> scales, bias_v;

  Problem(int bits_, int n_, int k_, int g_, bool zeros_, bool bias_, uint32_t seed)
      : bits(bits_), n(n_), k(k_), group_size(g_), zeros(zeros_), bias(bias_) {
    std::mt19937 rng(seed);
    const int lo = -(1 << (bits - 1)), hi = (1 << (bits - 1)) - 1;
    std::uniform_int_distribution<int> qd(lo, hi);
    std::uniform_real_distribution<float> sd(0.001f, 0.1f), bd(-1.0f, 1.0f);
    q.resize(size_t(n) * k);
    for (auto& v : q) v = static_cast<int8_t>(qd(rng));
    const int groups = k / group_size;
    scales.resize(size_t(n) * groups);
    for (auto& v : scales) v = sd(rng);
    if (zeros) {
      z.resize(size_t(n) * groups);
      for (auto& v : z) v = static_cast<int8_t>(qd(rng));
    }
    if (bias) {
      bias_v.resize(n);
      for (auto& v : bias_v) v = bd(rng);
    }
  }

  // Makes every scale a bfloat16 value (drops its lower 16 bits).
  void round_scales_to_bf16() {
    for (auto& v : scales) {
      uint32_t b;
      std::memcpy(&b, &v, 4);
      b &= 0xffff0000u;
      std::memcpy(&v, &b, 4);
    }
  }

  std::vector<uint8_t> pack(FormatId f, ScaleType st = ScaleType::kFloat32) const {
    std::vector<uint8_t> buf(packed_size(f, bits, n, k, group_size, zeros, bias, st));
    WeightsView w{bits, n, k, group_size, q.data(), scales.data(), zeros ? z.data() : nullptr,
                  bias ? bias_v.data() : nullptr, st};
    pack_weights(f, w, buf.data());
    return buf;
  }
};

inline std::vector<float> activations(int m, int k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(size_t(m) * k);
  for (auto& v : x) v = d(rng);
  return x;
}

// Runs `kernel` on all rows and blocks (single thread); output m x n.
inline std::vector<float> run_kernel(const KernelInfo& kernel, const std::vector<uint8_t>& packed,
                                     const std::vector<float>& x, int m) {
  const PackedView v = parse_packed(packed.data(), packed.size());
  const PackedLayout& l = v.layout;
  std::vector<uint8_t> buf(activation_bytes(kernel, m, l));
  QuantizedActivations qa = carve_activations(kernel, buf.data(), m, l);
  prepare_activations(kernel, x.data(), l.k, 0, m, qa);
  std::vector<float> out(size_t(m) * l.n, -1.0f);
  GemmArgs a{&l, v.body, &qa, 0, m, 0, l.n_blocks, out.data(), l.n};
  kernel.fn(a);
  return out;
}

// Runs `kernel` split as the op splits it over `threads` threads
// (ops/impl/linear_8bit_act_xbit_weight.cpp): activations quantized in row
// ranges starting on panel boundaries, then tasks over column steps of
// block_step blocks, and over row chunks of whole tiles when there are fewer
// than 4 steps per thread. The tasks run one after another, each with its own
// GemmArgs as a worker would get them: every output element must come out as
// in one call over everything.
inline std::vector<float> run_kernel_split(const KernelInfo& kernel, const std::vector<uint8_t>& packed,
                                           const std::vector<float>& x, int m, int threads) {
  const PackedView v = parse_packed(packed.data(), packed.size());
  const PackedLayout& l = v.layout;
  std::vector<uint8_t> buf(activation_bytes(kernel, m, l));
  QuantizedActivations qa = carve_activations(kernel, buf.data(), m, l);
  const int row_step = kernel.lhs_panel_rows ? kernel.lhs_panel_rows : 1;
  const int row_units = (m + row_step - 1) / row_step;
  if (m >= 4 * threads && threads > 1) {
    for (int t = 0; t < threads; ++t) {
      const int b = row_units * t / threads, e = row_units * (t + 1) / threads;
      if (b < e) prepare_activations(kernel, x.data(), l.k, b * row_step, std::min(m, e * row_step), qa);
    }
  } else {
    prepare_activations(kernel, x.data(), l.k, 0, m, qa);
  }
  const int step = kernel.block_step;
  const int n_steps = (l.n_blocks + step - 1) / step;
  int m_chunks = 1;
  if (n_steps < 4 * threads && m >= 2 * kernel.mr) m_chunks = std::min((m + kernel.mr - 1) / kernel.mr, 4 * threads);
  const int rows_per_chunk = ((m + m_chunks - 1) / m_chunks + kernel.mr - 1) / kernel.mr * kernel.mr;
  m_chunks = (m + rows_per_chunk - 1) / rows_per_chunk;
  std::vector<float> out(size_t(m) * l.n, -1.0f);
  for (int t = 0; t < n_steps * m_chunks; ++t) {
    const int ns = t % n_steps, mc = t / n_steps;
    GemmArgs a{&l, v.body, &qa, mc * rows_per_chunk, std::min(m, (mc + 1) * rows_per_chunk),
               ns * step, std::min(l.n_blocks, (ns + 1) * step), out.data(), l.n};
    kernel.fn(a);
  }
  return out;
}

inline const KernelInfo& reference_for(FormatId f) {
  for (const auto& k : kernel_registry())
    if (k.op == KernelOp::kLinear && k.format == f && k.required_isa == 0) return k;
  throw std::runtime_error("no reference kernel");
}

}  // namespace testing
}  // namespace torchao_kernels
