// Makes the op library a real Python extension module (torchao_kernels._C):
// importing it loads the library and runs the op registrations. It defines no
// Python functions; everything is reached through torch.ops.
#include <Python.h>

static struct PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&kModule); }
