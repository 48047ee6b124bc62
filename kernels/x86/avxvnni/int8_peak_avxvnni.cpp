// AVX-VNNI int8 ceiling (compiled with -mavx2 -mfma -mavxvnni): 12 chains of
// 256-bit vpdpbusd ({vex} encoding), 32 multiply-accumulates each.
#include "kernels/x86/int8_peak_impl.h"
#include "kernels/generated/kernel_functions.h"

namespace torchao_kernels {

double int8_peak_gops__avxvnni() {
  auto loop = [](long n) {
    asm volatile(
        "vpcmpeqb %%ymm14, %%ymm14, %%ymm14\n\t"
        "vpabsb %%ymm14, %%ymm14\n\t"
        "vmovdqa %%ymm14, %%ymm15\n\t"
        ".irp r,0,1,2,3,4,5,6,7,8,9,10,11\n\t"
        "vpxor %%ymm\\r, %%ymm\\r, %%ymm\\r\n\t"
        ".endr\n\t"
        "1:\n\t"
        ".irp r,0,1,2,3,4,5,6,7,8,9,10,11\n\t"
        "%{vex%} vpdpbusd %%ymm15, %%ymm14, %%ymm\\r\n\t"
        ".endr\n\t"
        "dec %0\n\t"
        "jnz 1b\n\t"
        "vzeroupper"
        : "+r"(n)
        :
        : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
          "xmm11", "xmm14", "xmm15", "cc");
  };
  return 12 * 32 * 2 / int8_peak::best_seconds_per_iter(loop) * 1e-9;
}

}  // namespace torchao_kernels
