#include "kernels/select/kernel_registry.h"

#include <cstring>

#include "kernels/reference/embedding_reference.h"
#include "kernels/reference/gemm_reference.h"
#include "kernels/aarch64/aarch64_kernels.h"
#include "kernels/x86/x86_kernels.h"

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
constexpr uint32_t kAllBits = 0xFF;
constexpr uint64_t kNeedAvx2 = kIsaAvx2 | kIsaFma;
constexpr uint64_t kNeedAvxvnni = kNeedAvx2 | kIsaAvxvnni;
constexpr uint64_t kNeedAvx512 = kNeedAvx2 | kIsaAvx512f | kIsaAvx512bw | kIsaAvx512vl;
constexpr uint64_t kNeedAvx512vnni =
    kNeedAvx2 | kIsaAvx512f | kIsaAvx512bw | kIsaAvx512vl | kIsaAvx512vnni;
constexpr uint64_t kNeedNeon = kIsaNeon;
constexpr uint64_t kNeedDotprod = kIsaNeon | kIsaDotprod;
constexpr uint64_t kNeedI8mm = kIsaNeon | kIsaDotprod | kIsaI8mm;

// An embedding-lookup row: reads one format, one output row per step.
KernelInfo embedding_row(const char* name, FormatId format, uint64_t isa, const char* isa_name,
                         int nr, int priority, const char* why, EmbeddingFn fn) {
  KernelInfo k{name, format, isa, isa_name, 1, 0, 1, nr, kKr, 1, 1, kAllBits, true, false,
               priority, {}, why, nullptr, nullptr};
  k.op = KernelOp::kEmbedding;
  k.embed = fn;
  return k;
}

std::vector<KernelInfo> build() {
  std::vector<KernelInfo> r;
  // Reference kernels: one row per format, any m, any CPU.
  r.push_back({"qd8_f32_qbw_gemm_1x1c4__scalar", FormatId::kN1K4, 0, "scalar", 1, 0, 1, 1, 4, 1, 1,
               kAllBits, true, true, 0, {},
               "portable ground truth; the only kernel of the portable format",
               qd8_f32_qbw_gemm_1xNRc4__scalar, quantize_activations_scalar});
  r.push_back({"qd8_f32_qbw_gemm_1x16c4__scalar", FormatId::kN16K4, 0, "scalar", 1, 0, 1, 16, 4, 1,
               1, kAllBits, true, true, 0, {},
               "ground truth for n16k4; runs it on CPUs without AVX2",
               qd8_f32_qbw_gemm_1xNRc4__scalar, quantize_activations_scalar});
  // AVX2: vpmaddubsw + vpmaddwd (8-bit weights split in nibbles to avoid int16 saturation).
  // GEMV rows: two 16-row blocks per step, int16 pair sums; the _prefetch
  // form also prefetches the next column step into L2. Decode streams the
  // weights from DRAM, where that prefetch halves the time of short layers
  // (Zen 4 core capped to AVX2, 4-bit, cold: 1536x576 63 -> 30 us); with the
  // weights in cache the plain form is 0-10% faster. Selection cannot see
  // where the weights live, so the decode case wins (docs/benchmarks.md).
  r.push_back({"qd8_f32_qbw_gemv_1x32c4__avx2", FormatId::kN16K4, kNeedAvx2, "avx2", 1, 3, 1, 32,
               4, 1, 2, kAllBits, true, true, 20, {},
               "GEMV on AVX2-only CPUs (Haswell .. Skylake client, Zen 1-3): two 16-row blocks per step, "
               "int16 pair sums, the weights left to the hardware prefetchers (faster when they are "
               "in cache)",
               TAK_X86(qd8_f32_qbw_gemv_1x32c4__avx2), TAK_X86(quantize_activations__avx2)});
  r.push_back({"qd8_f32_qbw_gemv_1x32c4_prefetch__avx2", FormatId::kN16K4, kNeedAvx2, "avx2", 1, 3, 1,
               32, 4, 1, 2, kAllBits, true, true, 25, {},
               "the AVX2 GEMV prefetching the next column step into L2 while it runs: weights "
               "streamed from DRAM (decode)",
               TAK_X86(qd8_f32_qbw_gemv_1x32c4_prefetch__avx2), TAK_X86(quantize_activations__avx2)});
  // GEMM rows: the in-register tile for m = 4-7 (one m-tile per column
  // step: nothing to share), the shared-unpack tile from m = 8 (docs/benchmarks.md).
  r.push_back({"qd8_f32_qbw_gemm_4x16c4__avx2", FormatId::kN16K4, kNeedAvx2, "avx2", 4, 7, 4, 16,
               4, 1, 1, kAllBits, true, true, 20, {},
               "GEMM tile on AVX2-only CPUs, each m-tile unpacking its own weights in registers",
               TAK_X86(qd8_f32_qbw_gemm_4x16c4__avx2), TAK_X86(quantize_activations__avx2)});
  r.push_back({"qd8_f32_qbw_gemm_4x16c4_shared__avx2", FormatId::kN16K4, kNeedAvx2, "avx2", 8, 0, 4, 16,
               4, 1, 1, kAllBits, true, true, 20, {},
               "GEMM on AVX2-only CPUs: a column step's weights unpacked once into L1 (8-bit: as two "
               "nibble planes) and read by every 4-row tile, int16 pair sums",
               TAK_X86(qd8_f32_qbw_gemm_4x16c4_shared__avx2), TAK_X86(quantize_activations__avx2), 4, 4});
  // AVX-VNNI: the same loops with 256-bit vpdpbusd (Alder Lake and later client cores).
  r.push_back({"qd8_f32_qbw_gemv_1x32c4__avxvnni", FormatId::kN16K4, kNeedAvxvnni, "avxvnni", 1, 3,
               1, 32, 4, 1, 2, kAllBits, true, true, 30, {},
               "GEMV with 256-bit VNNI on CPUs without AVX512 (Intel client cores from Alder Lake, "
               "AMD Zen 5 client), weights left to the hardware prefetchers",
               TAK_X86(qd8_f32_qbw_gemv_1x32c4__avxvnni), TAK_X86(quantize_activations__avx2)});
  r.push_back({"qd8_f32_qbw_gemv_1x32c4_prefetch__avxvnni", FormatId::kN16K4, kNeedAvxvnni, "avxvnni", 1,
               3, 1, 32, 4, 1, 2, kAllBits, true, true, 35, {},
               "GEMV with 256-bit VNNI prefetching the next column step into L2 (decode)",
               TAK_X86(qd8_f32_qbw_gemv_1x32c4_prefetch__avxvnni), TAK_X86(quantize_activations__avx2)});
  // vpdpbusd leaves the unpacking ops a port of their own, so sharing pays
  // only from m = 32 (4096x4096: m = 8 1209 us in registers vs 1368 shared,
  // m = 32 5229 vs 4918; Sapphire Rapids core, docs/benchmarks.md).
  r.push_back({"qd8_f32_qbw_gemm_4x16c4__avxvnni", FormatId::kN16K4, kNeedAvxvnni, "avxvnni", 4, 31,
               4, 16, 4, 1, 1, kAllBits, true, true, 30, {},
               "GEMM tile with 256-bit VNNI on CPUs without AVX512, unpacking in registers",
               TAK_X86(qd8_f32_qbw_gemm_4x16c4__avxvnni), TAK_X86(quantize_activations__avx2)});
  r.push_back({"qd8_f32_qbw_gemm_4x16c4_shared__avxvnni", FormatId::kN16K4, kNeedAvxvnni, "avxvnni", 32,
               0, 4, 16, 4, 1, 1, kAllBits, true, true, 30, {},
               "GEMM with 256-bit VNNI: a column step's weights unpacked once into L1, read by every "
               "4-row tile",
               TAK_X86(qd8_f32_qbw_gemm_4x16c4_shared__avxvnni), TAK_X86(quantize_activations__avx2), 4, 4});
  // The AVX-VNNI loops in EVEX form on AVX512-VNNI CPUs: below the 512-bit
  // rows by default (docs/benchmarks.md compares them on a Zen 4 core).
  r.push_back({"qd8_f32_qbw_gemv_1x32c4__avx512vnni", FormatId::kN16K4, kNeedAvx512vnni, "avx512vnni",
               1, 3, 1, 32, 4, 1, 2, kAllBits, true, true, 33, {},
               "the AVX-VNNI GEMV (256-bit vpdpbusd) in EVEX form, for AVX512-VNNI CPUs",
               TAK_X86(qd8_f32_qbw_gemv_1x32c4__avx512vnni), TAK_X86(quantize_activations__avx2)});
  r.push_back({"qd8_f32_qbw_gemv_1x32c4_prefetch__avx512vnni", FormatId::kN16K4, kNeedAvx512vnni,
               "avx512vnni", 1, 3, 1, 32, 4, 1, 2, kAllBits, true, true, 34, {},
               "the prefetching AVX-VNNI GEMV in EVEX form, for AVX512-VNNI CPUs",
               TAK_X86(qd8_f32_qbw_gemv_1x32c4_prefetch__avx512vnni), TAK_X86(quantize_activations__avx2)});
  r.push_back({"qd8_f32_qbw_gemm_4x16c4__avx512vnni", FormatId::kN16K4, kNeedAvx512vnni, "avx512vnni",
               4, 31, 4, 16, 4, 1, 1, kAllBits, true, true, 33, {},
               "the AVX-VNNI in-register GEMM tile in EVEX form, for AVX512-VNNI CPUs",
               TAK_X86(qd8_f32_qbw_gemm_4x16c4__avx512vnni), TAK_X86(quantize_activations__avx2)});
  r.push_back({"qd8_f32_qbw_gemm_4x16c4_shared__avx512vnni", FormatId::kN16K4, kNeedAvx512vnni,
               "avx512vnni", 32, 0, 4, 16, 4, 1, 1, kAllBits, true, true, 33, {},
               "the AVX-VNNI shared-unpack GEMM in EVEX form, for AVX512-VNNI CPUs",
               TAK_X86(qd8_f32_qbw_gemm_4x16c4_shared__avx512vnni), TAK_X86(quantize_activations__avx2), 4,
               4});
  // AVX512-VNNI: vpdpbusd on zmm, weights as the unsigned operand.
  // m = 2-3 go to the 4-row tile: its zero-padded panel reads the weights
  // once for all rows, where the GEMV streams them once per row (measured on
  // 4096x4096 4-bit: m = 2 441 vs 518 us, m = 3 454 vs 687 us; for weights
  // resident in L2, e.g. 1536x576, the GEMV stays ~10% faster at m = 2). The
  // 256-bit tiles run rows past a full tile one by one, so their GEMVs keep
  // m = 2-3.
  r.push_back({"qd8_f32_qbw_gemv_1x64c4__avx512vnni", FormatId::kN16K4, kNeedAvx512vnni,
               "avx512vnni", 1, 1, 1, 64, 4, 1, 4, kAllBits, true, true, 40, {},
               "GEMV: four 16-row blocks stream at once to keep loads in flight; the weights left to the "
               "hardware prefetchers (faster when they are in cache)",
               TAK_X86(qd8_f32_qbw_gemv_1x64c4__avx512vnni), TAK_X86(quantize_activations__avx512)});
  r.push_back({"qd8_f32_qbw_gemv_1x64c4_prefetch__avx512vnni", FormatId::kN16K4, kNeedAvx512vnni,
               "avx512vnni", 1, 1, 1, 64, 4, 1, 4, kAllBits, true, true, 35, {},
               "the 512-bit GEMV prefetching the next column step into L2 as the 256-bit _prefetch rows: "
               "short layers from DRAM 1.3-1.4x faster on a Zen 4 core, 25% slower in cache, SmolLM2 "
               "decode unchanged (four streams already keep enough loads in flight): not preferred",
               TAK_X86(qd8_f32_qbw_gemv_1x64c4_prefetch__avx512vnni), TAK_X86(quantize_activations__avx512)});
  r.push_back({"qd8_f32_qbw_gemm_4x32c4__avx512vnni", FormatId::kN16K4, kNeedAvx512vnni,
               "avx512vnni", 2, 7, 4, 32, 4, 1, 2, kAllBits, true, true, 40, {},
               "GEMM tile for m = 2..7: 4 rows x 32 columns, each unpacked weight vector feeds 4 dots "
               "(m = 2-3: zero-padded rows, still one pass over the weights)",
               TAK_X86(qd8_f32_qbw_gemm_4x32c4__avx512vnni), TAK_X86(quantize_activations__avx512), 4, 4,
               TAK_X86(quantize_activation_panels__avx512)});
  r.push_back({"qd8_f32_qbw_gemm_8x32c4__avx512vnni", FormatId::kN16K4, kNeedAvx512vnni,
               "avx512vnni", 8, 0, 8, 32, 4, 1, 2, kAllBits, true, true, 40, {},
               "GEMM tile for m >= 8: 8 rows share each unpacked weight vector; with more than 8 rows "
               "the weights are unpacked once per column step into L1 k-chunks that every m-tile reads",
               TAK_X86(qd8_f32_qbw_gemm_8x32c4__avx512vnni), TAK_X86(quantize_activations__avx512), 8, 4,
               TAK_X86(quantize_activation_panels__avx512)});
  // ARM preferences by core class. In-order little cores (Cortex-A53/A55/A510)
  // cannot overlap one row's weight unpacking with another row's loads, so for
  // m = 2-3 a row tile that unpacks each weight vector once for 4 rows wins
  // there (+15), while out-of-order big cores hide the re-unpacking of the
  // GEMV kernel per row and keep its lower register pressure. Every row tile
  // gets the same little-core bonus, so it only decides tile versus GEMV.
  // NEON without dot product: one kernel for every m. A 2-row tile needs 16
  // pair-sum accumulators and spills: it executed 0.81 instructions per MAC
  // against the GEMV's 0.53 (docs/results/arm_instruction_counts.md).
  r.push_back({"qd8_f32_qbw_gemv_1x16c4__neon", FormatId::kN16K4, kNeedNeon, "neon", 1, 0, 1, 16,
               4, 1, 1, kAllBits, true, true, 20, {},
               "GEMV (and row-by-row GEMM) on armv8.0 cores without dot product (SMULL + SADALP)",
               TAK_ARM(qd8_f32_qbw_gemv_1x16c4__neon), TAK_ARM(quantize_activations__neon)});
  r.push_back({"qd8_f32_qbw_gemv_1x16c4__dotprod", FormatId::kN16K4, kNeedDotprod, "dotprod", 1, 3,
               1, 16, 4, 1, 1, kAllBits, true, true, 30, {},
               "GEMV with SDOT by element: one activation load per 4 k-steps, one 16-row block per "
               "step (fewer instructions per MAC than two blocks per step, measured under qemu)",
               TAK_ARM(qd8_f32_qbw_gemv_1x16c4__dotprod), TAK_ARM(quantize_activations__neon)});
  r.push_back({"qd8_f32_qbw_gemm_4x16c4__dotprod", FormatId::kN16K4, kNeedDotprod, "dotprod", 2, 0,
               4, 16, 4, 1, 1, kAllBits, true, true, 30, {{UarchClass::kArmLittle, 15}},
               "GEMM tile with SDOT: each unpacked weight register feeds 4 rows",
               TAK_ARM(qd8_f32_qbw_gemm_4x16c4__dotprod), TAK_ARM(quantize_activations__neon)});
  r.push_back({"qd8_f32_qbw_gemm_4x16c4__i8mm", FormatId::kN16K4, kNeedI8mm, "i8mm", 4, 0, 4, 16, 4,
               1, 1, kAllBits, true, true, 40, {{UarchClass::kArmLittle, 15}},
               "GEMM tile with USDOT (unsigned weights as stored); the SMMLA tiles below execute "
               "fewer instructions for every bit width and group size measured, so it only runs "
               "when forced: the dot-product cross-check of the i8mm path",
               TAK_ARM(qd8_f32_qbw_gemm_4x16c4__i8mm), TAK_ARM(quantize_activations__neon)});
  // SMMLA: 32 MACs per instruction (SDOT/USDOT: 16), on 2x2 blocks of
  // (activation row pair) x (weight row pair); the weight pairs cost one ZIP
  // per register on top of the unpacking, so the tile shape decides how many
  // SMMLAs share it. 4 rows x 8 columns for m = 2..7 (8 integer + 8 float
  // accumulators), 8 rows x 4 columns for m >= 8 (each weight register feeds
  // 4 SMMLAs, activations come as one 64-byte load).
  r.push_back({"qd8_f32_qbw_gemm_4x8c8__i8mm", FormatId::kN16K4, kNeedI8mm, "i8mm", 2, 7, 4, 8, 8,
               1, 1, kAllBits, true, true, 50, {{UarchClass::kArmLittle, 15}},
               "GEMM tile with SMMLA for m = 2..7: two activation row pairs x four weight row pairs",
               TAK_ARM(qd8_f32_qbw_gemm_4x8c8__i8mm), TAK_ARM(quantize_activations__neon), 4, 8});
  r.push_back({"qd8_f32_qbw_gemm_8x4c8__i8mm", FormatId::kN16K4, kNeedI8mm, "i8mm", 8, 0, 8, 4, 8,
               1, 1, kAllBits, true, true, 50, {{UarchClass::kArmLittle, 15}},
               "GEMM tile with SMMLA for m >= 8: four activation row pairs x two weight row pairs",
               TAK_ARM(qd8_f32_qbw_gemm_8x4c8__i8mm), TAK_ARM(quantize_activations__neon), 8, 8});
  // Embedding lookups: dequantize rows of any packed buffer (the tied output
  // head's n16k4 weights, the portable n1k4 layout, or a weights-only table
  // with per-call scales). Memory-bound: the SIMD rows unpack a 32-value
  // superblock per plane with one load (n1k4) or one gather (n16k4, whose row
  // is 4 bytes of every 64-byte unit) and convert 8 values per instruction.
  r.push_back(embedding_row("qbw_f32_embedding_1x1c4__scalar", FormatId::kN1K4, 0, "scalar", 1, 0,
                            "ground truth for lookups in n1k4 buffers (and weights-only tables)",
                            qbw_f32_embedding_1xNRc4__scalar));
  r.push_back(embedding_row("qbw_f32_embedding_1x16c4__scalar", FormatId::kN16K4, 0, "scalar", 16,
                            0, "ground truth for lookups in n16k4 buffers (tied output heads)",
                            qbw_f32_embedding_1xNRc4__scalar));
  r.push_back(embedding_row("qbw_f32_embedding_1x1c4__avx2", FormatId::kN1K4, kNeedAvx2, "avx2", 1,
                            20, "lookups in n1k4 buffers: contiguous rows, one load + vpermd per plane",
                            TAK_X86(qbw_f32_embedding_1xNRc4__avx2)));
  r.push_back(embedding_row("qbw_f32_embedding_1x16c4__avx2", FormatId::kN16K4, kNeedAvx2, "avx2",
                            16, 20, "lookups in n16k4 buffers: one vpgatherdd per plane and superblock",
                            TAK_X86(qbw_f32_embedding_1xNRc4__avx2)));
  // AVX-512: 16 values per instruction; weights of up to 4 bits through a
  // 16-entry value table per scale group (one vpermps per 16 values).
  r.push_back(embedding_row("qbw_f32_embedding_1x1c4__avx512", FormatId::kN1K4, kNeedAvx512, "avx512",
                            1, 30, "lookups in n1k4 buffers: 16 values per store, value tables for <= 4 bits",
                            TAK_X86(qbw_f32_embedding_1xNRc4__avx512)));
  r.push_back(embedding_row("qbw_f32_embedding_1x16c4__avx512", FormatId::kN16K4, kNeedAvx512,
                            "avx512", 16, 30, "lookups in n16k4 buffers: 16 values per store, value tables for <= 4 bits",
                            TAK_X86(qbw_f32_embedding_1xNRc4__avx512)));
  r.push_back(embedding_row("qbw_f32_embedding_1x1c4__neon", FormatId::kN1K4, kNeedNeon, "neon", 1,
                            20, "lookups in n1k4 buffers on ARM: per-lane USHL unpacking, 4 values per convert",
                            TAK_ARM(qbw_f32_embedding_1xNRc4__neon)));
  r.push_back(embedding_row("qbw_f32_embedding_1x16c4__neon", FormatId::kN16K4, kNeedNeon, "neon",
                            16, 20, "lookups in n16k4 buffers on ARM (tied output heads)",
                            TAK_ARM(qbw_f32_embedding_1xNRc4__neon)));
  return r;
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
  return QuantizedActivations::bytes_needed(m, w.k, w.group_size, kernel.lhs_panel_rows);
}

QuantizedActivations carve_activations(const KernelInfo& kernel, void* scratch, int m,
                                       const PackedLayout& w) {
  QuantizedActivations a = QuantizedActivations::carve(scratch, m, w.k, w.group_size,
                                                       kernel.lhs_panel_rows, kernel.lhs_panel_kr);
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
      {"avx2_pairsum", "avx2", kNeedAvx2, "vpmaddubsw + vpaddw (int16 pair sums), 256-bit",
       TAK_X86(int8_peak_gops__avx2_pairsum)},
      {"avx2_madd", "avx2", kNeedAvx2, "vpmaddubsw + vpmaddwd + vpaddd, 256-bit",
       TAK_X86(int8_peak_gops__avx2_madd)},
      {"avxvnni", "avxvnni", kNeedAvxvnni, "vpdpbusd, 256-bit", TAK_X86(int8_peak_gops__avxvnni)},
      {"avx512vnni", "avx512vnni", kNeedAvx512vnni, "vpdpbusd, 512-bit", TAK_X86(int8_peak_gops__avx512vnni)},
  };
  return probes;
}

const KernelInfo* find_kernel(const char* name) {
  for (const auto& k : kernel_registry())
    if (std::strcmp(k.name, name) == 0) return &k;
  return nullptr;
}

}  // namespace torchao_kernels
