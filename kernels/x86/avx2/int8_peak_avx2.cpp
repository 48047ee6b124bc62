// AVX2 int8 ceilings (compiled with -mavx2 -mfma): the two exact dot-product
// sequences of the AVX2 kernels.
//   pair sums: vpmaddubsw + vpaddw, int16 lanes (weights of <= 4 bits, and
//              8-bit weights split in nibbles, widened once per superblock);
//   madd:      vpmaddubsw + vpmaddwd (ones) + vpaddd, int32 lanes every step;
//   madd16:    vpmaddwd + vpaddd on int16 operands (8-bit weights over int16
//              activation panels), 16 multiply-accumulates each.
// Each vpmaddubsw is 32 multiply-accumulates; GOPS counts 2 per MAC.
#include "kernels/x86/int8_peak_impl.h"
#include "kernels/generated/kernel_functions.h"

namespace torchao_kernels {

double int8_peak_gops__avx2_pairsum() {
  // 6 int16 accumulator chains (vpaddw: 1 cycle latency); the vpmaddubsw of
  // each step depend on nothing carried, so they overlap freely.
  auto loop = [](long n) {
    asm volatile(
        "vpcmpeqb %%ymm14, %%ymm14, %%ymm14\n\t"
        "vpabsb %%ymm14, %%ymm14\n\t"
        "vmovdqa %%ymm14, %%ymm15\n\t"
        "vpxor %%ymm0, %%ymm0, %%ymm0\n\t"
        "vpxor %%ymm1, %%ymm1, %%ymm1\n\t"
        "vpxor %%ymm2, %%ymm2, %%ymm2\n\t"
        "vpxor %%ymm3, %%ymm3, %%ymm3\n\t"
        "vpxor %%ymm4, %%ymm4, %%ymm4\n\t"
        "vpxor %%ymm5, %%ymm5, %%ymm5\n\t"
        "1:\n\t"
        ".irp r,6,7,8,9,10,11\n\t"
        "vpmaddubsw %%ymm15, %%ymm14, %%ymm\\r\n\t"
        ".endr\n\t"
        "vpaddw %%ymm6, %%ymm0, %%ymm0\n\t"
        "vpaddw %%ymm7, %%ymm1, %%ymm1\n\t"
        "vpaddw %%ymm8, %%ymm2, %%ymm2\n\t"
        "vpaddw %%ymm9, %%ymm3, %%ymm3\n\t"
        "vpaddw %%ymm10, %%ymm4, %%ymm4\n\t"
        "vpaddw %%ymm11, %%ymm5, %%ymm5\n\t"
        "dec %0\n\t"
        "jnz 1b\n\t"
        "vzeroupper"
        : "+r"(n)
        :
        : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
          "xmm11", "xmm14", "xmm15", "cc");
  };
  return 6 * 32 * 2 / int8_peak::best_seconds_per_iter(loop) * 1e-9;
}

double int8_peak_gops__avx2_madd() {
  auto loop = [](long n) {
    asm volatile(
        "vpcmpeqb %%ymm14, %%ymm14, %%ymm14\n\t"
        "vpabsb %%ymm14, %%ymm14\n\t"
        "vmovdqa %%ymm14, %%ymm15\n\t"
        "vpcmpeqw %%ymm13, %%ymm13, %%ymm13\n\t"
        "vpsrlw $15, %%ymm13, %%ymm13\n\t"
        "vpxor %%ymm0, %%ymm0, %%ymm0\n\t"
        "vpxor %%ymm1, %%ymm1, %%ymm1\n\t"
        "vpxor %%ymm2, %%ymm2, %%ymm2\n\t"
        "vpxor %%ymm3, %%ymm3, %%ymm3\n\t"
        "vpxor %%ymm4, %%ymm4, %%ymm4\n\t"
        "vpxor %%ymm5, %%ymm5, %%ymm5\n\t"
        "1:\n\t"
        ".irp r,6,7,8,9,10,11\n\t"
        "vpmaddubsw %%ymm15, %%ymm14, %%ymm\\r\n\t"
        "vpmaddwd %%ymm13, %%ymm\\r, %%ymm\\r\n\t"
        ".endr\n\t"
        "vpaddd %%ymm6, %%ymm0, %%ymm0\n\t"
        "vpaddd %%ymm7, %%ymm1, %%ymm1\n\t"
        "vpaddd %%ymm8, %%ymm2, %%ymm2\n\t"
        "vpaddd %%ymm9, %%ymm3, %%ymm3\n\t"
        "vpaddd %%ymm10, %%ymm4, %%ymm4\n\t"
        "vpaddd %%ymm11, %%ymm5, %%ymm5\n\t"
        "dec %0\n\t"
        "jnz 1b\n\t"
        "vzeroupper"
        : "+r"(n)
        :
        : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
          "xmm11", "xmm13", "xmm14", "xmm15", "cc");
  };
  return 6 * 32 * 2 / int8_peak::best_seconds_per_iter(loop) * 1e-9;
}

double int8_peak_gops__avx2_madd16() {
  // 6 int32 accumulator chains; exact for any int8 x int8 (or u8 x int8) products.
  auto loop = [](long n) {
    asm volatile(
        "vpcmpeqw %%ymm14, %%ymm14, %%ymm14\n\t"
        "vpsrlw $8, %%ymm14, %%ymm14\n\t"
        "vmovdqa %%ymm14, %%ymm15\n\t"
        "vpxor %%ymm0, %%ymm0, %%ymm0\n\t"
        "vpxor %%ymm1, %%ymm1, %%ymm1\n\t"
        "vpxor %%ymm2, %%ymm2, %%ymm2\n\t"
        "vpxor %%ymm3, %%ymm3, %%ymm3\n\t"
        "vpxor %%ymm4, %%ymm4, %%ymm4\n\t"
        "vpxor %%ymm5, %%ymm5, %%ymm5\n\t"
        "1:\n\t"
        ".irp r,6,7,8,9,10,11\n\t"
        "vpmaddwd %%ymm15, %%ymm14, %%ymm\\r\n\t"
        ".endr\n\t"
        "vpaddd %%ymm6, %%ymm0, %%ymm0\n\t"
        "vpaddd %%ymm7, %%ymm1, %%ymm1\n\t"
        "vpaddd %%ymm8, %%ymm2, %%ymm2\n\t"
        "vpaddd %%ymm9, %%ymm3, %%ymm3\n\t"
        "vpaddd %%ymm10, %%ymm4, %%ymm4\n\t"
        "vpaddd %%ymm11, %%ymm5, %%ymm5\n\t"
        "dec %0\n\t"
        "jnz 1b\n\t"
        "vzeroupper"
        : "+r"(n)
        :
        : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
          "xmm11", "xmm14", "xmm15", "cc");
  };
  return 6 * 16 * 2 / int8_peak::best_seconds_per_iter(loop) * 1e-9;
}

}  // namespace torchao_kernels
