// ExecuTorch registration of the linear and embedding ops (thin: tensor
// checks and conversions only; the op bodies are in ops/impl, shared with the
// ATen glue). Registers, when this shared library is loaded, the out=
// variants of the op list (ops/impl/op_list.h, TK_EXECUTORCH_OPS) with the
// schemas of the ATen ops; torchao_kernels_executorch_ops() lists them.
//
// Argument checks are the ATen glue's (ops/impl/op_checks.h), and every
// error of an op body maps to one ExecuTorch error (run_guarded), so both
// frameworks accept the same arguments with the same messages.
//
// Parallel loops run on ExecuTorch's threadpool; kernel selection uses the
// cpuinfo copy exported by the executorch wheel's threadpool library.
// Registering an op twice aborts the process, so this library must be loaded
// once (torchao_kernels.executorch.load_kernels() guards it).
#include <executorch/extension/kernel_util/make_boxed_from_unboxed_functor.h>
#include <executorch/runtime/kernel/kernel_includes.h>
#include <executorch/runtime/kernel/thread_parallel_interface.h>
#include <executorch/runtime/platform/log.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/select/selector.h"
#include "ops/impl/embedding_xbit.h"
#include "ops/impl/linear_8bit_act_xbit_weight.h"
#include "ops/impl/op_checks.h"
#include "ops/impl/op_list.h"

namespace torchao_kernels {
namespace et_glue {

using ::executorch::aten::ScalarType;
using ::executorch::aten::SizesType;
using ::executorch::aten::Tensor;
using ::executorch::runtime::Error;
using ::executorch::runtime::KernelRuntimeContext;

// Same tasks as the ATen glue's at::parallel_for, on ExecuTorch's threadpool.
ops::Parallel et_parallel() {
  ops::Parallel p;
  p.threads = static_cast<int>(std::max<int64_t>(1, ::executorch::extension::get_thread_count()));
  p.run = [](int64_t tasks, const std::function<void(int64_t, int64_t)>& fn) {
    const bool ok = ::executorch::extension::parallel_for(
        0, tasks, 1, [&](int64_t b, int64_t e) { fn(b, e); });
    if (!ok) throw std::runtime_error("executorch parallel_for failed");
  };
  return p;
}

bool is_float_type(ScalarType t) {
  return t == ScalarType::Float || t == ScalarType::BFloat16 || t == ScalarType::Half;
}

// Widens bfloat16 / float16 activations to float32 (exactly, as ATen's .to(float)).
template <class T>
void widen(const Tensor& x, std::vector<float>& dst) {
  const T* src = x.const_data_ptr<T>();
  dst.resize(x.numel());
  for (size_t i = 0; i < dst.size(); ++i) dst[i] = static_cast<float>(src[i]);
}

// Narrows float32 results into a bfloat16 / float16 out tensor (round to
// nearest even, as ATen's .to(dtype)).
template <class T>
void narrow(const std::vector<float>& src, Tensor& out) {
  T* dst = out.mutable_data_ptr<T>();
  for (size_t i = 0; i < src.size(); ++i) dst[i] = T(src[i]);
}

// A tensor as the shared argument checks see it (ExecuTorch tensors are CPU tensors).
ops::TensorArg tensor_arg(const Tensor& t) {
  ops::TensorArg a;
  switch (t.scalar_type()) {
    case ScalarType::Bool: a.dtype = ops::DType::kBool; break;
    case ScalarType::Byte: a.dtype = ops::DType::kUInt8; break;
    case ScalarType::Char: a.dtype = ops::DType::kInt8; break;
    case ScalarType::Short: a.dtype = ops::DType::kInt16; break;
    case ScalarType::Int: a.dtype = ops::DType::kInt32; break;
    case ScalarType::Long: a.dtype = ops::DType::kInt64; break;
    case ScalarType::Half: a.dtype = ops::DType::kFloat16; break;
    case ScalarType::BFloat16: a.dtype = ops::DType::kBFloat16; break;
    case ScalarType::Float: a.dtype = ops::DType::kFloat32; break;
    case ScalarType::Double: a.dtype = ops::DType::kFloat64; break;
    default:
      a.dtype = ops::DType::kOther;
      a.other_dtype = "dtype " + std::to_string(static_cast<int>(t.scalar_type()));
      break;
  }
  for (ssize_t i = 0; i < t.dim(); ++i) a.sizes.push_back(t.size(i));
  a.contiguous = ::executorch::runtime::tensor_is_contiguous(t);
  return a;
}

// Runs an op body, mapping its exceptions to ExecuTorch errors as the ATen
// glue maps them to torch errors: std::invalid_argument and std::out_of_range
// (bad arguments, indices out of range) -> InvalidArgument, anything else ->
// Internal; the message goes to the log.
template <class F>
void run_guarded(KernelRuntimeContext& ctx, F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    ET_LOG(Error, "torchao_kernels: %s", e.what());
    ctx.fail(Error::InvalidArgument);
  } catch (const std::out_of_range& e) {
    ET_LOG(Error, "torchao_kernels: %s", e.what());
    ctx.fail(Error::InvalidArgument);
  } catch (const std::exception& e) {
    ET_LOG(Error, "torchao_kernels: %s", e.what());
    ctx.fail(Error::Internal);
  }
}

// Validates, resizes `out` to (..., n) and runs ops::linear. `bits` > 0 also
// checks the packed weights' bit width (torchao's per-bit-width ops).
Tensor& linear_out(KernelRuntimeContext& ctx, const Tensor& activations, const Tensor& packed,
                   int64_t group_size, int64_t n, int64_t k, Tensor& out, int bits) {
  const ScalarType xt = activations.scalar_type();
  ET_KERNEL_CHECK_MSG(ctx, is_float_type(xt), InvalidArgument, out,
                      "activations must be float32, bfloat16 or float16, got dtype %d",
                      static_cast<int>(xt));
  ET_KERNEL_CHECK_MSG(ctx, out.scalar_type() == xt, InvalidArgument, out,
                      "out must have the activations' dtype %d, got %d", static_cast<int>(xt),
                      static_cast<int>(out.scalar_type()));
  ET_KERNEL_CHECK_MSG(ctx, activations.dim() >= 1, InvalidArgument, out,
                      "activations must have at least 1 dimension (k)");
  ET_KERNEL_CHECK_MSG(ctx, activations.size(activations.dim() - 1) == k, InvalidArgument, out,
                      "activations have last dimension %lld but k=%lld",
                      static_cast<long long>(activations.size(activations.dim() - 1)),
                      static_cast<long long>(k));
  ET_KERNEL_CHECK_MSG(ctx, ::executorch::runtime::tensor_is_contiguous(activations),
                      InvalidArgument, out, "activations must be contiguous");
  ET_KERNEL_CHECK_MSG(ctx, n >= 0 && n <= INT32_MAX, InvalidArgument, out,
                      "n=%lld is out of range", static_cast<long long>(n));

  // out: same leading dims as activations, last dim n.
  SizesType sizes[16];
  const size_t dim = activations.dim();
  ET_KERNEL_CHECK_MSG(ctx, dim <= 16, InvalidArgument, out, "activations have more than 16 dims");
  for (size_t i = 0; i < dim; ++i) sizes[i] = activations.size(i);
  sizes[dim - 1] = static_cast<SizesType>(n);
  ET_KERNEL_CHECK_MSG(ctx,
                      ::executorch::runtime::resize_tensor(
                          out, {sizes, dim}) == Error::Ok,
                      InvalidArgument, out, "could not resize out to the output shape (..., %lld)",
                      static_cast<long long>(n));
  ET_KERNEL_CHECK_MSG(ctx, ::executorch::runtime::tensor_is_contiguous(out), InvalidArgument, out,
                      "out must be contiguous");

  const int64_t m = k ? activations.numel() / k : 0;
  run_guarded(ctx, [&] {
    ops::check_packed_arg("packed_weights", tensor_arg(packed));
    if (bits > 0) {
      const PackedView v = parse_packed(packed.const_data_ptr(), packed.nbytes());
      ops::check_bit_width("packed_weights", v.layout.bits, bits);
    }
    if (xt == ScalarType::Float) {
      ops::linear(activations.const_data_ptr<float>(), m, k, packed.const_data_ptr(),
                  packed.nbytes(), group_size, n, out.mutable_data_ptr<float>(), et_parallel());
    } else {
      std::vector<float> x, y(static_cast<size_t>(m) * static_cast<size_t>(n));
      if (xt == ScalarType::BFloat16) {
        widen<::executorch::aten::BFloat16>(activations, x);
      } else {
        widen<::executorch::aten::Half>(activations, x);
      }
      ops::linear(x.data(), m, k, packed.const_data_ptr(), packed.nbytes(), group_size, n,
                  y.data(), et_parallel());
      if (xt == ScalarType::BFloat16) {
        narrow<::executorch::aten::BFloat16>(y, out);
      } else {
        narrow<::executorch::aten::Half>(y, out);
      }
    }
  });
  return out;
}

Tensor& linear_xbit_out(KernelRuntimeContext& ctx, const Tensor& activations, const Tensor& packed,
                        int64_t group_size, int64_t n, int64_t k, Tensor& out) {
  return linear_out(ctx, activations, packed, group_size, n, k, out, 0);
}

template <int B>
Tensor& linear_bits_out(KernelRuntimeContext& ctx, const Tensor& activations, const Tensor& packed,
                        int64_t group_size, int64_t n, int64_t k, Tensor& out) {
  return linear_out(ctx, activations, packed, group_size, n, k, out, B);
}

// ---- embedding lookups (ops/aten/register_embedding_ops.cpp has the schemas)

// Indices as int64 (the op bodies' type), out resized to indices.shape + (dim,).
// Throws std::invalid_argument.
std::vector<int64_t> lookup_setup(const Tensor& indices, int64_t dim, Tensor& out) {
  ops::check_indices_arg(tensor_arg(indices));
  if (out.scalar_type() != ScalarType::Float)
    throw std::invalid_argument("out must be float32, got " + ops::dtype_name(tensor_arg(out)));
  if (indices.dim() >= 16) throw std::invalid_argument("indices must have fewer than 16 dims");
  std::vector<int64_t> idx(indices.numel());
  if (indices.scalar_type() == ScalarType::Long) {
    std::memcpy(idx.data(), indices.const_data_ptr<int64_t>(), idx.size() * sizeof(int64_t));
  } else {
    const int32_t* p = indices.const_data_ptr<int32_t>();
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = p[i];
  }
  SizesType sizes[16];
  const size_t d = indices.dim();
  for (size_t i = 0; i < d; ++i) sizes[i] = indices.size(i);
  sizes[d] = static_cast<SizesType>(dim);
  if (::executorch::runtime::resize_tensor(out, {sizes, d + 1}) != Error::Ok ||
      !::executorch::runtime::tensor_is_contiguous(out)) {
    throw std::invalid_argument("could not resize out to indices.shape + (" + std::to_string(dim) + ",)");
  }
  return idx;
}

// Integer zero points as int8 (ops::check_zero_point_range on their values).
template <class T>
void narrow_zeros(const Tensor& z, std::vector<int8_t>& dst) {
  const T* p = z.const_data_ptr<T>();
  dst.resize(z.numel());
  int64_t mn = 0, mx = 0;
  for (size_t i = 0; i < dst.size(); ++i) {
    const int64_t v = static_cast<int64_t>(p[i]);
    mn = i ? std::min(mn, v) : v;
    mx = i ? std::max(mx, v) : v;
  }
  if (!dst.empty()) ops::check_zero_point_range(mn, mx);
  for (size_t i = 0; i < dst.size(); ++i) dst[i] = static_cast<int8_t>(p[i]);
}

Tensor& embedding_out(KernelRuntimeContext& ctx, const Tensor& packed, int64_t num_embeddings,
                      int64_t embedding_dim, const Tensor& scales, const Tensor* zeros,
                      const Tensor& indices, Tensor& out, int bits) {
  run_guarded(ctx, [&] {
    ops::check_packed_arg("packed_weight_qvals", tensor_arg(packed));
    const ops::TensorArg scales_arg = tensor_arg(scales);
    ops::check_embedding_scales_arg(scales_arg, num_embeddings);
    if (zeros) ops::check_embedding_zeros_arg(tensor_arg(*zeros), scales_arg);
    const std::vector<int64_t> idx = lookup_setup(indices, embedding_dim, out);
    // float32 scales are read in place (they are the whole table's: no copy
    // per call); other float dtypes are widened.
    std::vector<float> widened;
    const float* s = nullptr;
    switch (scales.scalar_type()) {
      case ScalarType::Float: s = scales.const_data_ptr<float>(); break;
      case ScalarType::BFloat16: widen<::executorch::aten::BFloat16>(scales, widened); break;
      case ScalarType::Half: widen<::executorch::aten::Half>(scales, widened); break;
      default: widen<double>(scales, widened); break;  // Double (the checks allow no other)
    }
    if (!s) s = widened.data();
    // int8 zero points (torchao's) are read in place; wider integers are narrowed.
    std::vector<int8_t> narrowed;
    const int8_t* z = nullptr;
    if (zeros) {
      switch (zeros->scalar_type()) {
        case ScalarType::Char: z = zeros->const_data_ptr<int8_t>(); break;
        case ScalarType::Byte: narrow_zeros<uint8_t>(*zeros, narrowed); break;
        case ScalarType::Short: narrow_zeros<int16_t>(*zeros, narrowed); break;
        case ScalarType::Int: narrow_zeros<int32_t>(*zeros, narrowed); break;
        case ScalarType::Long: narrow_zeros<int64_t>(*zeros, narrowed); break;
        default: narrow_zeros<bool>(*zeros, narrowed); break;  // Bool
      }
      if (!z) z = narrowed.data();
    }
    ops::embedding(packed.const_data_ptr(), packed.nbytes(), bits, num_embeddings, embedding_dim,
                   s, scales.size(1), z, idx.data(), static_cast<int64_t>(idx.size()),
                   out.mutable_data_ptr<float>(), et_parallel());
  });
  return out;
}

Tensor& embedding_xbit_out(KernelRuntimeContext& ctx, const Tensor& packed, int64_t num_embeddings,
                           int64_t embedding_dim, const Tensor& scales,
                           const ::executorch::aten::optional<Tensor>& zeros, const Tensor& indices,
                           Tensor& out) {
  return embedding_out(ctx, packed, num_embeddings, embedding_dim, scales,
                       zeros.has_value() ? &zeros.value() : nullptr, indices, out, 0);
}

template <int B>
Tensor& embedding_bits_out(KernelRuntimeContext& ctx, const Tensor& packed, int64_t num_embeddings,
                           int64_t embedding_dim, const Tensor& scales, const Tensor& zeros,
                           const Tensor& indices, Tensor& out) {
  return embedding_out(ctx, packed, num_embeddings, embedding_dim, scales, &zeros, indices, out, B);
}

Tensor& shared_embedding_out(KernelRuntimeContext& ctx, const Tensor& packed, int64_t group_size,
                             int64_t n, int64_t k, const Tensor& indices, Tensor& out, int bits) {
  run_guarded(ctx, [&] {
    ops::check_packed_arg("packed_weights", tensor_arg(packed));
    const std::vector<int64_t> idx = lookup_setup(indices, k, out);
    ops::shared_embedding(packed.const_data_ptr(), packed.nbytes(), bits, group_size, n, k,
                          idx.data(), static_cast<int64_t>(idx.size()),
                          out.mutable_data_ptr<float>(), et_parallel());
  });
  return out;
}

Tensor& shared_embedding_xbit_out(KernelRuntimeContext& ctx, const Tensor& packed,
                                  int64_t group_size, int64_t n, int64_t k, const Tensor& indices,
                                  Tensor& out) {
  return shared_embedding_out(ctx, packed, group_size, n, k, indices, out, 0);
}

template <int B>
Tensor& shared_embedding_bits_out(KernelRuntimeContext& ctx, const Tensor& packed,
                                  int64_t group_size, int64_t n, int64_t k, const Tensor& indices,
                                  Tensor& out) {
  return shared_embedding_out(ctx, packed, group_size, n, k, indices, out, B);
}

// The names registered so far, in order (torchao_kernels_executorch_ops()).
std::vector<const char*>& registered_ops() {
  static std::vector<const char*> names;
  return names;
}

::executorch::runtime::Error register_op(const ::executorch::runtime::Kernel& kernel) {
  registered_ops().push_back(kernel.name_);
  return ::executorch::runtime::register_kernel(kernel);
}

void log_warning(const std::string& msg) { ET_LOG(Info, "%s", msg.c_str()); }

struct InstallWarningHandler {
  InstallWarningHandler() { ops::set_warning_handler(log_warning); }
} install_warning_handler;

}  // namespace et_glue
}  // namespace torchao_kernels

namespace {
namespace eg = torchao_kernels::et_glue;

// One registration per op of TK_EXECUTORCH_OPS (ops/impl/op_list.h); the
// name array is static, as ExecuTorch keeps a pointer to it.
#define TK_ET_REGISTER_(uid, op_name, id, fn)                                              \
  constexpr char tk_et_name_##uid[] = "torchao::" op_name;                                  \
  const auto tk_et_registered_##uid = eg::register_op(::executorch::extension::make_boxed_kernel( \
      tk_et_name_##uid, EXECUTORCH_FN(eg::id##_##fn, tk_et_name_##uid)));
TK_EXECUTORCH_OPS(TK_ET_REGISTER_)
#undef TK_ET_REGISTER_

}  // namespace

// Inspection for loaders and runners (C ABI, the only exported symbols).
extern "C" {

// The ops this library registers, comma-separated.
__attribute__((visibility("default"))) const char* torchao_kernels_executorch_ops() {
  static const std::string names = [] {
    std::string s;
    for (const char* n : torchao_kernels::et_glue::registered_ops()) s += (s.empty() ? "" : ",") + std::string(n);
    return s;
  }();
  return names.c_str();
}

// CPU descriptor, kernels and selection table of this library's copy of the
// selection layer (JSON, as torchao_kernels.info()); valid until the next call.
__attribute__((visibility("default"))) const char* torchao_kernels_executorch_info_json() {
  static thread_local std::string s;
  s = torchao_kernels::ops::info_json();
  return s.c_str();
}

// Calls per kernel since load (JSON object, as torchao_kernels.stats()).
__attribute__((visibility("default"))) const char* torchao_kernels_executorch_stats_json() {
  static thread_local std::string s;
  s = torchao_kernels::ops::stats_json();
  return s.c_str();
}

// Sets this library's selection overrides (max_isa, force, exclude: as
// torchao_kernels.set_overrides; null or "" clears one) and resets its
// selection cache. Returns "" or the error message; valid until the next call.
__attribute__((visibility("default"))) const char* torchao_kernels_executorch_set_overrides(
    const char* max_isa, const char* force, const char* exclude) {
  static thread_local std::string error;
  error.clear();
  try {
    torchao_kernels::Selector::get().set_overrides(torchao_kernels::Overrides{
        max_isa ? max_isa : "", force ? force : "", exclude ? exclude : ""});
  } catch (const std::exception& e) {
    error = e.what();
    if (error.empty()) error = "invalid selection overrides";
  }
  return error.c_str();
}

// Sets this library's tuning table ("" = the default file for this CPU, "0" =
// none, else a path: as TORCHAO_KERNELS_TUNING) and resets its selection
// cache; the table loads at the next selection.
__attribute__((visibility("default"))) void torchao_kernels_executorch_set_tuning(const char* setting) {
  torchao_kernels::Selector::get().set_tuning(setting ? setting : "");
}

}  // extern "C"
