// Turns a packed layout's run-time parameters (bit width, superblock size,
// zero points) into template arguments, once for every SIMD kernel:
// dispatch_layout<K>(a) calls K::template run<BITS, KB, ZEROS>(a) with the
// instantiation matching a.w. Kernel TUs define K inside their anonymous
// namespace, so each instantiation stays private to its ISA's TU.
#pragma once

#include "kernels/format/kernel_args.h"

namespace torchao_kernels {

template <class K, int BITS, int KB>
inline void dispatch_zeros(const GemmArgs& a) {
  if (a.w->has_zeros) {
    K::template run<BITS, KB, true>(a);
  } else {
    K::template run<BITS, KB, false>(a);
  }
}

template <class K, int BITS>
inline void dispatch_kb(const GemmArgs& a) {
  if (a.w->kb == 32) {
    dispatch_zeros<K, BITS, 32>(a);
  } else {
    dispatch_zeros<K, BITS, 16>(a);
  }
}

template <class K>
inline void dispatch_layout(const GemmArgs& a) {
  switch (a.w->bits) {
    case 1: return dispatch_kb<K, 1>(a);
    case 2: return dispatch_kb<K, 2>(a);
    case 3: return dispatch_kb<K, 3>(a);
    case 4: return dispatch_kb<K, 4>(a);
    case 5: return dispatch_kb<K, 5>(a);
    case 6: return dispatch_kb<K, 6>(a);
    case 7: return dispatch_kb<K, 7>(a);
    case 8: return dispatch_kb<K, 8>(a);
  }
}

}  // namespace torchao_kernels
