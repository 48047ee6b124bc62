// Instruction-count probe for the ARM kernels (tools/count_arm_insns.py):
// packs random (n, k) weights for one registered kernel, then runs, between
// region markers, (1) the activation quantization and (2) the matmul call, so
// an instruction counter under qemu can attribute each part exactly. For an
// embedding kernel, M is the number of lookups (rows spread over the table)
// and region 1 is empty.
//   usage: tk_insn_count KERNEL M [N K BITS GROUP [bf16 | table | table-zeros0 | table-zeros1]]
//   (bf16: bfloat16 scale storage; table...: an n1k4 lookup row reading a
//   weights-only table, torchao's _embedding_{b}bit, whose scales come with
//   the call, without zero points, with zero points all 0 (what torchao
//   passes for symmetric weights) or all 1)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/format/kernel_args.h"
#include "kernels/select/json_writer.h"
#include "kernels/tests/test_util.h"

// Region markers: each a bare `ret` at its own symbol (the counter starts a
// translation block at every call target and recognises these by name).
asm(R"(
    .text
    .p2align 4
    .global armproxy_region_begin
    .type armproxy_region_begin, %function
armproxy_region_begin:
    ret
    .size armproxy_region_begin, .-armproxy_region_begin
    .p2align 4
    .global armproxy_region_end
    .type armproxy_region_end, %function
armproxy_region_end:
    ret
    .size armproxy_region_end, .-armproxy_region_end
)");
extern "C" void armproxy_region_begin();
extern "C" void armproxy_region_end();

using namespace torchao_kernels;

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s KERNEL M [N K BITS GROUP [bf16]]\n", argv[0]);
    return 2;
  }
  const KernelInfo* kernel = find_kernel(argv[1]);
  if (!kernel || !kernel->compiled()) {
    std::fprintf(stderr, "unknown or not compiled kernel %s\n", argv[1]);
    return 2;
  }
  const int m = std::atoi(argv[2]);
  const int n = argc > 3 ? std::atoi(argv[3]) : 4096;
  const int k = argc > 4 ? std::atoi(argv[4]) : 4096;
  const int bits = argc > 5 ? std::atoi(argv[5]) : 4;
  const int group = argc > 6 ? std::atoi(argv[6]) : 32;
  const std::string variant = argc > 7 ? argv[7] : "";
  const ScaleType scale_type = variant == "bf16" ? ScaleType::kBFloat16 : ScaleType::kFloat32;
  const bool table = variant.rfind("table", 0) == 0;
  if (!variant.empty() && variant != "bf16" && variant != "table" && variant != "table-zeros0" &&
      variant != "table-zeros1") {
    std::fprintf(stderr, "unknown variant %s\n", variant.c_str());
    return 2;
  }
  if (table && (kernel->op != KernelOp::kEmbedding || kernel->format != FormatId::kN1K4)) {
    std::fprintf(stderr, "%s: weights-only tables are read by the n1k4 lookup rows only\n", argv[7]);
    return 2;
  }
  // Random bytes are valid packed weights of any format (every bit pattern
  // decodes to some weights and scales): only the header needs building, which
  // keeps the untimed setup cheap under emulation.
  const PackedLayout layout = table ? PackedLayout::make_qvals_only(bits, n, k)
                                    : PackedLayout::make(kernel->format, bits, n, k, group, false, false, scale_type);
  const PackedHeader header = make_header(kernel->format, layout);
  std::vector<uint8_t> packed(kPackedHeaderBytes + layout.body_bytes);
  std::memcpy(packed.data(), &header, sizeof(header));
  uint32_t state = 12345;
  for (size_t i = kPackedHeaderBytes; i < packed.size(); ++i) {
    state = state * 1664525u + 1013904223u;
    packed[i] = static_cast<uint8_t>(state >> 24);
  }
  const PackedView v = parse_packed(packed.data(), packed.size());
  std::vector<float> out;
  if (kernel->op == KernelOp::kEmbedding) {
    std::vector<int64_t> rows(m);
    for (int i = 0; i < m; ++i) rows[i] = (int64_t{i} * 7919) % n;  // spread over the table's blocks
    out.resize(size_t(m) * k);
    // A weights-only table's scales (and zero points) per call.
    std::vector<float> scales(table ? size_t(n) * (k / group) : 0);
    for (size_t i = 0; i < scales.size(); ++i) scales[i] = 1e-3f * float(1 + i % 97);
    std::vector<int8_t> zeros(variant == "table-zeros0" || variant == "table-zeros1" ? scales.size() : 0,
                              variant == "table-zeros1" ? 1 : 0);
    EmbeddingArgs e{&v.layout, v.body, table ? scales.data() : nullptr, zeros.empty() ? nullptr : zeros.data(),
                    table ? group : 0, rows.data(), m, out.data(), k};
    armproxy_region_begin();
    armproxy_region_end();
    armproxy_region_begin();
    kernel->embed(e);
    armproxy_region_end();
  } else {
    const auto x = testing::activations(m, k, 2);
    std::vector<uint8_t> buf(activation_bytes(*kernel, m, v.layout));
    QuantizedActivations qa = carve_activations(*kernel, buf.data(), m, v.layout);
    out.resize(size_t(m) * n);
    GemmArgs a{&v.layout, v.body, &qa, 0, m, 0, v.layout.n_blocks, out.data(), n};

    armproxy_region_begin();
    prepare_activations(*kernel, x.data(), k, 0, m, qa);
    armproxy_region_end();

    armproxy_region_begin();
    kernel->fn(a);
    armproxy_region_end();
  }

  // Keep the output observable so the matmul cannot be optimised away.
  uint32_t digest = 0;
  for (float f : out) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    digest = digest * 31u + u;
  }
  const std::string line = JsonObject()
                               .str("kernel", kernel->name)
                               .num("m", m)
                               .num("n", n)
                               .num("k", k)
                               .num("bits", bits)
                               .num("group", group)
                               .num("packed_bytes", packed.size())
                               .num("digest", digest)
                               .done();
  std::printf("%s\n", line.c_str());
  return 0;
}
