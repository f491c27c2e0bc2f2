// Row kernels for the avx512 target: CMakeLists.txt compiles this file with the target's flags.
#define NL_TARGET avx512
#include "norm/row_kernels-inl.h"
#include "norm/column_kernels-inl.h"
#include "norm/convert_kernels-inl.h"
#include "norm/channel_kernels-inl.h"
