#include "kernels/select/cpu_descriptor.h"

#include <sstream>
#include <stdexcept>

#include "kernels/select/json_writer.h"
#include "kernels/select/uarch_class.h"

namespace torchao_kernels {

namespace {
struct IsaName {
  uint64_t bit;
  const char* name;
};
const IsaName kIsaNames[] = {
    {kIsaSse42, "sse4.2"},   {kIsaAvx2, "avx2"},         {kIsaFma, "fma"},
    {kIsaAvx512f, "avx512f"}, {kIsaAvx512bw, "avx512bw"}, {kIsaAvx512vl, "avx512vl"},
    {kIsaAvx512dq, "avx512dq"},
    {kIsaAvx512vnni, "avx512vnni"}, {kIsaAvxvnni, "avxvnni"}, {kIsaAmx, "amx"},
    {kIsaNeon, "neon"},      {kIsaDotprod, "dotprod"},   {kIsaI8mm, "i8mm"},
    {kIsaSve, "sve"},        {kIsaSve2, "sve2"},         {kIsaBf16, "bf16"},
    {kIsaSme, "sme"},
};
}  // namespace

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::kX86_64: return "x86_64";
    case Arch::kAarch64: return "aarch64";
    default: return "other";
  }
}

std::vector<std::string> isa_names(uint64_t isa) {
  std::vector<std::string> out;
  for (const auto& n : kIsaNames)
    if (isa & n.bit) out.push_back(n.name);
  return out;
}

const char* isa_feature_name(uint64_t bit) {
  for (const auto& n : kIsaNames)
    if (n.bit == bit) return n.name;
  return "?";
}

uint64_t all_isa_features() {
  uint64_t all = 0;
  for (const auto& n : kIsaNames) all |= n.bit;
  return all;
}

const char* uarch_class_name(UarchClass c) {
  switch (c) {
    case UarchClass::kArmLittle: return "arm_little";
    case UarchClass::kArmBig: return "arm_big";
    case UarchClass::kX86Big: return "x86_big";
    case UarchClass::kX86Little: return "x86_little";
    case UarchClass::kZen: return "zen";
    default: return "unknown";
  }
}

namespace {
struct UarchEntry {
  const char* uarch;
  UarchClass klass;
};
// Every core type the detectors or the fake CPUs name.
const UarchEntry kUarchClasses[] = {
    {"haswell", UarchClass::kX86Big},        {"broadwell", UarchClass::kX86Big},
    {"sky-lake", UarchClass::kX86Big},       {"palm-cove", UarchClass::kX86Big},
    {"sunny-cove", UarchClass::kX86Big},     {"willow-cove", UarchClass::kX86Big},
    {"golden-cove", UarchClass::kX86Big},    {"raptor-cove", UarchClass::kX86Big},
    {"redwood-cove", UarchClass::kX86Big},   {"gracemont", UarchClass::kX86Little},
    {"crestmont", UarchClass::kX86Little},   {"tremont", UarchClass::kX86Little},
    {"zen", UarchClass::kZen},               {"zen2", UarchClass::kZen},
    {"zen3", UarchClass::kZen},              {"zen4", UarchClass::kZen},
    {"zen5", UarchClass::kZen},              {"cortex-a53", UarchClass::kArmLittle},
    {"cortex-a55", UarchClass::kArmLittle},  {"cortex-a510", UarchClass::kArmLittle},
    {"cortex-a72", UarchClass::kArmBig},     {"cortex-a76", UarchClass::kArmBig},
    {"cortex-a710", UarchClass::kArmBig},    {"cortex-x2", UarchClass::kArmBig},
    {"neoverse-n1", UarchClass::kArmBig},    {"neoverse-n2", UarchClass::kArmBig},
    {"neoverse-v1", UarchClass::kArmBig},    {"neoverse-v2", UarchClass::kArmBig},
    // Apple's efficiency cores are out-of-order too: classed big.
    {"firestorm", UarchClass::kArmBig},      {"icestorm", UarchClass::kArmBig},
};
}  // namespace

namespace {
struct X86Part {
  const char* vendor;
  int family;
  int model_lo, model_hi;  // inclusive
  const char* uarch;
};
// Single-core-type x86 parts by CPUID family/model: Intel's client and server
// models of each core generation, AMD's by family and model range.
const X86Part kX86Parts[] = {
    {"Intel", 6, 0x3C, 0x3C, "haswell"},      {"Intel", 6, 0x3F, 0x3F, "haswell"},
    {"Intel", 6, 0x45, 0x46, "haswell"},      {"Intel", 6, 0x3D, 0x3D, "broadwell"},
    {"Intel", 6, 0x47, 0x47, "broadwell"},    {"Intel", 6, 0x4F, 0x4F, "broadwell"},
    {"Intel", 6, 0x56, 0x56, "broadwell"},    {"Intel", 6, 0x4E, 0x4E, "sky-lake"},
    {"Intel", 6, 0x55, 0x55, "sky-lake"},     {"Intel", 6, 0x5E, 0x5E, "sky-lake"},
    {"Intel", 6, 0x8E, 0x8E, "sky-lake"},     {"Intel", 6, 0x9E, 0x9E, "sky-lake"},
    {"Intel", 6, 0xA5, 0xA6, "sky-lake"},     {"Intel", 6, 0x66, 0x66, "palm-cove"},
    {"Intel", 6, 0x6A, 0x6A, "sunny-cove"},   {"Intel", 6, 0x6C, 0x6C, "sunny-cove"},
    {"Intel", 6, 0x7D, 0x7E, "sunny-cove"},   {"Intel", 6, 0xA7, 0xA7, "sunny-cove"},
    {"Intel", 6, 0x8C, 0x8D, "willow-cove"},  {"Intel", 6, 0x8F, 0x8F, "golden-cove"},
    {"Intel", 6, 0xCF, 0xCF, "raptor-cove"},  {"Intel", 6, 0xAD, 0xAE, "redwood-cove"},
    {"AMD", 0x17, 0x00, 0x2F, "zen"},         {"AMD", 0x17, 0x30, 0xFF, "zen2"},
    {"AMD", 0x19, 0x00, 0x0F, "zen3"},        {"AMD", 0x19, 0x10, 0x1F, "zen4"},
    {"AMD", 0x19, 0x20, 0x5F, "zen3"},        {"AMD", 0x19, 0x60, 0x7F, "zen4"},
    {"AMD", 0x19, 0xA0, 0xAF, "zen4"},        {"AMD", 0x1A, 0x00, 0xFF, "zen5"},
};
}  // namespace

std::string x86_uarch_of(const std::string& vendor, int family, int model) {
  for (const auto& p : kX86Parts)
    if (vendor == p.vendor && family == p.family && model >= p.model_lo && model <= p.model_hi) return p.uarch;
  return "";
}

UarchClass uarch_class_of(const std::string& uarch) {
  for (const auto& e : kUarchClasses)
    if (uarch == e.uarch) return e.klass;
  return UarchClass::kUnknown;
}

std::string CpuDescriptor::to_json() const {
  std::vector<std::string> isa_list, cluster_list;
  for (const auto& n : isa_names(isa)) isa_list.push_back(json_str(n));
  for (const auto& c : clusters) {
    cluster_list.push_back(JsonObject()
                               .str("uarch", c.uarch)
                               .str("uarch_class", uarch_class_name(c.uarch_class))
                               .num("cores", c.cores)
                               .done());
  }
  return JsonObject()
      .str("name", name)
      .str("id", id)
      .str("arch", arch_name(arch))
      .raw("isa", json_list(isa_list))
      .raw("clusters", json_list(cluster_list))
      .num("l1d_bytes", l1d_bytes)
      .num("l2_bytes", l2_bytes)
      .num("l3_bytes", l3_bytes)
      .num("cores", cores)
      .done();
}

namespace {
constexpr uint64_t kArmV8 = kIsaNeon;
constexpr uint64_t kArmV82 = kIsaNeon | kIsaDotprod;
constexpr uint64_t kX86V3 = kIsaSse42 | kIsaAvx2 | kIsaFma;
constexpr uint64_t kX86Avx512 = kX86V3 | kIsaAvx512f | kIsaAvx512bw | kIsaAvx512vl | kIsaAvx512dq;

CpuDescriptor make(const char* name, Arch arch, uint64_t isa,
                   std::vector<CoreCluster> clusters, int64_t l1, int64_t l2, int64_t l3) {
  CpuDescriptor d;
  d.name = name;
  d.id = std::string("fake ") + name;
  d.arch = arch;
  d.isa = isa;
  d.clusters = std::move(clusters);
  d.l1d_bytes = l1;
  d.l2_bytes = l2;
  d.l3_bytes = l3;
  d.cores = 0;
  for (const auto& c : d.clusters) d.cores += c.cores;
  return d;
}

constexpr int64_t KiB = 1024, MiB = 1024 * 1024;
}  // namespace

std::vector<std::string> fake_cpu_names() {
  return {"cortex-a53", "cortex-a55",  "cortex-a76",  "big-little-x2-a710-a510",
          "neoverse-n1", "neoverse-v1", "neoverse-v2", "apple-m1",
          "zen4",        "zen3",        "sapphire-rapids", "skylake-x",
          "haswell",     "alder-lake",  "x86-64-sse4.2"};
}

CpuDescriptor fake_cpu(const std::string& n) {
  const Arch A = Arch::kAarch64, X = Arch::kX86_64;
  if (n == "cortex-a53")
    return make("cortex-a53", A, kArmV8, {core_cluster("cortex-a53", 4)}, 32 * KiB, 512 * KiB, 0);
  if (n == "cortex-a55")
    return make("cortex-a55", A, kArmV82, {core_cluster("cortex-a55", 8)}, 32 * KiB, 256 * KiB,
                2 * MiB);
  if (n == "cortex-a76")
    return make("cortex-a76", A, kArmV82, {core_cluster("cortex-a76", 4)}, 64 * KiB, 512 * KiB,
                4 * MiB);
  if (n == "big-little-x2-a710-a510")
    return make("big-little-x2-a710-a510", A, kArmV82 | kIsaI8mm | kIsaBf16 | kIsaSve | kIsaSve2,
                {core_cluster("cortex-x2", 1), core_cluster("cortex-a710", 3),
                 core_cluster("cortex-a510", 4)},
                64 * KiB, 1 * MiB, 8 * MiB);
  if (n == "neoverse-n1")
    return make("neoverse-n1", A, kArmV82, {core_cluster("neoverse-n1", 64)}, 64 * KiB, 1 * MiB,
                32 * MiB);
  if (n == "neoverse-v1")
    return make("neoverse-v1", A, kArmV82 | kIsaI8mm | kIsaBf16 | kIsaSve,
                {core_cluster("neoverse-v1", 64)}, 64 * KiB, 1 * MiB, 32 * MiB);
  if (n == "neoverse-v2")
    return make("neoverse-v2", A, kArmV82 | kIsaI8mm | kIsaBf16 | kIsaSve | kIsaSve2,
                {core_cluster("neoverse-v2", 72)}, 64 * KiB, 1 * MiB, 114 * MiB);
  if (n == "apple-m1")
    return make("apple-m1", A, kArmV82, {core_cluster("firestorm", 4), core_cluster("icestorm", 4)},
                128 * KiB, 12 * MiB, 0);
  if (n == "zen4")
    return make("zen4", X, kX86Avx512 | kIsaAvx512vnni, {core_cluster("zen4", 16)}, 32 * KiB, 1 * MiB,
                32 * MiB);
  if (n == "zen3")
    return make("zen3", X, kX86V3, {core_cluster("zen3", 8)}, 32 * KiB, 512 * KiB, 32 * MiB);
  if (n == "sapphire-rapids")  // AVX512-VNNI and AVX-VNNI, Intel P-cores
    return make("sapphire-rapids", X, kX86Avx512 | kIsaAvx512vnni | kIsaAvxvnni,
                {core_cluster("golden-cove", 56)}, 48 * KiB, 2 * MiB, 105 * MiB);
  if (n == "skylake-x")
    return make("skylake-x", X, kX86Avx512, {core_cluster("sky-lake", 18)}, 32 * KiB, 1 * MiB,
                25 * MiB);
  if (n == "haswell")
    return make("haswell", X, kX86V3, {core_cluster("haswell", 4)}, 32 * KiB, 256 * KiB, 8 * MiB);
  if (n == "alder-lake")
    return make("alder-lake", X, kX86V3 | kIsaAvxvnni,
                {core_cluster("golden-cove", 8), core_cluster("gracemont", 8)}, 48 * KiB,
                1280 * KiB, 30 * MiB);
  if (n == "x86-64-sse4.2")
    return make("x86-64-sse4.2", X, kIsaSse42, {core_cluster("unknown", 2)}, 32 * KiB,
                256 * KiB, 4 * MiB);
  std::string msg = "unknown fake CPU '" + n + "'; known:";
  for (const auto& k : fake_cpu_names()) msg += " " + k;
  throw std::invalid_argument(msg);
}

}  // namespace torchao_kernels
