// Argument checks shared by the ATen and ExecuTorch glues, written once so
// both frameworks accept the same arguments and report the same messages.
// Framework-free: each glue describes its tensor as a TensorArg (adapting its
// dtype and shape), and a failed check throws std::invalid_argument, which
// each glue maps to its error (ValueError / Error::InvalidArgument).
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace torchao_kernels {
namespace ops {

// The dtypes the ops meet; names as torch spells them in messages.
enum class DType { kBool, kUInt8, kInt8, kInt16, kInt32, kInt64, kFloat16, kBFloat16, kFloat32, kFloat64, kOther };

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kBool: return "Bool";
    case DType::kUInt8: return "Byte";
    case DType::kInt8: return "Char";
    case DType::kInt16: return "Short";
    case DType::kInt32: return "Int";
    case DType::kInt64: return "Long";
    case DType::kFloat16: return "Half";
    case DType::kBFloat16: return "BFloat16";
    case DType::kFloat32: return "Float";
    case DType::kFloat64: return "Double";
    default: return "an unsupported dtype";
  }
}

inline bool is_floating(DType t) {
  return t == DType::kFloat16 || t == DType::kBFloat16 || t == DType::kFloat32 || t == DType::kFloat64;
}
inline bool is_integral(DType t) {  // bool included, as torch's !is_floating_point()
  return t == DType::kBool || t == DType::kUInt8 || t == DType::kInt8 || t == DType::kInt16 ||
         t == DType::kInt32 || t == DType::kInt64;
}

// A tensor argument as the checks see it.
struct TensorArg {
  DType dtype = DType::kOther;
  std::vector<int64_t> sizes;
  bool contiguous = true;
  std::string device = "cpu";  // the framework's spelling; "cpu" for CPU tensors
  std::string other_dtype;     // the framework's name of a kOther dtype
};

inline std::string dtype_name(const TensorArg& t) {
  return t.dtype == DType::kOther && !t.other_dtype.empty() ? t.other_dtype : dtype_name(t.dtype);
}

inline std::string shape_str(const std::vector<int64_t>& sizes) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < sizes.size(); ++i) os << (i ? ", " : "") << sizes[i];
  os << "]";
  return os.str();
}

[[noreturn]] inline void invalid(const std::string& msg) { throw std::invalid_argument(msg); }

inline void check_cpu(const char* name, const TensorArg& t) {
  if (t.device != "cpu") invalid(std::string(name) + " must be a CPU tensor, got " + t.device);
}

// A packed buffer argument: a contiguous 1-D int8 / uint8 CPU tensor (its
// bytes are validated by parse_packed in the op body).
inline void check_packed_arg(const char* name, const TensorArg& t) {
  check_cpu(name, t);
  if (t.sizes.size() != 1 || !t.contiguous)
    invalid(std::string(name) + " must be a contiguous 1-D tensor, got shape " + shape_str(t.sizes));
  if (t.dtype != DType::kInt8 && t.dtype != DType::kUInt8)
    invalid(std::string(name) + " must be int8 or uint8, got " + dtype_name(t));
}

// torchao's per-bit-width ops: the buffer's bit width must be the op's.
inline void check_bit_width(const char* name, int packed_bits, int op_bits) {
  if (op_bits != 0 && packed_bits != op_bits) {
    invalid(std::string(name) + " hold " + std::to_string(packed_bits) +
            "-bit weights, but this op is for " + std::to_string(op_bits) +
            "-bit weights (bit width mismatch)");
  }
}

// Lookup indices: int64 or int32 (as torch.nn.functional.embedding's users
// pass them), on the CPU.
inline void check_indices_arg(const TensorArg& t) {
  check_cpu("indices", t);
  if (t.dtype != DType::kInt64 && t.dtype != DType::kInt32)
    invalid(std::string("indices must be an integer tensor (int64 or int32), got ") + dtype_name(t));
}

// A weights-only table's scales: (num_embeddings, groups), floating point.
inline void check_embedding_scales_arg(const TensorArg& t, int64_t num_embeddings) {
  if (t.sizes.size() != 2 || t.sizes[0] != num_embeddings) {
    invalid("weight_scales must have shape (num_embeddings=" + std::to_string(num_embeddings) +
            ", groups), got " + shape_str(t.sizes));
  }
  if (!is_floating(t.dtype))
    invalid(std::string("weight_scales must be floating point, got ") + dtype_name(t));
}

// Its zero points: the scales' shape, integer values that fit in int8
// (check_zero_point_range once the values are known).
inline void check_embedding_zeros_arg(const TensorArg& zeros, const TensorArg& scales) {
  if (zeros.sizes != scales.sizes) {
    invalid("weight_zeros must have the shape of weight_scales " + shape_str(scales.sizes) +
            ", got " + shape_str(zeros.sizes));
  }
  if (!is_integral(zeros.dtype))
    invalid(std::string("weight_zeros must be integer (int8 values), got ") + dtype_name(zeros));
}

inline void check_zero_point_range(int64_t min_value, int64_t max_value) {
  if (min_value < -128 || max_value > 127) {
    invalid("weight_zeros must fit in int8, got values in [" + std::to_string(min_value) + ", " +
            std::to_string(max_value) + "]");
  }
}

}  // namespace ops
}  // namespace torchao_kernels
