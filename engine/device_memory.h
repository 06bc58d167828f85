// Where a backend's ops read and write: host memory for the CPU backends, device memory for
// the CUDA backend. The model's weights, activations and the paged KV pool live in it; the
// host hands each step's indices in and takes the requested rows out through Upload and
// Download, and never reads or writes it directly (a GPU backend's memory is not host
// memory). tests/unit/device_resident_test.cc holds the model to that on the CPU with a memory
// the host cannot touch between backend calls.
#ifndef SPECD_ENGINE_DEVICE_MEMORY_H_
#define SPECD_ENGINE_DEVICE_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace specd::engine {

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // True when a pointer into this memory is also a host pointer (the CPU backends): the model
  // then lets ops write straight into the caller's buffers instead of staging them.
  virtual bool host_addressable() const = 0;
  // `bytes` zeroed bytes, 64-byte aligned; RESOURCE_EXHAUSTED naming the size when it fails.
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  virtual void Free(void* p) = 0;
  // Host -> memory, memory -> host, memory -> memory. Ordered after every op issued before
  // them; Download returns once the bytes are on the host, with any error an earlier op left.
  virtual absl::Status Upload(void* dst, const void* host_src, size_t bytes) = 0;
  virtual absl::Status Download(void* host_dst, const void* src, size_t bytes) = 0;
  // `rows` runs of `width` bytes, at strides dst_pitch and src_pitch (a sub-block of the KV
  // pool); both ends in this memory.
  virtual absl::Status Copy2D(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                              size_t width, size_t rows) = 0;
};

// Plain host memory (aligned_alloc, memcpy): the CPU and reference backends'.
DeviceMemory& HostMemory();

// One allocation, freed with its owner.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static absl::StatusOr<DeviceBuffer> Allocate(DeviceMemory& memory, size_t bytes) {
    absl::StatusOr<void*> p = memory.Allocate(bytes);
    if (!p.ok()) return p.status();
    return DeviceBuffer(&memory, *p, bytes);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      Reset();
      memory_ = std::exchange(o.memory_, nullptr);
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Reset(); }

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }

 private:
  DeviceBuffer(DeviceMemory* memory, void* data, size_t bytes)
      : memory_(memory), data_(data), bytes_(bytes) {}
  void Reset() {
    if (data_ != nullptr) memory_->Free(data_);
    data_ = nullptr;
    bytes_ = 0;
  }

  DeviceMemory* memory_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace specd::engine

#endif  // SPECD_ENGINE_DEVICE_MEMORY_H_
