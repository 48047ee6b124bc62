// The int8 dot-product ceilings of one core, shared by the per-ISA probe
// files (kernels/x86/<isa>/int8_peak_<isa>.cpp): a loop of independent
// accumulator chains with every operand in registers, timed with the steady
// clock (best of several passes). What the GEMM tiles can reach is a fraction
// of this; the benchmark prints its rows as a percentage of it.
#pragma once

#include <chrono>

namespace torchao_kernels {
namespace int8_peak {

// Best seconds per call of loop(iters) over `passes` passes, iters grown
// until one pass takes about 5 ms (the clock's resolution stays negligible).
template <class Loop>
double best_seconds_per_iter(Loop loop) {
  long iters = 1000;
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    loop(iters);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 5e-3 || iters > (1L << 40)) break;
    iters *= 4;
  }
  double best = 1e30;
  for (int pass = 0; pass < 5; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    loop(iters);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
    if (s < best) best = s;
  }
  return best;
}

}  // namespace int8_peak
}  // namespace torchao_kernels
