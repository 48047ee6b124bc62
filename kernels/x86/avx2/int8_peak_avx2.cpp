// AVX2 int8 ceilings (compiled with -mavx2 -mfma): the exact dot-product
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

namespace {

// The loop every probe times: 6 accumulator chains (ymm0-5, from zero); each
// step computes 6 products into ymm6-11 (STEP, with r the register number),
// which depend on nothing carried and overlap freely, and ADDs them into the
// chains (1 cycle latency). The operands sit in ymm13-15, set up before it.
#define TAK_PEAK_LOOP(STEP, ADD)                                                                        \
  "vpxor %%ymm0, %%ymm0, %%ymm0\n\t"                                                                   \
  "vpxor %%ymm1, %%ymm1, %%ymm1\n\t"                                                                   \
  "vpxor %%ymm2, %%ymm2, %%ymm2\n\t"                                                                   \
  "vpxor %%ymm3, %%ymm3, %%ymm3\n\t"                                                                   \
  "vpxor %%ymm4, %%ymm4, %%ymm4\n\t"                                                                   \
  "vpxor %%ymm5, %%ymm5, %%ymm5\n\t"                                                                   \
  "1:\n\t"                                                                                             \
  ".irp r,6,7,8,9,10,11\n\t" STEP ".endr\n\t" ADD " %%ymm6, %%ymm0, %%ymm0\n\t" ADD                   \
  " %%ymm7, %%ymm1, %%ymm1\n\t" ADD " %%ymm8, %%ymm2, %%ymm2\n\t" ADD " %%ymm9, %%ymm3, %%ymm3\n\t" ADD \
  " %%ymm10, %%ymm4, %%ymm4\n\t" ADD " %%ymm11, %%ymm5, %%ymm5\n\t"                                    \
  "dec %0\n\t"                                                                                         \
  "jnz 1b\n\t"                                                                                         \
  "vzeroupper"
#define TAK_PEAK_CLOBBERS \
  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm13", "xmm14", "xmm15", "cc"

}  // namespace

double int8_peak_gops__avx2_pairsum() {
  auto loop = [](long n) {
    asm volatile(
        "vpcmpeqb %%ymm14, %%ymm14, %%ymm14\n\t"
        "vpabsb %%ymm14, %%ymm14\n\t"
        "vmovdqa %%ymm14, %%ymm15\n\t" TAK_PEAK_LOOP("vpmaddubsw %%ymm15, %%ymm14, %%ymm\\r\n\t", "vpaddw")
        : "+r"(n)
        :
        : TAK_PEAK_CLOBBERS);
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
        "vpsrlw $15, %%ymm13, %%ymm13\n\t" TAK_PEAK_LOOP(
            "vpmaddubsw %%ymm15, %%ymm14, %%ymm\\r\n\t"
            "vpmaddwd %%ymm13, %%ymm\\r, %%ymm\\r\n\t",
            "vpaddd")
        : "+r"(n)
        :
        : TAK_PEAK_CLOBBERS);
  };
  return 6 * 32 * 2 / int8_peak::best_seconds_per_iter(loop) * 1e-9;
}

double int8_peak_gops__avx2_madd16() {
  // Exact for any int8 x int8 (or u8 x int8) products.
  auto loop = [](long n) {
    asm volatile(
        "vpcmpeqw %%ymm14, %%ymm14, %%ymm14\n\t"
        "vpsrlw $8, %%ymm14, %%ymm14\n\t"
        "vmovdqa %%ymm14, %%ymm15\n\t" TAK_PEAK_LOOP("vpmaddwd %%ymm15, %%ymm14, %%ymm\\r\n\t", "vpaddd")
        : "+r"(n)
        :
        : TAK_PEAK_CLOBBERS);
  };
  return 6 * 16 * 2 / int8_peak::best_seconds_per_iter(loop) * 1e-9;
}

#undef TAK_PEAK_LOOP
#undef TAK_PEAK_CLOBBERS

}  // namespace torchao_kernels
