# cpuinfo for CPU detection: the modern copy the torch wheel ships (header in
# torch/include, symbols exported by libc10.so). The header and the library
# must come from the same cpuinfo version; Debian's libcpuinfo-dev is older
# (no Zen 4 / Neoverse V2 / i8mm queries) and must not be mixed in.
if(NOT TARGET tk::cpuinfo)
  add_library(tk::cpuinfo INTERFACE IMPORTED)
  set_target_properties(tk::cpuinfo PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${TORCH_ROOT}/include"
    INTERFACE_LINK_LIBRARIES "${TORCH_ROOT}/lib/libc10.so")
endif()
