// Every registered kernel this CPU can run, against the reference kernel of
// its format, by exact equality (results are bit-exact by design), over bit
// widths 1..8, zero points and bias, group sizes, odd n and many m. The cases
// are generated from the registry.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "kernels/select/cpu_descriptor.h"
#include "kernels/tests/test_util.h"

namespace torchao_kernels {
namespace {

std::vector<std::string> kernel_names() {
  std::vector<std::string> names;
  for (const auto& k : kernel_registry())
    if (k.op == KernelOp::kLinear) names.push_back(k.name);
  return names;
}

class KernelVsReference : public ::testing::TestWithParam<std::string> {};

TEST_P(KernelVsReference, BitExact) {
  const KernelInfo* k = find_kernel(GetParam().c_str());
  ASSERT_NE(k, nullptr);
  if (!k->fn) GTEST_SKIP() << "not compiled into this build";
  const uint64_t missing = k->required_isa & ~detected_cpu().isa;
  if (missing) GTEST_SKIP() << "this CPU lacks " << isa_names(missing)[0];
  const KernelInfo& ref = testing::reference_for(k->format);
  struct Shape {
    int m, n, k, g;
  };
  const Shape shapes[] = {{1, 37, 128, 32}, {2, 16, 64, 16}, {3, 70, 192, 64}, {4, 33, 256, 128},
                          {5, 17, 96, 32},  {8, 48, 128, 128}, {9, 1, 64, 64}, {13, 31, 160, 16},
                          {33, 66, 128, 32}};
  uint32_t seed = 1;
  for (int bits = 1; bits <= 8; ++bits) {
    // zb: bit 0 zero points, bit 1 bias, bit 2 bfloat16 scale storage
    // (then the reference runs on float32 storage of the same values).
    for (int zb = 0; zb < 6; ++zb) {
      const bool bf16 = zb & 4;
      for (const Shape& s : shapes) {
        if (s.k % s.g) continue;
        ++seed;
        testing::Problem p(bits, s.n, s.k, s.g, zb & 1, zb & 2, seed);
        if (bf16) p.round_scales_to_bf16();
        const auto packed = p.pack(k->format, bf16 ? ScaleType::kBFloat16 : ScaleType::kFloat32);
        const auto x = testing::activations(s.m, s.k, seed * 7);
        const auto want = testing::run_kernel(ref, bf16 ? p.pack(k->format) : packed, x, s.m);
        const auto got = testing::run_kernel(*k, packed, x, s.m);
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
            << k->name << " bits=" << bits << " zeros=" << (zb & 1) << " bias=" << ((zb >> 1) & 1)
            << " bf16 scales=" << bf16 << " m=" << s.m << " n=" << s.n << " k=" << s.k
            << " group=" << s.g;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Registry, KernelVsReference, ::testing::ValuesIn(kernel_names()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

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

}  // namespace
}  // namespace torchao_kernels
