// Selection on this CPU and on fake CPUs, and the proof that selection is
// what keeps unsupported instructions from running: a kernel this CPU lacks
// the ISA for traps (SIGILL) when called directly, while selection never
// picks it and forcing it through the overrides is refused with an error.
#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

#include "kernels/select/json_reader.h"
#include "kernels/select/selector.h"
#include "kernels/select/tuning_table.h"
#include "kernels/select/uarch_class.h"
#include "kernels/tests/test_util.h"

namespace torchao_kernels {
namespace {

// ISA features the OS says this process may execute, read independently of
// the library's detection (aarch64: auxv hwcaps).
uint64_t os_isa() {
#if defined(__aarch64__) && defined(__linux__)
  uint64_t isa = 0;
  const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
  if (hw & (1ul << 1)) isa |= kIsaNeon;
  if (hw & (1ul << 20)) isa |= kIsaDotprod;
  if (hw & (1ul << 22)) isa |= kIsaSve;
  if (hw2 & (1ul << 1)) isa |= kIsaSve2;
  if (hw2 & (1ul << 13)) isa |= kIsaI8mm;
  if (hw2 & (1ul << 14)) isa |= kIsaBf16;
  if (hw2 & (1ul << 23)) isa |= kIsaSme;
  return isa;
#else
  return detected_cpu().isa;
#endif
}

TEST(SelectionOnThisCpu, DetectionMatchesTheOs) {
  EXPECT_EQ(detected_cpu().isa, os_isa()) << detected_cpu().to_json();
}

TEST(SelectionOnThisCpu, PicksOnlyKernelsTheCpuSupports) {
  const uint64_t isa = os_isa();
  int count;
  const FormatInfo* fs = formats(&count);
  for (int f = 0; f < count; ++f)
    for (int bits = 1; bits <= 8; ++bits)
      for (int bucket = 0; bucket < kMBuckets; ++bucket)
        for (int zb = 0; zb < 4; ++zb) {
          const ProblemClass pc{fs[f].id, bits, bool(zb & 1), bool(zb & 2), bucket};
          const Selection s = select_kernel(detected_cpu(), Overrides{}, pc, 0);
          ASSERT_NE(s.winner, nullptr) << s.error;
          EXPECT_EQ(s.winner->required_isa & ~isa, 0u) << s.winner->name;
          EXPECT_NE(s.winner->fn, nullptr) << s.winner->name;
          EXPECT_EQ(s.winner->format, fs[f].id);
        }
}

TEST(SelectionOnThisCpu, SelectedKernelRunsBitExact) {
  testing::Problem p(4, 40, 128, 32, true, true, 11);
  const auto packed = p.pack(FormatId::kN16K4);
  for (int m : {1, 2, 5, 17}) {
    const auto x = testing::activations(m, 128, m);
    const KernelInfo& k = Selector::get().kernel(ProblemClass{FormatId::kN16K4, 4, true, true, m_bucket(m)}, 0);
    const auto want = testing::run_kernel(testing::reference_for(FormatId::kN16K4), packed, x, m);
    const auto got = testing::run_kernel(k, packed, x, m);
    EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * 4)) << k.name << " m=" << m;
  }
}

// Kernels compiled in whose ISA this CPU lacks.
std::vector<const KernelInfo*> unsupported_kernels() {
  std::vector<const KernelInfo*> v;
  for (const auto& k : kernel_registry())
    if (k.fn && (k.required_isa & ~os_isa())) v.push_back(&k);
  return v;
}

TEST(UnsupportedKernelDeathTest, TrapsWhenCalledDirectly) {
  const auto ks = unsupported_kernels();
  if (ks.empty()) GTEST_SKIP() << "this CPU supports every kernel compiled in";
  GTEST_FLAG_SET(death_test_style, "fast");
  testing::Problem p(4, 16, 64, 32, false, false, 5);
  const auto packed = p.pack(FormatId::kN16K4);
  const auto x = testing::activations(4, 64, 5);
  for (const KernelInfo* k : ks) {
    EXPECT_EXIT(testing::run_kernel(*k, packed, x, 4), ::testing::KilledBySignal(SIGILL), "")
        << k->name << " should trap on this CPU";
  }
}

TEST(UnsupportedKernel, ForcingIsRefusedWithTheMissingFeature) {
  const auto ks = unsupported_kernels();
  if (ks.empty()) GTEST_SKIP() << "this CPU supports every kernel compiled in";
  for (const KernelInfo* k : ks) {
    const ProblemClass pc{k->format, 4, false, false, m_bucket(k->m_min)};
    const Selection s = select_kernel(detected_cpu(), Overrides{"", k->name, ""}, pc, 0);
    EXPECT_EQ(s.winner, nullptr);
    EXPECT_NE(s.error.find("lacks"), std::string::npos) << s.error;
    Selector::get().set_overrides(Overrides{"", k->name, ""});
    try {
      Selector::get().kernel(pc, 0);
      ADD_FAILURE() << "forcing " << k->name << " did not raise";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("lacks"), std::string::npos) << e.what();
    }
    Selector::get().set_overrides(Overrides{});
  }
}

// The uarch-dependent policy, on fake CPUs (uarch reads as unknown under qemu).
TEST(FakeCpuPolicy, BigLittleGivesEachClusterItsKernelOnOneFormat) {
  const CpuDescriptor cpu = fake_cpu("big-little-x2-a710-a510");
  ASSERT_EQ(cpu.clusters.size(), 3u);
  const ProblemClass m2{FormatId::kN16K4, 4, false, false, m_bucket(2)};
  const ProblemClass m32{FormatId::kN16K4, 4, false, false, m_bucket(32)};
  // With i8mm every cluster takes the SMMLA tiles from m = 2 (fewest instructions).
  for (int c = 0; c < 3; ++c) {
    EXPECT_STREQ(select_kernel(cpu, Overrides{}, m2, c).winner->name, "qd8p4x8_f32_qbwn16k4_gemm_4x8_asm__i8mm");
    EXPECT_STREQ(select_kernel(cpu, Overrides{}, m32, c).winner->name, "qd8p8x8_f32_qbwn16k4_gemm_8x4_asm__i8mm");
  }
  // The same cores with dot product only: at m = 2-3 the big cores keep the
  // GEMV and the in-order little cores take the row tile, on one format.
  CpuDescriptor dot = cpu;
  dot.isa &= ~kIsaI8mm;
  const Selection big = select_kernel(dot, Overrides{}, m2, 0);
  const Selection little = select_kernel(dot, Overrides{}, m2, 2);
  ASSERT_TRUE(big.winner && little.winner);
  EXPECT_STREQ(big.winner->name, "qd8_f32_qbwn16k4_gemv_1x16__dotprod");
  EXPECT_STREQ(little.winner->name, "qd8_f32_qbwn16k4_gemm_4x16__dotprod");
  EXPECT_EQ(big.winner->format, little.winner->format);
}

TEST(FakeCpuPolicy, NeonOnlyCoresUseNeonKernels) {
  const CpuDescriptor a53 = fake_cpu("cortex-a53");
  const Selection s = select_kernel(a53, Overrides{}, ProblemClass{FormatId::kN16K4, 3, true, false, 0}, 0);
  ASSERT_NE(s.winner, nullptr);
  EXPECT_STREQ(s.winner->isa_name, "neon");
}

// End to end with a fake /proc/cpuinfo (tools/test_arm.sh bind-mounts one and
// sets TAK_EXPECT_UARCH to the cluster uarchs it describes, e.g. "cortex-a76,cortex-a55").
TEST(DetectedUarch, MatchesFakeProcCpuinfo) {
  const char* want = std::getenv("TAK_EXPECT_UARCH");
  if (!want) GTEST_SKIP() << "TAK_EXPECT_UARCH not set";
  std::string got;
  for (const auto& c : detected_cpu().clusters) got += (got.empty() ? "" : ",") + c.uarch;
  EXPECT_EQ(got, want) << detected_cpu().to_json();
  const int little = static_cast<int>(detected_cpu().clusters.size()) - 1;
  const Selection s = select_kernel(detected_cpu(), Overrides{},
                                    ProblemClass{FormatId::kN16K4, 4, false, false, m_bucket(2)}, little);
  ASSERT_NE(s.winner, nullptr);
  // braces: EXPECT_* expands to an if/else of its own (-Wdangling-else)
  if (detected_cpu().clusters[little].uarch_class == UarchClass::kArmLittle && (os_isa() & kIsaDotprod)) {
    EXPECT_STREQ(s.winner->name, "qd8_f32_qbwn16k4_gemm_4x16__dotprod");
  }
}

// x86 parts an older cpuinfo cannot name get their uarch, and so their core
// class, from CPUID family/model: the torch extension and the ExecuTorch
// library (each with its own cpuinfo) class a core the same way.
TEST(DetectedUarch, X86PartsByFamilyAndModel) {
  struct Case {
    const char* vendor;
    int family, model;
    const char* uarch;
    UarchClass klass;
  };
  const Case cases[] = {
      {"Intel", 6, 0xCF, "raptor-cove", UarchClass::kX86Big},   // Emerald Rapids
      {"Intel", 6, 0x8F, "golden-cove", UarchClass::kX86Big},   // Sapphire Rapids
      {"Intel", 6, 0x55, "sky-lake", UarchClass::kX86Big},      // Skylake-SP / Cascade Lake
      {"Intel", 6, 0x3F, "haswell", UarchClass::kX86Big},
      {"AMD", 0x19, 0x01, "zen3", UarchClass::kZen},            // Milan
      {"AMD", 0x19, 0x11, "zen4", UarchClass::kZen},            // Genoa
      {"AMD", 0x19, 0x21, "zen3", UarchClass::kZen},            // Vermeer
      {"AMD", 0x19, 0x61, "zen4", UarchClass::kZen},            // Raphael
      {"AMD", 0x17, 0x31, "zen2", UarchClass::kZen},            // Rome
      {"AMD", 0x1A, 0x02, "zen5", UarchClass::kZen},
  };
  for (const auto& c : cases) {
    const std::string u = x86_uarch_of(c.vendor, c.family, c.model);
    EXPECT_EQ(u, c.uarch) << c.vendor << " family " << c.family << " model " << c.model;
    EXPECT_EQ(uarch_class_of(u), c.klass) << u;
  }
  // Hybrid parts (Alder Lake 0x97), other vendors and unknown models: not named.
  EXPECT_EQ(x86_uarch_of("Intel", 6, 0x97), "");
  EXPECT_EQ(x86_uarch_of("Hygon", 0x18, 0x01), "");
  EXPECT_EQ(x86_uarch_of("Intel", 6, 0x01), "");
  EXPECT_EQ(x86_uarch_of("AMD", 0x19, 0x90), "");
}

// The selection cache has a slot per core cluster: a descriptor with more
// clusters than it holds is refused by name (never folded onto another
// cluster's slot), and a detected CPU with too many is merged to fit.
CpuDescriptor cpu_with_clusters(int n, UarchClass second_class) {
  CpuDescriptor d = fake_cpu("alder-lake");
  d.name = "many-clusters";
  d.clusters.clear();
  for (int i = 0; i < n; ++i)
    d.clusters.push_back(CoreCluster{i == 0 ? "golden-cove" : "gracemont",
                                     i == 0 ? UarchClass::kX86Big : second_class, 2});
  return d;
}

TEST(SelectionCache, RefusesDescriptorsWithTooManyClusters) {
  EXPECT_NO_THROW(check_selection_cache_fits(cpu_with_clusters(kMaxCpuClusters, UarchClass::kX86Little)));
  try {
    check_selection_cache_fits(cpu_with_clusters(kMaxCpuClusters + 1, UarchClass::kX86Little));
    FAIL() << "a descriptor with " << kMaxCpuClusters + 1 << " clusters was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "CPU descriptor 'many-clusters' has " + std::to_string(kMaxCpuClusters + 1) +
                  " core clusters; the selection cache indexes at most " +
                  std::to_string(kMaxCpuClusters));
  }
  EXPECT_THROW(Selector::get().kernel(ProblemClass{FormatId::kN1K4, 4, false, false, 0},
                                      kMaxCpuClusters),
               std::out_of_range);
}

TEST(SelectionCache, DetectedCpusMergeSurplusClustersOfTheSameClass) {
  CpuDescriptor d = cpu_with_clusters(kMaxCpuClusters + 3, UarchClass::kX86Little);
  const std::vector<int> index = fit_clusters_to_selection_cache(d);
  ASSERT_EQ(d.clusters.size(), static_cast<size_t>(kMaxCpuClusters));
  EXPECT_NO_THROW(check_selection_cache_fits(d));
  ASSERT_EQ(index.size(), static_cast<size_t>(kMaxCpuClusters + 3));
  for (int i = kMaxCpuClusters; i < kMaxCpuClusters + 3; ++i) EXPECT_EQ(index[i], 1) << i;
  EXPECT_EQ(d.clusters[1].cores, 2 * 4);
  EXPECT_NE(d.name.find("core clusters merged into"), std::string::npos) << d.name;
  int cores = 0;
  for (const auto& c : d.clusters) cores += c.cores;
  EXPECT_EQ(cores, 2 * (kMaxCpuClusters + 3));
}

// Tuning tables are files from outside: the reader must reject, never crash.
TEST(JsonReader, ParsesAndRejectsWithAnOffset) {
  JsonValue v;
  std::string err;
  ASSERT_TRUE(parse_json(R"({"a": [1, -2.5e3, true, null, "x\u00e9\ud83d\ude00"], "b": {}})", v, err)) << err;
  ASSERT_TRUE(v.is_object());
  const JsonValue* a = v.get("a");
  ASSERT_TRUE(a && a->items.size() == 5);
  EXPECT_EQ(a->items[1].number, -2500.0);
  EXPECT_EQ(a->items[4].string, "x\xc3\xa9\xf0\x9f\x98\x80");
  const char* bad[] = {"", "{", "[1,]", "{\"a\" 1}", "01", "1e999", "\"\\ud800\"", "\"\x01\"", "tru",
                       "{} x", "[\"unterminated"};
  for (const char* b : bad) {
    EXPECT_FALSE(parse_json(b, v, err)) << b;
    EXPECT_NE(err.find("at byte"), std::string::npos) << err;
  }
  EXPECT_FALSE(parse_json(std::string(100000, '['), v, err));
  EXPECT_NE(err.find("nesting too deep"), std::string::npos) << err;
  JsonLimits small;
  small.max_items = 3;
  EXPECT_FALSE(parse_json("[1,2,3,4]", v, err, small));
}

std::string table_text(const CpuDescriptor& cpu, const std::string& entries) {
  return std::string("{\"schema\": \"torchao_kernels.tuning\", \"version\": 1, \"cpu_signature\": ") +
         "\"" + cpu_signature(cpu) + "\", \"kernel_set\": \"" + kernel_set_version() +
         "\", \"entries\": " + entries + "}";
}

TEST(TuningTable, ChoosesOnlyAmongRowsThatMayRun) {
  const CpuDescriptor cpu = fake_cpu("zen3");
  ProblemClass pc{FormatId::kN16K4, 4, false, false, m_bucket(1)};
  const Selection st = select_kernel(cpu, Overrides{}, pc, 0);
  ASSERT_TRUE(st.winner);
  const std::string key = class_key(pc, 0);
  const std::string ref = "qd8_f32_qbwn16k4_gemm_1x16__scalar";
  ASSERT_TRUE(find_kernel(ref.c_str()));
  std::string why;
  auto t = parse_tuning_table(table_text(cpu, "{\"" + key + "\": {\"winner\": \"" + ref +
                                                  "\", \"times_us\": {\"" + ref + "\": 1}}}"),
                              cpu, why);
  ASSERT_TRUE(t) << why;
  Selection s = select_kernel(cpu, Overrides{}, pc, 0, t.get());
  EXPECT_STREQ(s.winner->name, ref.c_str());
  EXPECT_EQ(s.source, "table");
  EXPECT_EQ(s.static_winner, st.winner);
  // An override rules the table's winner out: static policy (no other row measured).
  s = select_kernel(cpu, Overrides{"", "", "scalar"}, pc, 0, t.get());
  EXPECT_EQ(s.winner, st.winner);
  EXPECT_EQ(s.source, "static");
  // A winner for another CPU family (an AVX-512 row on an AVX2-only part): never chosen.
  t = parse_tuning_table(table_text(cpu, "{\"" + key + "\": {\"winner\": \"qd8_f32_qbwn16k4_gemv_1x64__avx512vnni\"}}"),
                         cpu, why);
  if (t && find_kernel("qd8_f32_qbwn16k4_gemv_1x64__avx512vnni")) {
    s = select_kernel(cpu, Overrides{}, pc, 0, t.get());
    EXPECT_EQ(s.winner, st.winner);
  }
  // Another CPU's table is refused as a whole.
  EXPECT_FALSE(parse_tuning_table(table_text(fake_cpu("zen4"), "{}"), cpu, why));
  EXPECT_NE(why.find("another CPU"), std::string::npos) << why;
}

}  // namespace
}  // namespace torchao_kernels
