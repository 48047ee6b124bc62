#include "kernels/select/selector.h"

#include <fnmatch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

#include "kernels/format/packed_format.h"
#include "kernels/generated/kernel_functions.h"
#include "kernels/select/json_reader.h"
#include "kernels/select/json_writer.h"

namespace torchao_kernels {

namespace {

constexpr int kOutsideMRangePenalty = 1000;

constexpr uint64_t kX86Features = kIsaSse42 | kIsaAvx2 | kIsaFma | kIsaAvx512f | kIsaAvx512bw |
                                  kIsaAvx512vl | kIsaAvx512vnni | kIsaAvxvnni | kIsaAmx;

// The architecture a registry row is for (kOther: portable code, any CPU).
Arch kernel_arch(const KernelInfo& k) {
  if (k.required_isa == 0) return Arch::kOther;
  return (k.required_isa & kX86Features) ? Arch::kX86_64 : Arch::kAarch64;
}

constexpr Arch build_arch() {
#if defined(__x86_64__)
  return Arch::kX86_64;
#elif defined(__aarch64__)
  return Arch::kAarch64;
#else
  return Arch::kOther;
#endif
}

struct IsaLevel {
  const char* name;
  uint64_t allowed;
};
constexpr uint64_t kX86Avx2Set = kIsaSse42 | kIsaAvx2 | kIsaFma;
constexpr uint64_t kX86Avx512Set = kX86Avx2Set | kIsaAvx512f | kIsaAvx512bw | kIsaAvx512vl | kIsaAvx512dq;
const IsaLevel kIsaLevels[] = {
    {"reference", 0},
    {"sse4.2", kIsaSse42},
    {"avx2", kX86Avx2Set},
    {"avxvnni", kX86Avx2Set | kIsaAvxvnni},
    {"avx512", kX86Avx512Set},
    {"avx512vnni", kX86Avx512Set | kIsaAvx512vnni | kIsaAvxvnni},
    {"amx", kX86Avx512Set | kIsaAvx512vnni | kIsaAvxvnni | kIsaAmx},
    {"neon", kIsaNeon},
    {"dotprod", kIsaNeon | kIsaDotprod},
    {"i8mm", kIsaNeon | kIsaDotprod | kIsaI8mm | kIsaBf16},
    {"sve", kIsaNeon | kIsaDotprod | kIsaI8mm | kIsaBf16 | kIsaSve | kIsaSve2},
    {"sme", kIsaNeon | kIsaDotprod | kIsaI8mm | kIsaBf16 | kIsaSve | kIsaSve2 | kIsaSme},
};

std::vector<std::string> split_csv(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream is(s);
  while (std::getline(is, cur, ',')) {
    size_t a = cur.find_first_not_of(" \t"), b = cur.find_last_not_of(" \t");
    if (a != std::string::npos) out.push_back(cur.substr(a, b - a + 1));
  }
  return out;
}

std::string isa_list(uint64_t isa) {
  std::string s;
  for (const auto& n : isa_names(isa)) s += (s.empty() ? "" : "+") + n;
  return s.empty() ? "none" : s;
}

// The table's choice for this class, among the rows that may run here.
void apply_table(const TuningTable& table, const ProblemClass& pc, int cluster, Selection& sel) {
  const TunedChoice* t = table.find(class_key(pc, cluster));
  if (!t) return;
  sel.tuned = *t;
  auto runnable = [&](const std::string& name) -> Candidate* {
    for (auto& c : sel.candidates)
      if (c.runnable && name == c.kernel->name) return &c;
    return nullptr;
  };
  Candidate* pick = runnable(t->winner);
  // An entry that kept the static choice of its day (no row beat it by the
  // override margin) says nothing against today's static choice, unless its
  // own times put the old choice ahead by that margin: confirmed_winner's
  // rule, with the old choice as the challenger. Without it a table tuned
  // before the static policy changed would hold every class on the old
  // choice (a stale table that looks fresh).
  const char* now_static = sel.static_winner ? sel.static_winner->name : nullptr;
  if (pick && now_static && t->winner == t->static_when_tuned && t->winner != now_static) {
    // The second look's times where it timed both rows, else the first pass's.
    const RowTimes& from = time_of(t->confirm_us, t->winner) && time_of(t->confirm_us, now_static) ? t->confirm_us
                                                                                                    : t->times_us;
    const double* kept = time_of(from, t->winner);
    const double* now = time_of(from, now_static);
    if (!kept || !now ||
        confirmed_winner({}, {{t->winner, *kept}, {now_static, *now}}, now_static, kTuneOverrideMargin, nullptr,
                         0.0) == now_static) {
      std::ostringstream os;
      os << "the table kept " << t->winner << ", the static choice when it was tuned";
      if (kept && now) os << " (" << *kept << " us against " << *now << " us for " << now_static << ")";
      os << "; the static policy now chooses " << now_static << ": static policy";
      sel.note = os.str();
      return;
    }
    sel.note = "measured winner (the static choice when the class was tuned, more than " +
               std::to_string(static_cast<int>(kTuneOverrideMargin * 100 + 0.5)) +
               "% faster than today's static choice " + now_static + ")";
  } else if (pick) {
    sel.note = "measured winner";
  } else {
    // Ruled out here (overrides, or a table naming a row this CPU cannot
    // run): the fastest measured row that may run, else the static policy.
    double best = -1;
    for (const auto& kv : t->times_us) {
      Candidate* c = runnable(kv.first);
      if (c && (best < 0 || kv.second < best)) {
        pick = c;
        best = kv.second;
      }
    }
    if (!pick) {
      sel.note = "the table's rows for this class cannot run here (" + t->winner +
                 " measured fastest): static policy";
      return;
    }
    sel.note = "the table's winner " + t->winner + " cannot run here: fastest measured row that can";
  }
  sel.winner = pick->kernel;
  sel.source = "table";
  if (const double* us = time_of(t->times_us, pick->kernel->name)) {
    std::ostringstream os;
    os << " [table: " << *us << " us measured]";
    pick->reason += os.str();
  }
}

}  // namespace

std::string Overrides::to_json() const {
  return JsonObject().str("max_isa", max_isa).str("force", force).str("exclude", exclude).done();
}

std::vector<std::string> isa_levels() {
  std::vector<std::string> v;
  for (const auto& l : kIsaLevels) v.push_back(l.name);
  return v;
}

uint64_t isa_cap_mask(const std::string& max_isa) {
  if (max_isa.empty()) return ~uint64_t{0};
  for (const auto& l : kIsaLevels)
    if (max_isa == l.name) return l.allowed;
  std::string msg = "max_isa (TORCHAO_KERNELS_MAX_ISA) must be one of:";
  for (const auto& l : kIsaLevels) msg += std::string(" ") + l.name;
  throw std::invalid_argument(msg + "; got '" + max_isa + "'");
}

bool name_matches(const std::string& patterns_csv, const char* name) {
  for (const auto& p : split_csv(patterns_csv)) {
    if (p.find_first_of("*?[") == std::string::npos) {
      if (std::string(name).find(p) != std::string::npos) return true;
    } else if (fnmatch(p.c_str(), name, 0) == 0) {
      return true;
    }
  }
  return false;
}

void check_name_patterns(const std::string& patterns_csv, const char* what) {
  for (const auto& p : split_csv(patterns_csv)) {
    bool any = false;
    for (const auto& k : kernel_registry()) {
      if (name_matches(p, k.name)) {
        any = true;
        break;
      }
    }
    // The registry holds every kernel of every ISA in any build, so a pattern
    // that names none is a typo; as an exclude it would otherwise do nothing.
    if (!any) {
      throw std::invalid_argument(std::string(what) + " pattern '" + p +
                                  "' matches no kernel (python -m torchao_kernels info lists them)");
    }
  }
}

namespace {
// Each bucket's first m; the last bucket is unbounded.
constexpr int kMBucketLo[kMBuckets] = {1, 2, 3, 4, 8, 16, 32, 64, 128};
}  // namespace

int m_bucket(int64_t m) {
  int b = 0;
  while (b < kMBuckets - 1 && kMBucketLo[b + 1] <= m) ++b;
  return b;
}
int m_bucket_lo(int b) { return kMBucketLo[b]; }
int m_bucket_hi(int b) { return b == kMBuckets - 1 ? 0 : kMBucketLo[b + 1] - 1; }
const char* m_bucket_name(int b) {
  static const char* names[kMBuckets] = {"1",     "2",     "3",      "4-7", "8-15",
                                         "16-31", "32-63", "64-127", "128+"};
  return names[b];
}

const char* residency_name(int r) {
  static const char* names[kResidencies] = {"l2", "llc", "dram"};
  return r >= 0 && r < kResidencies ? names[r] : "?";
}

int weight_residency(const CpuDescriptor& cpu, int64_t weight_bytes, int threads) {
  const int64_t per_thread = weight_bytes / std::max(1, threads);
  if (cpu.l2_bytes > 0 && per_thread <= cpu.l2_bytes) return kResidencyL2;
  if (cpu.l3_bytes > 0 && weight_bytes <= cpu.l3_bytes) return kResidencyLlc;
  return kResidencyDram;
}

const char* row_length_name(int r) {
  static const char* names[kRowLengths] = {"short-rows", "medium-rows", "long-rows"};
  return r >= 0 && r < kRowLengths ? names[r] : "?";
}

std::string row_length_text(int r) {
  const std::string bytes = r == kRowsShort    ? "<= " + std::to_string(kShortRowBytes)
                            : r == kRowsMedium ? std::to_string(kShortRowBytes + 1) + ".." + std::to_string(kMediumRowBytes)
                                               : "> " + std::to_string(kMediumRowBytes);
  return std::string(row_kind_name(r)) + " rows (" + bytes + " weight bytes per output channel)";
}

const char* row_kind_name(int r) {
  static const char* names[kRowLengths] = {"short", "medium", "long"};
  return r >= 0 && r < kRowLengths ? names[r] : "?";
}

int weight_row_length(int64_t k, int bits) {
  return k * bits <= kShortRowBytes * 8 ? kRowsShort : k * bits <= kMediumRowBytes * 8 ? kRowsMedium : kRowsLong;
}

const int kShortGroupValues = kSharedUnpackMaxGroupSize;

const char* group_length_name(int g) {
  static const char* names[kGroupLengths] = {"short-groups", "long-groups"};
  return g >= 0 && g < kGroupLengths ? names[g] : "?";
}

int weight_group_length(int64_t group_size) {
  return group_size > kShortGroupValues ? kGroupsLong : kGroupsShort;
}

int thread_bucket(int threads) { return threads <= 1 ? 0 : threads == 2 ? 1 : threads <= 4 ? 2 : 3; }
const char* thread_bucket_name(int b) {
  static const char* names[kThreadBuckets] = {"1", "2", "3-4", "5+"};
  return b >= 0 && b < kThreadBuckets ? names[b] : "?";
}

Selection select_kernel(const CpuDescriptor& cpu, const Overrides& ov, const ProblemClass& pc,
                        int cluster, const TuningTable* table) {
  Selection sel;
  const uint64_t cap = isa_cap_mask(ov.max_isa);
  const UarchClass uc = cluster < static_cast<int>(cpu.clusters.size())
                            ? cpu.clusters[cluster].uarch_class
                            : UarchClass::kUnknown;
  const int lo = m_bucket_lo(pc.bucket), hi = m_bucket_hi(pc.bucket);
  // force names kernels of one op or the other: it applies to this op's
  // selection when it matches one of its rows, or when it matches no row at
  // all (then selection fails and says so).
  bool forcing = !ov.force.empty();
  if (forcing) {
    bool this_op = false, any = false;
    for (const auto& k : kernel_registry()) {
      if (!name_matches(ov.force, k.name)) continue;
      any = true;
      this_op = this_op || k.op == pc.op;
    }
    forcing = this_op || !any;
  }
  std::string force_failure;
  // An m range [m_min, m_max] (m_max 0 = unbounded) holds the class's whole
  // m-bucket: a row's own range, or the range of one of its core-class bonuses.
  auto covers_bucket = [&](int m_min, int m_max) {
    return m_min <= lo && (m_max == 0 || (hi != 0 && m_max >= hi));
  };
  auto range_text = [](int m_min, int m_max) {
    return std::to_string(m_min) + ".." + (m_max ? std::to_string(m_max) : std::string("inf"));
  };
  auto fits_m = [&](const KernelInfo& k) { return covers_bucket(k.m_min, k.m_max); };
  auto m_range = [&](const KernelInfo& k) { return range_text(k.m_min, k.m_max); };
  // On a CPU with several core types the op quantizes the activations once,
  // with the layout of cluster 0's kernel; every other cluster chooses among
  // the rows that read that layout, so what explain() names is what runs.
  const KernelInfo* leader = nullptr;
  if (cluster > 0 && pc.op == KernelOp::kLinear) leader = select_kernel(cpu, ov, pc, 0, table).winner;
  for (const auto& k : kernel_registry()) {
    Candidate c{&k, false, false, "", 0};
    const FormatInfo* kf = find_format(k.format);
    const uint64_t missing = k.required_isa & ~cpu.isa;
    const uint64_t capped = k.required_isa & cpu.isa & ~cap;
    const bool forced = forcing && name_matches(ov.force, k.name);
    const Arch karch = kernel_arch(k);
    if (k.op != pc.op) {
      c.reason = k.op == KernelOp::kEmbedding ? "an embedding kernel, not a linear kernel"
                                              : "a linear kernel, not an embedding kernel";
    } else if (karch != Arch::kOther && karch != cpu.arch) {
      c.reason = std::string("a kernel for ") + arch_name(karch) + " CPUs";
      if (forced) force_failure = std::string("forced kernel ") + k.name + " is a kernel for " +
                                  arch_name(karch) + " CPUs; this CPU (" + cpu.name + ") is " +
                                  arch_name(cpu.arch);
    } else if (!k.compiled() && cpu.arch == build_arch()) {
      c.reason = "not compiled into this build";
    } else if (k.format != pc.format) {
      c.reason = std::string("reads format ") + kf->name + ", not " + find_format(pc.format)->name;
    } else if (missing) {
      c.reason = "needs " + isa_list(missing) + ", which this CPU lacks";
      if (forced) force_failure = std::string("forced kernel ") + k.name + " needs " +
                                  isa_list(missing) + ", which this CPU (" + cpu.name + ") lacks";
    } else if (capped) {
      c.reason = "needs " + isa_list(capped) + ", above max_isa=" + ov.max_isa;
      if (forced) force_failure = std::string("forced kernel ") + k.name + " needs " +
                                  isa_list(capped) + ", above max_isa=" + ov.max_isa;
    } else if (!(k.bits_mask & (1u << (pc.bits - 1)))) {
      c.reason = "does not support " + std::to_string(pc.bits) + "-bit weights";
    } else if (pc.groups == kGroupsLong && !k.long_groups) {
      c.reason = "takes groups of at most " + std::to_string(kShortGroupValues) +
                 " values (its L1 chunks), not long groups";
      if (forced) force_failure = std::string("forced kernel ") + k.name + " takes groups of at most " +
                                  std::to_string(kShortGroupValues) + " values; these weights have longer groups";
    } else if ((pc.zeros && !k.zeros) || (pc.bias && !k.bias)) {
      c.reason = pc.zeros && !k.zeros ? "does not support weight zero points"
                                      : "does not support bias";
    } else if (leader && (k.lhs_panel_rows != leader->lhs_panel_rows ||
                          (k.lhs_panel_rows && (k.lhs_panel_kr != leader->lhs_panel_kr ||
                                                k.lhs_panel_int16 != leader->lhs_panel_int16)))) {
      auto layout = [](const KernelInfo& r) {
        return r.lhs_panel_rows ? "panels of " + std::to_string(r.lhs_panel_rows) + "x" +
                                      std::to_string(r.lhs_panel_kr) + (r.lhs_panel_int16 ? " int16" : "")
                                : std::string("rows");
      };
      c.reason = "reads activations as " + layout(k) + "; the op quantizes them for cluster 0's " +
                 leader->name + " (" + layout(*leader) + ")";
    } else if (!ov.exclude.empty() && name_matches(ov.exclude, k.name)) {
      c.reason = "excluded by exclude='" + ov.exclude + "'";
    } else if (forcing && !forced) {
      c.reason = "not matched by force='" + ov.force + "'";
    } else if (!forced && pc.op == KernelOp::kLinear && !fits_m(k)) {
      c.runnable = true;
      c.reason = "meant for m in " + m_range(k) + ", not " + m_bucket_name(pc.bucket);
    } else {
      c.eligible = c.runnable = true;
      c.score = k.priority;
      std::string why = "priority " + std::to_string(k.priority);
      if (pc.residency >= 0 && pc.residency < kResidencies && k.residency_bonus[pc.residency]) {
        const int b = k.residency_bonus[pc.residency];
        c.score += b;
        why += std::string(b >= 0 ? " + " : " - ") + std::to_string(std::abs(b)) + " with the weights in " +
               residency_name(pc.residency);
      }
      if (pc.rows >= 0 && pc.rows < kRowLengths && k.rows_bonus[pc.rows]) {
        const int b = k.rows_bonus[pc.rows];
        c.score += b;
        why += std::string(b >= 0 ? " + " : " - ") + std::to_string(std::abs(b)) + " with " +
               row_length_text(pc.rows);
      }
      if (pc.op == KernelOp::kLinear && !fits_m(k)) {
        // Forcing admits any m (every kernel handles any m), but among several
        // forced kernels the ones meant for this m still win.
        c.score -= kOutsideMRangePenalty;
        why += " - " + std::to_string(kOutsideMRangePenalty) + " (m outside its range " + m_range(k) + ")";
      }
      for (const auto& p : k.uarch_prefs) {
        if (p.uarch_class == uc && (pc.op != KernelOp::kLinear || covers_bucket(p.m_min, p.m_max)) &&
            pc.bits >= p.bits_min && pc.bits <= p.bits_max && (p.residency < 0 || p.residency == pc.residency) &&
            (p.groups < 0 || p.groups == pc.groups) && (p.rows < 0 || p.rows == pc.rows) &&
            (p.threads < 0 || p.threads == pc.threads)) {
          c.score += p.bonus;
          why += std::string(p.bonus >= 0 ? " + " : " - ") + std::to_string(std::abs(p.bonus)) +
                 " on " + uarch_class_name(uc) + " cores";
          if (p.m_min != 1 || p.m_max != 0) why += " at m " + range_text(p.m_min, p.m_max);
          if (p.bits_min != 1 || p.bits_max != 8)
            why += " for " + (p.bits_min == p.bits_max ? std::to_string(p.bits_min)
                                                       : std::to_string(p.bits_min) + ".." +
                                                             std::to_string(p.bits_max)) +
                   "-bit weights";
          if (p.residency >= 0) why += std::string(" with the weights in ") + residency_name(p.residency);
          if (p.groups >= 0)
            why += std::string(" with ") + (p.groups == kGroupsLong ? "long groups (> " : "short groups (<= ") +
                   std::to_string(kShortGroupValues) + " values)";
          if (p.rows >= 0) why += " with " + row_length_text(p.rows);
          if (p.threads >= 0) why += std::string(" on ") + thread_bucket_name(p.threads) + " threads";
        }
      }
      if (forced) why += " (forced)";
      c.reason = why;
    }
    sel.candidates.push_back(c);
  }
  int best = -1;  // highest score; ties go to the earlier registry row
  for (size_t i = 0; i < sel.candidates.size(); ++i) {
    const Candidate& c = sel.candidates[i];
    if (c.eligible && (best < 0 || c.score > sel.candidates[best].score)) best = static_cast<int>(i);
  }
  if (best >= 0) sel.static_winner = sel.winner = sel.candidates[best].kernel;
  if (table) apply_table(*table, pc, cluster, sel);
  if (sel.winner) return sel;
  if (!force_failure.empty()) {
    sel.error = force_failure;
  } else if (forcing) {
    sel.error = "force='" + ov.force + "' matches no kernel that can run format " +
                find_format(pc.format)->name + " with " + std::to_string(pc.bits) +
                "-bit weights on this CPU";
  } else {
    sel.error = std::string("no kernel can run format ") + find_format(pc.format)->name +
                " (exclude='" + ov.exclude + "' removed them all)";
  }
  return sel;
}

FormatId best_format(const CpuDescriptor& cpu, const Overrides& ov, int bits, bool zeros,
                     bool bias) {
  // The format whose best kernel (at m = 1 and at m = 128+, summed) scores
  // highest; ties go to the lower format id (the smaller layout). A format
  // whose kernels run at one end only (a forced GEMV scores its penalty
  // outside its m range) still beats one with none; with no kernel left for
  // any format (force or exclude), the first selection's error says why.
  int count;
  const FormatInfo* fs = formats(&count);
  int best = -1, best_ends = 0;
  long best_score = 0;
  std::string why;
  for (int i = 0; i < count; ++i) {
    long score = 0;
    int ends = 0;
    for (int bucket : {0, kMBuckets - 1}) {
      Selection s = select_kernel(cpu, ov, ProblemClass{fs[i].id, bits, zeros, bias, bucket}, 0);
      if (!s.winner) {
        if (why.empty()) why = s.error;
        continue;
      }
      ++ends;
      for (const auto& c : s.candidates)
        if (c.kernel == s.winner) score += c.score;
    }
    if (ends > best_ends || (ends == best_ends && ends > 0 && score > best_score)) {
      best = i;
      best_ends = ends;
      best_score = score;
    }
  }
  if (best < 0) throw std::invalid_argument("no packed format has a kernel to run here: " + why);
  return fs[best].id;
}

FormatId resolve_target(const std::string& target, const CpuDescriptor& cpu, const Overrides& ov,
                        int bits, bool zeros, bool bias) {
  // torchao's targets name its kernel libraries; ours is one family, so:
  //   "universal" (torchao's portable kernels)  -> the best format for this CPU
  //   "kleidiai"  (ARM KleidiAI kernels)        -> the best format for this CPU
  //   "aten"      (ATen's generic int4 path)    -> n1k4, the portable format
  if (target.empty() || target == "auto" || target == "native" || target == "universal" ||
      target == "kleidiai")
    return best_format(cpu, ov, bits, zeros, bias);
  if (target == "aten") return FormatId::kN1K4;
  if (const FormatInfo* f = find_format(target)) return f->id;
  std::string msg = "target must be None, 'auto', 'universal', 'kleidiai', 'aten' or a format name (";
  int count;
  const FormatInfo* fs = formats(&count);
  for (int i = 0; i < count; ++i) msg += std::string(i ? ", " : "") + "'" + fs[i].name + "'";
  throw std::invalid_argument(msg + "); got '" + target + "'");
}

// ---------------------------------------------------------------------------

Selector& Selector::get() {
  static Selector s;
  return s;
}

Selector::Selector() : counts_(kernel_registry().size()) {
  // The cache indexes formats by id (never folded): a build with more formats
  // needs a larger kMaxFormats.
  int nformats = 0;
  const FormatInfo* fmts = formats(&nformats);
  for (int i = 0; i < nformats; ++i) {
    if (static_cast<int>(fmts[i].id) >= kMaxFormats) {
      throw std::logic_error(std::string("format ") + fmts[i].name + " has id " +
                             std::to_string(static_cast<int>(fmts[i].id)) +
                             "; the selection cache indexes ids below " +
                             std::to_string(kMaxFormats));
    }
  }
  for (auto& c : cache_) c.store(-1, std::memory_order_relaxed);
  for (auto& c : counts_) c.store(0, std::memory_order_relaxed);
  auto env = [](const char* n) {
    const char* v = std::getenv(n);
    return std::string(v ? v : "");
  };
  overrides_.max_isa = env("TORCHAO_KERNELS_MAX_ISA");
  overrides_.force = env("TORCHAO_KERNELS_FORCE");
  overrides_.exclude = env("TORCHAO_KERNELS_EXCLUDE");
  try {
    isa_cap_mask(overrides_.max_isa);
    check_name_patterns(overrides_.force, "force (TORCHAO_KERNELS_FORCE)");
    check_name_patterns(overrides_.exclude, "exclude (TORCHAO_KERNELS_EXCLUDE)");
  } catch (const std::invalid_argument& e) {
    env_error_ = e.what();
  }
  tuning_setting_ = env("TORCHAO_KERNELS_TUNING");
  const std::string tune = env("TORCHAO_KERNELS_TUNE");
  if (tune == "first-use") {
    tune_first_use_ = true;
  } else if (!tune.empty() && tune != "off" && tune != "0") {
    env_error_ = "TORCHAO_KERNELS_TUNE must be 'first-use' or 'off'; got '" + tune + "'";
  }
}

// Whether the class's residency, row length and thread bucket index the cache.
static bool in_cache_range(const ProblemClass& pc) {
  return pc.residency >= 0 && pc.residency < kResidencies && pc.rows >= 0 && pc.rows < kRowLengths &&
         pc.groups >= 0 && pc.groups < kGroupLengths && pc.threads >= 0 && pc.threads < kThreadBuckets;
}

int Selector::slot(const ProblemClass& pc, int cluster) {
  const int variant = (pc.bits - 1) * 4 + (pc.zeros ? 2 : 0) + (pc.bias ? 1 : 0);
  const int f = static_cast<int>(pc.format);
  const int op = static_cast<int>(pc.op);
  const int where = ((pc.residency * kRowLengths + pc.rows) * kGroupLengths + pc.groups) * kThreadBuckets + pc.threads;
  return ((((op * kMaxFormats + f) * kVariants + variant) * kMBuckets + pc.bucket) *
              (kResidencies * kRowLengths * kGroupLengths * kThreadBuckets) + where) * kMaxClusters + cluster;
}

void check_selection_cache_fits(const CpuDescriptor& cpu) {
  const size_t n = cpu.clusters.size();
  if (n > static_cast<size_t>(kMaxCpuClusters)) {
    throw std::invalid_argument("CPU descriptor '" + cpu.name + "' has " + std::to_string(n) +
                                " core clusters; the selection cache indexes at most " +
                                std::to_string(kMaxCpuClusters));
  }
}

std::vector<int> fit_clusters_to_selection_cache(CpuDescriptor& cpu) {
  std::vector<int> index(cpu.clusters.size());
  for (size_t i = 0; i < index.size(); ++i) index[i] = static_cast<int>(i);
  if (cpu.clusters.size() <= static_cast<size_t>(kMaxCpuClusters)) return index;
  const size_t original = cpu.clusters.size();
  std::vector<CoreCluster> kept(cpu.clusters.begin(), cpu.clusters.begin() + kMaxCpuClusters);
  for (size_t i = kMaxCpuClusters; i < original; ++i) {
    int into = kMaxCpuClusters - 1;
    for (int j = 0; j < kMaxCpuClusters; ++j) {
      if (kept[j].uarch_class == cpu.clusters[i].uarch_class) {
        into = j;
        break;
      }
    }
    kept[into].cores += cpu.clusters[i].cores;
    index[i] = into;
  }
  cpu.clusters = std::move(kept);
  cpu.name += " (" + std::to_string(original) + " core clusters merged into " +
              std::to_string(kMaxCpuClusters) + ")";
  return index;
}

const KernelInfo& Selector::kernel(const ProblemClass& pc, int cluster) {
  if (cluster < 0 || cluster >= kMaxClusters) {
    throw std::out_of_range("core cluster " + std::to_string(cluster) +
                            " is outside the selection cache (at most " +
                            std::to_string(kMaxClusters) + " clusters)");
  }
  if (!in_cache_range(pc))
    throw std::out_of_range("problem class outside the selection cache (residency " +
                            std::to_string(pc.residency) + ", row length " + std::to_string(pc.rows) +
                            ", group length " + std::to_string(pc.groups) +
                            ", thread bucket " + std::to_string(pc.threads) + ")");
  std::atomic<int16_t>& c = cache_[slot(pc, cluster)];
  const int16_t cached = c.load(std::memory_order_acquire);
  if (cached >= 0) return kernel_registry()[cached];
  // Slow path: a pure function of (cpu, overrides, class); racing threads
  // compute the same answer, so the last store wins harmlessly.
  const Selection s = explain(active_cpu(), pc, cluster);
  if (!s.winner) throw std::runtime_error(s.error);
  if (!s.winner->compiled()) throw std::runtime_error(std::string("kernel ") + s.winner->name +
                                              " is not compiled into this build");
  const auto index = static_cast<int16_t>(s.winner - kernel_registry().data());
  c.store(index, std::memory_order_release);
  return *s.winner;
}

const KernelInfo* Selector::cached(const ProblemClass& pc, int cluster) const {
  if (cluster < 0 || cluster >= kMaxClusters) return nullptr;
  if (!in_cache_range(pc)) return nullptr;
  const int16_t i = cache_[slot(pc, cluster)].load(std::memory_order_acquire);
  return i >= 0 ? &kernel_registry()[i] : nullptr;
}

Selection Selector::explain(const CpuDescriptor& cpu, const ProblemClass& pc, int cluster) {
  Overrides ov;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!env_error_.empty()) throw std::invalid_argument(env_error_);
    ov = overrides_;
  }
  // The table describes the CPU this process runs on; explaining a fake CPU
  // uses the static policy unless the table was made for it.
  std::shared_ptr<const TuningTable> t = tuning_table();
  if (t && &cpu != &active_cpu() && t->cpu_signature != cpu_signature(cpu)) t.reset();
  return select_kernel(cpu, ov, pc, cluster, t.get());
}

namespace {
void default_warning(const std::string& msg) { std::fprintf(stderr, "%s\n", msg.c_str()); }
void (*g_selection_warning)(const std::string&) = default_warning;
}  // namespace

void set_selection_warning_handler(void (*handler)(const std::string&)) {
  g_selection_warning = handler ? handler : default_warning;
}

void Selector::set_tuning(const std::string& setting) {
  std::lock_guard<std::mutex> g(mu_);
  tuning_setting_ = setting;
  table_loaded_ = false;
  table_.reset();
  table_status_.clear();
  for (auto& c : cache_) c.store(-1, std::memory_order_relaxed);
}

std::string Selector::tuning_setting() const {
  std::lock_guard<std::mutex> g(mu_);
  return tuning_setting_;
}

void Selector::load_table_locked() {
  const CpuDescriptor& cpu = active_cpu();
  if (table_loaded_ && table_cpu_ == &cpu) return;
  table_loaded_ = true;
  table_cpu_ = &cpu;
  table_.reset();
  const bool is_default = tuning_setting_.empty();
  if (tuning_setting_ == "0") {
    table_status_ = "disabled (TORCHAO_KERNELS_TUNING=0)";
    return;
  }
  const std::string path = is_default ? default_tuning_path(cpu) : tuning_setting_;
  if (path.empty()) {
    table_status_ = "none (no cache directory: neither XDG_CACHE_HOME nor HOME is set)";
    return;
  }
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) {
    table_status_ = "none: no table at " + path;
    if (!is_default) g_selection_warning("torchao_kernels: tuning table " + path +
                                         " cannot be read; kernel selection uses the static policy");
    return;
  }
  std::string text;
  char buf[65536];
  size_t got;
  const size_t limit = JsonLimits().max_bytes + 1;
  while ((got = std::fread(buf, 1, sizeof buf, f)) > 0 && text.size() < limit) text.append(buf, got);
  std::fclose(f);
  std::string why;
  int dropped = 0;
  std::unique_ptr<TuningTable> t = parse_tuning_table(text, cpu, why, &dropped);
  if (!t) {
    table_status_ = "ignored: " + path + ": " + why;
    g_selection_warning("torchao_kernels: ignoring tuning table " + path + ": " + why +
                        ". Kernel selection uses the static policy; run `python -m "
                        "torchao_kernels tune` to measure this CPU.");
    return;
  }
  t->path = path;
  table_status_ = "loaded " + path + " (" + std::to_string(t->entries.size()) + " classes" +
                  (dropped ? ", " + std::to_string(dropped) + " entries naming unknown kernels dropped" : "") + ")";
  table_ = std::move(t);
}

std::shared_ptr<const TuningTable> Selector::tuning_table() {
  std::lock_guard<std::mutex> g(mu_);
  load_table_locked();
  return table_;
}

void Selector::add_tuned(const std::string& key, const TunedChoice& choice) {
  std::lock_guard<std::mutex> g(mu_);
  load_table_locked();
  auto t = std::make_shared<TuningTable>();
  if (table_) {
    *t = *table_;
  } else {
    t->cpu_signature = cpu_signature(active_cpu());
    t->kernel_set = kernel_set_version();
  }
  t->entries[key] = choice;
  table_ = std::move(t);
  table_status_ += (table_status_.empty() ? "" : "; ") + std::string("first-use tuned ") + key;
}

std::string Selector::tuning_json() {
  std::lock_guard<std::mutex> g(mu_);
  load_table_locked();
  const CpuDescriptor& cpu = active_cpu();
  return JsonObject()
      .str("setting", tuning_setting_)
      .str("default_path", default_tuning_path(cpu))
      .str("path", table_ ? table_->path : "")
      .boolean("loaded", table_ != nullptr)
      .num("classes", table_ ? table_->entries.size() : 0)
      .str("status", table_status_)
      .str("cpu_signature", cpu_signature(cpu))
      .str("kernel_set", kernel_set_version())
      .boolean("tune_first_use", tune_first_use_)
      .done();
}

Overrides Selector::overrides() const {
  std::lock_guard<std::mutex> g(mu_);
  if (!env_error_.empty()) throw std::invalid_argument(env_error_);
  return overrides_;
}

void Selector::set_overrides(const Overrides& ov) {
  isa_cap_mask(ov.max_isa);  // validates
  check_name_patterns(ov.force, "force");
  check_name_patterns(ov.exclude, "exclude");
  std::lock_guard<std::mutex> g(mu_);
  overrides_ = ov;
  env_error_.clear();
  for (auto& c : cache_) c.store(-1, std::memory_order_relaxed);
}

void Selector::clear_cache() {
  for (auto& c : cache_) c.store(-1, std::memory_order_release);
}

void Selector::count(const KernelInfo& k) {
  counts_[&k - kernel_registry().data()].fetch_add(1, std::memory_order_relaxed);
}

std::vector<std::pair<std::string, int64_t>> Selector::stats() const {
  std::vector<std::pair<std::string, int64_t>> out;
  for (size_t i = 0; i < counts_.size(); ++i) {
    const int64_t n = counts_[i].load(std::memory_order_relaxed);
    if (n) out.emplace_back(kernel_registry()[i].name, n);
  }
  return out;
}

void Selector::reset_stats() {
  for (auto& c : counts_) c.store(0, std::memory_order_relaxed);
}

}  // namespace torchao_kernels
