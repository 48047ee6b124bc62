// Framework-agnostic op bodies: validate, select, parallelize, call kernels.
// The ATen and ExecuTorch registrations are thin wrappers around these.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "kernels/format/packed_format.h"
#include "kernels/quant/pack_weights.h"
#include "kernels/select/selector.h"

namespace torchao_kernels {
namespace ops {

// How a framework runs a parallel loop: calls fn(begin, end) over [0, tasks).
struct Parallel {
  int threads = 1;
  std::function<void(int64_t tasks, const std::function<void(int64_t, int64_t)>& fn)> run;
};

// Pack-time format choice for a target string (see resolve_target).
FormatId choose_format(const std::string& target, int bits, bool zeros, bool bias);
size_t packed_weights_size(FormatId format, int bits, int64_t n, int64_t k, int64_t group_size,
                           bool zeros, bool bias, ScaleType scale_type = ScaleType::kFloat32);
// Validates shapes and packs; throws std::invalid_argument naming bad arguments.
void pack_weights_checked(FormatId format, const WeightsView& w, void* out);

// The threads a call runs on: `threads`, or 1 for a call too small to split
// (under kMinSplitMacs multiply-accumulates and kMinSplitWeightBytes of
// packed weights). Its problem class counts the threads it runs on.
constexpr int64_t kMinSplitMacs = int64_t{1} << 19;
constexpr int64_t kMinSplitWeightBytes = int64_t{128} << 10;
int call_threads(int64_t m, int64_t n, int64_t k, int64_t weight_bytes, int threads);

// Y[m, n] = linear(X[m, k], packed); float32 in and out.
void linear(const float* x, int64_t m, int64_t k, const void* packed, size_t packed_bytes,
            int64_t group_size, int64_t n, float* out, const Parallel& par);

// Runs one named kernel on one thread (kernel tests and per-kernel
// benchmarks). Throws if the CPU lacks the kernel's ISA or the format differs.
// The op with `kernel` instead of the selected one (benchmarks, tuning): the
// same parallel split, every core cluster running that kernel.
void linear_forced(const KernelInfo& kernel, const float* x, int64_t m, int64_t k,
                   const void* packed, size_t packed_bytes, float* out, const Parallel& par);
// The problem class a call at m rows and `threads` threads falls in: its key,
// the rows that may run it, the selected and the static choice (tuning).
std::string linear_class_json(const void* packed, size_t packed_bytes, int64_t m, int threads);

void linear_with_kernel(const KernelInfo& kernel, const float* x, int64_t m, int64_t k,
                        const void* packed, size_t packed_bytes, float* out);

// Converts packed weights to another format, through unpacking.
size_t repack_size(const void* packed, size_t packed_bytes, FormatId target);
void repack(const void* packed, size_t packed_bytes, FormatId target, void* out);

// Inspection (JSON strings; the Python layer turns them into objects).
std::string explain_json(const CpuDescriptor& cpu, FormatId format, int bits, bool zeros,
                         bool bias, int64_t m, int threads, KernelOp op = KernelOp::kLinear,
                         int64_t weight_bytes = -1, int64_t k = -1, int64_t group_size = -1,
                         int64_t n = -1);
std::string info_json();
std::string packed_header_json(const void* packed, size_t packed_bytes);
std::string stats_json();

// Where one-time warnings go (the ATen glue routes them to TORCH_WARN).
void set_warning_handler(void (*handler)(const std::string&));

}  // namespace ops
}  // namespace torchao_kernels
