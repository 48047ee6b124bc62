// ATen registration of the embedding ops (thin: tensor checks and
// conversions; the op bodies are in ops/impl/embedding_xbit.cpp).
//   torchao::pack_embedding_xbit / embedding_xbit[.out] / shared_embedding_xbit[.out]
//     this project's spelling, the bit width read from the buffer;
//   torchao::_pack_embedding_{b}bit / _embedding_{b}bit[.out] / _shared_embedding_{b}bit[.out]
//     torchao's schemas, registered at import (register_torchao_embedding_compat)
//     unless torchao's own kernel library already defined them.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <mutex>
#include <stdexcept>
#include <string>

#include "ops/aten/aten_glue.h"
#include "ops/impl/embedding_xbit.h"

namespace torchao_kernels {
namespace aten_glue {
namespace {

using at::Tensor;
namespace tk = torchao_kernels;

Tensor index_tensor(const Tensor& indices) {
  guarded([&] {
    ops::check_indices_arg(tensor_arg(indices));
    return 0;
  });
  return indices.to(at::kLong).contiguous();
}

std::vector<int64_t> out_shape(const Tensor& indices, int64_t dim) {
  auto s = indices.sizes().vec();
  s.push_back(dim);
  return s;
}

std::vector<c10::SymInt> out_sym_shape(const Tensor& indices, int64_t dim) {
  auto s = indices.sym_sizes().vec();
  s.push_back(c10::SymInt(dim));
  return s;
}

// ---- pack

Tensor pack_embedding_impl(const Tensor& weight_qvals, int64_t weight_nbit) {
  TORCH_CHECK_VALUE(weight_nbit >= 1 && weight_nbit <= tk::kMaxBits, "weight_nbit must be in 1..", tk::kMaxBits, ", got ",
                    weight_nbit);
  TORCH_CHECK_VALUE(weight_qvals.dim() == 2,
                    "weight_qvals must be 2-D (num_embeddings, embedding_dim), got shape ",
                    weight_qvals.sizes());
  TORCH_CHECK_VALUE(weight_qvals.scalar_type() == at::kChar, "weight_qvals must be int8, got ",
                    weight_qvals.scalar_type());
  const Tensor q = weight_qvals.contiguous();
  const int bits = static_cast<int>(weight_nbit);
  return guarded([&] {
    const size_t bytes = ops::pack_embedding_size(bits, q.size(0), q.size(1));
    Tensor out = empty_packed(static_cast<int64_t>(bytes), at::TensorOptions().dtype(at::kChar));
    ops::pack_embedding(bits, q.size(0), q.size(1), q.data_ptr<int8_t>(), out.data_ptr());
    return out;
  });
}

Tensor pack_embedding_meta(const Tensor& weight_qvals, int64_t weight_nbit) {
  TORCH_CHECK_VALUE(weight_qvals.dim() == 2,
                    "weight_qvals must be 2-D (num_embeddings, embedding_dim), got shape ",
                    weight_qvals.sizes());
  return guarded([&] {
    const size_t bytes = ops::pack_embedding_size(static_cast<int>(weight_nbit),
                                                  weight_qvals.size(0), weight_qvals.size(1));
    return at::empty({static_cast<int64_t>(bytes)},
                     at::TensorOptions().dtype(at::kChar).device(at::kMeta));
  });
}

// Runs a lookup into `out` (resized to indices.shape + (dim,)): body(indices,
// count, float32 rows) on out itself when it is contiguous float32, else on a
// temporary copied into it.
template <class F>
void lookup_into(const Tensor& indices, int64_t dim, Tensor& out, F&& body) {
  // Rows are float32; a narrower or integer `out` would silently round them.
  TORCH_CHECK_VALUE(out.scalar_type() == at::kFloat, "out must be float32, got ", out.scalar_type());
  TORCH_CHECK_VALUE(out.device().is_cpu(), "out must be a CPU tensor, got ", out.device());
  TORCH_CHECK_VALUE(dim >= 0, "the embedding dimension must be >= 0, got ", dim);
  const Tensor idx = index_tensor(indices);
  const auto shape = out_shape(indices, dim);
  if (out.sizes().vec() != shape) out.resize_(shape);
  const bool direct = out.scalar_type() == at::kFloat && out.is_contiguous();
  Tensor y = direct ? out : at::empty(shape, at::kFloat);
  guarded([&] {
    body(idx.data_ptr<int64_t>(), idx.numel(), y.data_ptr<float>());
    return 0;
  });
  if (!direct) out.copy_(y);
}

// ---- lookup in a weights-only table

void embedding_into(int bits, const Tensor& packed, int64_t num_embeddings, int64_t embedding_dim,
                    const Tensor& weight_scales, const std::optional<Tensor>& weight_zeros,
                    const Tensor& indices, Tensor& out) {
  check_packed(packed, "packed_weight_qvals");
  check_size_fits("embedding_dim", embedding_dim, packed, "packed_weight_qvals");
  const bool has_zeros = weight_zeros.has_value() && weight_zeros->defined();
  guarded([&] {
    const ops::TensorArg s = tensor_arg(weight_scales);
    ops::check_embedding_scales_arg(s, num_embeddings);
    if (has_zeros) ops::check_embedding_zeros_arg(tensor_arg(*weight_zeros), s);
    return 0;
  });
  const int64_t groups = weight_scales.size(1);
  const Tensor scales = weight_scales.to(at::kFloat).contiguous();
  Tensor zeros;
  if (has_zeros) {
    // int8 zero points (torchao's) fit by type; wider types are checked once
    // per call, which costs a pass over the table's zero points.
    if (weight_zeros->scalar_type() != at::kChar && weight_zeros->numel() > 0) {
      const auto mn = weight_zeros->min().item<int64_t>(), mx = weight_zeros->max().item<int64_t>();
      guarded([&] {
        ops::check_zero_point_range(mn, mx);
        return 0;
      });
    }
    zeros = weight_zeros->to(at::kChar).contiguous();
  }
  lookup_into(indices, embedding_dim, out, [&](const int64_t* idx, int64_t count, float* y) {
    ops::embedding(packed.data_ptr(), static_cast<size_t>(packed.numel()), bits, num_embeddings,
                   embedding_dim, scales.data_ptr<float>(), groups,
                   zeros.defined() ? zeros.data_ptr<int8_t>() : nullptr, idx, count, y,
                   aten_parallel());
  });
}

template <int B>
Tensor embedding_impl(const Tensor& packed, int64_t num_embeddings, int64_t embedding_dim,
                      const Tensor& weight_scales, const std::optional<Tensor>& weight_zeros,
                      const Tensor& indices) {
  Tensor out = at::empty({0}, at::kFloat);
  embedding_into(B, packed, num_embeddings, embedding_dim, weight_scales, weight_zeros, indices, out);
  return out;
}

template <int B>
Tensor& embedding_out_impl(const Tensor& packed, int64_t num_embeddings, int64_t embedding_dim,
                           const Tensor& weight_scales, const std::optional<Tensor>& weight_zeros,
                           const Tensor& indices, Tensor& out) {
  embedding_into(B, packed, num_embeddings, embedding_dim, weight_scales, weight_zeros, indices, out);
  return out;
}

// torchao's schema takes the zero points as a Tensor (not optional).
template <int B>
Tensor embedding_bits(const Tensor& packed, int64_t num_embeddings, int64_t embedding_dim,
                      const Tensor& weight_scales, const Tensor& weight_zeros, const Tensor& indices) {
  return embedding_impl<B>(packed, num_embeddings, embedding_dim, weight_scales, weight_zeros, indices);
}
template <int B>
Tensor& embedding_bits_out(const Tensor& packed, int64_t num_embeddings, int64_t embedding_dim,
                           const Tensor& weight_scales, const Tensor& weight_zeros,
                           const Tensor& indices, Tensor& out) {
  return embedding_out_impl<B>(packed, num_embeddings, embedding_dim, weight_scales, weight_zeros,
                               indices, out);
}

Tensor embedding_meta(const Tensor& packed, int64_t num_embeddings, int64_t embedding_dim,
                      const Tensor& weight_scales, const std::optional<Tensor>& weight_zeros,
                      const Tensor& indices) {
  check_one_device({{"packed_weight_qvals", &packed}, {"weight_scales", &weight_scales},
                    {"weight_zeros", weight_zeros.has_value() ? &*weight_zeros : nullptr},
                    {"indices", &indices}});
  return at::empty_symint(out_sym_shape(indices, embedding_dim),
                          at::TensorOptions().dtype(at::kFloat).device(at::kMeta));
}
Tensor embedding_bits_meta(const Tensor& packed, int64_t num_embeddings, int64_t embedding_dim,
                           const Tensor& weight_scales, const Tensor& weight_zeros,
                           const Tensor& indices) {
  return embedding_meta(packed, num_embeddings, embedding_dim, weight_scales, weight_zeros, indices);
}

// ---- lookup in a linear packed buffer

void shared_into(int bits, const Tensor& packed, int64_t group_size, int64_t n, int64_t k,
                 const Tensor& indices, Tensor& out) {
  check_packed(packed, "packed_weights");
  check_size_fits("k", k, packed);
  lookup_into(indices, k, out, [&](const int64_t* idx, int64_t count, float* y) {
    ops::shared_embedding(packed.data_ptr(), static_cast<size_t>(packed.numel()), bits, group_size,
                          n, k, idx, count, y, aten_parallel());
  });
}

template <int B>
Tensor shared_impl(const Tensor& packed, int64_t group_size, int64_t n, int64_t k,
                   const Tensor& indices) {
  Tensor out = at::empty({0}, at::kFloat);
  shared_into(B, packed, group_size, n, k, indices, out);
  return out;
}
template <int B>
Tensor& shared_out_impl(const Tensor& packed, int64_t group_size, int64_t n, int64_t k,
                        const Tensor& indices, Tensor& out) {
  shared_into(B, packed, group_size, n, k, indices, out);
  return out;
}
Tensor shared_meta(const Tensor& packed, int64_t group_size, int64_t n, int64_t k,
                   const Tensor& indices) {
  check_one_device({{"packed_weights", &packed}, {"indices", &indices}});
  return at::empty_symint(out_sym_shape(indices, k),
                          at::TensorOptions().dtype(at::kFloat).device(at::kMeta));
}
Tensor& shared_out_meta(const Tensor& packed, int64_t group_size, int64_t n, int64_t k,
                        const Tensor& indices, Tensor& out) {
  check_one_device({{"packed_weights", &packed}, {"indices", &indices}, {"out", &out}});
  const auto shape = out_sym_shape(indices, k);
  if (out.sym_sizes() != c10::SymIntArrayRef(shape)) out.resize__symint(shape);
  return out;
}
template <int B>
Tensor pack_bits(const Tensor& q) {
  return pack_embedding_impl(q, B);
}
template <int B>
Tensor pack_bits_meta(const Tensor& q) {
  return pack_embedding_meta(q, B);
}
Tensor& embedding_out_meta(const Tensor& packed, int64_t num_embeddings, int64_t embedding_dim,
                           const Tensor& weight_scales, const std::optional<Tensor>& weight_zeros,
                           const Tensor& indices, Tensor& out) {
  check_one_device({{"packed_weight_qvals", &packed}, {"weight_scales", &weight_scales},
                    {"weight_zeros", weight_zeros.has_value() ? &*weight_zeros : nullptr},
                    {"indices", &indices}, {"out", &out}});
  const auto shape = out_sym_shape(indices, embedding_dim);
  if (out.sym_sizes() != c10::SymIntArrayRef(shape)) out.resize__symint(shape);
  return out;
}
Tensor& embedding_bits_out_meta(const Tensor& packed, int64_t num_embeddings, int64_t embedding_dim,
                                const Tensor& weight_scales, const Tensor& weight_zeros,
                                const Tensor& indices, Tensor& out) {
  return embedding_out_meta(packed, num_embeddings, embedding_dim, weight_scales, weight_zeros,
                            indices, out);
}

using ops::OpFamilyId;
using ops::op_family;
using ops::op_name;

template <int B>
void def_compat(torch::Library& lib, torch::Library& cpu, torch::Library& meta, torch::Library& autograd,
                bool want_meta) {
  const std::string pack = op_name(OpFamilyId::pack_embedding, B),
                    emb = op_name(OpFamilyId::embedding, B),
                    shared = op_name(OpFamilyId::shared_embedding, B);
  for (auto id : {OpFamilyId::pack_embedding, OpFamilyId::embedding, OpFamilyId::shared_embedding})
    def_op(lib, op_family(id), B);
  cpu.impl(pack.c_str(), &pack_bits<B>);
  cpu.impl(emb.c_str(), &embedding_bits<B>);
  cpu.impl((emb + ".out").c_str(), &embedding_bits_out<B>);
  cpu.impl(shared.c_str(), &shared_impl<B>);
  cpu.impl((shared + ".out").c_str(), &shared_out_impl<B>);
  meta.impl(pack.c_str(), &pack_bits_meta<B>);
  // torchao's Python package may have registered Meta kernels for the
  // functional lookups already (torchao/csrc_meta_ops.py): keep them then.
  if (want_meta) {
    meta.impl(emb.c_str(), &embedding_bits_meta);
    meta.impl(shared.c_str(), &shared_meta);
  }
  meta.impl((emb + ".out").c_str(), &embedding_bits_out_meta);
  meta.impl((shared + ".out").c_str(), &shared_out_meta);
  impl_out_autograd(autograd, emb);
  impl_out_autograd(autograd, shared);
}

}  // namespace
}  // namespace aten_glue
}  // namespace torchao_kernels

namespace ag = torchao_kernels::aten_glue;

// The ops of the embedding families of ops/impl/op_list.h.
using torchao_kernels::ops::OpFamilyId;
using torchao_kernels::ops::op_family;
using torchao_kernels::ops::op_name;

TORCH_LIBRARY_FRAGMENT(torchao, m) {
  for (auto id : {OpFamilyId::pack_embedding, OpFamilyId::embedding, OpFamilyId::shared_embedding})
    ag::def_op(m, op_family(id), 0);
}

TORCH_LIBRARY_IMPL(torchao, CPU, m) {
  const std::string emb = op_name(OpFamilyId::embedding, 0), shared = op_name(OpFamilyId::shared_embedding, 0);
  m.impl(op_name(OpFamilyId::pack_embedding, 0).c_str(), &ag::pack_embedding_impl);
  m.impl(emb.c_str(), &ag::embedding_impl<0>);
  m.impl((emb + ".out").c_str(), &ag::embedding_out_impl<0>);
  m.impl(shared.c_str(), &ag::shared_impl<0>);
  m.impl((shared + ".out").c_str(), &ag::shared_out_impl<0>);
}

TORCH_LIBRARY_IMPL(torchao, Autograd, m) {
  ag::impl_out_autograd(m, op_name(OpFamilyId::embedding, 0));
  ag::impl_out_autograd(m, op_name(OpFamilyId::shared_embedding, 0));
}

TORCH_LIBRARY_IMPL(torchao, Meta, m) {
  const std::string emb = op_name(OpFamilyId::embedding, 0), shared = op_name(OpFamilyId::shared_embedding, 0);
  m.impl(op_name(OpFamilyId::pack_embedding, 0).c_str(), &ag::pack_embedding_meta);
  m.impl(emb.c_str(), &ag::embedding_meta);
  m.impl((emb + ".out").c_str(), &ag::embedding_out_meta);
  m.impl(shared.c_str(), &ag::shared_meta);
  m.impl((shared + ".out").c_str(), &ag::shared_out_meta);
}

// Returns "registered", or why torchao's own definitions were kept.
std::string register_torchao_embedding_compat() {
  return ag::register_torchao_family(
      "torchao::" + op_name(OpFamilyId::embedding, 4),
      "torchao's own kernel library already defines torchao::_embedding_{1..8}bit; its implementation serves "
      "those calls (torchao_kernels serves torchao::embedding_xbit and torchao::shared_embedding_xbit)",
      [](torch::Library& lib, torch::Library& cpu, torch::Library& meta, torch::Library& autograd, bool want_meta) {
        torchao_kernels::ops::for_each_op_bit_width(
            [&](auto b) { ag::def_compat<decltype(b)::value>(lib, cpu, meta, autograd, want_meta); });
      });
}

// Internal entry points (namespace torchao_kernels) behind the Python API and
// the generated kernel tests.
namespace {

// One named lookup kernel on one thread: (count,) indices -> (count, k).
// scales / zeros: for weights-only tables (else ignored).
at::Tensor run_embedding_kernel(const at::Tensor& packed, const at::Tensor& indices,
                                const std::string& kernel,
                                const std::optional<at::Tensor>& weight_scales,
                                const std::optional<at::Tensor>& weight_zeros) {
  namespace tk = torchao_kernels;
  const tk::KernelInfo* k = tk::find_kernel(kernel.c_str());
  TORCH_CHECK_VALUE(k != nullptr, "unknown kernel '", kernel, "'");
  ag::check_packed(packed, "packed_weights");
  const at::Tensor idx = ag::index_tensor(indices).reshape({-1});
  const tk::PackedView v =
      ag::guarded([&] { return tk::parse_packed(packed.data_ptr(), packed.numel()); });
  at::Tensor scales, zeros;
  int64_t groups = 1;
  if (v.layout.qvals_only) {
    // As the op checks them (embedding_into): the rows a lookup reads must exist.
    TORCH_CHECK_VALUE(weight_scales.has_value(), "a weights-only table needs weight_scales");
    ag::guarded([&] {
      const tk::ops::TensorArg s = ag::tensor_arg(*weight_scales);
      tk::ops::check_embedding_scales_arg(s, v.layout.n);
      if (weight_zeros.has_value()) tk::ops::check_embedding_zeros_arg(ag::tensor_arg(*weight_zeros), s);
      return 0;
    });
    scales = weight_scales->to(at::kFloat).contiguous();
    groups = scales.size(1);
    if (weight_zeros.has_value()) {
      if (weight_zeros->scalar_type() != at::kChar && weight_zeros->numel() > 0) {
        const auto mn = weight_zeros->min().item<int64_t>(), mx = weight_zeros->max().item<int64_t>();
        ag::guarded([&] {
          tk::ops::check_zero_point_range(mn, mx);
          return 0;
        });
      }
      zeros = weight_zeros->to(at::kChar).contiguous();
    }
  }
  return ag::guarded([&] {
    at::Tensor out = at::empty({idx.numel(), v.layout.k}, at::kFloat);
    tk::ops::embedding_with_kernel(*k, packed.data_ptr(), packed.numel(),
                                   scales.defined() ? scales.data_ptr<float>() : nullptr, groups,
                                   zeros.defined() ? zeros.data_ptr<int8_t>() : nullptr,
                                   idx.data_ptr<int64_t>(), idx.numel(), out.data_ptr<float>());
    return out;
  });
}

std::string explain_embedding_json(const at::Tensor& packed, int64_t threads,
                                   const std::optional<std::string>& cpu) {
  namespace tk = torchao_kernels;
  ag::check_packed(packed, "packed_weights");
  return ag::guarded([&] {
    if (threads < 1) throw std::invalid_argument("threads must be >= 1, got " + std::to_string(threads));
    const tk::PackedView v = tk::parse_packed(packed.data_ptr(), packed.numel());
    tk::CpuDescriptor d;
    if (!cpu.has_value() || cpu->empty() || *cpu == "active") {
      d = tk::active_cpu();
    } else if (*cpu == "detected") {
      d = tk::detected_cpu();
    } else {
      d = tk::fake_cpu(*cpu);
    }
    // Weights-only tables always pass zero points (torchao's schema).
    return tk::ops::explain_json(d, v.format, v.layout.bits, v.layout.has_zeros || v.layout.qvals_only,
                                 false, 1, static_cast<int>(threads), tk::KernelOp::kEmbedding);
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(torchao_kernels, m) {
  m.def("_register_torchao_embedding_compat() -> str", &register_torchao_embedding_compat);
  m.def("_run_embedding_kernel(Tensor packed_weights, Tensor indices, str kernel, Tensor? "
        "weight_scales=None, Tensor? weight_zeros=None) -> Tensor",
        &run_embedding_kernel);
  m.def("_explain_embedding_json(Tensor packed_weights, int threads, str? cpu=None) -> str",
        &explain_embedding_json);
}
