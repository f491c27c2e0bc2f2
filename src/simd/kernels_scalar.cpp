// Row, column and channel kernels for the scalar target: CMakeLists.txt compiles this file with the
// target's flags. The storage-conversion table (with the bf16/fp16 row kernels) is compiled in a second
// unit, kernels_scalar_convert.cpp, so that a 2-core build compiles the two halves of this target, its
// longest, side by side.
#define NL_TARGET scalar
// In the order of the other targets' units.
// clang-format off
#include "norm/row_kernels-inl.h"
#include "norm/column_kernels-inl.h"
#include "norm/channel_kernels-inl.h"
// clang-format on
