#include "kernels/select/tuning_table.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>

#include "kernels/format/packed_format.h"
#include "kernels/generated/kernel_functions.h"
#include "kernels/select/json_reader.h"
#include "kernels/select/selector.h"

namespace torchao_kernels {

namespace {

uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string hex(uint64_t v, int digits) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return std::string(buf + 16 - digits);
}

std::string file_safe(const std::string& s) {
  std::string o;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (ok) {
      o += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    } else if (!o.empty() && o.back() != '-') {
      o += '-';
    }
  }
  while (!o.empty() && o.back() == '-') o.pop_back();
  return o.substr(0, 48);
}

}  // namespace

std::string class_key(const ProblemClass& pc, int cluster) {
  std::string k = kernel_op_name(pc.op);
  k += "/" + std::string(find_format(pc.format)->name);
  k += "/b" + std::to_string(pc.bits) + "/z" + std::to_string(pc.zeros ? 1 : 0) + "/bias" +
       std::to_string(pc.bias ? 1 : 0);
  k += "/m" + std::string(m_bucket_name(pc.bucket));
  k += "/" + std::string(residency_name(pc.residency));
  k += "/" + std::string(row_length_name(pc.rows));
  k += "/" + std::string(group_length_name(pc.groups));
  k += "/t" + std::string(thread_bucket_name(pc.threads));
  k += "/c" + std::to_string(cluster);
  return k;
}

std::string cpu_signature(const CpuDescriptor& cpu) {
  std::string s = cpu.id.empty() ? "unknown" : cpu.id;
  s += "; clusters";
  for (const auto& c : cpu.clusters) s += " " + std::to_string(c.cores) + "x" + c.uarch;
  s += "; isa";
  for (const auto& n : isa_names(cpu.isa)) s += " " + n;
  s += "; l1d " + std::to_string(cpu.l1d_bytes) + " l2 " + std::to_string(cpu.l2_bytes) + " l3 " +
       std::to_string(cpu.l3_bytes) + "; cores " + std::to_string(cpu.cores);
  return s;
}

std::string cpu_signature_file_id(const CpuDescriptor& cpu) {
  const std::string id = file_safe(cpu.id.empty() ? "unknown" : cpu.id);
  return (id.empty() ? "cpu" : id) + "-" + hex(fnv1a(cpu_signature(cpu)), 12);
}

std::string kernel_set_version() {
  // The class key's layout is part of the stamp: a table keyed by other
  // class dimensions is ignored with its warning rather than half-matched.
  uint64_t h = fnv1a("torchao_kernels kernel set; classes by op/format/bits/zeros/bias/m (1, 2, 3, 4-7, ...)/residency/rows (<= 576, <= 1024, longer)/groups/threads/cluster");
  for (const auto& k : kernel_registry()) {
    std::string row = std::string(k.name) + "|" + kernel_op_name(k.op) + "|" +
                      find_format(k.format)->name + "|" + std::to_string(k.required_isa) + "|" +
                      std::to_string(k.m_min) + "|" + std::to_string(k.m_max) + "|" +
                      std::to_string(k.mr) + "|" + std::to_string(k.nr) + "|" +
                      std::to_string(k.bits_mask) + "|" + std::to_string(k.zeros) +
                      std::to_string(k.bias) + "|" + std::to_string(k.lhs_panel_rows) + "x" +
                      std::to_string(k.lhs_panel_kr) + (k.lhs_panel_int16 ? "i16" : "") + "|" +
                      std::to_string(k.long_groups) + ";";
    h = fnv1a(row, h);
  }
  return hex(h, 16);
}

std::string default_tuning_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && *xdg) return std::string(xdg) + "/torchao_kernels/tuning";
  const char* home = std::getenv("HOME");
  if (home && *home) return std::string(home) + "/.cache/torchao_kernels/tuning";
  return "";
}

std::string default_tuning_path(const CpuDescriptor& cpu) {
  const std::string dir = default_tuning_dir();
  return dir.empty() ? "" : dir + "/" + cpu_signature_file_id(cpu) + ".json";
}

std::unique_ptr<TuningTable> parse_tuning_table(const std::string& text, const CpuDescriptor& cpu,
                                                std::string& why, int* dropped) {
  if (dropped) *dropped = 0;
  JsonValue doc;
  std::string err;
  if (!parse_json(text, doc, err)) {
    why = "not valid JSON (" + err + ")";
    return nullptr;
  }
  if (!doc.is_object()) {
    why = "not a JSON object";
    return nullptr;
  }
  const JsonValue* schema = doc.get("schema");
  const JsonValue* version = doc.get("version");
  if (!schema || !schema->is_string() || schema->string != kTuningTableSchema) {
    why = std::string("not a tuning table (\"schema\" is not \"") + kTuningTableSchema + "\")";
    return nullptr;
  }
  if (!version || !version->is_number() || version->number != kTuningTableVersion) {
    why = "table format version is not " + std::to_string(kTuningTableVersion);
    return nullptr;
  }
  auto t = std::make_unique<TuningTable>();
  const JsonValue* sig = doc.get("cpu_signature");
  const JsonValue* kset = doc.get("kernel_set");
  if (!sig || !sig->is_string() || !kset || !kset->is_string()) {
    why = "\"cpu_signature\" or \"kernel_set\" missing";
    return nullptr;
  }
  t->cpu_signature = sig->string;
  t->kernel_set = kset->string;
  if (t->cpu_signature != cpu_signature(cpu)) {
    why = "it was measured on another CPU (table: '" + t->cpu_signature + "'; this CPU: '" +
          cpu_signature(cpu) + "')";
    return nullptr;
  }
  if (t->kernel_set != kernel_set_version()) {
    why = "it was measured with another set of kernels (table: " + t->kernel_set +
          ", this build: " + kernel_set_version() + ")";
    return nullptr;
  }
  const JsonValue* entries = doc.get("entries");
  if (!entries || !entries->is_object()) {
    why = "\"entries\" missing or not an object";
    return nullptr;
  }
  for (const auto& kv : entries->members) {
    const JsonValue& e = kv.second;
    const JsonValue* winner = e.get("winner");
    if (!winner || !winner->is_string() || !find_kernel(winner->string.c_str())) {
      if (dropped) ++*dropped;
      continue;
    }
    TunedChoice c;
    c.winner = winner->string;
    const JsonValue* st = e.get("static");
    if (st && st->is_string() && find_kernel(st->string.c_str())) c.static_when_tuned = st->string;
    // Rows this build knows, each once (a name repeated in the file: its
    // last value, as JsonValue::get reads a key), with a number in [0, hi]
    // (a corrupt entry loses the field, not the table).
    auto read_rows = [&](const char* field, double hi, std::vector<std::pair<std::string, double>>& out) {
      const JsonValue* rows = e.get(field);
      if (!rows || !rows->is_object()) return;
      std::map<std::string, const JsonValue*> last;
      for (const auto& tv : rows->members) last[tv.first] = &tv.second;
      for (const auto& kv : last) {
        const JsonValue& v = *kv.second;
        if (v.is_number() && v.number >= 0 && v.number <= hi && find_kernel(kv.first.c_str()))
          out.emplace_back(kv.first, v.number);
      }
    };
    read_rows("times_us", std::numeric_limits<double>::max(), c.times_us);
    read_rows("confirm_us", std::numeric_limits<double>::max(), c.confirm_us);
    read_rows("confirm_wins", 1.0, c.confirm_wins);
    auto by_time = [](const auto& a, const auto& b) { return a.second < b.second; };
    std::stable_sort(c.times_us.begin(), c.times_us.end(), by_time);
    std::stable_sort(c.confirm_us.begin(), c.confirm_us.end(), by_time);
    t->entries[kv.first] = std::move(c);
  }
  return t;
}

RowTimes paired_wins(const std::vector<RoundSamples>& samples_per_point, const std::string& static_row,
                     double margin) {
  std::vector<std::string> order;
  std::map<std::string, std::pair<int64_t, int64_t>> won_of;  // row -> (won, pairs)
  for (const RoundSamples& point : samples_per_point) {
    const std::vector<double>* ref = nullptr;
    for (const auto& rs : point)
      if (rs.first == static_row) ref = &rs.second;
    if (!ref) continue;
    for (const auto& rs : point) {
      if (rs.first == static_row) continue;
      const size_t rounds = std::min(rs.second.size(), ref->size());
      if (rounds == 0) continue;
      auto it = won_of.find(rs.first);
      if (it == won_of.end()) {
        order.push_back(rs.first);
        it = won_of.emplace(rs.first, std::make_pair(int64_t{0}, int64_t{0})).first;
      }
      for (size_t i = 0; i < rounds; ++i) {
        it->second.second += 1;
        it->second.first += rs.second[i] * (1 + margin) <= (*ref)[i];
      }
    }
  }
  RowTimes out;
  for (const auto& r : order) {
    const auto& wp = won_of[r];
    out.emplace_back(r, static_cast<double>(wp.first) / static_cast<double>(wp.second));
  }
  return out;
}

namespace {
const std::pair<std::string, double>* fastest(const RowTimes& t) {
  const std::pair<std::string, double>* best = nullptr;
  for (const auto& rt : t)
    if (!best || rt.second < best->second) best = &rt;
  return best;
}
}  // namespace

const double* time_of(const RowTimes& t, const std::string& row) {
  const double* v = nullptr;
  for (const auto& rt : t)
    if (rt.first == row) v = &rt.second;  // the last one, as a JSON object's repeated name
  return v;
}

std::string confirmed_winner(const RowTimes& first, const RowTimes& second, const std::string& static_row,
                             double margin, const RowTimes* wins, double min_wins) {
  if (second.empty()) {
    const auto* best = fastest(first);
    return best ? best->first : std::string();
  }
  const auto* best_time = fastest(second);
  const std::string best = best_time->first;
  const double* static_time = static_row.empty() ? nullptr : time_of(second, static_row);
  if (!static_time) return best;
  if (*static_time < best_time->second * (1 + margin)) return static_row;
  if (wins && best != static_row) {
    const double* w = time_of(*wins, best);
    if ((w ? *w : 0.0) < min_wins) return static_row;
  }
  return best;
}

bool raced_in_bucket(const KernelInfo& kernel, int bucket) {
  const int64_t f = kTuneRangeFactor;
  const bool not_far_above = kernel.m_max <= 0 || m_bucket_lo(bucket) <= f * kernel.m_max;
  const bool not_far_below = m_bucket_hi(bucket) <= 0 || kernel.m_min <= f * m_bucket_hi(bucket);
  return not_far_above && not_far_below;
}

}  // namespace torchao_kernels
