// CPU detection backend for torch-free Linux/aarch64 builds without cpuinfo
// (the cross-compiled test suite): ISA features from the kernel's auxv
// HWCAP bits, which are exactly what the kernel lets user space execute, and
// core types from the "CPU part" lines of /proc/cpuinfo.
#include <sched.h>
#include <sys/auxv.h>

#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "kernels/select/cpu_detect.h"
#include "kernels/select/selector.h"
#include "kernels/select/uarch_class.h"

namespace torchao_kernels {

namespace {

// Linux arm64 hwcap bits (arch/arm64/include/uapi/asm/hwcap.h).
constexpr unsigned long kHwcapAsimd = 1ul << 1;
constexpr unsigned long kHwcapAsimddp = 1ul << 20;
constexpr unsigned long kHwcapSve = 1ul << 22;
constexpr unsigned long kHwcap2Sve2 = 1ul << 1;
constexpr unsigned long kHwcap2I8mm = 1ul << 13;
constexpr unsigned long kHwcap2Bf16 = 1ul << 14;
constexpr unsigned long kHwcap2Sme = 1ul << 23;

// MIDR implementer / part -> uarch name; the class comes from uarch_class_of().
struct Part {
  unsigned implementer, part;
  const char* name;
};
const Part kParts[] = {
    {0x41, 0xd03, "cortex-a53"}, {0x41, 0xd05, "cortex-a55"},
    {0x41, 0xd46, "cortex-a510"}, {0x41, 0xd08, "cortex-a72"},
    {0x41, 0xd0b, "cortex-a76"},   {0x41, 0xd0c, "neoverse-n1"},
    {0x41, 0xd40, "neoverse-v1"},  {0x41, 0xd4f, "neoverse-v2"},
    {0x41, 0xd47, "cortex-a710"},  {0x41, 0xd48, "cortex-x2"},
    {0x41, 0xd49, "neoverse-n2"},
};

struct CpuInfoText {
  std::vector<int> cpu_part;  // per processor: index into kParts, or -1
};

CpuInfoText read_proc_cpuinfo() {
  CpuInfoText t;
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  unsigned implementer = 0;
  while (std::getline(f, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
    const std::string value = line.substr(colon + 1);
    if (key == "CPU implementer") {
      implementer = std::stoul(value, nullptr, 0);
    } else if (key == "CPU part") {
      const unsigned part = std::stoul(value, nullptr, 0);
      int idx = -1;
      for (size_t i = 0; i < sizeof(kParts) / sizeof(kParts[0]); ++i)
        if (kParts[i].implementer == implementer && kParts[i].part == part) idx = static_cast<int>(i);
      t.cpu_part.push_back(idx);
    }
  }
  return t;
}

std::vector<int> g_cpu_to_cluster;

}  // namespace

CpuDescriptor detect_cpu() {
  CpuDescriptor d;
  d.name = "detected (auxv hwcaps + /proc/cpuinfo)";
#if defined(__aarch64__)
  d.arch = Arch::kAarch64;
  const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
  if (hw & kHwcapAsimd) d.isa |= kIsaNeon;
  if (hw & kHwcapAsimddp) d.isa |= kIsaDotprod;
  if (hw & kHwcapSve) d.isa |= kIsaSve;
  if (hw2 & kHwcap2Sve2) d.isa |= kIsaSve2;
  if (hw2 & kHwcap2I8mm) d.isa |= kIsaI8mm;
  if (hw2 & kHwcap2Bf16) d.isa |= kIsaBf16;
  if (hw2 & kHwcap2Sme) d.isa |= kIsaSme;
#else
  d.arch = Arch::kOther;
#endif
  const CpuInfoText t = read_proc_cpuinfo();
  std::map<int, int> cluster_of_part;  // part index (-1 unknown) -> cluster
  for (size_t cpu = 0; cpu < t.cpu_part.size(); ++cpu) {
    const int part = t.cpu_part[cpu];
    auto it = cluster_of_part.find(part);
    if (it == cluster_of_part.end()) {
      it = cluster_of_part.emplace(part, static_cast<int>(d.clusters.size())).first;
      d.clusters.push_back(core_cluster(part >= 0 ? kParts[part].name : "unknown", 0));
    }
    d.clusters[it->second].cores += 1;
    g_cpu_to_cluster.push_back(it->second);
  }
  if (d.clusters.empty()) {
    const int n = static_cast<int>(std::thread::hardware_concurrency());
    d.clusters.push_back(core_cluster("unknown", n > 0 ? n : 1));
  }
  const std::vector<int> merged = fit_clusters_to_selection_cache(d);
  for (int& c : g_cpu_to_cluster) c = merged[c];
  d.cores = 0;
  for (const auto& c : d.clusters) d.cores += c.cores;
  // The exact parts (implementer:part per cluster), for tuning tables.
  d.id = "parts";
  for (const auto& kv : cluster_of_part)
    d.id += " " + (kv.first >= 0 ? std::string(kParts[kv.first].name) : std::string("unknown"));
  return d;
}

int detected_current_cluster(const CpuDescriptor& d) {
  if (d.clusters.size() <= 1) return 0;
  const int cpu = sched_getcpu();
  return cpu >= 0 && cpu < static_cast<int>(g_cpu_to_cluster.size()) ? g_cpu_to_cluster[cpu] : 0;
}

}  // namespace torchao_kernels
