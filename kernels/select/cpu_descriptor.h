// CPU descriptor: a plain value describing what selection needs to know about
// a CPU. Filled from cpuinfo in production (cpu_detect.cpp), built by hand in
// tests (fake_cpu), so the selection policy is a pure function testable on
// CPUs we do not have.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace torchao_kernels {

enum class Arch { kX86_64, kAarch64, kOther };
const char* arch_name(Arch a);

// ISA features, one bit each.
enum IsaFeature : uint64_t {
  kIsaSse42 = 1ull << 0,
  kIsaAvx2 = 1ull << 1,
  kIsaFma = 1ull << 2,
  kIsaAvx512f = 1ull << 3,
  kIsaAvx512bw = 1ull << 4,
  kIsaAvx512vl = 1ull << 5,
  kIsaAvx512vnni = 1ull << 6,
  kIsaAvxvnni = 1ull << 7,
  kIsaAmx = 1ull << 8,  // AMX-INT8 with tiles
  kIsaAvx512dq = 1ull << 9,
  kIsaNeon = 1ull << 16,
  kIsaDotprod = 1ull << 17,
  kIsaI8mm = 1ull << 18,
  kIsaSve = 1ull << 19,
  kIsaSve2 = 1ull << 20,
  kIsaBf16 = 1ull << 21,
  kIsaSme = 1ull << 22,
};
// Names in bit order (for printing, parsing and error messages).
std::vector<std::string> isa_names(uint64_t isa);
const char* isa_feature_name(uint64_t single_bit);
uint64_t all_isa_features();

// Class of a core's microarchitecture: what the kernel preferences key on.
enum class UarchClass {
  kUnknown,
  kArmLittle,  // in-order: Cortex-A53 / A55 / A510
  kArmBig,     // out-of-order: Cortex-A7x / X, Neoverse, Apple
  kX86Big,     // Intel P-cores (Haswell .. Golden Cove and later)
  kX86Little,  // Intel E-cores (Gracemont ...)
  kZen,        // AMD Zen 1..5 (Zen 4 executes 512-bit ops as two 256-bit halves)
};
const char* uarch_class_name(UarchClass c);

struct CoreCluster {
  std::string uarch;  // e.g. "cortex-a76", "zen4", "unknown"
  UarchClass uarch_class = UarchClass::kUnknown;
  int cores = 1;
};

struct CpuDescriptor {
  std::string name;  // "detected: <package name>" or the fake's name
  // The exact part, for tuning tables (tuning_table.h): x86 "<vendor> family F
  // model M stepping S", ARM "MIDR 0x..." per cluster, fakes "fake <name>".
  std::string id;
  Arch arch = Arch::kOther;
  uint64_t isa = 0;
  std::vector<CoreCluster> clusters;  // at least one; one per core type
  int64_t l1d_bytes = 0, l2_bytes = 0, l3_bytes = 0;
  int cores = 1;

  bool has(uint64_t features) const { return (isa & features) == features; }
  std::string to_json() const;
};

// The CPU this process runs on (cached after the first call).
const CpuDescriptor& detected_cpu();

// The descriptor selection uses: detected_cpu(), unless a test replaced it
// with set_active_cpu(). A replacement keeps only the ISA features the real
// CPU has, so selection can never pick an instruction this CPU lacks; each
// thread is then assigned a cluster round-robin on its first call, so a fake
// heterogeneous CPU exercises per-cluster kernels on a homogeneous machine.
// Not thread-safe against running ops: set it before use (tests only).
const CpuDescriptor& active_cpu();
void set_active_cpu(const CpuDescriptor* fake);  // nullptr restores detected_cpu()

// Named fake CPUs for tests and explain(). Throws std::invalid_argument for an
// unknown name (listing the known ones).
CpuDescriptor fake_cpu(const std::string& name);
std::vector<std::string> fake_cpu_names();

// Index (into active_cpu().clusters) of the cluster the calling thread runs on
// (0 on a homogeneous CPU).
int current_cluster();

}  // namespace torchao_kernels
