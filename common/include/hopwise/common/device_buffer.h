// An owning block of device memory (CUDA). reserve() grows it and never shrinks it, so that a buffer kept across
// calls is allocated once: cudaMalloc synchronizes the device and costs far more than the kernels it feeds.
#pragma once

#include <cstddef>
#include <utility>

#include "hopwise/common/cuda_reduce.h"

namespace hopwise {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) { reserve(bytes); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }

  // At least `bytes` bytes; growing drops the old contents (callers keep no data across a reserve that grows).
  void reserve(std::size_t bytes) {
    if (bytes <= bytes_ && data_ != nullptr) return;
    release();
    data_ = cuda::device_alloc(bytes);
    bytes_ = bytes;
  }
  void* data() const { return data_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  std::size_t bytes() const { return bytes_; }

 private:
  void release() {
    if (data_ != nullptr) cuda::device_free(data_);
    data_ = nullptr;
    bytes_ = 0;
  }
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace hopwise
