// The CPU detection backend interface (cpu_detect.cpp with cpuinfo, or
// cpu_detect_hwcap.cpp from Linux auxv / /proc/cpuinfo); cpu_active.cpp
// builds detected_cpu() / active_cpu() / current_cluster() on top of it.
#pragma once

#include "kernels/select/cpu_descriptor.h"

namespace torchao_kernels {

CpuDescriptor detect_cpu();
// The cluster of the calling thread, for a descriptor made by detect_cpu().
int detected_current_cluster(const CpuDescriptor& d);

}  // namespace torchao_kernels
