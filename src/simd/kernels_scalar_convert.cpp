// The storage-conversion table of the scalar target (kernels_scalar.cpp has the rest): the row kernel
// templates without the float entries (NL_ROWS_FOR_CONVERT), then the table, which instantiates them for
// bf16 and fp16.
#define NL_TARGET scalar
#define NL_ROWS_FOR_CONVERT 1
// convert_kernels-inl.h uses the row kernels, so it comes second.
// clang-format off
#include "norm/row_kernels-inl.h"
#include "norm/convert_kernels-inl.h"
// clang-format on
