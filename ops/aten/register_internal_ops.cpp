// Internal ops (namespace torchao_kernels) behind the Python API: selection
// overrides, explain/info/stats, repack, and per-kernel entry points for the
// generated kernel tests and benchmarks. Not part of the public op surface.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <tuple>

#include "kernels/quant/quantized_activations.h"
#include "kernels/generated/kernel_functions.h"
#include "kernels/select/json_reader.h"
#include "kernels/select/kernel_registry.h"
#include "kernels/select/tuning_table.h"
#include "ops/aten/aten_glue.h"
#include "ops/impl/embedding_xbit.h"
#include "ops/impl/json_writer.h"
#include "ops/impl/linear_8bit_act_xbit_weight.h"
#include "ops/impl/op_list.h"

std::string register_torchao_compat();  // register_ops.cpp

namespace {

using at::Tensor;
namespace tk = torchao_kernels;
namespace ops = torchao_kernels::ops;
using torchao_kernels::aten_glue::check_packed;
using torchao_kernels::aten_glue::empty_packed;
using torchao_kernels::aten_glue::guarded;

tk::CpuDescriptor cpu_named(const std::optional<std::string>& cpu) {
  if (!cpu.has_value() || cpu->empty() || *cpu == "active") return tk::active_cpu();
  if (*cpu == "detected") return tk::detected_cpu();
  return guarded([&] {
    tk::CpuDescriptor d = tk::fake_cpu(*cpu);
    tk::check_selection_cache_fits(d);
    return d;
  });
}

std::string explain_json(const std::optional<Tensor>& packed, const std::optional<std::string>& format,
                         int64_t bits, bool zeros, bool bias, int64_t m, int64_t threads,
                         const std::optional<std::string>& cpu) {
  if (packed.has_value()) check_packed(*packed);
  return guarded([&] {
    if (threads < 1) throw std::invalid_argument("threads must be >= 1, got " + std::to_string(threads));
    tk::FormatId f;
    int b = static_cast<int>(bits);
    int64_t weight_bytes = -1, k = -1, group_size = -1, n = -1;
    if (packed.has_value()) {
      const tk::PackedView v = tk::parse_packed(packed->data_ptr(), packed->numel());
      f = v.format;
      weight_bytes = static_cast<int64_t>(v.layout.body_bytes);
      k = v.layout.k;
      n = v.layout.n;
      group_size = v.layout.group_size;
      b = v.layout.bits;
      zeros = v.layout.has_zeros;
      bias = v.layout.has_bias;
    } else {
      tk::check_weight_params(b, 1, tk::kGroupMultiple, tk::kGroupMultiple);  // only the bit width can fail: named
      const std::string name = format.value_or("auto");
      const tk::CpuDescriptor d = cpu_named(cpu);
      f = tk::resolve_target(name, d, tk::Selector::get().overrides(), b, zeros, bias);
    }
    if (m < 1) throw std::invalid_argument("m must be >= 1, got " + std::to_string(m));
    return ops::explain_json(cpu_named(cpu), f, b, zeros, bias, m, static_cast<int>(threads),
                             tk::KernelOp::kLinear, weight_bytes, k, group_size, n);
  });
}

std::string best_format(const std::optional<std::string>& target, int64_t bits, bool zeros, bool bias,
                        const std::optional<std::string>& cpu) {
  return guarded([&] {
    tk::check_weight_params(static_cast<int>(bits), 1, 16, 16);
    const tk::FormatId f = tk::resolve_target(target.value_or(""), cpu_named(cpu),
                                              tk::Selector::get().overrides(),
                                              static_cast<int>(bits), zeros, bias);
    return std::string(tk::find_format(f)->name);
  });
}

void set_overrides(const std::string& max_isa, const std::string& force, const std::string& exclude) {
  guarded([&] {
    tk::Selector::get().set_overrides(tk::Overrides{max_isa, force, exclude});
    return 0;
  });
}

std::string overrides_json() {
  return guarded([&] { return tk::Selector::get().overrides().to_json(); });
}

std::string info_json() {
  return guarded([&] { return ops::info_json(); });
}

std::string stats_json() { return ops::stats_json(); }
void reset_stats() { tk::Selector::get().reset_stats(); }

Tensor repack(const Tensor& packed, const std::optional<std::string>& target) {
  check_packed(packed);
  return guarded([&] {
    const tk::PackedView v = tk::parse_packed(packed.data_ptr(), packed.numel());
    const tk::FormatId f = ops::choose_format(target.value_or(""), v.layout.bits, v.layout.has_zeros,
                                              v.layout.has_bias);
    Tensor out = empty_packed(static_cast<int64_t>(ops::repack_size(packed.data_ptr(), packed.numel(), f)),
                              packed.options().dtype(at::kChar));
    ops::repack(packed.data_ptr(), packed.numel(), f, out.data_ptr());
    return out;
  });
}

// A copy of a packed buffer in memory advised into transparent huge pages
// (empty_packed), for a buffer that comes from elsewhere (a state_dict being
// loaded): a clone lands in ordinary 4 KB pages, where 128 random lookups in
// a 49152 x 576 4-bit table take 1.2x as long (docs/embeddings.md).
Tensor copy_packed(const Tensor& packed) {
  check_packed(packed);
  Tensor out = empty_packed(packed.numel(), packed.options());
  out.copy_(packed);
  return out;
}

std::string packed_info_json(const Tensor& packed) {
  check_packed(packed);
  return guarded([&] { return ops::packed_header_json(packed.data_ptr(), packed.numel()); });
}

std::tuple<Tensor, Tensor, Tensor, Tensor> unpack(const Tensor& packed) {
  check_packed(packed);
  return guarded([&] {
    const tk::PackedView v = tk::parse_packed(packed.data_ptr(), packed.numel());
    const auto& l = v.layout;
    Tensor q = at::empty({l.n, l.k}, at::kChar);
    Tensor s = at::empty({l.n, l.groups}, at::kFloat);
    Tensor z = at::zeros({l.has_zeros ? l.n : 0, l.groups}, at::kChar);
    Tensor b = at::zeros({l.has_bias ? l.n : 0}, at::kFloat);
    tk::unpack_weights(v, q.data_ptr<int8_t>(), s.data_ptr<float>(),
                       l.has_zeros ? z.data_ptr<int8_t>() : nullptr,
                       l.has_bias ? b.data_ptr<float>() : nullptr);
    // Scales come back in their stored dtype (exactly), so packing the
    // result again gives the same buffer.
    if (l.scales_bf16) s = s.to(at::kBFloat16);
    return std::make_tuple(q, s, z, b);
  });
}

// A named kernel on 2-D float32 activations: alone over all rows on the
// calling thread (through_op false: the generated kernel tests, bench
// --kernels), or through the op's own parallel split (true: tuning).
Tensor run_named_kernel(const Tensor& activations, const Tensor& packed, const std::string& kernel,
                        bool through_op) {
  check_packed(packed);
  TORCH_CHECK_VALUE(activations.dim() == 2 && activations.scalar_type() == at::kFloat,
                    "activations must be a 2-D float32 tensor");
  const tk::KernelInfo* k = tk::find_kernel(kernel.c_str());
  TORCH_CHECK_VALUE(k != nullptr, "unknown kernel '", kernel, "'");
  const Tensor x = activations.contiguous();
  return guarded([&] {
    const tk::PackedView v = tk::parse_packed(packed.data_ptr(), packed.numel());
    Tensor out = at::empty({x.size(0), v.layout.n}, at::kFloat);
    if (through_op) {
      ops::linear_forced(*k, x.data_ptr<float>(), x.size(0), x.size(1), packed.data_ptr(),
                         packed.numel(), out.data_ptr<float>(), torchao_kernels::aten_glue::aten_parallel());
    } else {
      ops::linear_with_kernel(*k, x.data_ptr<float>(), x.size(0), x.size(1), packed.data_ptr(),
                              packed.numel(), out.data_ptr<float>());
    }
    return out;
  });
}

Tensor run_kernel(const Tensor& activations, const Tensor& packed, const std::string& kernel) {
  return run_named_kernel(activations, packed, kernel, false);
}

// The activation panels a kernel reads (prepare_activations, as the op builds
// them) for weights of `bits` bits: (panel bytes, int32 sums, float sums or an
// empty tensor), flat, for tests of the panel layout.
std::tuple<Tensor, Tensor, Tensor> activation_panels(const Tensor& x_in, int64_t group_size, int64_t bits,
                                                     const std::string& kernel) {
  const tk::KernelInfo* k = tk::find_kernel(kernel.c_str());
  TORCH_CHECK_VALUE(k != nullptr, "unknown kernel '", kernel, "'");
  TORCH_CHECK_VALUE(k->fn != nullptr && (k->required_isa & ~tk::detected_cpu().isa) == 0, "kernel ",
                    kernel, " is not compiled into this build or needs ISA features this CPU lacks");
  TORCH_CHECK_VALUE(k->lhs_panel_rows > 0, "kernel ", kernel, " reads no activation panels");
  TORCH_CHECK_VALUE(x_in.dim() == 2 && x_in.scalar_type() == at::kFloat && x_in.size(0) > 0,
                    "x must be 2-D float32 with at least one row");
  const Tensor x = x_in.contiguous();
  const int m = static_cast<int>(x.size(0)), kk = static_cast<int>(x.size(1));
  const tk::PackedLayout l = guarded([&] {
    tk::check_weight_params(static_cast<int>(bits), 16, kk, group_size);
    return tk::PackedLayout::make(k->format, static_cast<int>(bits), 16, kk, static_cast<int>(group_size),
                                  false, false);
  });
  std::vector<uint8_t> buf(tk::activation_bytes(*k, m, l));
  tk::QuantizedActivations qa = tk::carve_activations(*k, buf.data(), m, l);
  tk::prepare_activations(*k, x.data_ptr<float>(), kk, 0, m, qa);
  const int64_t panels = (m + qa.panel_rows - 1) / qa.panel_rows;
  // int16 panels come back as int16 values.
  Tensor bytes = qa.panel_int16 ? at::empty({panels * qa.panel_stride / 2}, at::kShort)
                                : at::empty({panels * qa.panel_stride}, at::kChar);
  Tensor sums = at::empty({panels * qa.panel_sums_stride}, at::kInt);
  std::memcpy(bytes.data_ptr(), qa.panels, panels * qa.panel_stride);
  std::memcpy(sums.data_ptr<int32_t>(), qa.panel_sums, 4 * sums.numel());
  Tensor fsums = at::empty({qa.panel_sums_f ? panels * qa.panel_sums_stride : 0}, at::kFloat);
  if (qa.panel_sums_f) std::memcpy(fsums.data_ptr<float>(), qa.panel_sums_f, 4 * fsums.numel());
  return std::make_tuple(bytes, sums, fsums);
}

std::tuple<Tensor, Tensor, Tensor, Tensor> quantize_activations(const Tensor& x_in, int64_t group_size,
                                                                const std::string& kernel) {
  const tk::KernelInfo* k = tk::find_kernel(kernel.c_str());
  TORCH_CHECK_VALUE(k != nullptr, "unknown kernel '", kernel, "'");
  TORCH_CHECK_VALUE(k->fn != nullptr && (k->required_isa & ~tk::detected_cpu().isa) == 0, "kernel ",
                    kernel, " is not compiled into this build or needs ISA features this CPU lacks");
  TORCH_CHECK_VALUE(x_in.dim() == 2 && x_in.scalar_type() == at::kFloat, "x must be 2-D float32");
  const Tensor x = x_in.contiguous();
  const int m = static_cast<int>(x.size(0)), kk = static_cast<int>(x.size(1));
  guarded([&] {
    tk::check_weight_params(1, 1, kk, group_size);
    return 0;
  });
  std::vector<uint8_t> buf(tk::QuantizedActivations::bytes_needed(m, kk, static_cast<int>(group_size)));
  auto qa = tk::QuantizedActivations::carve(buf.data(), m, kk, static_cast<int>(group_size));
  k->quantize(x.data_ptr<float>(), kk, 0, m, qa);
  Tensor q = at::empty({m, kk}, at::kChar), sums = at::empty({m, qa.groups}, at::kInt);
  Tensor scale = at::empty({m}, at::kFloat), zero = at::empty({m}, at::kInt);
  for (int r = 0; r < m; ++r) {
    std::memcpy(q.data_ptr<int8_t>() + int64_t(r) * kk, qa.q + r * qa.row_stride, kk);
    std::memcpy(sums.data_ptr<int32_t>() + int64_t(r) * qa.groups, qa.group_sums + int64_t(r) * qa.groups,
                4 * qa.groups);
  }
  std::memcpy(scale.data_ptr<float>(), qa.scale, 4 * m);
  std::memcpy(zero.data_ptr<int32_t>(), qa.zero, 4 * m);
  return std::make_tuple(q, sums, scale, zero);
}

Tensor linear_forced(const Tensor& activations, const Tensor& packed, const std::string& kernel) {
  return run_named_kernel(activations, packed, kernel, true);
}

std::string linear_class_json(const Tensor& packed, int64_t m, int64_t threads) {
  check_packed(packed);
  return guarded([&] {
    if (threads < 1) throw std::invalid_argument("threads must be >= 1, got " + std::to_string(threads));
    return ops::linear_class_json(packed.data_ptr(), packed.numel(), m, static_cast<int>(threads));
  });
}

void set_tuning(const std::string& setting) { tk::Selector::get().set_tuning(setting); }
std::string tuning_json() {
  return guarded([&] { return tk::Selector::get().tuning_json(); });
}

// The override rule of kernels/select/tuning_table.h for tune()'s second
// look (torchao_kernels/tuning.py), so Python and the first-use tuner apply
// one rule with the manifest's constants.
std::tuple<int64_t, double, double, double, double> tuning_rule() {
  return {tk::kTuneRounds, tk::kTuneOverrideMargin, tk::kTuneOverrideWins, tk::kTuneRaceCut, tk::kTuneRoundCut};
}

tk::JsonValue parse_arg(const std::string& text, const char* what) {
  tk::JsonValue v;
  std::string error;
  if (!tk::parse_json(text, v, error)) throw std::invalid_argument(std::string(what) + ": " + error);
  return v;
}

// rows[name] = value in first-seen order: a name repeated in a JSON object
// counts once, with its last value (as JsonValue::get reads it).
template <class V>
void set_row(std::vector<std::pair<std::string, V>>& rows, const std::string& name, V value) {
  auto it = std::find_if(rows.begin(), rows.end(), [&](const auto& r) { return r.first == name; });
  if (it == rows.end()) {
    rows.emplace_back(name, std::move(value));
  } else {
    it->second = std::move(value);
  }
}

// {"row": number, ...}.
tk::RowTimes row_times(const tk::JsonValue& v, const char* what) {
  if (!v.is_object()) throw std::invalid_argument(std::string(what) + " must be a JSON object of row: number");
  tk::RowTimes out;
  for (const auto& [name, t] : v.members) {
    if (!t.is_number()) throw std::invalid_argument(std::string(what) + ": '" + name + "' is not a number");
    set_row(out, name, t.number);
  }
  return out;
}

std::string confirmed_winner(const std::string& first, const std::string& second, const std::string& static_row,
                             double margin, const std::optional<std::string>& wins, double min_wins) {
  return guarded([&] {
    const tk::RowTimes f = row_times(parse_arg(first, "first"), "first");
    const tk::RowTimes s = row_times(parse_arg(second, "second"), "second");
    if (f.empty() && s.empty())
      throw std::invalid_argument("confirmed_winner: no row was timed (first and second are empty)");
    tk::RowTimes w;
    if (wins) w = row_times(parse_arg(*wins, "wins"), "wins");
    return tk::confirmed_winner(f, s, static_row, margin, wins ? &w : nullptr, min_wins);
  });
}

// samples: [{"row": [t_round0, t_round1, ...], ...} per point].
std::string paired_wins(const std::string& samples, const std::string& static_row, double margin) {
  return guarded([&] {
    const tk::JsonValue v = parse_arg(samples, "samples");
    if (v.type != tk::JsonValue::Type::kArray) throw std::invalid_argument("samples must be a JSON list of objects");
    std::vector<tk::RoundSamples> points;
    for (const auto& p : v.items) {
      if (!p.is_object()) throw std::invalid_argument("samples: each point must be an object of row: [times]");
      tk::RoundSamples rs;
      for (const auto& [name, ts] : p.members) {
        if (ts.type != tk::JsonValue::Type::kArray)
          throw std::invalid_argument("samples: '" + name + "' is not a list of times");
        std::vector<double> t;
        for (const auto& x : ts.items) {
          if (!x.is_number()) throw std::invalid_argument("samples: '" + name + "' holds a non-number");
          t.push_back(x.number);
        }
        set_row(rs, name, std::move(t));
      }
      points.push_back(std::move(rs));
    }
    tk::JsonObject o;
    for (const auto& [name, w] : tk::paired_wins(points, static_row, margin)) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.17g", w);  // every bit: the share is compared with min_wins
      o.raw(name, buf);
    }
    return o.done();
  });
}

std::vector<std::string> fake_cpu_names() { return tk::fake_cpu_names(); }

// Test hook: run selection (and the op's per-cluster loop) as if on a fake CPU,
// limited to this CPU's ISA features. None restores the detected CPU.
void set_active_cpu(const std::optional<std::string>& cpu) {
  guarded([&] {
    if (!cpu.has_value() || cpu->empty()) {
      tk::set_active_cpu(nullptr);
    } else {
      const tk::CpuDescriptor d = tk::fake_cpu(*cpu);
      tk::check_selection_cache_fits(d);  // ValueError naming the cluster count and the limit
      tk::set_active_cpu(&d);
    }
    tk::Selector::get().clear_cache();
    return 0;
  });
}

// Cost of a cached kernel lookup (the hot path), in nanoseconds.
double bench_cached_lookup(int64_t iterations) {
  const tk::ProblemClass pc{tk::FormatId::kN16K4, 4, false, false, 0};
  auto& sel = tk::Selector::get();
  const tk::KernelInfo* k = &sel.kernel(pc, 0);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iterations; ++i) {
    tk::ProblemClass p = pc;
    p.bucket = static_cast<int>(i & 1);
    k = &sel.kernel(p, tk::current_cluster());
    asm volatile("" : : "r"(k) : "memory");
  }
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(iterations);
}
// Seconds of each of `calls` lookups of the op body (argument checks,
// selection, kernel: no dispatch, no output allocation), index batch
// i % rows of index_pool (rows x count) into one output buffer, on torch's
// thread count as a call would be.
// Shows the lookup's own time next to a Python call's (bench_embedding).
// A weights-only table takes its scales (and zero points); a linear buffer
// carries its own.
Tensor time_lookups(const Tensor& packed, const std::optional<Tensor>& scales,
                    const std::optional<Tensor>& zeros, const Tensor& index_pool, int64_t calls) {
  check_packed(packed, "packed");
  TORCH_CHECK_VALUE(index_pool.dim() == 2 && index_pool.scalar_type() == at::kLong,
                    "index_pool must be a 2-D int64 tensor (rows x count), got ", index_pool.sizes(),
                    " ", index_pool.scalar_type());
  TORCH_CHECK_VALUE(index_pool.size(0) >= 1, "index_pool must have at least one row (index batch), got ",
                    index_pool.sizes());
  TORCH_CHECK_VALUE(calls >= 1, "calls must be >= 1, got ", calls);
  const Tensor pool = index_pool.contiguous();
  const tk::PackedView v = guarded([&] { return tk::parse_packed(packed.data_ptr(), packed.numel()); });
  const tk::PackedLayout& l = v.layout;
  TORCH_CHECK_VALUE(!l.qvals_only || scales.has_value(), "a weights-only table needs its scales");
  if (l.qvals_only) {
    guarded([&] {
      const ops::TensorArg sa = torchao_kernels::aten_glue::tensor_arg(*scales);
      ops::check_embedding_scales_arg(sa, l.n);
      if (zeros.has_value()) ops::check_embedding_zeros_arg(torchao_kernels::aten_glue::tensor_arg(*zeros), sa);
      return 0;
    });
  }
  const Tensor s = l.qvals_only ? scales->to(at::kFloat).contiguous() : Tensor();
  // int8 zero points only: wider ones would need the public op's range check.
  TORCH_CHECK_VALUE(!zeros.has_value() || zeros->scalar_type() == at::kChar, "zeros must be int8, got ",
                    zeros.has_value() ? zeros->scalar_type() : at::kChar);
  const Tensor z = l.qvals_only && zeros.has_value() ? zeros->contiguous() : Tensor();
  const int64_t rows = pool.size(0), count = pool.size(1);
  Tensor out = at::empty({count, l.k}, at::kFloat);
  Tensor times = at::empty({calls}, at::kDouble);
  double* t = times.data_ptr<double>();
  const ops::Parallel par = torchao_kernels::aten_glue::aten_parallel();
  guarded([&] {
    for (int64_t c = 0; c < calls; ++c) {
      const int64_t* idx = pool.data_ptr<int64_t>() + (c % rows) * count;
      const auto t0 = std::chrono::steady_clock::now();
      if (l.qvals_only) {
        ops::embedding(packed.data_ptr(), packed.numel(), l.bits, l.n, l.k, s.data_ptr<float>(),
                       s.size(1), z.defined() ? z.data_ptr<int8_t>() : nullptr, idx, count,
                       out.data_ptr<float>(), par);
      } else {
        ops::shared_embedding(packed.data_ptr(), packed.numel(), l.bits, l.group_size, l.n, l.k, idx,
                              count, out.data_ptr<float>(), par);
      }
      t[c] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    return 0;
  });
  return times;
}
// Every int8 ceiling probe of kernel_registry.cpp: name, family, sequence and,
// where this CPU runs it, the measured GOPS of one core (null otherwise).
std::string int8_peaks_json() {
  return guarded([&] {
    const uint64_t isa = tk::detected_cpu().isa;
    std::string out = "[";
    for (const auto& p : tk::int8_peak_probes()) {
      const bool runnable = p.fn && (p.required_isa & ~isa) == 0;
      tk::ops::JsonObject j;
      j.str("name", p.name).str("isa_name", p.isa_name).str("what", p.what);
      if (runnable) {
        j.num("gops", p.fn());
      } else {
        j.raw("gops", "null");
      }
      out += (out.size() > 1 ? ", " : "") + j.done();
    }
    return out + "]";
  });
}

std::vector<std::string> isa_levels() { return tk::isa_levels(); }

// The op list (ops/impl/op_list.h) for the Python side: every family's op,
// torchao's per-bit-width ops, whether it has an out= variant, and the ops of
// the ExecuTorch kernel library.
std::string op_list_json() {
  std::vector<std::string> families;
  for (const auto& f : ops::kOpFamilies) {
    std::vector<std::string> per_bit;
    for (int b : ops::kOpBitWidths) per_bit.push_back(ops::json_str(ops::op_name(f, b)));
    families.push_back(ops::JsonObject()
                           .str("family", f.id)
                           .str("name", f.name)
                           .raw("per_bit", ops::json_list(per_bit))
                           .boolean("out", f.has_out)
                           .done());
  }
  std::vector<std::string> et;
  for (const auto& n : ops::executorch_op_names()) et.push_back(ops::json_str(n));
  return ops::JsonObject()
      .raw("families", ops::json_list(families))
      .raw("executorch", ops::json_list(et))
      .done();
}
std::string cpu_json(const std::optional<std::string>& cpu) { return cpu_named(cpu).to_json(); }

}  // namespace

TORCH_LIBRARY(torchao_kernels, m) {
  m.def("_register_torchao_compat() -> str", &register_torchao_compat);
  m.def("_info_json() -> str", &info_json);
  m.def("_cpu_json(str? cpu=None) -> str", &cpu_json);
  m.def("_fake_cpu_names() -> str[]", &fake_cpu_names);
  m.def("_set_active_cpu(str? cpu) -> ()", &set_active_cpu);
  m.def("_bench_cached_lookup(int iterations) -> float", &bench_cached_lookup);
  m.def("_time_lookups(Tensor packed, Tensor? scales, Tensor? zeros, Tensor index_pool, int calls) -> Tensor",
        &time_lookups);
  m.def("_isa_levels() -> str[]", &isa_levels);
  m.def("_op_list_json() -> str", &op_list_json);
  m.def("_int8_peaks_json() -> str", &int8_peaks_json);
  m.def(
      "_explain_json(Tensor? packed_weights, str? format, int bits, bool zeros, bool bias, int m, "
      "int threads, str? cpu=None) -> str",
      &explain_json);
  m.def("_best_format(str? target, int bits, bool zeros, bool bias, str? cpu=None) -> str", &best_format);
  m.def("_set_overrides(str max_isa, str force, str exclude) -> ()", &set_overrides);
  m.def("_overrides_json() -> str", &overrides_json);
  m.def("_stats_json() -> str", &stats_json);
  m.def("_reset_stats() -> ()", &reset_stats);
  m.def("_repack(Tensor packed_weights, str? target=None) -> Tensor", &repack);
  m.def("_copy_packed(Tensor packed_weights) -> Tensor", &copy_packed);
  m.def("_packed_info_json(Tensor packed_weights) -> str", &packed_info_json);
  m.def("_unpack(Tensor packed_weights) -> (Tensor, Tensor, Tensor, Tensor)", &unpack);
  m.def("_run_kernel(Tensor activations, Tensor packed_weights, str kernel) -> Tensor", &run_kernel);
  m.def("_linear_forced(Tensor activations, Tensor packed_weights, str kernel) -> Tensor", &linear_forced);
  m.def("_linear_class_json(Tensor packed_weights, int m, int threads) -> str", &linear_class_json);
  m.def("_set_tuning(str setting) -> ()", &set_tuning);
  m.def("_tuning_json() -> str", &tuning_json);
  m.def("_tuning_rule() -> (int, float, float, float, float)", &tuning_rule);
  m.def("_confirmed_winner(str first, str second, str static, float margin, str? wins, float min_wins) -> str",
        &confirmed_winner);
  m.def("_paired_wins(str samples, str static, float margin) -> str", &paired_wins);
  m.def("_activation_panels(Tensor x, int group_size, int bits, str kernel) -> (Tensor, Tensor, Tensor)",
        &activation_panels);
  m.def("_quantize_activations(Tensor x, int group_size, str kernel) -> (Tensor, Tensor, Tensor, Tensor)",
        &quantize_activations);
}
