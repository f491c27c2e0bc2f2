// normlab/npy.h — reading and writing NumPy .npy files.
//
// Contract:
//   * Readers accept format versions 1.0, 2.0 and 3.0 with dtype '<f4', '<f8', '<i4' or '<i8' ('=' and a
//     missing byte-order character count as little-endian), in C or Fortran order, of rank 0..kMaxRank.
//     Results are always contiguous and in C (row-major) order. Zero-size arrays load fine.
//   * Anything else — bad magic, unknown version, malformed header dict, other dtypes (big-endian,
//     float16, bool, complex, structured, ...), negative or overflowing shapes, truncated data, extra bytes
//     after the data, unreadable files — throws normlab::Error naming the file and the problem.
//   * Writers emit version 1.0 (2.0 only if the header exceeds 65535 bytes), C order, little-endian, with
//     the data 64-byte aligned like NumPy. They write PATH.tmp and rename it over PATH, so a reader never
//     sees a half-written file; failures throw normlab::Error and leave no PATH.tmp behind.
#pragma once

#include <normlab/tensor.h>

#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace normlab {

// Element types normlab reads; all little-endian.
enum class NpyDType { f32, f64, i32, i64 };

struct NpyHeader {
  NpyDType dtype;
  bool fortran_order;
  Dims shape;               // rank 0 (a scalar) .. kMaxRank
  int version_major;        // 1, 2 or 3
  std::size_t data_offset;  // byte offset of the first element
};

// Parses and validates a whole .npy file held in memory: the header, and that exactly
// shape.product() * itemsize data bytes follow it. `what` names the source in error messages.
NpyHeader parse_npy_header(std::span<const std::byte> bytes, const std::string& what = "<memory>");

// float32 or float64 (rounded to nearest float32) in any order -> C-order contiguous tensor.
// Throws for integer files and for finite float64 values beyond the float32 range.
Tensor load_npy(const std::string& path);
// float32 or float64 -> double, C order.
BasicTensor<double> load_npy_f64(const std::string& path);
// int32/int64 (or float32/float64 holding exact integers in the int64 range), flattened in C order.
std::vector<Index> load_npy_index(const std::string& path);
// In-memory variant of load_npy.
Tensor parse_npy(std::span<const std::byte> bytes, const std::string& what = "<memory>");

// Writes '<f4' / '<f8' in C order from any strided view (negative and zero strides included).
void save_npy(const std::string& path, TensorView<const float> v);
void save_npy(const std::string& path, TensorView<const double> v);
// Writes '<i8'; `values` holds shape.product() elements in C order.
void save_npy_index(const std::string& path, std::span<const Index> values, Dims shape);

}  // namespace normlab
