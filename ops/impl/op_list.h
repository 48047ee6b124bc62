// Every op this project registers, written once. Generated from this list:
// the ATen schemas and registrations (ops/aten/register_ops.cpp,
// ops/aten/register_embedding_ops.cpp), the ExecuTorch registrations and
// torchao_kernels_executorch_ops() (ops/executorch/register_ops.cpp), and the
// Python side's list (torch.ops.torchao_kernels._op_list_json, read by
// torchao_kernels.executorch.OPS and torchao_kernels.autograd).
//
// An op family is this project's op, whose bit width is an argument or read
// from the buffer, plus torchao's per-bit-width ops, one per bit width of
// TK_OP_BIT_WIDTHS. A row:
//   X(id, out, name, args, per_bit_prefix, per_bit_suffix, per_bit_args, extra...)
//   id       the family's name in the glue code (its functions are named after it)
//   out      1: the op also has an out= variant (ExecuTorch registers the out=
//            variants only); 0: functional only (the pack ops, ATen only)
//   name     this project's op; torchao's op for bit width B is
//            per_bit_prefix "B" per_bit_suffix
//   args     the schema's arguments; the schemas are
//              name(args) -> Tensor
//              name.out(args, *, Tensor(a!) out) -> Tensor(a!)
// All ops are in the `torchao` namespace (torchao's schemas: keep them exact).
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "kernels/generated/format_limits.h"

#define TK_OP_FAMILIES(X, ...)                                                                  \
  X(pack_linear, 0, "pack_8bit_act_xbit_weight",                                               \
    "Tensor weight_qvals, Tensor weight_scales, Tensor? weight_zeros, int weight_nbit, "       \
    "int group_size, Tensor? bias, str? target=None",                                          \
    "_pack_8bit_act_", "bit_weight",                                                           \
    "Tensor weight_qvals, Tensor weight_scales, Tensor? weight_zeros, int group_size, "        \
    "Tensor? bias, str? target", __VA_ARGS__)                                                               \
  X(linear, 1, "linear_8bit_act_xbit_weight",                                                  \
    "Tensor activations, Tensor packed_weights, int group_size, int n, int k",                 \
    "_linear_8bit_act_", "bit_weight",                                                         \
    "Tensor activations, Tensor packed_weights, int group_size, int n, int k", __VA_ARGS__)                 \
  X(pack_embedding, 0, "pack_embedding_xbit", "Tensor weight_qvals, int weight_nbit",          \
    "_pack_embedding_", "bit", "Tensor weight_qvals", __VA_ARGS__)                                          \
  X(embedding, 1, "embedding_xbit",                                                            \
    "Tensor packed_weight_qvals, int num_embeddings, int embedding_dim, "                      \
    "Tensor weight_scales, Tensor? weight_zeros, Tensor indices",                              \
    "_embedding_", "bit",                                                                      \
    "Tensor packed_weight_qvals, int num_embeddings, int embedding_dim, "                      \
    "Tensor weight_scales, Tensor weight_zeros, Tensor indices", __VA_ARGS__)                               \
  X(shared_embedding, 1, "shared_embedding_xbit",                                              \
    "Tensor packed_weights, int group_size, int n, int k, Tensor indices",                     \
    "_shared_embedding_", "bit",                                                               \
    "Tensor packed_weights, int group_size, int n, int k, Tensor indices", __VA_ARGS__)

// The bit widths of torchao's per-bit-width ops: X(B, extra...) for each.
static_assert(torchao_kernels::kMaxBits == 8, "TK_OP_BIT_WIDTHS lists torchao's per-bit-width ops, 1..8");
#define TK_OP_BIT_WIDTHS(X, ...) \
  X(1, __VA_ARGS__) X(2, __VA_ARGS__) X(3, __VA_ARGS__) X(4, __VA_ARGS__) \
  X(5, __VA_ARGS__) X(6, __VA_ARGS__) X(7, __VA_ARGS__) X(8, __VA_ARGS__)

// The ExecuTorch kernel library's ops: the out= variant of every op of every
// family with one. X(uid, "name.out", id, fn): uid a unique identifier, fn
// the ExecuTorch glue's function for the op, after its family id:
// id_xbit_out for this project's op, id_bits_out<B> for torchao's.
#define TK_EXECUTORCH_OPS(X) TK_OP_FAMILIES(TK_OP_ET_FAMILY_, X)
#define TK_OP_ET_FAMILY_(id, out, name, args, prefix, suffix, per_bit_args, X) \
  TK_OP_ET_FAMILY_##out(id, name, prefix, suffix, X)
#define TK_OP_ET_FAMILY_0(id, name, prefix, suffix, X)
#define TK_OP_ET_FAMILY_1(id, name, prefix, suffix, X) \
  X(id##_xbit, name ".out", id, xbit_out) TK_OP_BIT_WIDTHS(TK_OP_ET_BITS_, id, prefix, suffix, X)
#define TK_OP_ET_BITS_(B, id, prefix, suffix, X) \
  X(id##_##B, prefix #B suffix ".out", id, bits_out<B>)

namespace torchao_kernels {
namespace ops {

enum class OpFamilyId {
#define TK_OP_ENUM_(id, ...) id,
  TK_OP_FAMILIES(TK_OP_ENUM_, )
#undef TK_OP_ENUM_
};

struct OpFamily {
  const char* id;
  bool has_out;
  const char* name;
  const char* args;
  const char* per_bit_prefix;
  const char* per_bit_suffix;
  const char* per_bit_args;
};

inline constexpr OpFamily kOpFamilies[] = {
#define TK_OP_ROW_(id, out, name, args, prefix, suffix, per_bit_args, ...) \
  {#id, out != 0, name, args, prefix, suffix, per_bit_args},
    TK_OP_FAMILIES(TK_OP_ROW_, )
#undef TK_OP_ROW_
};

inline constexpr int kOpBitWidths[] = {
#define TK_OP_BITS_(B, ...) B,
    TK_OP_BIT_WIDTHS(TK_OP_BITS_, )
#undef TK_OP_BITS_
};

inline const OpFamily& op_family(OpFamilyId id) { return kOpFamilies[static_cast<int>(id)]; }

// The op's name (without namespace): bits = 0 for this project's op, else
// torchao's op for that bit width.
inline std::string op_name(const OpFamily& f, int bits) {
  return bits == 0 ? std::string(f.name)
                   : f.per_bit_prefix + std::to_string(bits) + f.per_bit_suffix;
}
inline std::string op_name(OpFamilyId id, int bits) { return op_name(op_family(id), bits); }

// The op's schema (without namespace), functional or out= variant.
inline std::string op_schema(const OpFamily& f, int bits, bool out) {
  const std::string args = bits == 0 ? f.args : f.per_bit_args;
  return out ? op_name(f, bits) + ".out(" + args + ", *, Tensor(a!) out) -> Tensor(a!)"
             : op_name(f, bits) + "(" + args + ") -> Tensor";
}

// fn(std::integral_constant<int, B>) for every bit width B of the per-bit-width ops.
template <class F, size_t... I>
void for_each_op_bit_width_(F&& fn, std::index_sequence<I...>) {
  (fn(std::integral_constant<int, kOpBitWidths[I]>{}), ...);
}
template <class F>
void for_each_op_bit_width(F&& fn) {
  for_each_op_bit_width_(fn, std::make_index_sequence<sizeof(kOpBitWidths) / sizeof(int)>{});
}

// "torchao::<name>.out" for every op of the ExecuTorch kernel library, in
// registration order.
inline std::vector<std::string> executorch_op_names() {
  return {
#define TK_OP_ET_NAME_(uid, name, id, fn) "torchao::" name,
      TK_EXECUTORCH_OPS(TK_OP_ET_NAME_)
#undef TK_OP_ET_NAME_
  };
}

}  // namespace ops
}  // namespace torchao_kernels
