// What every ATen registration file shares: the mapping of the op bodies'
// exceptions to torch errors, the parallel loop, and the packed-buffer check.
// Written once here so that messages and error types agree across the ops.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <functional>
#include <stdexcept>

#include "ops/impl/linear_8bit_act_xbit_weight.h"

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

// A packed buffer argument: a contiguous 1-D int8 / uint8 CPU tensor (its
// bytes are validated by parse_packed in the op body).
inline void check_packed(const at::Tensor& packed, const char* name = "packed_weights") {
  TORCH_CHECK_VALUE(packed.device().is_cpu(), name, " must be a CPU tensor, got ", packed.device());
  TORCH_CHECK_VALUE(packed.dim() == 1 && packed.is_contiguous(), name,
                    " must be a contiguous 1-D tensor, got shape ", packed.sizes());
  TORCH_CHECK_VALUE(packed.scalar_type() == at::kByte || packed.scalar_type() == at::kChar, name,
                    " must be int8 or uint8, got ", packed.scalar_type());
}

}  // namespace aten_glue
}  // namespace torchao_kernels
