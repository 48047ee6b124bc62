#include "ops/impl/linear_8bit_act_xbit_weight.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "kernels/generated/kernel_functions.h"
#include "kernels/select/tuning_table.h"
#include "ops/impl/json_writer.h"

namespace torchao_kernels {
namespace ops {

namespace {

void (*g_warning_handler)(const std::string&) = nullptr;

void warn(const std::string& msg) {
  if (g_warning_handler) g_warning_handler(msg);
}

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

// Per-thread scratch for quantized activations, grown on demand: avoids an
// allocation (and page faults) per call.
uint8_t* scratch(size_t bytes) {
  thread_local std::unique_ptr<uint8_t[]> buf;
  thread_local size_t size = 0;
  if (size < bytes) {
    buf.reset(new uint8_t[bytes]);
    size = bytes;
  }
  return buf.get();
}

// Warns once per format when its weights run through a reference kernel
// while another format would get a SIMD kernel on this CPU (under the
// overrides in force). The flag is only spent when the warning is given or
// when the format runs a SIMD kernel, so a first call under a cap does not
// silence later ones.
std::atomic<bool> g_format_checked[8];

void check_format_is_native(FormatId format, const ProblemClass& pc, const KernelInfo& k) {
  std::atomic<bool>& done = g_format_checked[static_cast<int>(format) % 8];
  if (done.load(std::memory_order_relaxed)) return;
  if (k.required_isa != 0) {
    done.store(true, std::memory_order_relaxed);
    return;
  }
  const Overrides ov = Selector::get().overrides();
  const CpuDescriptor& cpu = active_cpu();
  const FormatId best = best_format(cpu, ov, pc.bits, pc.zeros, pc.bias);
  if (best == format) return;
  ProblemClass bpc = pc;
  bpc.format = best;
  const Selection s = select_kernel(cpu, ov, bpc, 0);
  if (!s.winner || s.winner->required_isa == 0) return;  // no faster format either
  if (done.exchange(true)) return;
  warn(std::string("torchao_kernels: packed weights in format ") + find_format(format)->name +
       " run through the portable reference kernel (" + k.name + ") on this CPU; format " +
       find_format(best)->name + " runs " + s.winner->name +
       " here. Convert once with torchao_kernels.repack(packed_weights).");
}

// A kernel named by the caller (benchmarks, tuning) must be able to run here.
void check_kernel_runs(const KernelInfo& kernel, const PackedView& v) {
  if (kernel.op != KernelOp::kLinear || !kernel.fn)
    fail(std::string("kernel ") + kernel.name + " is not a linear kernel compiled into this build");
  const uint64_t missing = kernel.required_isa & ~detected_cpu().isa;
  if (missing) {
    std::string names;
    for (const auto& s : isa_names(missing)) names += (names.empty() ? "" : "+") + s;
    fail(std::string("kernel ") + kernel.name + " needs " + names + ", which this CPU lacks");
  }
  if (kernel.format != v.format) {
    fail(std::string("kernel ") + kernel.name + " reads format " + find_format(kernel.format)->name +
         ", but packed_weights are in format " + find_format(v.format)->name);
  }
  if (!(kernel.bits_mask & (1u << (v.layout.bits - 1))) || (v.layout.has_zeros && !kernel.zeros) ||
      (v.layout.has_bias && !kernel.bias))
    fail(std::string("kernel ") + kernel.name + " does not support these weights (" +
         std::to_string(v.layout.bits) + "-bit" + (v.layout.has_zeros ? ", zero points" : "") +
         (v.layout.has_bias ? ", bias" : "") + ")");
}

// Messages are streamed inside the failing branch only: constructing a
// std::ostringstream costs ~0.2 us per call.
void check_linear_args(const PackedView& v, int64_t m, int64_t k, int64_t group_size, int64_t n) {
  if (v.layout.qvals_only) {
    fail("packed_weights is a weights-only embedding table (torchao::_pack_embedding_{b}bit), "
         "which carries no scales; the linear op needs a buffer of "
         "torchao::pack_8bit_act_xbit_weight");
  }
  if (m < 0) {
    std::ostringstream os;
    os << "activations must have a non-negative number of rows, got m=" << m;
    fail(os.str());
  }
  if (k != v.layout.k) {
    std::ostringstream os;
    os << "activations have k=" << k << " (last dimension) but packed_weights were packed with k="
       << v.layout.k;
    fail(os.str());
  }
  if (n != v.layout.n) {
    std::ostringstream os;
    os << "n=" << n << " does not match packed_weights (packed with n=" << v.layout.n << ")";
    fail(os.str());
  }
  if (group_size != v.layout.group_size) {
    std::ostringstream os;
    os << "group_size=" << group_size << " does not match packed_weights (packed with group_size="
       << v.layout.group_size << ")";
    fail(os.str());
  }
}

}  // namespace

void set_warning_handler(void (*handler)(const std::string&)) { g_warning_handler = handler; }

FormatId choose_format(const std::string& target, int bits, bool zeros, bool bias) {
  return resolve_target(target, active_cpu(), Selector::get().overrides(), bits, zeros, bias);
}

size_t packed_weights_size(FormatId format, int bits, int64_t n, int64_t k, int64_t group_size,
                           bool zeros, bool bias, ScaleType scale_type) {
  check_weight_params(bits, n, k, group_size);
  return packed_size(format, bits, static_cast<int>(n), static_cast<int>(k),
                     static_cast<int>(group_size), zeros, bias, scale_type);
}

void pack_weights_checked(FormatId format, const WeightsView& w, void* out) {
  check_weight_params(w.bits, w.n, w.k, w.group_size);
  pack_weights(format, w, out);
}

namespace {

// One call with `kernel` (on other core clusters, their own choice unless
// `pinned`).
void run_linear(const KernelInfo& kernel, bool pinned, const ProblemClass& pc, const PackedView& v,
                const float* x, int64_t m, int64_t k, int64_t n, float* out, const Parallel& par) {
  const PackedLayout& l = v.layout;
  Selector& sel = Selector::get();
  sel.count(kernel);
  const int mi = static_cast<int>(m);
  // GEMM tiles may read the activations as row panels (padded with zero rows).
  const int panel = kernel.lhs_panel_rows;
  uint8_t* buf = scratch(activation_bytes(kernel, mi, l));
  QuantizedActivations qa = carve_activations(kernel, buf, mi, l);

  // Activation quantization (and panels): by rows, in parallel when there are enough.
  const int threads = call_threads(m, n, k, static_cast<int64_t>(l.body_bytes), par.threads);
  auto quantize_rows = [&](int64_t b, int64_t e) {
    prepare_activations(kernel, x, k, static_cast<int>(b), static_cast<int>(e), qa);
  };
  const int64_t row_step = panel ? panel : 1;
  const int64_t row_units = (m + row_step - 1) / row_step;
  if (m >= 4 * threads && threads > 1) {
    par.run(row_units, [&](int64_t b, int64_t e) {
      quantize_rows(b * row_step, std::min<int64_t>(m, e * row_step));
    });
  } else {
    quantize_rows(0, m);
  }

  // Matmul: tasks over column steps (each step = the kernel's block_step
  // blocks), split over rows too when there are few column steps. The split
  // never changes a result: every output element is computed the same way.
  const int step = kernel.block_step;
  const int64_t n_steps = (l.n_blocks + step - 1) / step;
  int64_t m_chunks = 1;
  if (n_steps < 4 * threads && m >= 2 * kernel.mr) {
    m_chunks = std::min<int64_t>((m + kernel.mr - 1) / kernel.mr, 4 * threads);
  }
  const int64_t rows_per_chunk =
      ((m + m_chunks - 1) / m_chunks + kernel.mr - 1) / kernel.mr * kernel.mr;
  m_chunks = (m + rows_per_chunk - 1) / rows_per_chunk;
  const int64_t tasks = n_steps * m_chunks;
  const bool heterogeneous = !pinned && active_cpu().clusters.size() > 1;
  std::atomic<uint64_t> used_elsewhere{0};  // kernels other clusters ran (for stats)

  auto body = [&](int64_t t0, int64_t t1) {
    const KernelInfo* kr = &kernel;
    if (heterogeneous) {
      // Same format and bits; the selector gives every cluster a row reading
      // the activation layout of cluster 0's choice (select_kernel).
      kr = &sel.kernel(pc, current_cluster());
      used_elsewhere.fetch_or(uint64_t{1} << ((kr - kernel_registry().data()) % 64),
                              std::memory_order_relaxed);
    }
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t ns = t % n_steps, mc = t / n_steps;
      GemmArgs a;
      a.w = &l;
      a.body = v.body;
      a.x = &qa;
      a.m_begin = static_cast<int>(mc * rows_per_chunk);
      a.m_end = static_cast<int>(std::min<int64_t>(m, (mc + 1) * rows_per_chunk));
      a.block_begin = static_cast<int>(ns * step);
      a.block_end = static_cast<int>(std::min<int64_t>(l.n_blocks, (ns + 1) * step));
      a.out = out;
      a.out_stride = n;
      kr->fn(a);
    }
  };
  if (threads > 1 && tasks > 1) {
    par.run(tasks, body);
  } else {
    body(0, tasks);
  }
  const uint64_t used = used_elsewhere.load(std::memory_order_relaxed) &
                        ~(uint64_t{1} << ((&kernel - kernel_registry().data()) % 64));
  for (size_t i = 0; i < kernel_registry().size() && i < 64; ++i)
    if (used & (uint64_t{1} << i)) sel.count(kernel_registry()[i]);
}

// TORCHAO_KERNELS_TUNE=first-use: times every row that may run this class on
// this call's own operands (warm; rows far outside their m range excepted, as
// `tune` does: raced_in_bucket), races them as `tune` does (kTuneRaceCut,
// then kTuneRoundCut after the first of kTuneRounds interleaved rounds), and
// records for this process the row `tune`'s rule picks (confirmed_winner,
// kernels/select/tuning_table.h): the fastest median, if the static choice
// took at least 1 + kTuneOverrideMargin times its time overall and in
// kTuneOverrideWins of the rounds; else the static choice. A sample is the
// mean of enough calls to last kFirstUseSampleUs, so a small layer's sample
// is not one timer tick. Results are bit-identical whichever row runs.
constexpr double kFirstUseSampleUs = 50.0;
constexpr int kFirstUseMaxCallsPerSample = 64;

void tune_class_first_use(const ProblemClass& pc, int cluster, const PackedView& v, const float* x,
                          int64_t m, int64_t k, int64_t n, float* out, const Parallel& par) {
  Selector& sel = Selector::get();
  if (!sel.overrides().force.empty()) return;  // force decides
  const std::string key = class_key(pc, cluster);
  auto table = sel.tuning_table();
  if (table && table->find(key)) return;
  const Selection s = sel.explain(active_cpu(), pc, cluster);
  std::vector<const KernelInfo*> rows;
  for (const auto& c : s.candidates)
    if (c.runnable && c.kernel->compiled() && raced_in_bucket(*c.kernel, pc.bucket)) rows.push_back(c.kernel);
  if (rows.empty()) return;
  // The timed calls write a scratch output: `out` may alias x (an .out call
  // given its own activations), which a call would then overwrite before the
  // next one reads it.
  std::vector<float> scratch(static_cast<size_t>(m) * static_cast<size_t>(n));
  out = scratch.data();
  auto time_calls = [&](const KernelInfo& kernel, int calls) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) run_linear(kernel, true, pc, v, x, m, k, n, out, par);
    const auto t1 = std::chrono::steady_clock::now();
    return std::chrono::duration<double, std::micro>(t1 - t0).count() / calls;
  };
  const std::string static_row = s.static_winner ? s.static_winner->name : std::string();
  // One call brings the operands into cache, a second one sizes the samples;
  // then one sample per row, and the race: rows kTuneRaceCut times behind the
  // fastest are not timed further (that sample is their time), except the
  // static choice, which the rule compares with.
  const KernelInfo& first = s.static_winner ? *s.static_winner : *rows.front();
  run_linear(first, true, pc, v, x, m, k, n, out, par);
  const double call_us = time_calls(first, 1);
  const int calls = static_cast<int>(std::clamp(std::ceil(kFirstUseSampleUs / std::max(call_us, 1e-3)), 1.0,
                                                double(kFirstUseMaxCallsPerSample)));
  std::vector<double> first_us;
  for (const KernelInfo* r : rows) first_us.push_back(time_calls(*r, calls));
  const double fastest_us = *std::min_element(first_us.begin(), first_us.end());
  RoundSamples samples;
  std::vector<const KernelInfo*> raced;
  std::vector<double> best_us;  // each raced row's best sample so far
  RowTimes medians;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (first_us[i] <= kTuneRaceCut * fastest_us || rows[i]->name == static_row) {
      raced.push_back(rows[i]);
      best_us.push_back(first_us[i]);
      samples.emplace_back(rows[i]->name, std::vector<double>());
    } else {
      medians.emplace_back(rows[i]->name, first_us[i]);
    }
  }
  // After the first round, rows kTuneRoundCut times behind the fastest (each
  // row's best of its first sample and that round's) are timed no further,
  // except the static choice.
  std::vector<char> timing(raced.size(), 1);
  for (int round = 0; round < kTuneRounds; ++round) {
    if (round == 1) {
      for (size_t i = 0; i < raced.size(); ++i) best_us[i] = std::min(best_us[i], samples[i].second.front());
      const double lead = *std::min_element(best_us.begin(), best_us.end());
      for (size_t i = 0; i < raced.size(); ++i)
        timing[i] = best_us[i] <= kTuneRoundCut * lead || raced[i]->name == static_row;
    }
    for (size_t i = 0; i < raced.size(); ++i)
      if (timing[i]) samples[i].second.push_back(time_calls(*raced[i], calls));
  }
  for (auto& [name, us] : samples) {
    std::vector<double> sorted = us;
    std::sort(sorted.begin(), sorted.end());
    medians.emplace_back(name, sorted[sorted.size() / 2]);
  }
  std::stable_sort(medians.begin(), medians.end(),
                   [](const auto& a, const auto& b) { return a.second < b.second; });
  TunedChoice choice;
  choice.times_us = medians;
  if (!static_row.empty() && medians.front().first != static_row) {
    // As tune's second look: the fastest row and the runner-up against the
    // static choice, round by round.
    std::vector<std::string> names{static_row};
    for (size_t i = 0; i < medians.size() && i < 2; ++i)
      if (medians[i].first != static_row) names.push_back(medians[i].first);
    RoundSamples look;
    for (const auto& rs : samples)
      if (std::find(names.begin(), names.end(), rs.first) != names.end()) look.push_back(rs);
    for (const auto& rt : medians)
      for (const auto& rs : look)
        if (rs.first == rt.first) choice.confirm_us.push_back(rt);
    choice.confirm_wins = paired_wins({look}, static_row, kTuneOverrideMargin);
    choice.winner = confirmed_winner(medians, choice.confirm_us, static_row, kTuneOverrideMargin,
                                     &choice.confirm_wins, kTuneOverrideWins);
  } else {
    choice.winner = medians.front().first;
  }
  sel.add_tuned(key, choice);
}

ProblemClass linear_class(const PackedView& v, int64_t m, const Parallel& par) {
  const PackedLayout& l = v.layout;
  ProblemClass pc{v.format, l.bits, l.has_zeros, l.has_bias, m_bucket(m)};
  const int threads = call_threads(m, l.n, l.k, static_cast<int64_t>(l.body_bytes), par.threads);
  pc.residency = weight_residency(active_cpu(), static_cast<int64_t>(l.body_bytes), threads);
  pc.rows = weight_row_length(l.k, l.bits);
  pc.groups = weight_group_length(l.group_size);
  pc.threads = thread_bucket(threads);
  return pc;
}

}  // namespace

// Waking a second thread and joining it costs about as much as the smallest
// layers' whole call: 192 x 576 at m = 4 (4-bit) takes 6.3 us on one Zen 4
// thread and 7.0 us on two in a loop of calls, 10 us on two between other
// work (bench --selection). Either a large product or a large weight stream
// pays for the split (576 x 576 at m = 1: 7.8 us on one thread, 7.0 on two:
// a second core's loads), so only calls small in both run on one thread.
int call_threads(int64_t m, int64_t n, int64_t k, int64_t weight_bytes, int threads) {
  threads = std::max(1, threads);
  if (threads > 1 && m * n * k < kMinSplitMacs && weight_bytes >= 0 && weight_bytes < kMinSplitWeightBytes)
    return 1;
  return threads;
}

void linear(const float* x, int64_t m, int64_t k, const void* packed, size_t packed_bytes,
            int64_t group_size, int64_t n, float* out, const Parallel& par) {
  const PackedView v = parse_packed(packed, packed_bytes);
  check_linear_args(v, m, k, group_size, n);
  if (m == 0) return;
  const ProblemClass pc = linear_class(v, m, par);
  Selector& sel = Selector::get();
  const int home_cluster = current_cluster();
  if (sel.tune_on_first_use() && !sel.cached(pc, home_cluster))
    tune_class_first_use(pc, home_cluster, v, x, m, k, n, out, par);
  const KernelInfo& kernel = sel.kernel(pc, home_cluster);
  check_format_is_native(v.format, pc, kernel);
  run_linear(kernel, false, pc, v, x, m, k, n, out, par);
}

void linear_forced(const KernelInfo& kernel, const float* x, int64_t m, int64_t k,
                   const void* packed, size_t packed_bytes, float* out, const Parallel& par) {
  const PackedView v = parse_packed(packed, packed_bytes);
  check_linear_args(v, m, k, v.layout.group_size, v.layout.n);
  check_kernel_runs(kernel, v);
  if (m == 0) return;
  run_linear(kernel, true, linear_class(v, m, par), v, x, m, k, v.layout.n, out, par);
}

std::string linear_class_json(const void* packed, size_t packed_bytes, int64_t m, int threads) {
  const PackedView v = parse_packed(packed, packed_bytes);
  Parallel par;
  par.threads = threads;
  const ProblemClass pc = linear_class(v, std::max<int64_t>(m, 1), par);
  const int cluster = current_cluster();
  const Selection s = Selector::get().explain(active_cpu(), pc, cluster);
  std::vector<std::string> runnable, raced;
  for (const auto& c : s.candidates) {
    if (!c.runnable || !c.kernel->compiled()) continue;
    runnable.push_back(json_str(c.kernel->name));
    if (raced_in_bucket(*c.kernel, pc.bucket)) raced.push_back(json_str(c.kernel->name));
  }
  return JsonObject()
      .str("key", class_key(pc, cluster))
      .str("residency", residency_name(pc.residency))
      .str("rows", row_length_name(pc.rows))
      .str("groups", group_length_name(pc.groups))
      .str("threads", thread_bucket_name(pc.threads))
      .str("m_bucket", m_bucket_name(pc.bucket))
      .num("weight_bytes", v.layout.body_bytes)
      .raw("runnable", json_list(runnable))
      .raw("raced", json_list(raced))
      .raw("selected", s.winner ? json_str(s.winner->name) : "null")
      .raw("static", s.static_winner ? json_str(s.static_winner->name) : "null")
      .str("source", s.source)
      .done();
}

void linear_with_kernel(const KernelInfo& kernel, const float* x, int64_t m, int64_t k,
                        const void* packed, size_t packed_bytes, float* out) {
  const PackedView v = parse_packed(packed, packed_bytes);
  check_linear_args(v, m, k, v.layout.group_size, v.layout.n);
  check_kernel_runs(kernel, v);
  if (m == 0) return;
  const PackedLayout& l = v.layout;
  const int mi = static_cast<int>(m);
  std::vector<uint8_t> buf(activation_bytes(kernel, mi, l));
  QuantizedActivations qa = carve_activations(kernel, buf.data(), mi, l);
  prepare_activations(kernel, x, k, 0, mi, qa);
  GemmArgs a{&l, v.body, &qa, 0, mi, 0, l.n_blocks, out, l.n};
  kernel.fn(a);
}

size_t repack_size(const void* packed, size_t packed_bytes, FormatId target) {
  const PackedView v = parse_packed(packed, packed_bytes);
  const PackedLayout& l = v.layout;
  return packed_size(target, l.bits, l.n, l.k, l.group_size, l.has_zeros, l.has_bias,
                     l.scale_type);
}

void repack(const void* packed, size_t packed_bytes, FormatId target, void* out) {
  const PackedView v = parse_packed(packed, packed_bytes);
  const PackedLayout& l = v.layout;
  std::vector<int8_t> q(size_t(l.n) * l.k);
  std::vector<float> scales(size_t(l.n) * l.groups);
  std::vector<int8_t> zeros(l.has_zeros ? size_t(l.n) * l.groups : 0);
  std::vector<float> bias(l.has_bias ? l.n : 0);
  unpack_weights(v, q.data(), scales.data(), l.has_zeros ? zeros.data() : nullptr,
                 l.has_bias ? bias.data() : nullptr);
  WeightsView w{l.bits, l.n, l.k, l.group_size, q.data(), scales.data(),
                l.has_zeros ? zeros.data() : nullptr, l.has_bias ? bias.data() : nullptr,
                l.scale_type};
  pack_weights(target, w, out);
}

// ---------------------------------------------------------------------------
// Inspection

namespace {

std::string isa_json(uint64_t isa) {
  std::vector<std::string> v;
  for (const auto& s : isa_names(isa)) v.push_back(json_str(s));
  return json_list(v);
}

std::string kernel_json(const KernelInfo& k, const CpuDescriptor& cpu) {
  std::vector<std::string> bits, prefs;
  for (int b = 1; b <= kMaxBits; ++b)
    if (k.bits_mask & (1u << (b - 1))) bits.push_back(std::to_string(b));
  for (const auto& p : k.uarch_prefs)
    prefs.push_back(JsonObject()
                        .str("uarch_class", uarch_class_name(p.uarch_class))
                        .num("bonus", p.bonus)
                        .num("m_min", p.m_min)
                        .raw("m_max", p.m_max ? std::to_string(p.m_max) : "null")
                        .num("bits_min", p.bits_min)
                        .num("bits_max", p.bits_max)
                        .raw("residency", p.residency >= 0 ? "\"" + std::string(residency_name(p.residency)) + "\""
                                                           : "null")
                        .raw("groups", p.groups >= 0 ? (p.groups == kGroupsLong ? "\"long\"" : "\"short\"") : "null")
                        .raw("rows", p.rows >= 0 ? json_str(row_kind_name(p.rows)) : "null")
                        .raw("threads", p.threads >= 0 ? json_str(thread_bucket_name(p.threads)) : "null")
                        .done());
  return JsonObject()
      .str("name", k.name)
      .str("op", kernel_op_name(k.op))
      .boolean("long_groups", k.long_groups)
      .str("format", find_format(k.format)->name)
      .str("isa", k.isa_name)
      .raw("required_isa", isa_json(k.required_isa))
      .num("m_min", k.m_min)
      .raw("m_max", k.m_max ? std::to_string(k.m_max) : "null")
      .num("mr", k.mr)
      .num("nr", k.nr)
      .num("kr", k.kr)
      .num("sr", k.sr)
      .num("lhs_panel_rows", k.lhs_panel_rows)
      .num("lhs_panel_kr", k.lhs_panel_kr)
      .boolean("lhs_panel_int16", k.lhs_panel_int16)
      .raw("ceiling", k.ceiling ? "\"" + std::string(k.ceiling) + "\"" : std::string("null"))
      .boolean("one_pass_panels", k.quantize_panels != nullptr)
      .raw("bits", json_list(bits))
      .boolean("zeros", k.zeros)
      .boolean("bias", k.bias)
      .num("priority", k.priority)
      .raw("uarch_prefs", json_list(prefs))
      .str("why", k.why)
      .boolean("compiled", k.compiled())
      .boolean("runnable", k.compiled() && (k.required_isa & ~cpu.isa) == 0)
      .done();
}

}  // namespace

std::string explain_json(const CpuDescriptor& cpu, FormatId format, int bits, bool zeros,
                         bool bias, int64_t m, int threads, KernelOp op, int64_t weight_bytes,
                         int64_t k, int64_t group_size, int64_t n) {
  const Overrides ov = Selector::get().overrides();
  const bool lookup = op == KernelOp::kEmbedding;
  ProblemClass pc{format, bits, zeros, lookup ? false : bias,
                  lookup ? 0 : m_bucket(std::max<int64_t>(m, 1)), op};
  if (!lookup) {
    // A buffer's shape says whether the call runs on fewer threads (call_threads).
    if (n > 0 && k > 0) threads = call_threads(std::max<int64_t>(m, 1), n, k, weight_bytes, threads);
    if (weight_bytes >= 0) pc.residency = weight_residency(cpu, weight_bytes, std::max(1, threads));
    if (k > 0) pc.rows = weight_row_length(k, bits);
    if (group_size > 0) pc.groups = weight_group_length(group_size);
    pc.threads = thread_bucket(threads);
  }
  std::vector<std::string> clusters;
  std::string winner0;
  for (size_t c = 0; c < cpu.clusters.size(); ++c) {
    const Selection s = Selector::get().explain(cpu, pc, static_cast<int>(c));
    std::vector<std::string> times, again;
    for (const auto& kv : s.tuned.times_us)
      times.push_back(JsonObject().str("kernel", kv.first).num("us", kv.second).done());
    for (const auto& kv : s.tuned.confirm_us) {
      JsonObject row;
      row.str("kernel", kv.first).num("us", kv.second);
      for (const auto& w : s.tuned.confirm_wins) {
        if (w.first == kv.first) {
          row.num("wins", w.second);
          break;
        }
      }
      again.push_back(row.done());
    }
    std::vector<std::string> cands;
    for (const auto& cd : s.candidates) {
      cands.push_back(JsonObject()
                          .str("name", cd.kernel->name)
                          .str("format", find_format(cd.kernel->format)->name)
                          .str("isa", cd.kernel->isa_name)
                          .boolean("eligible", cd.eligible)
                          .boolean("op_mismatch", cd.kernel->op != op)
                          .raw("score", cd.eligible ? std::to_string(cd.score) : "null")
                          .str("reason", cd.reason)
                          .done());
    }
    if (c == 0) winner0 = s.winner ? s.winner->name : "";
    clusters.push_back(JsonObject()
                           .num("cluster", c)
                           .str("uarch", cpu.clusters[c].uarch)
                           .str("uarch_class", uarch_class_name(cpu.clusters[c].uarch_class))
                           .num("cores", cpu.clusters[c].cores)
                           .raw("winner", s.winner ? json_str(s.winner->name) : "null")
                           .str("source", s.source)
                           .raw("static_winner", s.static_winner ? json_str(s.static_winner->name) : "null")
                           .str("class_key", class_key(pc, static_cast<int>(c)))
                           .str("table_note", s.note)
                           .raw("table_times_us", json_list(times))
                           .raw("table_confirm_us", json_list(again))
                           .str("error", s.error)
                           .raw("candidates", json_list(cands))
                           .done());
  }
  return JsonObject()
      .raw("cpu", cpu.to_json())
      .str("op", kernel_op_name(op))
      .str("format", find_format(format)->name)
      .num("bits", bits)
      .boolean("zeros", zeros)
      .boolean("bias", bias)
      .num("m", m)
      .str("m_bucket", lookup ? "any" : m_bucket_name(pc.bucket))
      .num("threads", threads)
      .str("residency", lookup ? "any" : weight_bytes < 0 ? "dram (assumed: no buffer given)"
                                                          : residency_name(pc.residency))
      .num("weight_bytes", weight_bytes)
      .str("rows", lookup ? "any" : k <= 0 ? "long-rows (assumed: no buffer given)" : row_length_name(pc.rows))
      .str("groups", lookup ? "any"
                            : group_size <= 0 ? "short-groups (assumed: no buffer given)"
                                              : group_length_name(pc.groups))
      .raw("overrides", ov.to_json())
      .raw("winner", winner0.empty() ? "null" : json_str(winner0))
      .raw("clusters", json_list(clusters))
      .done();
}

// info()'s best format, or why there is none (overrides that leave no kernel).
std::string best_format_text(const CpuDescriptor& cpu, const Overrides& ov) {
  try {
    return find_format(best_format(cpu, ov, 4, false, false))->name;
  } catch (const std::invalid_argument& e) {
    return std::string("none (") + e.what() + ")";
  }
}

std::string info_json() {
  const CpuDescriptor& cpu = active_cpu();
  const Overrides ov = Selector::get().overrides();
  const uint64_t cap = isa_cap_mask(ov.max_isa);
  std::vector<std::string> kernels, runnable, fmts, table;
  for (const auto& k : kernel_registry()) {
    kernels.push_back(kernel_json(k, cpu));
    if (k.compiled() && (k.required_isa & ~(cpu.isa & cap)) == 0) runnable.push_back(json_str(k.name));
  }
  int count;
  const FormatInfo* fs = formats(&count);
  for (int i = 0; i < count; ++i) {
    fmts.push_back(JsonObject()
                       .str("name", fs[i].name)
                       .num("id", static_cast<int>(fs[i].id))
                       .num("nr", fs[i].nr)
                       .num("kr", kKr)
                       .str("description", fs[i].description)
                       .done());
    JsonObject row;
    for (int b = 0; b < kMBuckets; ++b) {
      const Selection s = select_kernel(cpu, ov, ProblemClass{fs[i].id, 4, false, false, b}, 0);
      row.raw(m_bucket_name(b), s.winner ? json_str(s.winner->name) : json_str("error: " + s.error));
    }
    // Embedding lookups in this format (4-bit weights; one class for every m).
    const Selection e = select_kernel(
        cpu, ov, ProblemClass{fs[i].id, 4, false, false, 0, KernelOp::kEmbedding}, 0);
    table.push_back(JsonObject()
                        .str("format", fs[i].name)
                        .raw("by_m", row.done())
                        .raw("embedding", e.winner ? json_str(e.winner->name)
                                                   : json_str("error: " + e.error))
                        .done());
  }
  return JsonObject()
      .raw("cpu", cpu.to_json())
      .raw("overrides", ov.to_json())
      .raw("tuning", Selector::get().tuning_json())
      .str("best_format", best_format_text(cpu, ov))
      .raw("formats", json_list(fmts))
      .raw("kernels", json_list(kernels))
      .raw("runnable", json_list(runnable))
      .raw("selection", json_list(table))
      .done();
}

std::string packed_header_json(const void* packed, size_t packed_bytes) {
  const PackedView v = parse_packed(packed, packed_bytes);
  const PackedLayout& l = v.layout;
  return JsonObject()
      .str("format", find_format(v.format)->name)
      .num("abi_version", v.header.abi_version)
      .num("bits", l.bits)
      .num("n", l.n)
      .num("k", l.k)
      .num("group_size", l.group_size)
      .boolean("has_zeros", l.has_zeros)
      .boolean("has_bias", l.has_bias)
      .num("nr", l.nr)
      .num("kr", kKr)
      .num("kb", l.kb)
      .str("scale_dtype", l.scales_bf16 ? "bfloat16" : "float32")
      .num("body_bytes", l.body_bytes)
      .boolean("weights_only", l.qvals_only)  // a lookup table of _pack_embedding_{b}bit: no scales
      .done();
}

std::string stats_json() {
  JsonObject o;
  for (const auto& kv : Selector::get().stats()) o.num(kv.first, kv.second);
  return o.done();
}

}  // namespace ops
}  // namespace torchao_kernels
