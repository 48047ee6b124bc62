// Tuning tables: kernel choices measured on one CPU, persisted as JSON.
//
// Every kernel of a class gives bit-identical results, so a table can change
// only speed. A table is keyed by a CPU signature (the exact part, per-cluster
// uarch, the ISA features the OS enables, cache sizes, core count) and stamped
// with the kernel-set version (a hash of the registry rows); a table whose
// stamp does not match this process is ignored as a whole, with one warning.
// Entries map a problem class (class_key) to the measured winner and the
// times of every row timed. Selection still filters every row by the CPU's ISA
// and the overrides: a table can only choose among rows that may run.
//
// Written by torchao_kernels.tune() (Python); read here, by the torch
// extension and the ExecuTorch kernel library alike.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/select/cpu_descriptor.h"

namespace torchao_kernels {

struct ProblemClass;

constexpr int kTuningTableVersion = 1;
constexpr const char* kTuningTableSchema = "torchao_kernels.tuning";

struct TunedChoice {
  std::string winner;                                  // a registry row's name
  // The static policy's choice when the class was tuned ("static"; "" when
  // absent or not a row of this build). An entry whose winner is that row
  // records only that no other row beat it clearly; once the static policy
  // chooses another row, selection weighs the two on the entry's own times
  // (selector.cpp, apply_table).
  std::string static_when_tuned;
  std::vector<std::pair<std::string, double>> times_us;  // every row timed, fastest first
  // tune()'s second look, when it had one: the rows timed again (fastest
  // first) and each one's share of rounds won against the static choice.
  std::vector<std::pair<std::string, double>> confirm_us;
  std::vector<std::pair<std::string, double>> confirm_wins;
};

struct TuningTable {
  std::string path;           // where it was read from ("" = built in memory)
  std::string cpu_signature;  // as written by tune()
  std::string kernel_set;     // kernel_set_version() when tuned
  std::map<std::string, TunedChoice> entries;  // class_key -> choice
  const TunedChoice* find(const std::string& key) const {
    auto it = entries.find(key);
    return it == entries.end() ? nullptr : &it->second;
  }
};

// "linear/n16k4/b4/z0/bias0/m1/dram/long-rows/short-groups/t1/c0": op,
// format, bits, zeros, bias, m-bucket, weight residency, row length, group
// length, thread bucket, core cluster.
std::string class_key(const ProblemClass& pc, int cluster);

// The CPU signature a table must match (human-readable; see the header).
std::string cpu_signature(const CpuDescriptor& cpu);
// A short file-name-safe form: "<vendor>-<family>-<model>-<stepping>-<hash>".
std::string cpu_signature_file_id(const CpuDescriptor& cpu);
// FNV-1a hash (hex) over every registry row's name and selection fields.
std::string kernel_set_version();

// $XDG_CACHE_HOME/torchao_kernels/tuning (else $HOME/.cache/...), "" if neither is set.
std::string default_tuning_dir();
// default_tuning_dir() + "/" + cpu_signature_file_id(cpu) + ".json" ("" without a directory).
std::string default_tuning_path(const CpuDescriptor& cpu);

// ---- When a measurement may override the static policy ----------------------
// One rule for `tune`'s second look (Python, through an internal op) and for
// TORCHAO_KERNELS_TUNE=first-use; its constants are the manifest's [tuning]
// (kTuneRounds, kTuneOverrideMargin, kTuneOverrideWins in
// kernels/generated/kernel_functions.h).

// Rows' times, in any one unit; order matters only to break exact ties (the
// first listed wins).
using RowTimes = std::vector<std::pair<std::string, double>>;
// A row's time in `t` (its last entry, as a JSON object's repeated name
// reads), or nullptr when `t` has none.
const double* time_of(const RowTimes& t, const std::string& row);
// Per row, its samples of one point, the i-th taken in round i.
using RoundSamples = std::vector<std::pair<std::string, std::vector<double>>>;

// Each row's share of the rounds (pooled over the points) in which
// static_row took at least 1 + margin times its time in the same round.
// Rows never paired with static_row (it has no samples there) are left out.
RowTimes paired_wins(const std::vector<RoundSamples>& samples_per_point, const std::string& static_row,
                     double margin);

// The row a measured class should run, from the first pass's times and a
// second look's (rows timed again, interleaved; empty when there was none):
// without a second look, the first pass's fastest. Otherwise the second
// look's fastest, unless static_row ("" = none) took less than 1 + margin
// times its time there, or (wins: paired_wins against static_row) it won
// fewer than min_wins of the rounds: then static_row. A near-tie, or a lead
// some rounds contradict, is not worth overriding the policy for. Returns ""
// when first and second are both empty.
std::string confirmed_winner(const RowTimes& first, const RowTimes& second, const std::string& static_row,
                             double margin, const RowTimes* wins, double min_wins);

struct KernelInfo;
// Whether tuning (tune() and first-use) times `kernel` in a class of m-bucket
// `bucket`: a row meant for m = [m_min, m_max] is raced while the bucket
// starts at most kTuneRangeFactor * m_max (m_max 0: no bound) and ends at
// least m_min / kTuneRangeFactor (an unbounded bucket: always)
// (kernels/manifest.toml [tuning] range_factor: a GEMV runs an m-row call as
// m passes; a tile meant for m >= 8 computes its rows in whole tiles).
bool raced_in_bucket(const KernelInfo& kernel, int bucket);

// Parses a table. Returns nullptr and sets why on any problem: unreadable
// JSON, wrong schema or version, a signature or kernel-set mismatch (against
// `cpu` and this build). Entries that name no registry row are dropped (and
// counted in *dropped).
std::unique_ptr<TuningTable> parse_tuning_table(const std::string& text, const CpuDescriptor& cpu,
                                                std::string& why, int* dropped = nullptr);

}  // namespace torchao_kernels
