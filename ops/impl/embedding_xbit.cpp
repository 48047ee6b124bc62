#include "ops/impl/embedding_xbit.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <string>

#include "kernels/format/kernel_args.h"
#include "kernels/quant/pack_weights.h"
#include "ops/impl/op_checks.h"

namespace torchao_kernels {
namespace ops {

namespace {

// Failure messages are streamed inside the failing branch only: constructing a
// std::ostringstream costs ~0.2 us, a visible share of a lookup call.
[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

// Lookups are split over threads in runs of rows large enough to outweigh
// the cost of waking a thread (~32 KB of output per task).
void run_lookups(const KernelInfo& kernel, EmbeddingArgs a, const Parallel& par) {
  if (a.count == 0) return;
  const int64_t rows_per_task = std::max<int64_t>(1, 8192 / std::max(1, a.w->k));
  const int64_t tasks = (a.count + rows_per_task - 1) / rows_per_task;
  auto body = [&](int64_t t0, int64_t t1) {
    EmbeddingArgs b = a;
    b.rows = a.rows + t0 * rows_per_task;
    b.count = std::min(a.count, t1 * rows_per_task) - t0 * rows_per_task;
    b.out = a.out + t0 * rows_per_task * a.out_stride;
    kernel.embed(b);
  };
  if (par.threads > 1 && tasks > 1 && par.run) {
    par.run(tasks, body);
  } else {
    body(0, tasks);
  }
}

const KernelInfo& select_lookup(const PackedView& v, bool zeros) {
  const PackedLayout& l = v.layout;
  const ProblemClass pc{v.format, l.bits, zeros, false, 0, KernelOp::kEmbedding};
  Selector& sel = Selector::get();
  const KernelInfo& k = sel.kernel(pc, current_cluster());
  sel.count(k);
  return k;
}

}  // namespace

size_t pack_embedding_size(int bits, int64_t num_embeddings, int64_t embedding_dim) {
  check_qvals_only_params(bits, num_embeddings, embedding_dim);
  return qvals_only_size(bits, static_cast<int>(num_embeddings), static_cast<int>(embedding_dim));
}

void pack_embedding(int bits, int64_t num_embeddings, int64_t embedding_dim, const int8_t* qvals,
                    void* out) {
  check_qvals_only_params(bits, num_embeddings, embedding_dim);
  pack_qvals_only(bits, static_cast<int>(num_embeddings), static_cast<int>(embedding_dim), qvals,
                  out);
}

void check_indices(const int64_t* indices, int64_t count, int64_t num_embeddings) {
  for (int64_t i = 0; i < count; ++i) {
    if (indices[i] < 0 || indices[i] >= num_embeddings) {
      std::ostringstream os;
      os << "indices[" << i << "] = " << indices[i] << " is out of range for an embedding of "
         << num_embeddings << " rows (valid: 0.." << num_embeddings - 1 << ")";
      throw std::out_of_range(os.str());
    }
  }
}

namespace {

void check_table(const PackedView& v, int64_t num_embeddings, int64_t embedding_dim,
                 int64_t groups) {
  const PackedLayout& l = v.layout;
  if (!l.qvals_only) {
    fail("packed_weight_qvals is a buffer of the linear pack op (it carries its own scales); "
         "look rows up with torchao::_shared_embedding_{b}bit, or pack the table with "
         "torchao::_pack_embedding_{b}bit");
  }
  if (num_embeddings != l.n || embedding_dim != l.k) {
    std::ostringstream os;
    os << "num_embeddings=" << num_embeddings << ", embedding_dim=" << embedding_dim
       << " do not match packed_weight_qvals (packed as " << l.n << " x " << l.k << ")";
    fail(os.str());
  }
  if (groups < 1 || embedding_dim % groups != 0 || (embedding_dim / groups) % kGroupMultiple != 0) {
    std::ostringstream os;
    os << "weight_scales must have shape (num_embeddings, groups) with embedding_dim / groups a "
          "multiple of " << kGroupMultiple << "; got "
       << groups << " groups for embedding_dim=" << embedding_dim;
    fail(os.str());
  }
}

}  // namespace

void embedding(const void* packed, size_t packed_bytes, int bits, int64_t num_embeddings,
               int64_t embedding_dim, const float* scales, int64_t groups, const int8_t* zeros,
               const int64_t* indices, int64_t count, float* out, const Parallel& par) {
  const PackedView v = parse_packed(packed, packed_bytes);
  check_bit_width("packed_weight_qvals", v.layout.bits, bits);
  check_table(v, num_embeddings, embedding_dim, groups);
  check_indices(indices, count, num_embeddings);
  const KernelInfo& kernel = select_lookup(v, zeros != nullptr);
  EmbeddingArgs a{&v.layout, v.body, scales, zeros, static_cast<int>(embedding_dim / groups),
                  indices, count, out, embedding_dim};
  run_lookups(kernel, a, par);
}

void shared_embedding(const void* packed, size_t packed_bytes, int bits, int64_t group_size,
                      int64_t n, int64_t k, const int64_t* indices, int64_t count, float* out,
                      const Parallel& par) {
  const PackedView v = parse_packed(packed, packed_bytes);
  const PackedLayout& l = v.layout;
  check_bit_width("packed_weights", l.bits, bits);
  if (l.qvals_only) {
    fail("packed_weights is a weights-only embedding table (torchao::_pack_embedding_{b}bit); "
         "look rows up with torchao::_embedding_{b}bit, which takes its scales");
  }
  if (n != l.n || k != l.k) {
    std::ostringstream os;
    os << "n=" << n << ", k=" << k << " do not match packed_weights (packed with n=" << l.n
       << ", k=" << l.k << ")";
    fail(os.str());
  }
  if (group_size != l.group_size) {
    std::ostringstream os;
    os << "group_size=" << group_size << " does not match packed_weights (packed with group_size="
       << l.group_size << ")";
    fail(os.str());
  }
  check_indices(indices, count, n);
  const KernelInfo& kernel = select_lookup(v, l.has_zeros);
  EmbeddingArgs a{&l, v.body, nullptr, nullptr, 0, indices, count, out, k};
  run_lookups(kernel, a, par);
}

void embedding_with_kernel(const KernelInfo& kernel, const void* packed, size_t packed_bytes,
                           const float* scales, int64_t groups, const int8_t* zeros,
                           const int64_t* indices, int64_t count, float* out) {
  const PackedView v = parse_packed(packed, packed_bytes);
  const PackedLayout& l = v.layout;
  if (kernel.op != KernelOp::kEmbedding || !kernel.embed)
    fail(std::string("kernel ") + kernel.name + " is not an embedding kernel of this build");
  const uint64_t missing = kernel.required_isa & ~detected_cpu().isa;
  if (missing) fail(std::string("kernel ") + kernel.name + " needs ISA extensions this CPU lacks");
  if (kernel.format != v.format)
    fail(std::string("kernel ") + kernel.name + " reads format " + find_format(kernel.format)->name +
         ", but packed_weights are in format " + find_format(v.format)->name);
  if (l.qvals_only) check_table(v, l.n, l.k, groups);
  check_indices(indices, count, l.n);
  EmbeddingArgs a{&l, v.body, l.qvals_only ? scales : nullptr, l.qvals_only ? zeros : nullptr,
                  l.qvals_only ? static_cast<int>(l.k / groups) : 0, indices, count, out, l.k};
  if (count) kernel.embed(a);
}

}  // namespace ops
}  // namespace torchao_kernels
