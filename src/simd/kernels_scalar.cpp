// Row kernels for the scalar target: CMakeLists.txt compiles this file with the target's flags.
#define NL_TARGET scalar
#include "norm/row_kernels-inl.h"
#include "norm/column_kernels-inl.h"
#include "norm/convert_kernels-inl.h"
#include "norm/channel_kernels-inl.h"
