// AVX512-VNNI int8 ceiling (compiled with the AVX512-VNNI flags): 16 chains
// of 512-bit vpdpbusd, 64 multiply-accumulates each.
#include "kernels/x86/int8_peak_impl.h"
#include "kernels/generated/kernel_functions.h"

namespace torchao_kernels {

double int8_peak_gops__avx512vnni() {
  auto loop = [](long n) {
    asm volatile(
        "vpternlogd $0xff, %%zmm30, %%zmm30, %%zmm30\n\t"
        "vmovdqa64 %%zmm30, %%zmm29\n\t"
        ".irp r,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15\n\t"
        "vpxord %%zmm\\r, %%zmm\\r, %%zmm\\r\n\t"
        ".endr\n\t"
        "1:\n\t"
        ".irp r,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15\n\t"
        "vpdpbusd %%zmm30, %%zmm29, %%zmm\\r\n\t"
        ".endr\n\t"
        "dec %0\n\t"
        "jnz 1b\n\t"
        "vzeroupper"
        : "+r"(n)
        :
        : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
          "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm29", "xmm30", "cc");
  };
  return 16 * 64 * 2 / int8_peak::best_seconds_per_iter(loop) * 1e-9;
}

}  // namespace torchao_kernels
