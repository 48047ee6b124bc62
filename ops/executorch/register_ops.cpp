// ExecuTorch registration of the linear and embedding ops (thin: tensor
// checks and conversions only; the op bodies are in ops/impl, shared with the
// ATen glue). Registered with EXECUTORCH_LIBRARY when this shared library is
// loaded:
//
//   torchao::linear_8bit_act_xbit_weight.out
//   torchao::_linear_8bit_act_{1..8}bit_weight.out   (torchao's schemas)
//   torchao::embedding_xbit.out, torchao::shared_embedding_xbit.out
//   torchao::_embedding_{1..8}bit.out, torchao::_shared_embedding_{1..8}bit.out
//
// with the schemas of the ATen ops (ops/aten/register_ops.cpp):
//   (Tensor activations, Tensor packed_weights, int group_size, int n, int k,
//    *, Tensor(a!) out) -> Tensor(a!)
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
  ET_KERNEL_CHECK_MSG(ctx, packed.dim() == 1 && (packed.scalar_type() == ScalarType::Char ||
                                                 packed.scalar_type() == ScalarType::Byte),
                      InvalidArgument, out, "packed_weights must be a 1-D int8 or uint8 tensor");
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
  try {
    if (bits > 0) {
      const PackedView v = parse_packed(packed.const_data_ptr(), packed.nbytes());
      if (v.layout.bits != bits) {
        throw std::invalid_argument("packed_weights hold " + std::to_string(v.layout.bits) +
                                    "-bit weights, but this op is for " + std::to_string(bits) +
                                    "-bit weights (bit width mismatch)");
      }
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
  } catch (const std::invalid_argument& e) {
    ET_LOG(Error, "torchao_kernels: %s", e.what());
    ctx.fail(Error::InvalidArgument);
  } catch (const std::exception& e) {
    ET_LOG(Error, "torchao_kernels: %s", e.what());
    ctx.fail(Error::Internal);
  }
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

// Indices as int64 (the op bodies' type), resized out to indices.shape + (dim,).
bool lookup_setup(KernelRuntimeContext& ctx, const Tensor& indices, int64_t dim, Tensor& out,
                  std::vector<int64_t>& idx) {
  const ScalarType it = indices.scalar_type();
  if (it != ScalarType::Long && it != ScalarType::Int) {
    ET_LOG(Error, "torchao_kernels: indices must be int64 or int32, got dtype %d", static_cast<int>(it));
    ctx.fail(Error::InvalidArgument);
    return false;
  }
  if (out.scalar_type() != ScalarType::Float || indices.dim() >= 16) {
    ET_LOG(Error, "torchao_kernels: out must be float32 and indices have fewer than 16 dims");
    ctx.fail(Error::InvalidArgument);
    return false;
  }
  idx.resize(indices.numel());
  if (it == ScalarType::Long) {
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
    ET_LOG(Error, "torchao_kernels: could not resize out to indices.shape + (%lld,)",
           static_cast<long long>(dim));
    ctx.fail(Error::InvalidArgument);
    return false;
  }
  return true;
}

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

Tensor& embedding_out(KernelRuntimeContext& ctx, const Tensor& packed, int64_t num_embeddings,
                      int64_t embedding_dim, const Tensor& scales, const Tensor* zeros,
                      const Tensor& indices, Tensor& out, int bits) {
  std::vector<int64_t> idx;
  if (!lookup_setup(ctx, indices, embedding_dim, out, idx)) return out;
  run_guarded(ctx, [&] {
    if (scales.dim() != 2 || scales.size(0) != num_embeddings)
      throw std::invalid_argument("weight_scales must have shape (num_embeddings, groups)");
    // float32 scales are read in place (they are the whole table's: no copy
    // per call); bfloat16 ones are widened.
    std::vector<float> widened;
    const float* s = nullptr;
    if (scales.scalar_type() == ScalarType::Float) {
      s = scales.const_data_ptr<float>();
    } else if (scales.scalar_type() == ScalarType::BFloat16) {
      widen<::executorch::aten::BFloat16>(scales, widened);
      s = widened.data();
    } else {
      throw std::invalid_argument("weight_scales must be float32 or bfloat16");
    }
    const int8_t* z = nullptr;
    if (zeros) {
      if (zeros->scalar_type() != ScalarType::Char || zeros->numel() != scales.numel())
        throw std::invalid_argument("weight_zeros must be int8 with the shape of weight_scales");
      z = zeros->const_data_ptr<int8_t>();
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

Tensor& shared_out(KernelRuntimeContext& ctx, const Tensor& packed, int64_t group_size, int64_t n,
                   int64_t k, const Tensor& indices, Tensor& out, int bits) {
  std::vector<int64_t> idx;
  if (!lookup_setup(ctx, indices, k, out, idx)) return out;
  run_guarded(ctx, [&] {
    ops::shared_embedding(packed.const_data_ptr(), packed.nbytes(), bits, group_size, n, k,
                          idx.data(), static_cast<int64_t>(idx.size()),
                          out.mutable_data_ptr<float>(), et_parallel());
  });
  return out;
}

Tensor& shared_xbit_out(KernelRuntimeContext& ctx, const Tensor& packed, int64_t group_size,
                        int64_t n, int64_t k, const Tensor& indices, Tensor& out) {
  return shared_out(ctx, packed, group_size, n, k, indices, out, 0);
}

template <int B>
Tensor& shared_bits_out(KernelRuntimeContext& ctx, const Tensor& packed, int64_t group_size,
                        int64_t n, int64_t k, const Tensor& indices, Tensor& out) {
  return shared_out(ctx, packed, group_size, n, k, indices, out, B);
}

void log_warning(const std::string& msg) { ET_LOG(Info, "%s", msg.c_str()); }

struct InstallWarningHandler {
  InstallWarningHandler() { ops::set_warning_handler(log_warning); }
} install_warning_handler;

}  // namespace et_glue
}  // namespace torchao_kernels

namespace {
namespace eg = torchao_kernels::et_glue;
}  // namespace

EXECUTORCH_LIBRARY(torchao, "linear_8bit_act_xbit_weight.out", eg::linear_xbit_out);
EXECUTORCH_LIBRARY(torchao, "embedding_xbit.out", eg::embedding_xbit_out);
EXECUTORCH_LIBRARY(torchao, "shared_embedding_xbit.out", eg::shared_xbit_out);
EXECUTORCH_LIBRARY(torchao, "_linear_8bit_act_1bit_weight.out", eg::linear_bits_out<1>);
EXECUTORCH_LIBRARY(torchao, "_embedding_1bit.out", eg::embedding_bits_out<1>);
EXECUTORCH_LIBRARY(torchao, "_shared_embedding_1bit.out", eg::shared_bits_out<1>);
EXECUTORCH_LIBRARY(torchao, "_linear_8bit_act_2bit_weight.out", eg::linear_bits_out<2>);
EXECUTORCH_LIBRARY(torchao, "_embedding_2bit.out", eg::embedding_bits_out<2>);
EXECUTORCH_LIBRARY(torchao, "_shared_embedding_2bit.out", eg::shared_bits_out<2>);
EXECUTORCH_LIBRARY(torchao, "_linear_8bit_act_3bit_weight.out", eg::linear_bits_out<3>);
EXECUTORCH_LIBRARY(torchao, "_embedding_3bit.out", eg::embedding_bits_out<3>);
EXECUTORCH_LIBRARY(torchao, "_shared_embedding_3bit.out", eg::shared_bits_out<3>);
EXECUTORCH_LIBRARY(torchao, "_linear_8bit_act_4bit_weight.out", eg::linear_bits_out<4>);
EXECUTORCH_LIBRARY(torchao, "_embedding_4bit.out", eg::embedding_bits_out<4>);
EXECUTORCH_LIBRARY(torchao, "_shared_embedding_4bit.out", eg::shared_bits_out<4>);
EXECUTORCH_LIBRARY(torchao, "_linear_8bit_act_5bit_weight.out", eg::linear_bits_out<5>);
EXECUTORCH_LIBRARY(torchao, "_embedding_5bit.out", eg::embedding_bits_out<5>);
EXECUTORCH_LIBRARY(torchao, "_shared_embedding_5bit.out", eg::shared_bits_out<5>);
EXECUTORCH_LIBRARY(torchao, "_linear_8bit_act_6bit_weight.out", eg::linear_bits_out<6>);
EXECUTORCH_LIBRARY(torchao, "_embedding_6bit.out", eg::embedding_bits_out<6>);
EXECUTORCH_LIBRARY(torchao, "_shared_embedding_6bit.out", eg::shared_bits_out<6>);
EXECUTORCH_LIBRARY(torchao, "_linear_8bit_act_7bit_weight.out", eg::linear_bits_out<7>);
EXECUTORCH_LIBRARY(torchao, "_embedding_7bit.out", eg::embedding_bits_out<7>);
EXECUTORCH_LIBRARY(torchao, "_shared_embedding_7bit.out", eg::shared_bits_out<7>);
EXECUTORCH_LIBRARY(torchao, "_linear_8bit_act_8bit_weight.out", eg::linear_bits_out<8>);
EXECUTORCH_LIBRARY(torchao, "_embedding_8bit.out", eg::embedding_bits_out<8>);
EXECUTORCH_LIBRARY(torchao, "_shared_embedding_8bit.out", eg::shared_bits_out<8>);

// Inspection for loaders and runners (C ABI, the only exported symbols).
extern "C" {

// The ops this library registers, comma-separated.
__attribute__((visibility("default"))) const char* torchao_kernels_executorch_ops() {
  return "torchao::linear_8bit_act_xbit_weight.out,"
         "torchao::_linear_8bit_act_1bit_weight.out,torchao::_linear_8bit_act_2bit_weight.out,"
         "torchao::_linear_8bit_act_3bit_weight.out,torchao::_linear_8bit_act_4bit_weight.out,"
         "torchao::_linear_8bit_act_5bit_weight.out,torchao::_linear_8bit_act_6bit_weight.out,"
         "torchao::_linear_8bit_act_7bit_weight.out,torchao::_linear_8bit_act_8bit_weight.out,"
         "torchao::embedding_xbit.out,torchao::shared_embedding_xbit.out,"
         "torchao::_embedding_1bit.out,torchao::_embedding_2bit.out,torchao::_embedding_3bit.out,"
         "torchao::_embedding_4bit.out,torchao::_embedding_5bit.out,torchao::_embedding_6bit.out,"
         "torchao::_embedding_7bit.out,torchao::_embedding_8bit.out,"
         "torchao::_shared_embedding_1bit.out,torchao::_shared_embedding_2bit.out,"
         "torchao::_shared_embedding_3bit.out,torchao::_shared_embedding_4bit.out,"
         "torchao::_shared_embedding_5bit.out,torchao::_shared_embedding_6bit.out,"
         "torchao::_shared_embedding_7bit.out,torchao::_shared_embedding_8bit.out";
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

}  // extern "C"
