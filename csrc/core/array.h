// fm::Array: a strided view of a Storage on one backend. The Python `fastmetal.Array`
// wraps this; ops take and return it. Strides are in elements (negative and zero allowed);
// `offset` is the element index of [0, 0, ..., 0] inside the storage.
#pragma once
#include <cstdint>
#include <string>

#include "dtype.h"
#include "shape.h"
#include "storage.h"

namespace fm {

struct Array {
  StoragePtr storage;
  std::int64_t offset = 0;
  Shape shape;
  Strides strides;
  DType dtype = DType::float32;
  // Views memory that Python says is immutable (a read-only buffer export, e.g. `bytes`,
  // a read-only or broadcast NumPy array): ops read it but never write into it.
  bool readonly = false;

  Backend& backend() const { return *storage->backend; }
  std::int64_t size() const { return numel(shape); }
  std::int64_t ndim() const { return std::int64_t(shape.size()); }
  std::size_t nbytes() const { return std::size_t(size()) * itemsize(dtype); }
  std::size_t byte_offset() const { return std::size_t(offset) * itemsize(dtype); }
  bool contiguous() const { return is_contiguous(shape, strides); }
  // CPU address of element [0, ..., 0] (host-visible backends only).
  char* host_data() const { return static_cast<char*>(storage->host) + byte_offset(); }
  // Device address of element [0, ..., 0] (cuda: the storage handle is a device pointer).
  char* device_data() const { return static_cast<char*>(storage->handle) + byte_offset(); }
  // [lowest, highest] byte addresses touched (host-visible backends), for overlap checks.
  std::pair<const char*, const char*> host_extent() const;

  // A new contiguous array. ValueError (naming `op`) where the byte count does not fit a
  // signed 64-bit size, MemoryError where the device cannot allocate it; nothing is
  // allocated in either case.
  // (Defined in csrc/backend/array_alloc.cpp: allocating is the backend's job.)
  static Array empty(Backend& backend, const Shape& shape, DType dtype, const char* op = nullptr);
};

// Called before every write into an existing Array: ValueError unless `a` may be written by
// `op` (as `arg`) — not read-only and without broadcast (zero-stride) dimensions, whose
// elements share memory — then advances its storage's version (autograd's check that
// what backward saved was not overwritten).
void prepare_write(const Array& a, const std::string& op, const char* arg);

// True where a and b can touch the same bytes.
bool may_overlap(const Array& a, const Array& b);
// True where a and b view exactly the same elements in the same order.
bool same_view(const Array& a, const Array& b);

}  // namespace fm
