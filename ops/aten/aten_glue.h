// What every ATen registration file shares: the mapping of the op bodies'
// exceptions to torch errors, the parallel loop, the adaptation of a tensor to
// the shared argument checks (ops/impl/op_checks.h) and the schema
// definitions of the op list (ops/impl/op_list.h).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "ops/impl/linear_8bit_act_xbit_weight.h"
#include "ops/impl/op_checks.h"
#include "ops/impl/op_list.h"

namespace torchao_kernels {
namespace aten_glue {

// Rethrows the framework-agnostic errors as the matching torch errors:
// std::out_of_range -> IndexError, std::invalid_argument -> ValueError,
// std::runtime_error -> RuntimeError.
template <class F>
auto guarded(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::out_of_range& e) {
    TORCH_CHECK_INDEX(false, e.what());
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, e.what());
  } catch (const std::runtime_error& e) {
    TORCH_CHECK(false, e.what());
  }
}

// The op bodies' parallel loops on at::parallel_for (OpenMP in torch's build).
inline ops::Parallel aten_parallel() {
  ops::Parallel p;
  p.threads = at::get_num_threads();
  p.run = [](int64_t tasks, const std::function<void(int64_t, int64_t)>& fn) {
    at::parallel_for(0, tasks, 1, fn);
  };
  return p;
}

// A tensor as the shared argument checks see it.
inline ops::TensorArg tensor_arg(const at::Tensor& t) {
  ops::TensorArg a;
  switch (t.scalar_type()) {
    case at::kBool: a.dtype = ops::DType::kBool; break;
    case at::kByte: a.dtype = ops::DType::kUInt8; break;
    case at::kChar: a.dtype = ops::DType::kInt8; break;
    case at::kShort: a.dtype = ops::DType::kInt16; break;
    case at::kInt: a.dtype = ops::DType::kInt32; break;
    case at::kLong: a.dtype = ops::DType::kInt64; break;
    case at::kHalf: a.dtype = ops::DType::kFloat16; break;
    case at::kBFloat16: a.dtype = ops::DType::kBFloat16; break;
    case at::kFloat: a.dtype = ops::DType::kFloat32; break;
    case at::kDouble: a.dtype = ops::DType::kFloat64; break;
    default:
      a.dtype = ops::DType::kOther;
      a.other_dtype = c10::toString(t.scalar_type());
      break;
  }
  a.sizes = t.sizes().vec();
  a.contiguous = t.is_contiguous();
  a.device = t.device().is_cpu() ? "cpu" : t.device().str();
  return a;
}

// The Meta kernels run when any tensor argument is on the meta device; the
// others must be too. A meta buffer with CPU activations would otherwise
// return an uninitialized CPU tensor, or leave a CPU `out` untouched.
inline void check_one_device(std::initializer_list<std::pair<const char*, const at::Tensor*>> args) {
  const char* first = nullptr;
  c10::Device device(c10::kCPU);
  for (const auto& [name, t] : args) {
    if (!t || !t->defined()) continue;
    if (!first) {
      first = name;
      device = t->device();
    } else {
      TORCH_CHECK_VALUE(t->device() == device, name, " is on ", t->device(), " but ", first, " is on ",
                        device, ": every tensor argument must be on the same device");
    }
  }
}

// A packed buffer argument (ops::check_packed_arg).
// A new packed buffer (the pack ops' outputs), its whole 2 MiB-aligned
// interior advised into transparent huge pages before anything is written to
// it (Linux with THP "madvise" or "always"; elsewhere, or when the kernel
// declines, ordinary pages). A lookup reads rows of a large table at random:
// with 4 KB pages each row is a TLB miss (a 49152x576 4-bit table spans 4300
// pages), and 128 lookups took ~8% longer (docs/embeddings.md). Results never
// depend on it.
inline at::Tensor empty_packed(int64_t bytes, const at::TensorOptions& options) {
  at::Tensor t = at::empty({bytes}, options);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
  if (!t.device().is_cpu() || bytes < static_cast<int64_t>(kHugePage)) return t;
  const auto p = reinterpret_cast<uintptr_t>(t.data_ptr());
  const uintptr_t begin = (p + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t end = (p + static_cast<uintptr_t>(bytes)) & ~(kHugePage - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#endif
  return t;
}

inline void check_packed(const at::Tensor& packed, const char* name = "packed_weights") {
  guarded([&] {
    ops::check_packed_arg(name, tensor_arg(packed));
    return 0;
  });
}

// A size argument no packed buffer of packed.numel() bytes can hold (it
// stores at least one bit per weight), rejected before an output of that size
// is allocated: a buffer that is none gets the header's own error, any other
// this one. The op body checks plausible sizes against the header.
inline void check_size_fits(const char* name, int64_t v, const at::Tensor& packed,
                            const char* buffer = "packed_weights") {
  if (v >= 0 && v <= packed.numel() * 8) return;
  check_packed(packed, buffer);
  guarded([&] { return parse_packed(packed.data_ptr(), packed.numel()).layout.n; });
  TORCH_CHECK_VALUE(false, name, "=", v, " does not match ", buffer, " (", packed.numel(), " bytes)");
}

// Defines the op of a family for a bit width (0: this project's op) and its
// out= variant if the family has one.
inline void def_op(torch::Library& lib, const ops::OpFamily& f, int bits) {
  lib.def(ops::op_schema(f, bits, false).c_str());
  if (f.has_out) lib.def(ops::op_schema(f, bits, true).c_str());
}

// The Autograd kernel of every out= variant: an out= call cannot record a
// graph, so with grad mode on and a tensor argument that requires a gradient
// (the activations, out itself, a caller's scales) it raises, as aten's out=
// variants do, instead of returning a result that silently has none; other
// calls go straight to the kernel. Boxed and in C++: a Python kernel cost
// ~4.5 us per call, more than a one-row lookup.
inline void refuse_grad_for_out(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  if (at::GradMode::is_enabled()) {
    const size_t n = op.schema().arguments().size();
    for (size_t i = stack->size() - n; i < stack->size(); ++i) {
      const c10::IValue& v = (*stack)[i];
      if (v.isTensor() && v.toTensor().defined() && v.toTensor().requires_grad()) {
        const std::string name = op.schema().name();
        const std::string base = name.substr(name.find("::") + 2);
        const bool linear = base.find("linear") != std::string::npos;
        TORCH_CHECK(false, name, ".out does not record gradients (out= variants cannot), but its argument '",
                    op.schema().arguments()[i - (stack->size() - n)].name(), "' requires grad: ",
                    linear ? "call torch.ops.torchao." + base +
                                 " (or QuantizedLinear) for a gradient with respect to the activations, "
                           : std::string("pass tensors that do not require grad, "),
                    "or run under torch.no_grad()");
      }
    }
  }
  at::AutoDispatchBelowADInplaceOrView below;
  op.redispatchBoxed(ks & c10::after_ADInplaceOrView_keyset, stack);
}

inline void impl_out_autograd(torch::Library& autograd, const std::string& op) {
  autograd.impl((op + ".out").c_str(), torch::CppFunction::makeFromBoxedFunction<&refuse_grad_for_out>());
}

// Registers one op family under torchao's per-bit-width names (probe: the
// 4-bit one, "torchao::_linear_8bit_act_4bit_weight", ...) once, unless
// torchao's own kernel library defines them: its implementation then serves
// those calls and the result is `kept`, the reason, else "registered". Meta
// kernels torchao's Python package registered first (torchao/csrc_meta_ops.py)
// are kept too. def(lib, cpu, meta, autograd, want_meta) defines every bit
// width; each family (each Def) has its own libraries and state.
template <class Def>
std::string register_torchao_family(const std::string& probe, const char* kept, Def def) {
  static std::mutex mu;
  static std::string state;
  std::lock_guard<std::mutex> g(mu);
  if (!state.empty()) return state;
  auto& d = c10::Dispatcher::singleton();
  if (d.findSchema({probe.c_str(), ""}).has_value()) {
    state = kept;
    return state;
  }
  auto h = d.findOp({probe.c_str(), ""});
  const bool want_meta = !(h.has_value() && h->hasKernelForDispatchKey(c10::DispatchKey::Meta));
  static auto* lib = new torch::Library(torch::Library::FRAGMENT, "torchao", std::nullopt, __FILE__, __LINE__);
  static auto* cpu = new torch::Library(torch::Library::IMPL, "torchao", c10::DispatchKey::CPU, __FILE__, __LINE__);
  static auto* meta = new torch::Library(torch::Library::IMPL, "torchao", c10::DispatchKey::Meta, __FILE__, __LINE__);
  static auto* autograd =
      new torch::Library(torch::Library::IMPL, "torchao", c10::DispatchKey::Autograd, __FILE__, __LINE__);
  def(*lib, *cpu, *meta, *autograd, want_meta);
  state = "registered";
  return state;
}

}  // namespace aten_glue
}  // namespace torchao_kernels
