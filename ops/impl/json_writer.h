// The op layer's JSON text building: the shared writer of the kernels
// library (kernels/select/json_writer.h), under the ops namespace.
#pragma once

#include "kernels/select/json_writer.h"

namespace torchao_kernels {
namespace ops {

using ::torchao_kernels::json_bool;
using ::torchao_kernels::json_list;
using ::torchao_kernels::json_str;
using ::torchao_kernels::JsonObject;

}  // namespace ops
}  // namespace torchao_kernels
