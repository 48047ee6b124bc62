// The micro-architecture table: uarch name -> UarchClass, written once
// (cpu_descriptor.cpp). The detectors (cpuinfo, auxv + /proc/cpuinfo) map
// their ids to names only, and the fake CPUs name their cores; both take the
// class from here, so a core type is classed the same way everywhere.
#pragma once

#include <string>

#include "kernels/select/cpu_descriptor.h"

namespace torchao_kernels {

// The class of a uarch name ("cortex-a55", "golden-cove", ...); kUnknown for
// names not in the table.
UarchClass uarch_class_of(const std::string& uarch);

// The uarch name of an x86 part from its CPUID vendor ("Intel", "AMD"),
// family and model (the display values, extended fields folded in), for the
// single-core-type parts whose uarch the CPU library at hand cannot name: the
// torch extension and the ExecuTorch kernel library each link their own
// cpuinfo, and an older copy reports "unknown" for a newer part (Emerald
// Rapids in ExecuTorch 1.5.1's), which would give the two libraries different
// core classes and so different kernels. "" when not in the table (hybrid
// parts are left to the CPU library: one model number spans two core types).
std::string x86_uarch_of(const std::string& vendor, int family, int model);

// A core cluster of `cores` cores of that uarch, classed by the table.
inline CoreCluster core_cluster(const std::string& uarch, int cores) {
  return CoreCluster{uarch, uarch_class_of(uarch), cores};
}

}  // namespace torchao_kernels
