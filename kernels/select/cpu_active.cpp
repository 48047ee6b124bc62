#include <atomic>

#include "kernels/select/cpu_detect.h"

namespace torchao_kernels {

const CpuDescriptor& detected_cpu() {
  static const CpuDescriptor d = detect_cpu();
  return d;
}

namespace {
std::atomic<const CpuDescriptor*> g_active{nullptr};
std::atomic<int> g_thread_counter{0};
}  // namespace

const CpuDescriptor& active_cpu() {
  const CpuDescriptor* a = g_active.load(std::memory_order_acquire);
  return a ? *a : detected_cpu();
}

void set_active_cpu(const CpuDescriptor* fake) {
  if (!fake) {
    g_active.store(nullptr, std::memory_order_release);
    return;
  }
  // Kept alive for the process: threads may still hold references (tests only).
  auto* copy = new CpuDescriptor(*fake);
  copy->isa &= detected_cpu().isa;
  copy->name = fake->name + " (ISA limited to this CPU's)";
  g_active.store(copy, std::memory_order_release);
}

int current_cluster() {
  const CpuDescriptor* fake = g_active.load(std::memory_order_acquire);
  if (fake) {
    thread_local int assigned = g_thread_counter.fetch_add(1);
    return assigned % static_cast<int>(fake->clusters.size());
  }
  return detected_current_cluster(detected_cpu());
}

}  // namespace torchao_kernels
