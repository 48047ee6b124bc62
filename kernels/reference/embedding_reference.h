#pragma once
#include "kernels/format/kernel_args.h"

namespace torchao_kernels {
// Portable embedding lookup for every layout (any nr, weights-only tables
// too): value by value, the ground truth of the lookup kernels.
void qbw_f32_embedding_1xNRc4__scalar(const EmbeddingArgs& a);
}  // namespace torchao_kernels
