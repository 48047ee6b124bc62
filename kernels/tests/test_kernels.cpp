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

}  // namespace
}  // namespace torchao_kernels
