// The kernel registry: one table listing every micro-kernel compiled into this
// binary. It is the single source of truth for selection, the generated kernel
// tests, the per-kernel benchmarks, explain() and the docs. Its rows are
// derived from kernels/manifest.toml (kernels/generated/kernel_rows.inc).
//
// Kernel name grammar (derived from the row's fields by tools/gen_kernels.py):
//   <lhs>_f32_qbw<format>_<op>_<mr>x<nr>[_shared|_prefetch|_stream|_asm]__<isa>   linear kernels
//   qbw<format>_f32_embedding_<mr>x<nr>__<isa>    embedding lookups: dequantized
//                                                  rows of a packed buffer
//     lhs      qd8: activations quantized dynamically per row to int8;
//              qd8p<R>x<K>: the same, read as panels of R interleaved rows
//              with K-value k-chunks (lhs_panel_rows / lhs_panel_kr);
//              qd8p<R>x<K>i16: panels whose values are widened to int16
//              (lhs_panel_int16)
//     f32      float32 output
//     qbw<format>  groupwise b-bit weights (b = 1..8, see bits_mask) packed in
//              <format>: n1k4 (one row per block) or n16k4 (16 rows per block),
//              both 4 k-values per column (kr)
//     op       gemv (tuned for m = 1..3) or gemm (tiles of mr rows)
//     mr x nr  output tile: activation rows x output columns per step
//     shared   the weights of a column step are unpacked once into L1 and read
//              by every m-tile (otherwise each tile unpacks in registers)
//     prefetch the next column step's weights are prefetched into L2 while a
//              step runs (otherwise the hardware prefetchers alone)
//     asm      hand-scheduled assembly loops where they apply (otherwise
//              intrinsics throughout)
//     isa      scalar | avx2 | avxvnni | avx512 | avx512vnni | neon | dotprod | i8mm
//   The reference kernels share one function that reads any nr.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/format/kernel_args.h"
#include "kernels/select/cpu_descriptor.h"

namespace torchao_kernels {

// What a row computes. Selection only considers rows of the op it selects for.
enum class KernelOp : uint8_t {
  kLinear = 0,     // fn: GemmFn
  kEmbedding = 1,  // embed: EmbeddingFn
};
const char* kernel_op_name(KernelOp op);

struct UarchPreference {
  UarchClass uarch_class;
  int bonus;  // added to the kernel's priority on cores of this class
  // The m-buckets it applies to, as the row's own m range (m_max 0 =
  // unbounded): one core class can prefer a row for some m and not others.
  int m_min = 1;
  int m_max = 0;
  // The bit widths it applies to (a crossover between rows can depend on the
  // work per weight byte, not only on m).
  int bits_min = 1;
  int bits_max = 8;
  // The weight residency it applies to (WeightResidency, selector.h), or -1
  // for any: a tile's advantage can hold only while the weights stream from
  // DRAM.
  int residency = -1;
  // The group length it applies to (WeightGroups, selector.h), or -1 for
  // any: a tile that unpacks in registers can win where the groups are long
  // (per-channel weights) and lose where the per-group work dominates.
  int groups = -1;
  // The row length it applies to (WeightRows, selector.h), or -1 for any.
  int rows = -1;
  // The thread bucket it applies to (thread_bucket(), selector.h), or -1 for
  // any: which GEMV streams best can depend on what the other cores do.
  int threads = -1;
};

struct KernelInfo {
  const char* name;
  FormatId format;
  uint64_t required_isa;  // every bit must be present
  const char* isa_name;   // the name's ISA suffix
  int m_min, m_max;       // shape classes it is meant for (m_max = 0: unbounded)
  int mr, nr, kr, sr;     // tile: rows, columns per step, k interleave, sub-rows
  int block_step;         // format blocks per step (nr / format nr)
  uint32_t bits_mask;     // bit (b - 1) set when b-bit weights are supported
  bool zeros, bias;       // supports weight zero points / bias
  int priority;           // base preference (higher wins)
  std::vector<UarchPreference> uarch_prefs;
  const char* why;        // why it exists / when it wins (shown in docs)
  GemmFn fn;
  QuantizeActivationsFn quantize;  // activation quantizer this kernel pairs with
  // > 0: the kernel reads activations as panels of this many interleaved rows
  // (QuantizedActivations::panels), which the op builds after quantizing,
  // with k-chunks of lhs_panel_kr bytes.
  int lhs_panel_rows = 0;
  int lhs_panel_kr = 4;
  // Optional: quantizes straight into the panels (with everything `quantize`
  // fills), replacing quantize + pack_activation_panels.
  QuantizeActivationsFn quantize_panels = nullptr;
  KernelOp op = KernelOp::kLinear;
  EmbeddingFn embed = nullptr;  // op == kEmbedding
  // Added to the priority by where the weights live (WeightResidency: L2,
  // last-level cache, DRAM), e.g. a prefetching GEMV that only pays off
  // when the weights stream from beyond the caches.
  int residency_bonus[3] = {0, 0, 0};
  // Added to the priority by the weights' row length (WeightRows: short,
  // medium, long), e.g. a GEMV prefetching the next column step, which beats the
  // hardware prefetchers only over short rows.
  int rows_bonus[3] = {0, 0, 0};
  // Whether selection may give it weights in long groups (WeightGroups): a
  // row whose own path covers short groups only (a long group would run
  // another row's code inside it) is rejected for them, so explain() and
  // stats() name the row that runs.
  bool long_groups = true;
  // The panels hold int16 values (QuantizedActivations::panel_int16).
  bool lhs_panel_int16 = false;
  // The int8 peak probe (Int8PeakProbe::name) that bounds this row, where it
  // is not its ISA family's first (null): the benchmark's compute roof.
  const char* ceiling = nullptr;
  // Whether this build holds the row's function (either kind).
  bool compiled() const { return op == KernelOp::kLinear ? fn != nullptr : embed != nullptr; }
};

// Fills `qa` (carved by carve_activations) for rows [m_begin, m_end) of x:
// the kernel's quantizer, then its panels when it reads panels. Row ranges
// start on panel boundaries.
void prepare_activations(const KernelInfo& kernel, const float* x, int64_t x_stride, int m_begin,
                         int m_end, QuantizedActivations& qa);

// Quantized activations for `kernel` over m rows against weights of layout
// `w`: carved from scratch (at least activation_bytes(kernel, m, w) bytes).
size_t activation_bytes(const KernelInfo& kernel, int m, const PackedLayout& w);
QuantizedActivations carve_activations(const KernelInfo& kernel, void* scratch, int m,
                                       const PackedLayout& w);

const std::vector<KernelInfo>& kernel_registry();

// The int8 compute ceilings a kernel family is measured against: one probe
// per exact dot-product sequence (kernels/manifest.toml, [[probe]]), listed like the
// kernels so every build can name them; fn is null where not compiled in.
struct Int8PeakProbe {
  const char* name;      // e.g. "avx2_pairsum"
  const char* isa_name;  // the kernel family (name suffix) it bounds
  uint64_t required_isa;
  const char* what;      // the instruction sequence
  double (*fn)();        // GOPS of one core
};
const std::vector<Int8PeakProbe>& int8_peak_probes();
const KernelInfo* find_kernel(const char* name);

}  // namespace torchao_kernels
