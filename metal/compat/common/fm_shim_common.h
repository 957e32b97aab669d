// What the CPU and CUDA stand-ins for <metal_stdlib> have in common: MSL's scalar names,
// vector types, dot/select/mix/as_type and the memory-model enums, in namespace metal.
//
// The including shim defines first:
//   FM_SHIM_FN        qualifiers of every function here (CPU: inline; CUDA: host+device)
//   FM_SHIM_MEMCPY    a memcpy its kernels can call (as_type)
// and includes its own <cstdint>/<cstring> before this header.
#pragma once

// MSL's float macros (Metal Shading Language Specification, math functions). <cmath>
// defines INFINITY, NAN and HUGE_VALF; MAXFLOAT only on some C libraries.
#ifndef INFINITY
#define INFINITY __builtin_inff()
#endif
#ifndef NAN
#define NAN __builtin_nanf("")
#endif
#ifndef HUGE_VALF
#define HUGE_VALF __builtin_huge_valf()
#endif
#ifndef MAXFLOAT
#define MAXFLOAT 0x1.fffffep+127f
#endif

namespace metal {

using uint = std::uint32_t;
using ushort = std::uint16_t;
using uchar = std::uint8_t;
using std::int16_t;
using std::int32_t;
using std::int64_t;
using std::int8_t;
using std::uint16_t;
using std::uint32_t;
using std::uint64_t;
using std::uint8_t;

// ---- vector types (components .x .y .z .w; swizzles are outside the portable subset) ----
template <typename T, int N>
struct vec;
template <typename T>
struct vec<T, 2> {
  T x, y;
  vec() = default;
  FM_SHIM_FN constexpr vec(T a, T b) : x(a), y(b) {}
  FM_SHIM_FN constexpr explicit vec(T s) : x(s), y(s) {}
  FM_SHIM_FN T& operator[](int i) { return (&x)[i]; }
  FM_SHIM_FN const T& operator[](int i) const { return (&x)[i]; }
};
template <typename T>
struct vec<T, 3> {
  T x, y, z;
  vec() = default;
  FM_SHIM_FN constexpr vec(T a, T b, T c) : x(a), y(b), z(c) {}
  FM_SHIM_FN constexpr explicit vec(T s) : x(s), y(s), z(s) {}
  FM_SHIM_FN T& operator[](int i) { return (&x)[i]; }
  FM_SHIM_FN const T& operator[](int i) const { return (&x)[i]; }
};
// Aligned like Metal's (float4: 16 bytes, half4: 8), so that a vec<T, 4> access is one wide
// load or store on CUDA, as on an Apple GPU.
template <typename T>
struct alignas(4 * sizeof(T)) vec<T, 4> {
  T x, y, z, w;
  vec() = default;
  FM_SHIM_FN constexpr vec(T a, T b, T c, T d) : x(a), y(b), z(c), w(d) {}
  FM_SHIM_FN constexpr explicit vec(T s) : x(s), y(s), z(s), w(s) {}
  FM_SHIM_FN T& operator[](int i) { return (&x)[i]; }
  FM_SHIM_FN const T& operator[](int i) const { return (&x)[i]; }
};

#define FM_VEC_BINOP(op)                                                   \
  template <typename T, int N>                                             \
  FM_SHIM_FN vec<T, N> operator op(vec<T, N> a, const vec<T, N>& b) {      \
    for (int i = 0; i < N; ++i) a[i] = a[i] op b[i];                       \
    return a;                                                              \
  }                                                                        \
  template <typename T, int N>                                             \
  FM_SHIM_FN vec<T, N> operator op(vec<T, N> a, T s) {                     \
    for (int i = 0; i < N; ++i) a[i] = a[i] op s;                          \
    return a;                                                              \
  }                                                                        \
  template <typename T, int N>                                             \
  FM_SHIM_FN vec<T, N> operator op(T s, vec<T, N> a) {                     \
    for (int i = 0; i < N; ++i) a[i] = s op a[i];                          \
    return a;                                                              \
  }                                                                        \
  template <typename T, int N>                                             \
  FM_SHIM_FN vec<T, N>& operator op##=(vec<T, N>& a, const vec<T, N>& b) { \
    for (int i = 0; i < N; ++i) a[i] = a[i] op b[i];                       \
    return a;                                                              \
  }
FM_VEC_BINOP(+)
FM_VEC_BINOP(-)
FM_VEC_BINOP(*)
FM_VEC_BINOP(/)
#undef FM_VEC_BINOP

using float2 = vec<float, 2>;
using float3 = vec<float, 3>;
using float4 = vec<float, 4>;
using int2 = vec<int, 2>;
using int3 = vec<int, 3>;
using int4 = vec<int, 4>;
using uint2 = vec<uint, 2>;
using uint3 = vec<uint, 3>;
using uint4 = vec<uint, 4>;

template <typename T, int N>
FM_SHIM_FN T dot(const vec<T, N>& a, const vec<T, N>& b) {
  T s = 0;
  for (int i = 0; i < N; ++i) s += a[i] * b[i];
  return s;
}

template <typename T>
FM_SHIM_FN T select(T a, T b, bool c) { return c ? b : a; }
template <typename T>
FM_SHIM_FN T mix(T a, T b, T t) { return a + (b - a) * t; }

template <typename To, typename From>
FM_SHIM_FN To as_type(const From& v) {
  static_assert(sizeof(To) == sizeof(From), "as_type needs equal sizes");
  To out;
  FM_SHIM_MEMCPY(&out, &v, sizeof(To));
  return out;
}

// ---- memory model ----
enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
enum memory_order { memory_order_relaxed = 0 };

}  // namespace metal
