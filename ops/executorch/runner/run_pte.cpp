// tk_pte_runner: runs the "forward" method of an ExecuTorch program (.pte)
// with float32 inputs read from raw files and writes its float32 outputs as
// raw files (output 0 to OUT.f32, output i > 0 to OUT.f32.i). Links the ExecuTorch runtime, its CPU kernels and
// libtorchao_kernels_executorch (the torchao ops), so a .pte exported on one
// machine runs on another (tools/test_executorch_arm.sh runs it under
// qemu-aarch64).
//
//   tk_pte_runner MODEL.pte OUT.f32 IN0.f32 D0,D1,... [IN1.f32 D0,D1,... ...]
//
// Prints the ExecuTorch threadpool size, one line per output ("output 0:
// float32 [2, 8, 64]") and the kernels that ran ("torchao_kernels stats:
// {...}"). Exit code 0 on success.
#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor.h>
#include <executorch/runtime/kernel/thread_parallel_interface.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

extern "C" const char* torchao_kernels_executorch_ops();
extern "C" const char* torchao_kernels_executorch_stats_json();

namespace {

using executorch::aten::ScalarType;
using executorch::aten::SizesType;
using executorch::extension::Module;
using executorch::extension::TensorPtr;
using executorch::runtime::EValue;

int usage() {
  std::fprintf(stderr,
               "usage: tk_pte_runner MODEL.pte OUT.f32 IN0.f32 D0,D1,... [IN1.f32 D0,D1,... ...]\n");
  return 2;
}

bool parse_dims(const std::string& s, std::vector<SizesType>& dims) {
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end || v < 0) return false;
    dims.push_back(static_cast<SizesType>(v));
  }
  return !dims.empty();
}

bool read_floats(const std::string& path, size_t count, std::vector<float>& out) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) return false;
  const std::streamsize bytes = f.tellg();
  if (bytes != static_cast<std::streamsize>(count * sizeof(float))) {
    std::fprintf(stderr, "%s: %lld bytes, expected %zu float32 values (%zu bytes)\n", path.c_str(),
                 static_cast<long long>(bytes), count, count * sizeof(float));
    return false;
  }
  out.resize(count);
  f.seekg(0);
  return static_cast<bool>(f.read(reinterpret_cast<char*>(out.data()), bytes));
}

const char* dtype_name(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return "float32";
    case ScalarType::BFloat16: return "bfloat16";
    case ScalarType::Half: return "float16";
    case ScalarType::Long: return "int64";
    default: return "other";
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5 || (argc - 3) % 2 != 0) return usage();
  const std::string model_path = argv[1], out_path = argv[2];
  std::printf("registered: %s\n", torchao_kernels_executorch_ops());
  std::printf("threads: %lld\n",
              static_cast<long long>(::executorch::extension::get_thread_count()));

  std::vector<std::vector<float>> buffers;
  std::vector<TensorPtr> tensors;
  for (int i = 3; i < argc; i += 2) {
    std::vector<SizesType> dims;
    if (!parse_dims(argv[i + 1], dims)) {
      std::fprintf(stderr, "bad shape '%s' (expected D0,D1,...)\n", argv[i + 1]);
      return usage();
    }
    size_t count = 1;
    for (auto d : dims) count *= static_cast<size_t>(d);
    buffers.emplace_back();
    if (!read_floats(argv[i], count, buffers.back())) {
      std::fprintf(stderr, "cannot read %s\n", argv[i]);
      return 1;
    }
    tensors.push_back(executorch::extension::make_tensor_ptr(dims, buffers.back().data()));
  }

  Module module(model_path, Module::LoadMode::File);
  const auto load_err = module.load_forward();
  if (load_err != executorch::runtime::Error::Ok) {
    std::fprintf(stderr, "loading %s (method forward) failed: error 0x%x\n", model_path.c_str(),
                 static_cast<unsigned>(load_err));
    return 1;
  }
  std::vector<EValue> inputs;
  for (auto& t : tensors) inputs.emplace_back(t);
  const auto result = module.forward(inputs);
  if (!result.ok()) {
    std::fprintf(stderr, "forward failed: error 0x%x\n", static_cast<unsigned>(result.error()));
    return 1;
  }
  const std::vector<EValue>& outputs = result.get();
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].isTensor()) {
      std::printf("output %zu: not a tensor\n", i);
      continue;
    }
    const auto& t = outputs[i].toTensor();
    std::printf("output %zu: %s [", i, dtype_name(t.scalar_type()));
    for (ssize_t d = 0; d < t.dim(); ++d) std::printf(d ? ", %d" : "%d", static_cast<int>(t.size(d)));
    std::printf("]\n");
  }
  if (outputs.empty()) {
    std::fprintf(stderr, "the program returned no output\n");
    return 1;
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].isTensor() || outputs[i].toTensor().scalar_type() != ScalarType::Float) {
      std::fprintf(stderr, "output %zu is not a float32 tensor\n", i);
      return 1;
    }
    const auto& y = outputs[i].toTensor();
    const std::string path = i == 0 ? out_path : out_path + "." + std::to_string(i);
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(y.const_data_ptr<float>()),
            static_cast<std::streamsize>(y.nbytes()));
    if (!f) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      return 1;
    }
  }
  std::printf("torchao_kernels stats: %s\n", torchao_kernels_executorch_stats_json());
  return 0;
}
