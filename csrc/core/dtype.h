// The dtypes kernels run on. Everything else is converted (float64, ints, bool -> float32)
// or rejected at the Python boundary (pyarray.cpp), as ops/arguments.h decides.
//
// int64 is the index dtype: what argmax/argmin return (NumPy's intp on 64-bit platforms)
// and what integer labels become when compared with them. Arrays of it support copies,
// views, astype, comparisons and sum/mean; every float kernel refuses it (TypeError at the
// Python boundary), since the elementwise table computes in float.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace fm {

enum class DType : std::uint8_t { float32, float16, int64 };

inline std::size_t itemsize(DType t) {
  return t == DType::float32 ? 4 : t == DType::float16 ? 2 : 8;
}
inline const char* dtype_name(DType t) {
  return t == DType::float32 ? "float32" : t == DType::float16 ? "float16" : "int64";
}
inline bool is_float(DType t) { return t != DType::int64; }
// Which dtype an op computes in and returns: the promotion tables of ops/arguments.cpp.

}  // namespace fm
