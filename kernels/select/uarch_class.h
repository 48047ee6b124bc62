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

// A core cluster of `cores` cores of that uarch, classed by the table.
inline CoreCluster core_cluster(const std::string& uarch, int cores) {
  return CoreCluster{uarch, uarch_class_of(uarch), cores};
}

}  // namespace torchao_kernels
