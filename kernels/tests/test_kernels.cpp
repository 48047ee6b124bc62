// Every registered kernel this CPU can run, against the reference kernel of
// its format, by exact equality (results are bit-exact by design), on cases
// derived from each registry row's parameters: its tiles and their partial
// forms, column steps and their tails, superblock structures, unpack passes
// and chunks, the op's thread splits; bit widths, zero points, bias and
// bfloat16 scales rotate over them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "kernels/generated/kernel_functions.h"
#include "kernels/select/cpu_descriptor.h"
#include "kernels/tests/test_util.h"

namespace torchao_kernels {
namespace {

// ---- Cases derived from each row's declared parameters --------------------
// As XNNPACK derives its cases from mr / nr / kr: the shapes that reach each
// code path of a row, from its mr, nr, format block, panel rows, declared m
// range, op and variant. test/test_kernels.py (derive_cases) derives the same
// cases; keep the two in step.

// Constants of the x86 shared-unpack GEMMs (ymm_gemm_impl.h and
// avx512vnni/qd8_f32_qbw_gemm_avx512vnni.cpp): a pass covers up to kPassRows
// rows, k is unpacked in 12 KiB chunks (k = 1024 with groups of 64 makes 2-3
// of them on every path), and groups over kMaxChunkGroup are unpacked chunk
// by chunk with int32 sums carried across chunks (256-bit tiles) or run the
// in-register tiles (512-bit tiles).
// Declared once in kernels/manifest.toml ([shared_unpack]).
constexpr int kPassRows = kSharedUnpackPassRows;
constexpr int kPassRows256 = kSharedUnpackPassRows256;  // the 256-bit tiles' passes
constexpr int kMaxChunkGroup = kSharedUnpackMaxGroupSize;
constexpr int kOpStepsPerThread = 4;  // the op splits rows below this many steps per thread

struct Case {
  std::string kernel;
  int m, n, k, g, threads, bits;
  bool zeros, bias, bf16;
};

// (k, group_size) by superblock structure (kb = 32 if group_size % 32 == 0
// else 16): kb 32 / kb 16, one and several superblocks, per-channel groups.
constexpr int kDepths[][2] = {{64, 32}, {48, 16}, {192, 48}, {160, 80}, {256, 128}, {96, 96}, {80, 80}};
// Several chunks, the largest group one chunk holds, a group past it, and
// two such groups per row of kb 16 (49 superblocks each).
constexpr int kChunks[][2] = {
    {1024, 64}, {1024, kMaxChunkGroup}, {1024, 2 * kMaxChunkGroup}, {1568, 784}};
constexpr int kRowsKg[][2] = {{64, 32}, {96, 16}, {128, 64}};
// Weight variants rotate over a row's cases: bits with period 8, (zeros,
// bias) with period 4 shifted once per bits cycle, bfloat16 scales every
// third case.
constexpr int kBitsOrder[] = {4, 1, 8, 3, 2, 5, 7, 6};

std::vector<Case> derive_cases(const KernelInfo& ki) {
  const std::string name = ki.name;
  const int mr = ki.mr, nr = ki.nr, step = std::max(1, ki.block_step);
  const int block = nr / step;  // format rows per block
  const int panel = ki.lhs_panel_rows;
  const bool gemv = name.find("_gemv_") != std::string::npos;
  // The _shared rows and the panel tiles (whose run takes the same unpacked
  // passes once m > mr) share unpacked weights across m-tiles.
  const bool shared = name.find("_shared__") != std::string::npos || panel > 0;

  // Tails of 1, 2 and mr - 1 rows (the int16-panel 4x16 tile has a loop per
  // tail length).
  std::set<int> ms = {1, mr - 1, mr, mr + 1, mr + 2, 2 * mr + 1, ki.m_min};
  if (panel) ms.insert({panel - 1, panel, panel + 1, 2 * panel + 1});
  if (ki.m_max) {
    ms.insert(ki.m_max);
  } else if (gemv) {
    ms.insert(5);
  }
  if (gemv) ms.insert({2, 3});
  ms.erase(0);
  ms.erase(-1);
  const int m_rep = mr == 1 ? 1 : (shared ? 2 * mr + 1 : mr + 1);
  std::set<int> ns;
  int n_rep;
  if (block == 1) {
    ns = {1, 7, 37};
    n_rep = 37;
  } else {
    ns = {1, block / 2 + 1, nr, nr + block, 2 * nr - 1};
    if (step > 2) ns.insert(nr + 2 * block + 5);
    n_rep = nr + block - 1;
  }
  struct Shape {
    int m, n, k, g, threads, variants;
  };
  std::vector<Shape> shapes;
  int i = 0;
  for (int m : ms) shapes.push_back({m, n_rep, kRowsKg[i % 3][0], kRowsKg[i % 3][1], 1, 1}), ++i;
  i = 0;
  for (int n : ns) shapes.push_back({m_rep, n, kRowsKg[i % 3][0], kRowsKg[i % 3][1], 1, 1}), ++i;
  for (const auto& d : kDepths) shapes.push_back({m_rep, n_rep, d[0], d[1], 1, 2});
  for (const auto& c : kChunks) shapes.push_back({m_rep, n_rep, c[0], c[1], 1, 1});
  if (shared) {
    for (int rows : {kPassRows, kPassRows256}) {
      if (rows == kPassRows256 && kPassRows256 == kPassRows) break;
      shapes.push_back({rows, nr + block, 256, 64, 1, 1});
      shapes.push_back({rows + 1, nr + block, 192, 48, 1, 1});
      shapes.push_back({2 * rows + 1, nr + block, 1024, 64, 1, 1});
      shapes.push_back({rows + 1, nr + block, 1536, 768, 1, 1});  // long groups over two passes
    }
  }
  const int m_split = mr == 1 ? 3 : (shared ? kPassRows + 1 : 4 * mr + 3);
  shapes.push_back({m_split, n_rep, 128, 32, 2, 1});
  shapes.push_back({m_rep, 2 * kOpStepsPerThread * nr + block + 3, 128, 32, 2, 1});

  std::vector<Case> out;
  std::set<std::string> seen;
  int c = 0;
  for (const Shape& s : shapes) {
    for (int v = 0; v < s.variants; ++v, ++c) {
      int bits = kBitsOrder[c % 8];
      for (int j = 1; !(ki.bits_mask & (1u << (bits - 1))); ++j) bits = kBitsOrder[(c + j) % 8];
      const int zb = (c + c / 8) % 4;
      Case cs{name, s.m, s.n, s.k, s.g, s.threads, bits, (zb & 1) && ki.zeros, (zb & 2) && ki.bias, c % 3 == 1};
      std::string key = std::to_string(cs.m) + "," + std::to_string(cs.n) + "," + std::to_string(cs.k) + "," +
                        std::to_string(cs.g) + "," + std::to_string(cs.threads) + "," + std::to_string(bits) +
                        (cs.zeros ? "z" : "") + (cs.bias ? "b" : "") + (cs.bf16 ? "h" : "");
      if (seen.insert(key).second) out.push_back(cs);
    }
  }
  return out;
}

std::string case_name(const Case& c) {
  return c.kernel + "_m" + std::to_string(c.m) + "_n" + std::to_string(c.n) + "_k" + std::to_string(c.k) + "_g" +
         std::to_string(c.g) + "_b" + std::to_string(c.bits) + (c.zeros ? "_z" : "") + (c.bias ? "_bias" : "") +
         (c.bf16 ? "_bf16" : "") + (c.threads > 1 ? "_t" + std::to_string(c.threads) : "");
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const auto& k : kernel_registry())
    if (k.op == KernelOp::kLinear)
      for (auto& c : derive_cases(k)) cases.push_back(std::move(c));
  return cases;
}

class KernelVsReference : public ::testing::TestWithParam<Case> {};

TEST_P(KernelVsReference, BitExact) {
  const Case& c = GetParam();
  const KernelInfo* k = find_kernel(c.kernel.c_str());
  ASSERT_NE(k, nullptr);
  if (!k->fn) GTEST_SKIP() << "not compiled into this build";
  const uint64_t missing = k->required_isa & ~detected_cpu().isa;
  if (missing) GTEST_SKIP() << "this CPU lacks " << isa_names(missing)[0];
  // A reference row is compared with the reference of the other format.
  const KernelInfo* ref = &testing::reference_for(k->format);
  if (ref == k) ref = &testing::reference_for(k->format == FormatId::kN16K4 ? FormatId::kN1K4 : FormatId::kN16K4);
  const std::string id = case_name(c);
  uint32_t seed = 2166136261u;  // FNV-1a of the case name: the same on every build
  for (char ch : id) seed = (seed ^ static_cast<uint8_t>(ch)) * 16777619u;
  testing::Problem p(c.bits, c.n, c.k, c.g, c.zeros, c.bias, seed);
  // bfloat16 scale storage: the reference reads float32 storage of the same
  // values (scales and zero points then sit elsewhere in the buffer).
  if (c.bf16) p.round_scales_to_bf16();
  const auto packed = p.pack(k->format, c.bf16 ? ScaleType::kBFloat16 : ScaleType::kFloat32);
  const auto ref_packed = p.pack(ref->format);
  const auto x = testing::activations(c.m, c.k, seed * 7);
  const auto want = testing::run_kernel(*ref, ref_packed, x, c.m);
  const auto got = c.threads > 1 ? testing::run_kernel_split(*k, packed, x, c.m, c.threads)
                                 : testing::run_kernel(*k, packed, x, c.m);
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (std::memcmp(&want[i], &got[i], 4) != 0 && bad++ == 0) first = i;
  ASSERT_EQ(bad, 0u) << id << " vs " << ref->name << ": " << bad << " of " << want.size()
                     << " outputs differ, first at row " << first / c.n << " col " << first % c.n << ": "
                     << got[first] << " != " << want[first];
}

INSTANTIATE_TEST_SUITE_P(Registry, KernelVsReference, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return case_name(i.param); });

// The derivation itself: every row's cases reach what its parameters promise.
TEST(DerivedCases, ReachParameterPaths) {
  for (const auto& k : kernel_registry()) {
    if (k.op != KernelOp::kLinear) continue;
    const auto cases = derive_cases(k);
    bool mr = false, mr1 = false, kb16 = false, kb16_multi = false, kb32 = false, per_channel = false;
    bool big_group = false, split = false, bf16_bias = false, zeros = false, pass2 = false;
    for (const auto& c : cases) {
      mr |= c.m == k.mr;
      mr1 |= c.m == k.mr + 1;
      kb16 |= c.g % 32 != 0;
      kb32 |= c.g % 32 == 0;
      kb16_multi |= c.g % 32 != 0 && c.g / 16 > 1 && c.k / c.g > 1;
      per_channel |= c.k == c.g;
      big_group |= c.g > kMaxChunkGroup;
      split |= c.threads > 1;
      bf16_bias |= c.bf16 && c.bias;
      zeros |= c.zeros;
      pass2 |= c.m > kPassRows;
    }
    EXPECT_TRUE(mr && mr1 && kb16 && kb16_multi && kb32 && per_channel && big_group && split) << k.name;
    EXPECT_TRUE(bf16_bias || !k.bias) << k.name;
    EXPECT_TRUE(zeros || !k.zeros) << k.name;
    const bool shared = std::string(k.name).find("_shared__") != std::string::npos || k.lhs_panel_rows > 0;
    EXPECT_TRUE(pass2 || !shared) << k.name;
  }
}

// Every activation quantizer a runnable kernel pairs with gives the scalar
// quantizer's bytes.
TEST(ActivationQuantizers, MatchScalar) {
  const int m = 5, k = 256, g = 32;
  auto x = testing::activations(m, k, 3);
  x[k + 7] = 1e30f;  // a row with a huge value
  for (int i = 0; i < k; ++i) x[2 * k + i] = 0.0f;  // an all-zero row
  std::vector<uint8_t> b0(QuantizedActivations::bytes_needed(m, k, g)), b1(b0.size());
  auto want = QuantizedActivations::carve(b0.data(), m, k, g);
  quantize_activations_scalar(x.data(), k, 0, m, want);
  for (const auto& kern : kernel_registry()) {
    if (!kern.fn || (kern.required_isa & ~detected_cpu().isa)) continue;
    auto got = QuantizedActivations::carve(b1.data(), m, k, g);
    kern.quantize(x.data(), k, 0, m, got);
    for (int r = 0; r < m; ++r) {
      ASSERT_EQ(0, std::memcmp(want.q + r * want.row_stride, got.q + r * got.row_stride, k)) << kern.name;
      ASSERT_EQ(0, std::memcmp(want.group_sums + r * (k / g), got.group_sums + r * (k / g), 4 * (k / g)));
      ASSERT_EQ(0, std::memcmp(&want.scale[r], &got.scale[r], 4)) << kern.name << " row " << r;
      ASSERT_EQ(want.zero[r], got.zero[r]);
    }
  }
}

// Every embedding-lookup row this CPU can run gives the dequantized rows,
// scale * (w - zero), bit for bit (the reference row's results too), for
// every bit width, zero points, scale storage, partial 16-row blocks and
// 16-value superblocks; weights-only tables with per-call scales as well.
TEST(EmbeddingLookups, EqualDequantizedRows) {
  struct Shape {
    int n, k, g;
  };
  const Shape shapes[] = {{17, 48, 16}, {37, 64, 32}, {33, 256, 64}, {20, 96, 48}, {5, 80, 80}};
  int tested = 0;
  uint32_t seed = 11;
  for (const auto& kern : kernel_registry()) {
    if (kern.op != KernelOp::kEmbedding || !kern.embed || (kern.required_isa & ~detected_cpu().isa))
      continue;
    ++tested;
    for (int bits = 1; bits <= 8; ++bits) {
      for (int zb = 0; zb < 4; ++zb) {
        const bool zeros = zb & 1, bf16 = zb & 2;
        for (const Shape& s : shapes) {
          testing::Problem p(bits, s.n, s.k, s.g, zeros, false, ++seed);
          if (bf16) p.round_scales_to_bf16();
          const auto packed = p.pack(kern.format, bf16 ? ScaleType::kBFloat16 : ScaleType::kFloat32);
          const PackedView v = parse_packed(packed.data(), packed.size());
          std::vector<int64_t> rows;
          for (int r = s.n - 1; r >= 0; r -= 3) rows.push_back(r);
          rows.push_back(0);
          std::vector<float> got(rows.size() * s.k, -1.0f);
          EmbeddingArgs a{&v.layout, v.body, nullptr, nullptr, 0, rows.data(),
                          static_cast<int64_t>(rows.size()), got.data(), s.k};
          kern.embed(a);
          // weights-only table of the same values, scales per call (n1k4 rows only)
          std::vector<uint8_t> table;
          std::vector<float> got_table(got.size(), -1.0f);
          if (kern.format == FormatId::kN1K4) {
            table.resize(qvals_only_size(bits, s.n, s.k));
            pack_qvals_only(bits, s.n, s.k, p.q.data(), table.data());
            const PackedView t = parse_packed(table.data(), table.size());
            EmbeddingArgs b{&t.layout, t.body, p.scales.data(), zeros ? p.z.data() : nullptr, s.g,
                            rows.data(), static_cast<int64_t>(rows.size()), got_table.data(), s.k};
            kern.embed(b);
          }
          const int groups = s.k / s.g;
          for (size_t i = 0; i < rows.size(); ++i) {
            for (int c = 0; c < s.k; ++c) {
              const int64_t r = rows[i];
              const int g = c / s.g;
              const int z = zeros ? p.z[r * groups + g] : 0;
              const float want = p.scales[r * groups + g] * static_cast<float>(p.q[r * s.k + c] - z);
              ASSERT_EQ(0, std::memcmp(&want, &got[i * s.k + c], 4))
                  << kern.name << " bits=" << bits << " zeros=" << zeros << " bf16=" << bf16
                  << " n=" << s.n << " k=" << s.k << " g=" << s.g << " row " << r << " col " << c;
              if (!table.empty()) {
                ASSERT_EQ(0, std::memcmp(&want, &got_table[i * s.k + c], 4))
                    << kern.name << " (weights-only table) bits=" << bits << " row " << r;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GE(tested, 2);  // the two reference rows at least
}

// Weights-only tables whose zero points are all 0 on some rows (torchao
// passes such for symmetric weights; the SIMD rows convert those rows without
// them) next to rows that have nonzero ones, including rows whose only
// nonzero zero point is the first or the last group.
TEST(EmbeddingLookups, WeightsOnlyTablesMixRowsWithAndWithoutZeroPoints) {
  const int n = 24, k = 160, g = 32, groups = k / g;
  uint32_t seed = 301;
  int tested = 0;
  for (const auto& kern : kernel_registry()) {
    if (kern.op != KernelOp::kEmbedding || !kern.embed || kern.format != FormatId::kN1K4 ||
        (kern.required_isa & ~detected_cpu().isa))
      continue;
    ++tested;
    for (int bits : {1, 2, 3, 4, 8}) {
      testing::Problem p(bits, n, k, g, /*zeros=*/true, false, ++seed);
      std::vector<int8_t> z = p.z;
      for (int r = 0; r < n; ++r) {
        if (r % 6 == 1 || r % 6 == 3 || r % 2 == 0)
          for (int j = 0; j < groups; ++j) z[r * groups + j] = 0;
        if (r % 6 == 1) z[r * groups] = 5;
        if (r % 6 == 3) z[r * groups + groups - 1] = -7;
      }
      std::vector<uint8_t> table(qvals_only_size(bits, n, k));
      pack_qvals_only(bits, n, k, p.q.data(), table.data());
      const PackedView t = parse_packed(table.data(), table.size());
      std::vector<int64_t> rows;
      for (int r = 0; r < n; ++r) rows.push_back(r);
      for (int r = n - 1; r >= 0; r -= 5) rows.push_back(r);
      std::vector<float> got(rows.size() * k, -1.0f);
      EmbeddingArgs b{&t.layout, t.body, p.scales.data(), z.data(), g, rows.data(),
                      static_cast<int64_t>(rows.size()), got.data(), k};
      kern.embed(b);
      for (size_t i = 0; i < rows.size(); ++i) {
        for (int c = 0; c < k; ++c) {
          const int64_t r = rows[i];
          const float want = p.scales[r * groups + c / g] * static_cast<float>(p.q[r * k + c] - z[r * groups + c / g]);
          ASSERT_EQ(0, std::memcmp(&want, &got[i * k + c], 4))
              << kern.name << " bits=" << bits << " row " << r << " col " << c;
        }
      }
    }
  }
  EXPECT_GE(tested, 1);  // the reference row at least
}

// The same where the buffer is not 4-byte aligned (an int8 tensor view may
// start anywhere), the output rows are strided, and a weights-only table's
// scale groups (16 values) are half of its 32-value superblocks.
TEST(EmbeddingLookups, UnalignedBuffersStridedOutputSmallTableGroups) {
  const int n = 37, k = 64, out_stride = k + 5;
  uint32_t seed = 101;
  for (const auto& kern : kernel_registry()) {
    if (kern.op != KernelOp::kEmbedding || !kern.embed || (kern.required_isa & ~detected_cpu().isa))
      continue;
    for (int bits : {2, 4, 5, 8}) {
      for (int g : {16, 32}) {
        testing::Problem p(bits, n, k, g, /*zeros=*/true, false, ++seed);
        const auto packed = p.pack(kern.format, ScaleType::kFloat32);
        std::vector<uint8_t> shifted(packed.size() + 1);
        std::memcpy(shifted.data() + 1, packed.data(), packed.size());
        const PackedView v = parse_packed(shifted.data() + 1, packed.size());
        const std::vector<int64_t> rows = {36, 0, 17, 5, 35};
        std::vector<float> got(rows.size() * out_stride, -1.0f);
        EmbeddingArgs a{&v.layout, v.body, nullptr, nullptr, 0, rows.data(),
                        static_cast<int64_t>(rows.size()), got.data(), out_stride};
        kern.embed(a);
        std::vector<uint8_t> table, shifted_table;
        std::vector<float> got_table(got.size(), -1.0f);
        if (kern.format == FormatId::kN1K4) {  // weights-only table, scales per call
          table.resize(qvals_only_size(bits, n, k));
          pack_qvals_only(bits, n, k, p.q.data(), table.data());
          shifted_table.resize(table.size() + 3);
          std::memcpy(shifted_table.data() + 3, table.data(), table.size());
          const PackedView t = parse_packed(shifted_table.data() + 3, table.size());
          EmbeddingArgs b{&t.layout, t.body, p.scales.data(), p.z.data(), g, rows.data(),
                          static_cast<int64_t>(rows.size()), got_table.data(), out_stride};
          kern.embed(b);
        }
        const int groups = k / g;
        for (size_t i = 0; i < rows.size(); ++i) {
          for (int c = 0; c < out_stride; ++c) {
            const int64_t r = rows[i];
            float want = -1.0f;  // the gap between strided rows stays untouched
            if (c < k) want = p.scales[r * groups + c / g] * static_cast<float>(p.q[r * k + c] - p.z[r * groups + c / g]);
            ASSERT_EQ(0, std::memcmp(&want, &got[i * out_stride + c], 4))
                << kern.name << " bits=" << bits << " g=" << g << " row " << r << " col " << c;
            if (!table.empty()) {
              ASSERT_EQ(0, std::memcmp(&want, &got_table[i * out_stride + c], 4))
                  << kern.name << " (weights-only table) bits=" << bits << " g=" << g << " row " << r << " col " << c;
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace torchao_kernels
