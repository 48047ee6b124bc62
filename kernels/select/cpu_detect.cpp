// CPU detection backend: cpuinfo (the copy exported by the torch wheel's
// libc10, or by ExecuTorch's threadpool library; always compiled against the
// header matching that library). cpu_detect_hwcap.cpp is the alternative for
// torch-free Linux/aarch64 builds without cpuinfo.
#include <cpuinfo.h>

#include <cstdio>
#include <string>
#include <vector>

#include "kernels/select/cpu_detect.h"
#include "kernels/select/selector.h"
#include "kernels/select/uarch_class.h"

namespace torchao_kernels {

namespace {

// cpuinfo's uarch ids -> names; the class comes from uarch_class_of().
struct UarchName {
  enum cpuinfo_uarch uarch;
  const char* name;
};

const UarchName kUarchNames[] = {
    {cpuinfo_uarch_haswell, "haswell"},
    {cpuinfo_uarch_broadwell, "broadwell"},
    {cpuinfo_uarch_sky_lake, "sky-lake"},
    {cpuinfo_uarch_palm_cove, "palm-cove"},
    {cpuinfo_uarch_sunny_cove, "sunny-cove"},
    {cpuinfo_uarch_willow_cove, "willow-cove"},
    {cpuinfo_uarch_golden_cove, "golden-cove"},
    {cpuinfo_uarch_raptor_cove, "raptor-cove"},
    {cpuinfo_uarch_redwood_cove, "redwood-cove"},
    {cpuinfo_uarch_gracemont, "gracemont"},
    {cpuinfo_uarch_crestmont, "crestmont"},
    {cpuinfo_uarch_tremont, "tremont"},
    {cpuinfo_uarch_zen, "zen"},
    {cpuinfo_uarch_zen2, "zen2"},
    {cpuinfo_uarch_zen3, "zen3"},
    {cpuinfo_uarch_zen4, "zen4"},
    {cpuinfo_uarch_zen5, "zen5"},
    {cpuinfo_uarch_cortex_a53, "cortex-a53"},
    {cpuinfo_uarch_cortex_a55r0, "cortex-a55"},
    {cpuinfo_uarch_cortex_a55, "cortex-a55"},
    {cpuinfo_uarch_cortex_a510, "cortex-a510"},
    {cpuinfo_uarch_cortex_a72, "cortex-a72"},
    {cpuinfo_uarch_cortex_a76, "cortex-a76"},
    {cpuinfo_uarch_cortex_a710, "cortex-a710"},
    {cpuinfo_uarch_cortex_x2, "cortex-x2"},
    {cpuinfo_uarch_neoverse_n1, "neoverse-n1"},
    {cpuinfo_uarch_neoverse_n2, "neoverse-n2"},
    {cpuinfo_uarch_neoverse_v1, "neoverse-v1"},
    {cpuinfo_uarch_neoverse_v2, "neoverse-v2"},
    {cpuinfo_uarch_firestorm, "firestorm"},
    {cpuinfo_uarch_icestorm, "icestorm"},
};

CoreCluster describe_uarch(enum cpuinfo_uarch u, int cores) {
  for (const auto& n : kUarchNames)
    if (n.uarch == u) return core_cluster(n.name, cores);
  return core_cluster("unknown", cores);
}

// cpuinfo's uarch index -> descriptor cluster (differs only when clusters
// were merged to fit the selection cache).
std::vector<int> g_uarch_to_cluster;

#if CPUINFO_ARCH_X86_64
struct X86Signature {
  const char* vendor;
  int family, model, stepping;
};

X86Signature x86_signature(const cpuinfo_core& core) {
  const char* vendor = core.vendor == cpuinfo_vendor_intel ? "Intel"
                       : core.vendor == cpuinfo_vendor_amd ? "AMD"
                       : core.vendor == cpuinfo_vendor_hygon ? "Hygon"
                                                              : "other";
  // CPUID leaf 1 EAX: stepping [3:0], model [7:4], family [11:8], extended
  // model [19:16], extended family [27:20].
  const uint32_t eax = core.cpuid;
  const uint32_t base_family = (eax >> 8) & 0xF;
  uint32_t family = base_family, model = (eax >> 4) & 0xF;
  if (base_family == 0xF) family += (eax >> 20) & 0xFF;
  if (base_family == 0xF || base_family == 0x6) model |= ((eax >> 16) & 0xF) << 4;
  return {vendor, static_cast<int>(family), static_cast<int>(model), static_cast<int>(eax & 0xF)};
}
#endif

// The exact part (cpuinfo_initialize() done): what a tuning table is keyed on.
std::string part_id() {
  const cpuinfo_core* core = cpuinfo_get_core(0);
  if (!core) return "unknown";
#if CPUINFO_ARCH_X86_64
  const X86Signature s = x86_signature(*core);
  return std::string(s.vendor) + " family " + std::to_string(s.family) + " model " +
         std::to_string(s.model) + " stepping " + std::to_string(s.stepping);
#elif CPUINFO_ARCH_ARM64
  std::string s;
  char buf[32];
  for (uint32_t i = 0; i < cpuinfo_get_uarchs_count(); ++i) {
    std::snprintf(buf, sizeof buf, "0x%08x", cpuinfo_get_uarch(i)->midr);
    s += (s.empty() ? "MIDR " : " + ") + std::string(buf);
  }
  return s.empty() ? "unknown" : s;
#else
  return "unknown";
#endif
}

CpuDescriptor detect() {
  CpuDescriptor d;
#if defined(__x86_64__) || defined(_M_X64)
  d.arch = Arch::kX86_64;
#elif defined(__aarch64__)
  d.arch = Arch::kAarch64;
#else
  d.arch = Arch::kOther;
#endif
  if (!cpuinfo_initialize()) {
    d.name = "detected: cpuinfo failed to initialize (no ISA extensions assumed)";
    d.clusters.push_back(core_cluster("unknown", 1));
    return d;
  }
  const cpuinfo_package* pkg = cpuinfo_get_package(0);
  d.name = std::string("detected: ") + (pkg && pkg->name[0] ? pkg->name : "unknown");
  d.id = part_id();
#if CPUINFO_ARCH_X86_64
  if (cpuinfo_has_x86_sse4_2()) d.isa |= kIsaSse42;
  if (cpuinfo_has_x86_avx2()) d.isa |= kIsaAvx2;
  if (cpuinfo_has_x86_fma3()) d.isa |= kIsaFma;
  if (cpuinfo_has_x86_avx512f()) d.isa |= kIsaAvx512f;
  if (cpuinfo_has_x86_avx512bw()) d.isa |= kIsaAvx512bw;
  if (cpuinfo_has_x86_avx512vl()) d.isa |= kIsaAvx512vl;
  if (cpuinfo_has_x86_avx512dq()) d.isa |= kIsaAvx512dq;
  if (cpuinfo_has_x86_avx512vnni()) d.isa |= kIsaAvx512vnni;
  if (cpuinfo_has_x86_avxvnni()) d.isa |= kIsaAvxvnni;
  if (cpuinfo_has_x86_amx_int8() && cpuinfo_has_x86_amx_tile()) d.isa |= kIsaAmx;
#elif CPUINFO_ARCH_ARM64
  if (cpuinfo_has_arm_neon()) d.isa |= kIsaNeon;
  if (cpuinfo_has_arm_neon_dot()) d.isa |= kIsaDotprod;
  if (cpuinfo_has_arm_i8mm()) d.isa |= kIsaI8mm;
  if (cpuinfo_has_arm_sve()) d.isa |= kIsaSve;
  if (cpuinfo_has_arm_sve2()) d.isa |= kIsaSve2;
  if (cpuinfo_has_arm_bf16()) d.isa |= kIsaBf16;
  if (cpuinfo_has_arm_sme()) d.isa |= kIsaSme;
#endif
  const uint32_t n_uarchs = cpuinfo_get_uarchs_count();
  for (uint32_t i = 0; i < n_uarchs; ++i) {
    const cpuinfo_uarch_info* u = cpuinfo_get_uarch(i);
    d.clusters.push_back(describe_uarch(u->uarch, static_cast<int>(u->core_count)));
  }
  if (d.clusters.empty()) d.clusters.push_back(core_cluster("unknown", 1));
#if CPUINFO_ARCH_X86_64
  // A part this cpuinfo cannot name (one core type): named from its CPUID
  // family and model, as a newer cpuinfo would (uarch_class.h).
  if (d.clusters.size() == 1 && d.clusters[0].uarch == "unknown" && cpuinfo_get_core(0)) {
    const X86Signature s = x86_signature(*cpuinfo_get_core(0));
    const std::string u = x86_uarch_of(s.vendor, s.family, s.model);
    if (!u.empty()) d.clusters[0] = core_cluster(u, d.clusters[0].cores);
  }
#endif
  g_uarch_to_cluster = fit_clusters_to_selection_cache(d);
  d.cores = static_cast<int>(cpuinfo_get_cores_count());
  if (cpuinfo_get_l1d_caches_count()) d.l1d_bytes = cpuinfo_get_l1d_cache(0)->size;
  if (cpuinfo_get_l2_caches_count()) d.l2_bytes = cpuinfo_get_l2_cache(0)->size;
  if (cpuinfo_get_l3_caches_count()) d.l3_bytes = cpuinfo_get_l3_cache(0)->size;
  return d;
}

}  // namespace

CpuDescriptor detect_cpu() { return detect(); }

int detected_current_cluster(const CpuDescriptor& d) {
  // cpuinfo numbers uarchs in the same order as the descriptor's clusters.
  if (d.clusters.size() <= 1) return 0;
  const uint32_t i = cpuinfo_get_current_uarch_index_with_default(0);
  return i < g_uarch_to_cluster.size() ? g_uarch_to_cluster[i] : 0;
}

}  // namespace torchao_kernels
