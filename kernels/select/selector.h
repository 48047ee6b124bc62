// Kernel selection: two decisions with two lifetimes.
//  1. Pack time: best_format() picks the packed format for the CPU that packs.
//  2. First call per problem class: select() picks a kernel for
//     (format, bits/zeros/bias, m-bucket, weight residency, row length,
//     group length, thread count, core cluster): the measured winner when a tuning table (tuning_table.h)
//     has the class, else the static policy (priority + bonuses). The cache
//     keeps the choice; the hot path is one relaxed atomic load, no lock.
// Both are pure functions of (CPU descriptor, overrides, tuning table,
// registry), so tests run them on fake CPUs.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/select/cpu_descriptor.h"
#include "kernels/select/kernel_registry.h"
#include "kernels/select/tuning_table.h"

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
// Throws std::invalid_argument naming `what` and the first pattern of the list
// that matches no kernel of the registry.
void check_name_patterns(const std::string& patterns_csv, const char* what);

// m = 1, 2, 3, 4-7, 8-15, 16-31, 32-63, 64-127, 128+: powers of two, except
// that m = 2 and m = 3 are buckets of their own. Decode-sized calls are where
// the rows differ most: on a Zen 4 core the prefetching GEMV (one pass per
// row) wins m = 2 at 2 bits in every point measured and loses m = 3 in every
// one (docs/benchmarks.md, run 13), so one bucket for both had to be wrong for
// one of them.
constexpr int kMBuckets = 9;
int m_bucket(int64_t m);
const char* m_bucket_name(int bucket);
int m_bucket_lo(int bucket);
int m_bucket_hi(int bucket);  // 0 = unbounded

// Where a call's packed weights live, from their size against the caches:
// per-thread bytes within L2, all bytes within the last-level cache, or
// beyond it (streamed from DRAM, as in LLM decode).
enum WeightResidency : int { kResidencyL2 = 0, kResidencyLlc = 1, kResidencyDram = 2 };
constexpr int kResidencies = 3;
const char* residency_name(int residency);  // "l2", "llc", "dram"
int weight_residency(const CpuDescriptor& cpu, int64_t weight_bytes, int threads);

// How long each output channel's run of packed weight bytes is: a GEMV
// streams one column step of 32 such rows at a time, and whether prefetching
// the next step beats the hardware prefetchers depends on it (short rows:
// the prefetchers cannot ramp up within a step; long rows: they do, and the
// extra prefetches only cost). Short: at most kShortRowBytes bytes of
// quantized weights per output channel (k * bits / 8); medium: at most
// kMediumRowBytes; long: more. Where the rows change their order: the
// prefetching GEMVs lead up to 576 bytes, are level at 768-1024 and behind
// beyond; at m = 2 on a Zen 4 core the 256-bit 4x16 tile (one block stream)
// leads the 4x32 tile up to 576 bytes and trails it from 768
// (docs/benchmarks.md, runs 13 and 14).
enum WeightRows : int { kRowsShort = 0, kRowsMedium = 1, kRowsLong = 2 };
constexpr int kRowLengths = 3;
constexpr int64_t kShortRowBytes = 576;
constexpr int64_t kMediumRowBytes = 1024;
const char* row_length_name(int rows);  // "short-rows", "medium-rows", "long-rows"
const char* row_kind_name(int rows);    // "short", "medium", "long" (the manifest's words)
std::string row_length_text(int rows);  // for explain(): the kind and its byte range
int weight_row_length(int64_t k, int bits);

// How long the weights' scale groups are: short groups (at most
// kShortGroupValues values, e.g. the common 32) carry a float epilogue per
// group; long ones (per-channel weights, group = k) hardly any, and the
// shared-unpack tiles take them chunk by chunk with int32 sums
// (kernels/x86/ymm_gemm_impl.h), so which tile wins can differ.
enum WeightGroups : int { kGroupsShort = 0, kGroupsLong = 1 };
constexpr int kGroupLengths = 2;
const char* group_length_name(int groups);  // "short-groups", "long-groups"
int weight_group_length(int64_t group_size);
extern const int kShortGroupValues;  // the shared-unpack tiles' largest one-chunk group (manifest)

constexpr int kThreadBuckets = 4;  // threads = 1, 2, 3-4, 5+
int thread_bucket(int threads);
const char* thread_bucket_name(int bucket);

struct ProblemClass {
  FormatId format;
  int bits;
  bool zeros, bias;
  int bucket;  // m-bucket (linear); 0 for embedding lookups
  KernelOp op = KernelOp::kLinear;
  // Unknown residency (explain() without a buffer, info()) counts as DRAM:
  // the decode case the static policy is written for.
  int residency = kResidencyDram;
  // Unknown row length counts as long: the layers of the LLMs decode is
  // written for (k >= 2048 at 4 bits).
  int rows = kRowsLong;
  // Unknown group length counts as short: the default group of 32.
  int groups = kGroupsShort;
  int threads = 0;  // thread_bucket() of the op's thread count
};

struct Candidate {
  const KernelInfo* kernel;
  bool eligible;       // may win under the static policy
  bool runnable;       // may run for this class (a table may choose it): eligible,
                       // or rejected only for its m range
  std::string reason;  // why rejected, or how the score was made
  int score;
};

struct Selection {
  const KernelInfo* winner = nullptr;
  const KernelInfo* static_winner = nullptr;  // what the static policy picks
  std::vector<Candidate> candidates;  // every registry row, in registry order
  std::string error;                  // non-empty when an override makes selection fail
  std::string source = "static";      // "static" or "table"
  std::string note;                   // how the table entry was applied, when one exists
  TunedChoice tuned;                  // the table entry (empty winner: none)
};

// Pure selection. cluster indexes cpu.clusters. With a table (matching this
// CPU and build), a class it holds goes to its measured winner if that row
// may run here under the overrides, else to the fastest measured row that
// may; classes it lacks, or whose measured rows all are ruled out, go to the
// static policy.
Selection select_kernel(const CpuDescriptor& cpu, const Overrides& ov, const ProblemClass& pc,
                        int cluster, const TuningTable* table = nullptr);

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

  // The cached choice, or nullptr when the class has not been selected yet.
  const KernelInfo* cached(const ProblemClass& pc, int cluster) const;
  // The full selection the cached choice came from (explain()).
  Selection explain(const CpuDescriptor& cpu, const ProblemClass& pc, int cluster);

  Overrides overrides() const;
  // Replaces the overrides (validated first) and clears the cache.
  void set_overrides(const Overrides& ov);
  void clear_cache();

  // Tuning table: setting "" = the default path for this CPU (if the file
  // exists), "0" = none, anything else a file path. Starts from
  // TORCHAO_KERNELS_TUNING; loaded lazily at the first selection. Changing it
  // clears the cache.
  void set_tuning(const std::string& setting);
  std::string tuning_setting() const;
  // The table in force for the active CPU (nullptr: none), loading it if needed.
  std::shared_ptr<const TuningTable> tuning_table();
  // Status for info(): setting, path, loaded entries, why a table was ignored.
  std::string tuning_json();
  // Adds measured entries in memory (first-use tuning), on top of the table.
  void add_tuned(const std::string& key, const TunedChoice& choice);
  // TORCHAO_KERNELS_TUNE=first-use: tune a class missing from the table on its first call.
  bool tune_on_first_use() const { return tune_first_use_; }

  // Per-kernel call counters (stats()).
  void count(const KernelInfo& k);
  std::vector<std::pair<std::string, int64_t>> stats() const;
  void reset_stats();

 private:
  Selector();
  static constexpr int kMaxFormats = 8, kMaxClusters = kMaxCpuClusters, kVariants = 8 * 4, kOps = 2;
  static int slot(const ProblemClass& pc, int cluster);
  void load_table_locked();
  std::atomic<int16_t> cache_[kOps * kMaxFormats * kVariants * kMBuckets * kResidencies *
                              kRowLengths * kGroupLengths * kThreadBuckets * kMaxClusters];
  std::vector<std::atomic<int64_t>> counts_;
  Overrides overrides_;
  std::string env_error_;  // invalid environment overrides, reported at first use
  std::string tuning_setting_;
  bool table_loaded_ = false, tune_first_use_ = false;
  const CpuDescriptor* table_cpu_ = nullptr;  // the active CPU the table was checked against
  std::shared_ptr<const TuningTable> table_;
  std::string table_status_;  // what happened to the table ("" = not looked at yet)
  mutable std::mutex mu_;
};

// Warnings of the selection layer (an ignored tuning table): the torch
// extension routes them to Python's warnings; by default they go to stderr.
void set_selection_warning_handler(void (*handler)(const std::string&));

}  // namespace torchao_kernels
