// ATen registration of the ops (thin: tensor checks and conversions only; the
// op bodies are in ops/impl). Ops in the `torchao` namespace use
// TORCH_LIBRARY_FRAGMENT so PyPI torchao's own ops load in the same process.
// torchao's per-bit-width ops (_pack_8bit_act_{b}bit_weight, ...) are
// registered at import time by torchao_kernels._C_register_torchao_compat()
// (see register_torchao_compat below), so a process where torchao's own
// kernel library already defined them keeps working.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <Python.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include "ops/aten/aten_glue.h"
#include "ops/impl/linear_8bit_act_xbit_weight.h"

namespace torchao_kernels {
namespace aten_glue {

using at::Tensor;
namespace tk = torchao_kernels;

struct PackArgs {
  Tensor qvals, scales, zeros, bias;
  // The buffer is sized for the scales' dtype: bfloat16 scales for bfloat16
  // storage (2 bytes each), any other float dtype for float32, so its size
  // depends on shapes and dtypes only, as fake tensors need.
  tk::ScaleType scale_type = tk::ScaleType::kFloat32;
  int bits;
  int64_t n, k, group_size;
};

// The scales' or zero points' shape: (n, k / group_size), or flat.
void check_group_shape(const char* name, const Tensor& t, int64_t n, int64_t groups) {
  // sym_*: the Meta kernel sees symbolic sizes under dynamic shapes.
  const bool ok = (t.dim() == 1 && t.sym_numel() == n * groups) ||
                  (t.dim() == 2 && t.sym_size(0) == n && t.sym_size(1) == groups);
  TORCH_CHECK_VALUE(ok, name, " must have shape (n, k / group_size) = (", n, ", ", groups, ") or (",
                    n * groups, ",), got ", t.sym_sizes());
}

// What the pack ops check without reading any value (the Meta kernel too, so
// tracing fails where eager would).
void check_pack_arg_shapes(const Tensor& weight_qvals, const Tensor& weight_scales,
                           const std::optional<Tensor>& weight_zeros, int64_t weight_nbit,
                           int64_t group_size, const std::optional<Tensor>& bias) {
  TORCH_CHECK_VALUE(weight_nbit >= 1 && weight_nbit <= tk::kMaxBits, "weight_nbit must be in 1..", tk::kMaxBits, ", got ",
                    weight_nbit);
  TORCH_CHECK_VALUE(weight_qvals.dim() == 2, "weight_qvals must be 2-D (n, k), got shape ",
                    weight_qvals.sizes());
  TORCH_CHECK_VALUE(weight_qvals.scalar_type() == at::kChar,
                    "weight_qvals must be int8, got ", weight_qvals.scalar_type());
  const int64_t n = weight_qvals.size(0), k = weight_qvals.size(1);
  guarded([&] {
    tk::check_weight_params(static_cast<int>(weight_nbit), n, k, group_size);
    return 0;
  });
  const int64_t groups = k / group_size;
  check_group_shape("weight_scales", weight_scales, n, groups);
  TORCH_CHECK_VALUE(weight_scales.is_floating_point(), "weight_scales must be floating point, got ",
                    weight_scales.scalar_type());
  if (weight_zeros.has_value()) {
    check_group_shape("weight_zeros", *weight_zeros, n, groups);
    TORCH_CHECK_VALUE(!weight_zeros->is_floating_point() && !weight_zeros->is_complex() &&
                          weight_zeros->scalar_type() != at::kBool,
                      "weight_zeros must be integer (int8 values), got ", weight_zeros->scalar_type());
  }
  if (bias.has_value()) {
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->sym_numel() == n, "bias must have shape (n,) = (", n,
                      ",), got ", bias->sym_sizes());
    TORCH_CHECK_VALUE(bias->is_floating_point(), "bias must be floating point, got ", bias->scalar_type());
  }
}

PackArgs check_pack_args(const Tensor& weight_qvals, const Tensor& weight_scales,
                         const std::optional<Tensor>& weight_zeros, int64_t weight_nbit,
                         int64_t group_size, const std::optional<Tensor>& bias) {
  check_pack_arg_shapes(weight_qvals, weight_scales, weight_zeros, weight_nbit, group_size, bias);
  PackArgs a;
  a.bits = static_cast<int>(weight_nbit);
  a.n = weight_qvals.size(0);
  a.k = weight_qvals.size(1);
  a.group_size = group_size;
  a.qvals = weight_qvals.contiguous();
  a.scales = weight_scales.to(at::kFloat).contiguous().reshape({-1});
  if (weight_scales.scalar_type() == at::kBFloat16) a.scale_type = tk::ScaleType::kBFloat16;
  if (weight_zeros.has_value()) {
    if (weight_zeros->numel() > 0) {
      const auto mn = weight_zeros->min().item<int64_t>(), mx = weight_zeros->max().item<int64_t>();
      TORCH_CHECK_VALUE(mn >= -128 && mx <= 127, "weight_zeros must fit in int8, got values in [",
                        mn, ", ", mx, "]");
    }
    a.zeros = weight_zeros->to(at::kChar).contiguous().reshape({-1});
  }
  if (bias.has_value()) a.bias = bias->to(at::kFloat).contiguous().reshape({-1});
  return a;
}

Tensor pack_impl(const Tensor& weight_qvals, const Tensor& weight_scales,
                 const std::optional<Tensor>& weight_zeros, int64_t weight_nbit, int64_t group_size,
                 const std::optional<Tensor>& bias, const std::optional<std::string>& target) {
  PackArgs a = check_pack_args(weight_qvals, weight_scales, weight_zeros, weight_nbit, group_size, bias);
  return guarded([&] {
    const FormatId f = ops::choose_format(target.value_or(""), a.bits, a.zeros.defined(), a.bias.defined());
    const size_t bytes = ops::packed_weights_size(f, a.bits, a.n, a.k, group_size, a.zeros.defined(),
                                                  a.bias.defined(), a.scale_type);
    Tensor out = empty_packed(static_cast<int64_t>(bytes), at::TensorOptions().dtype(at::kChar));
    // Scales whose values are all bfloat16 (torchao's flow on bfloat16 models,
    // which hands them over as float32) are stored as bfloat16 in any case:
    // fewer bytes to read per call, the same results. The float32-sized
    // buffer then ends in unused (zeroed) bytes.
    const tk::ScaleType stored =
        a.scale_type == tk::ScaleType::kBFloat16
            ? a.scale_type
            : tk::lossless_scale_type(a.scales.data_ptr<float>(), a.scales.numel());
    const size_t used = ops::packed_weights_size(f, a.bits, a.n, a.k, group_size, a.zeros.defined(),
                                                 a.bias.defined(), stored);
    std::memset(static_cast<uint8_t*>(out.data_ptr()) + used, 0, bytes - used);
    WeightsView w{a.bits,
                  static_cast<int>(a.n),
                  static_cast<int>(a.k),
                  static_cast<int>(group_size),
                  a.qvals.data_ptr<int8_t>(),
                  a.scales.data_ptr<float>(),
                  a.zeros.defined() ? a.zeros.data_ptr<int8_t>() : nullptr,
                  a.bias.defined() ? a.bias.data_ptr<float>() : nullptr,
                  stored};
    ops::pack_weights_checked(f, w, out.data_ptr());
    return out;
  });
}

Tensor pack_meta(const Tensor& weight_qvals, const Tensor& weight_scales,
                 const std::optional<Tensor>& weight_zeros, int64_t weight_nbit, int64_t group_size,
                 const std::optional<Tensor>& bias, const std::optional<std::string>& target) {
  const Tensor* z = weight_zeros.has_value() ? &*weight_zeros : nullptr;
  const Tensor* b = bias.has_value() ? &*bias : nullptr;
  check_one_device({{"weight_qvals", &weight_qvals}, {"weight_scales", &weight_scales}, {"weight_zeros", z},
                    {"bias", b}});
  check_pack_arg_shapes(weight_qvals, weight_scales, weight_zeros, weight_nbit, group_size, bias);
  const int64_t n = weight_qvals.size(0), k = weight_qvals.size(1);
  return guarded([&] {
    const FormatId f = ops::choose_format(target.value_or(""), static_cast<int>(weight_nbit),
                                          weight_zeros.has_value(), bias.has_value());
    const size_t bytes = ops::packed_weights_size(
        f, static_cast<int>(weight_nbit), n, k, group_size, weight_zeros.has_value(), bias.has_value(),
        weight_scales.scalar_type() == at::kBFloat16 ? tk::ScaleType::kBFloat16 : tk::ScaleType::kFloat32);
    return at::empty({static_cast<int64_t>(bytes)},
                     at::TensorOptions().dtype(at::kChar).device(at::kMeta));
  });
}

void check_activations(const Tensor& activations) {
  TORCH_CHECK_VALUE(activations.device().is_cpu(), "activations must be a CPU tensor, got ",
                    activations.device());
  const auto t = activations.scalar_type();
  TORCH_CHECK_VALUE(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf,
                    "activations must be float32, bfloat16 or float16, got ", t);
  TORCH_CHECK_VALUE(activations.dim() >= 1, "activations must have at least 1 dimension (k)");
}

void linear_into(const Tensor& activations, const Tensor& packed, int64_t group_size, int64_t n,
                 int64_t k, Tensor& out) {
  check_activations(activations);
  check_packed(packed);
  TORCH_CHECK_VALUE(activations.size(-1) == k, "activations have last dimension ",
                    activations.size(-1), " but k=", k);
  const Tensor x = activations.to(at::kFloat).contiguous();
  const int64_t m = k ? x.numel() / k : 0;
  const bool direct = out.scalar_type() == at::kFloat && out.is_contiguous();
  Tensor y = direct ? out : at::empty({m, n}, x.options());
  guarded([&] {
    ops::linear(x.data_ptr<float>(), m, k, packed.data_ptr(), static_cast<size_t>(packed.numel()),
                group_size, n, y.data_ptr<float>(), aten_parallel());
    return 0;
  });
  if (!direct) out.copy_(y.view(out.sizes()));
}

std::vector<int64_t> out_shape(const Tensor& activations, int64_t n) {
  auto s = activations.sizes().vec();
  s.back() = n;
  return s;
}

Tensor linear_impl(const Tensor& activations, const Tensor& packed, int64_t group_size, int64_t n,
                   int64_t k) {
  check_activations(activations);
  check_size_fits("n", n, packed);
  Tensor out = at::empty(out_shape(activations, n), activations.options().dtype(at::kFloat));
  linear_into(activations, packed, group_size, n, k, out);
  return activations.scalar_type() == at::kFloat ? out : out.to(activations.scalar_type());
}

Tensor& linear_out_impl(const Tensor& activations, const Tensor& packed, int64_t group_size,
                        int64_t n, int64_t k, Tensor& out) {
  check_activations(activations);
  TORCH_CHECK_VALUE(out.scalar_type() == activations.scalar_type(),
                    "out must have the activations' dtype ", activations.scalar_type(), ", got ",
                    out.scalar_type());
  check_size_fits("n", n, packed);
  const auto shape = out_shape(activations, n);
  if (out.sizes().vec() != shape) out.resize_(shape);
  linear_into(activations, packed, group_size, n, k, out);
  return out;
}

Tensor linear_meta(const Tensor& activations, const Tensor& packed, int64_t group_size, int64_t n,
                   int64_t k) {
  check_one_device({{"activations", &activations}, {"packed_weights", &packed}});
  TORCH_CHECK_VALUE(activations.dim() >= 1, "activations must have at least 1 dimension (k)");
  TORCH_CHECK_VALUE(activations.sym_size(-1) == k, "activations have last dimension ",
                    activations.sym_size(-1), " but k=", k);
  auto sizes = activations.sym_sizes().vec();
  sizes.back() = c10::SymInt(n);
  return at::empty_symint(sizes, activations.options());
}

Tensor& linear_out_meta(const Tensor& activations, const Tensor& packed, int64_t group_size,
                        int64_t n, int64_t k, Tensor& out) {
  check_one_device({{"activations", &activations}, {"packed_weights", &packed}, {"out", &out}});
  auto sizes = activations.sym_sizes().vec();
  sizes.back() = c10::SymInt(n);
  if (out.sym_sizes() != c10::SymIntArrayRef(sizes)) out.resize__symint(sizes);
  return out;
}

// Compat wrappers for torchao's per-bit-width schemas.
template <int B>
Tensor pack_bits(const Tensor& q, const Tensor& s, const std::optional<Tensor>& z, int64_t g,
                 const std::optional<Tensor>& bias, const std::optional<std::string>& target) {
  return pack_impl(q, s, z, B, g, bias, target);
}
template <int B>
Tensor pack_bits_meta(const Tensor& q, const Tensor& s, const std::optional<Tensor>& z, int64_t g,
                      const std::optional<Tensor>& bias, const std::optional<std::string>& target) {
  return pack_meta(q, s, z, B, g, bias, target);
}
void check_packed_bits(const Tensor& p, int bits) {
  check_packed(p);
  guarded([&] {
    ops::check_bit_width("packed_weights", tk::parse_packed(p.data_ptr(), p.numel()).layout.bits, bits);
    return 0;
  });
}
template <int B>
Tensor linear_bits(const Tensor& x, const Tensor& p, int64_t g, int64_t n, int64_t k) {
  check_packed_bits(p, B);
  return linear_impl(x, p, g, n, k);
}
template <int B>
Tensor& linear_bits_out(const Tensor& x, const Tensor& p, int64_t g, int64_t n, int64_t k,
                        Tensor& out) {
  check_packed_bits(p, B);
  return linear_out_impl(x, p, g, n, k, out);
}

// Gradient with respect to the activations (torchao_kernels/autograd.py has
// the why): dL/dx = dL/dy @ W, W as the kernels dequantize it, the int8
// rounding of the activations taken as the identity. In C++ so that calls
// needing no gradient (torch.no_grad(), as Hugging Face's generate() runs, or
// activations without requires_grad) go straight to the kernel: the Python
// autograd kernel of torch.library.register_autograd cost ~8 us per call on
// a Zen 3 core, more than a 576 x 576 decode GEMV from L2.
// B: the op's bit width in its name (0: linear_8bit_act_xbit_weight).
template <int B>
const c10::TypedOperatorHandle<Tensor(const Tensor&, const Tensor&, int64_t, int64_t, int64_t)>& linear_handle() {
  static const auto h = c10::Dispatcher::singleton()
                            .findSchemaOrThrow(("torchao::" + ops::op_name(ops::OpFamilyId::linear, B)).c_str(), "")
                            .typed<Tensor(const Tensor&, const Tensor&, int64_t, int64_t, int64_t)>();
  return h;
}

template <int B>
struct LinearGrad : public torch::autograd::Function<LinearGrad<B>> {
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& x, const Tensor& packed,
                        int64_t group_size, int64_t n, int64_t k) {
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->save_for_backward({packed});
    ctx->saved_data["n"] = n;
    ctx->saved_data["k"] = k;
    ctx->saved_data["dtype"] = x.scalar_type();
    return linear_handle<B>().call(x, packed, group_size, n, k);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    static const auto dequantize =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("torchao_kernels::_dequantize_packed", "")
            .typed<Tensor(const Tensor&, int64_t, int64_t)>();
    const Tensor packed = ctx->get_saved_variables()[0];
    const Tensor w = dequantize.call(packed, ctx->saved_data["n"].toInt(), ctx->saved_data["k"].toInt());
    const Tensor gx = at::matmul(grad[0].to(at::kFloat), w).to(ctx->saved_data["dtype"].toScalarType());
    return {gx, Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

template <int B>
Tensor linear_autograd(const Tensor& x, const Tensor& packed, int64_t group_size, int64_t n, int64_t k) {
  if (!(at::GradMode::is_enabled() && x.requires_grad())) {
    at::AutoDispatchBelowADInplaceOrView below;
    return linear_handle<B>().call(x, packed, group_size, n, k);
  }
  return LinearGrad<B>::apply(x, packed, group_size, n, k);
}

}  // namespace aten_glue
}  // namespace torchao_kernels

namespace {
namespace ag = torchao_kernels::aten_glue;

// One-time warnings become Python UserWarnings (torch.ops calls do not turn
// TORCH_WARN into Python warnings). They are only emitted on the thread that
// called the op, which holds the GIL or can take it without deadlock.
void route_warning(const std::string& msg) {
  if (!Py_IsInitialized()) {
    TORCH_WARN(msg);
    return;
  }
  PyGILState_STATE st = PyGILState_Ensure();
  const int rc = PyErr_WarnEx(PyExc_UserWarning, msg.c_str(), 1);
  std::string err;
  if (rc != 0) {  // warnings turned into errors: surface it as the op's error
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject* str = value ? PyObject_Str(value) : nullptr;
    err = str ? PyUnicode_AsUTF8(str) : msg;
    Py_XDECREF(str);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
  }
  PyGILState_Release(st);
  if (rc != 0) throw std::runtime_error(err);
}
struct InstallWarningHandler {
  InstallWarningHandler() {
    torchao_kernels::ops::set_warning_handler(route_warning);
    torchao_kernels::set_selection_warning_handler(route_warning);
  }
} install_warning_handler;
}  // namespace

// The ops of the linear families of ops/impl/op_list.h.
using torchao_kernels::ops::OpFamilyId;
using torchao_kernels::ops::op_family;
using torchao_kernels::ops::op_name;

TORCH_LIBRARY_FRAGMENT(torchao, m) {
  ag::def_op(m, op_family(OpFamilyId::pack_linear), 0);
  ag::def_op(m, op_family(OpFamilyId::linear), 0);
}

TORCH_LIBRARY_IMPL(torchao, CPU, m) {
  m.impl(op_name(OpFamilyId::pack_linear, 0).c_str(), &ag::pack_impl);
  m.impl(op_name(OpFamilyId::linear, 0).c_str(), &ag::linear_impl);
  m.impl((op_name(OpFamilyId::linear, 0) + ".out").c_str(), &ag::linear_out_impl);
}

TORCH_LIBRARY_IMPL(torchao, Autograd, m) {
  m.impl(op_name(OpFamilyId::linear, 0).c_str(), &ag::linear_autograd<0>);
  ag::impl_out_autograd(m, op_name(OpFamilyId::linear, 0));
}

TORCH_LIBRARY_IMPL(torchao, Meta, m) {
  m.impl(op_name(OpFamilyId::pack_linear, 0).c_str(), &ag::pack_meta);
  m.impl(op_name(OpFamilyId::linear, 0).c_str(), &ag::linear_meta);
  m.impl((op_name(OpFamilyId::linear, 0) + ".out").c_str(), &ag::linear_out_meta);
}

// torchao's per-bit-width ops, registered on request (at import) unless
// another library already defined them.
namespace {

template <int B>
void def_compat(torch::Library& lib, torch::Library& cpu, torch::Library& meta, torch::Library& autograd,
                bool want_meta) {
  const std::string pack = op_name(OpFamilyId::pack_linear, B), linear = op_name(OpFamilyId::linear, B);
  ag::def_op(lib, op_family(OpFamilyId::pack_linear), B);
  ag::def_op(lib, op_family(OpFamilyId::linear), B);
  cpu.impl(pack.c_str(), &ag::pack_bits<B>);
  cpu.impl(linear.c_str(), &ag::linear_bits<B>);
  cpu.impl((linear + ".out").c_str(), &ag::linear_bits_out<B>);
  autograd.impl(linear.c_str(), &ag::linear_autograd<B>);
  ag::impl_out_autograd(autograd, linear);
  meta.impl(pack.c_str(), &ag::pack_bits_meta<B>);
  if (want_meta) {
    meta.impl(linear.c_str(), &ag::linear_meta);
  }
  meta.impl((linear + ".out").c_str(), &ag::linear_out_meta);
}

}  // namespace

// Returns "registered", or the reason the existing definitions were kept.
std::string register_torchao_compat() {
  return ag::register_torchao_family(
      "torchao::" + op_name(OpFamilyId::linear, 4),
      "torchao's own kernel library already defines torchao::_linear_8bit_act_{1..8}bit_weight; its "
      "implementation serves those calls (torchao_kernels serves torchao::linear_8bit_act_xbit_weight)",
      [](torch::Library& lib, torch::Library& cpu, torch::Library& meta, torch::Library& autograd, bool want_meta) {
        torchao_kernels::ops::for_each_op_bit_width(
            [&](auto b) { def_compat<decltype(b)::value>(lib, cpu, meta, autograd, want_meta); });
      });
}
