// Kernel selection: two decisions with two lifetimes.
//  1. Pack time: best_format() picks the packed format for the CPU that packs.
//  2. First call per shape class: select() picks a kernel for
//     (format, bits/zeros/bias, m-bucket, core cluster); KernelCache keeps the
//     choice; the hot path is one relaxed atomic load, no lock.
// Both are pure functions of (CPU descriptor, overrides, registry), so tests
// run them on fake CPUs.
#pragma once

#include <atomic>
#include <mutex>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/select/cpu_descriptor.h"
#include "kernels/select/kernel_registry.h"

namespace torchao_kernels {

// User overrides (env TORCHAO_KERNELS_MAX_ISA / _FORCE / _EXCLUDE, or the API).
struct Overrides {
  std::string max_isa;  // "" = no cap; else an ISA level name (isa_levels())
  std::string force;    // comma-separated kernel name patterns; "" = none
  std::string exclude;  // comma-separated kernel name patterns; "" = none
  std::string to_json() const;
};

// ISA caps accepted by max_isa, in increasing order per architecture.
std::vector<std::string> isa_levels();
// Features allowed under a cap (throws std::invalid_argument for unknown names).
uint64_t isa_cap_mask(const std::string& max_isa);
// Glob match ('*', '?'); a pattern without wildcards matches as a substring.
bool name_matches(const std::string& patterns_csv, const char* name);

constexpr int kMBuckets = 8;  // m = 1, 2-3, 4-7, 8-15, 16-31, 32-63, 64-127, 128+
int m_bucket(int64_t m);
const char* m_bucket_name(int bucket);
int m_bucket_lo(int bucket);
int m_bucket_hi(int bucket);  // 0 = unbounded

struct ProblemClass {
  FormatId format;
  int bits;
  bool zeros, bias;
  int bucket;  // m-bucket (linear); 0 for embedding lookups
  KernelOp op = KernelOp::kLinear;
};

struct Candidate {
  const KernelInfo* kernel;
  bool eligible;
  std::string reason;  // why rejected, or how the score was made
  int score;
};

struct Selection {
  const KernelInfo* winner = nullptr;
  std::vector<Candidate> candidates;  // every registry row, in registry order
  std::string error;                  // non-empty when an override makes selection fail
};

// Pure selection. cluster indexes cpu.clusters.
Selection select_kernel(const CpuDescriptor& cpu, const Overrides& ov, const ProblemClass& pc,
                        int cluster);

// Best format for packing on this CPU (also honouring overrides).
FormatId best_format(const CpuDescriptor& cpu, const Overrides& ov, int bits, bool zeros,
                     bool bias);

// Maps a pack-time target ("auto", a format name, or torchao's "universal",
// "kleidiai", "aten") to a format. Throws std::invalid_argument naming the
// value and the accepted ones.
FormatId resolve_target(const std::string& target, const CpuDescriptor& cpu, const Overrides& ov,
                        int bits, bool zeros, bool bias);

// The selection cache has one slot per core cluster, for at most
// kMaxCpuClusters clusters.
constexpr int kMaxCpuClusters = 8;
// Throws std::invalid_argument (naming the descriptor, its cluster count and
// the limit) for a descriptor the cache cannot index. Fake CPUs are checked
// with it when a test makes them active.
void check_selection_cache_fits(const CpuDescriptor& cpu);
// For detected CPUs, which must always work: merges the clusters past the
// limit into a kept cluster of the same uarch class (else into the last kept
// one, whose class then decides for those cores), notes the merge in the
// descriptor's name, and returns each original cluster's new index.
std::vector<int> fit_clusters_to_selection_cache(CpuDescriptor& cpu);

// Process-wide state: the overrides in force and the cache of choices.
class Selector {
 public:
  static Selector& get();

  // Kernel for this problem class on the calling thread's core cluster.
  // Throws std::runtime_error if an override makes selection impossible, and
  // std::out_of_range for a cluster index the cache cannot hold (descriptors
  // are checked before use, so this never happens in practice).
  const KernelInfo& kernel(const ProblemClass& pc, int cluster);

  Overrides overrides() const;
  // Replaces the overrides (validated first) and clears the cache.
  void set_overrides(const Overrides& ov);
  void clear_cache();

  // Per-kernel call counters (stats()).
  void count(const KernelInfo& k);
  std::vector<std::pair<std::string, int64_t>> stats() const;
  void reset_stats();

 private:
  Selector();
  static constexpr int kMaxFormats = 8, kMaxClusters = kMaxCpuClusters, kVariants = 8 * 4, kOps = 2;
  static int slot(const ProblemClass& pc, int cluster);
  std::atomic<int16_t> cache_[kOps * kMaxFormats * kVariants * kMBuckets * kMaxClusters];
  std::vector<std::atomic<int64_t>> counts_;
  Overrides overrides_;
  std::string env_error_;  // invalid environment overrides, reported at first use
  mutable std::mutex mu_;
};

}  // namespace torchao_kernels
