#include "kernels/select/kernel_registry.h"

#include <cstring>

#include "kernels/generated/kernel_functions.h"

// Every architecture's rows are listed in every build, so selection can be
// explained (and its policy tested) for any CPU; a row whose kernel is not
// compiled into this build has no function and can never be selected to run
// (its ISA features do not exist on this architecture).
#if defined(__x86_64__)
#define TAK_X86(f) f
#else
#define TAK_X86(f) nullptr
#endif
#if defined(__aarch64__)
#define TAK_ARM(f) f
#else
#define TAK_ARM(f) nullptr
#endif

namespace torchao_kernels {

namespace {
// The rows, in manifest order (kernels/manifest.toml: names, ISA, tiles,
// panels, preferences and the reasons for them are declared there).
std::vector<KernelInfo> build() {
  return {
#include "kernels/generated/kernel_rows.inc"
  };
}
}  // namespace

const char* kernel_op_name(KernelOp op) {
  return op == KernelOp::kEmbedding ? "embedding" : "linear";
}

const std::vector<KernelInfo>& kernel_registry() {
  static const std::vector<KernelInfo> r = build();
  return r;
}

size_t activation_bytes(const KernelInfo& kernel, int m, const PackedLayout& w) {
  return QuantizedActivations::bytes_needed(m, w.k, w.group_size, kernel.lhs_panel_rows, kernel.lhs_panel_int16);
}

QuantizedActivations carve_activations(const KernelInfo& kernel, void* scratch, int m,
                                       const PackedLayout& w) {
  QuantizedActivations a = QuantizedActivations::carve(scratch, m, w.k, w.group_size,
                                                       kernel.lhs_panel_rows, kernel.lhs_panel_kr,
                                                       kernel.lhs_panel_int16);
  // Matrix-multiply panels hold -sum(x) premultiplied by the weights' storage
  // offset 2^(bits-1) (8-bit weights are fed to them as signed: no offset).
  if (kernel.lhs_panel_kr == 8 && w.bits < 8) a.panel_sum_shift = w.bits - 1;
  return a;
}

void prepare_activations(const KernelInfo& kernel, const float* x, int64_t x_stride, int m_begin,
                         int m_end, QuantizedActivations& qa) {
  if (qa.panel_rows > 0 && kernel.quantize_panels) {
    kernel.quantize_panels(x, x_stride, m_begin, m_end, qa);
    return;
  }
  kernel.quantize(x, x_stride, m_begin, m_end, qa);
  if (qa.panel_rows > 0) pack_activation_panels(qa, m_begin, m_end);
}

const std::vector<Int8PeakProbe>& int8_peak_probes() {
  // The first probe of a family is its ceiling: the best exact sequence of
  // that ISA (AVX2: int16 pair sums, what weights of <= 4 bits and 8-bit
  // nibble halves run on).
  static const std::vector<Int8PeakProbe> probes = {
#include "kernels/generated/int8_peak_probes.inc"
  };
  return probes;
}

const KernelInfo* find_kernel(const char* name) {
  for (const auto& k : kernel_registry())
    if (std::strcmp(k.name, name) == 0) return &k;
  return nullptr;
}

}  // namespace torchao_kernels
