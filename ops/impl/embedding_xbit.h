// Framework-agnostic bodies of the embedding ops: validate, select, split the
// lookups over threads, call the lookup kernel. Two kinds of table:
//  - weights-only tables (torchao::_pack_embedding_{b}bit), whose scales and
//    zero points come with every call (torchao::_embedding_{b}bit);
//  - any buffer packed by the linear pack op, read row by row
//    (torchao::_shared_embedding_{b}bit): one packed buffer serves a tied
//    input embedding and output head.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ops/impl/linear_8bit_act_xbit_weight.h"

namespace torchao_kernels {
namespace ops {

size_t pack_embedding_size(int bits, int64_t num_embeddings, int64_t embedding_dim);
// Throws std::invalid_argument naming a qval outside the bit range.
void pack_embedding(int bits, int64_t num_embeddings, int64_t embedding_dim, const int8_t* qvals,
                    void* out);

// Index validation shared by both lookups: every index in [0, num_embeddings),
// else std::invalid_argument naming the position and the value.
void check_indices(const int64_t* indices, int64_t count, int64_t num_embeddings);

// out[i] = dequantized row indices[i] of a weights-only table (count x embedding_dim).
// scales: float32 [num_embeddings][groups]; zeros: int8, same shape, or null.
// bits: the op's bit width (0 = any; else it must match the table's).
void embedding(const void* packed, size_t packed_bytes, int bits, int64_t num_embeddings,
               int64_t embedding_dim, const float* scales, int64_t groups, const int8_t* zeros,
               const int64_t* indices, int64_t count, float* out, const Parallel& par);

// out[i] = row indices[i] of the dequantized weight of a linear packed buffer
// (count x k), without bias.
void shared_embedding(const void* packed, size_t packed_bytes, int bits, int64_t group_size,
                      int64_t n, int64_t k, const int64_t* indices, int64_t count, float* out,
                      const Parallel& par);

// One named lookup kernel on one thread (kernel tests, per-kernel benchmarks);
// scales / zeros as for embedding() when the buffer is a weights-only table.
void embedding_with_kernel(const KernelInfo& kernel, const void* packed, size_t packed_bytes,
                           const float* scales, int64_t groups, const int8_t* zeros,
                           const int64_t* indices, int64_t count, float* out);

}  // namespace ops
}  // namespace torchao_kernels
