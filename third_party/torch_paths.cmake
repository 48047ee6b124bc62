# Locates the installed torch wheel (headers and the two libraries the op
# library links) without TorchConfig.cmake, whose CUDA probing is not needed
# for a CPU extension.
# Cross builds pass -DTORCH_ROOT=<unpacked torch wheel of the target>/torch.
if(DEFINED TORCH_ROOT)
  set(TORCH_CXX11_ABI 1)
  set(TORCH_INCLUDE_DIRS ${TORCH_ROOT}/include ${TORCH_ROOT}/include/torch/csrc/api/include)
  set(TORCH_CPU_LIBRARIES ${TORCH_ROOT}/lib/libtorch_cpu.so ${TORCH_ROOT}/lib/libc10.so)
  message(STATUS "torch (given): ${TORCH_ROOT}")
  return()
endif()
execute_process(
  COMMAND ${Python_EXECUTABLE} -c
    "import os, torch; print(os.path.dirname(torch.__file__)); print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"
  OUTPUT_VARIABLE _tk_torch_out
  RESULT_VARIABLE _tk_torch_rc
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _tk_torch_rc EQUAL 0)
  message(FATAL_ERROR "torch is not importable by ${Python_EXECUTABLE}: install torch==2.13.0 first "
                      "and build with pip install --no-build-isolation")
endif()
string(REPLACE "\n" ";" _tk_torch_out "${_tk_torch_out}")
list(GET _tk_torch_out 0 TORCH_ROOT)
list(GET _tk_torch_out 1 TORCH_CXX11_ABI)
set(TORCH_INCLUDE_DIRS ${TORCH_ROOT}/include ${TORCH_ROOT}/include/torch/csrc/api/include)
set(TORCH_CPU_LIBRARIES ${TORCH_ROOT}/lib/libtorch_cpu.so ${TORCH_ROOT}/lib/libc10.so)
message(STATUS "torch: ${TORCH_ROOT} (cxx11 abi ${TORCH_CXX11_ABI})")
