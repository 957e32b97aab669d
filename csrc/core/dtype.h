// The dtypes kernels run on. Everything else is converted (float64, ints, bool -> float32)
// or rejected at the Python boundary (pyarray.cpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace fm {

enum class DType : std::uint8_t { float32, float16 };

inline std::size_t itemsize(DType t) { return t == DType::float32 ? 4 : 2; }
inline const char* dtype_name(DType t) { return t == DType::float32 ? "float32" : "float16"; }

// float16 op float16 -> float16; anything with float32 -> float32 (NumPy's promotion).
inline DType promote(DType a, DType b) {
  return (a == DType::float16 && b == DType::float16) ? DType::float16 : DType::float32;
}

}  // namespace fm
