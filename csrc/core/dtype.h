// The dtypes an Array has: the Array API standard's bool, uint8, int32, int64, float16,
// float32 and float64 (float64 on the backends with doubles: cpu and cuda, not metal).
//
// How ops treat them is decided in one place, ops/arguments.cpp (promotion, which kernels
// compute which dtype). The enum's order is fixed (values travel in saved state and kernel
// names use dtype_name): new dtypes go at the end.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace fm {

enum class DType : std::uint8_t { float32, float16, int64, bool_, uint8, int32, float64 };
constexpr int kDTypes = 7;

inline std::size_t itemsize(DType t) {
  switch (t) {
    case DType::float16: return 2;
    case DType::int64:
    case DType::float64: return 8;
    case DType::bool_:
    case DType::uint8: return 1;
    default: return 4;  // float32, int32
  }
}
inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::float32: return "float32";
    case DType::float16: return "float16";
    case DType::int64: return "int64";
    case DType::bool_: return "bool";
    case DType::uint8: return "uint8";
    case DType::int32: return "int32";
    default: return "float64";
  }
}
// NumPy's dtype.kind: 'f' floating, 'i' signed integer, 'u' unsigned, 'b' bool.
inline char dtype_kind(DType t) {
  switch (t) {
    case DType::int64:
    case DType::int32: return 'i';
    case DType::uint8: return 'u';
    case DType::bool_: return 'b';
    default: return 'f';
  }
}
// Kernels that move elements without computing (take, put, where) exist per element width.
inline const char* width_name(DType t) {
  switch (itemsize(t)) {
    case 1: return "b1";
    case 2: return "b2";
    case 4: return "b4";
    default: return "b8";
  }
}
inline bool is_float(DType t) { return dtype_kind(t) == 'f'; }
inline bool is_integer(DType t) { return dtype_kind(t) == 'i' || dtype_kind(t) == 'u'; }

}  // namespace fm
