// PowerSGD allreduce of device gradients over a DeviceCommunicator, the recipe the host Communicator runs too
// (allreduce_powersgd): every compressed matrix's P factor in one float32 allreduce, then every Q factor in a
// second, with the device PowerSGD kernels (compression/device_powersgd.h) in between; matrices in warm-up or not
// worth compressing are all-reduced plainly. Kernels run on the communicator's stream after the caller's
// `stream`, and the caller's stream waits for the outputs; the host returns once both allreduces are done (with
// the communicator's timeout).
#pragma once

#include <cstddef>
#include <span>
#include <string_view>

#include "hopwise/comm/device_communicator.h"
#include "hopwise/common/device_buffer.h"
#include "hopwise/compression/device_powersgd.h"

namespace hopwise::comm {

// One gradient matrix: rows x cols float32, row-major, device memory; `state` is the tensor's own, kept across steps.
struct DevicePowerSgdTensor {
  const float* in = nullptr;
  float* out = nullptr;  // may equal in
  std::size_t rows = 0, cols = 0;
  compression::DevicePowerSgdState* state = nullptr;
};

class DevicePowerSgdAllreduce {
 public:
  // "powersgd:rank=4[,ef=1,warmup=0]"
  DevicePowerSgdAllreduce(DeviceCommunicator& comm, std::string_view spec);
  // op: sum or avg. Every rank passes the same shapes in the same order.
  void allreduce(std::span<const DevicePowerSgdTensor> tensors, ReduceOp op = ReduceOp::kSum, void* stream = nullptr);
  const compression::DevicePowerSgd& powersgd() const { return ps_; }
  // Bytes this rank put on the wire in the last call (P and Q factors, plus the plainly reduced matrices).
  std::size_t wire_bytes() const { return wire_bytes_; }

 private:
  DeviceCommunicator& comm_;
  compression::DevicePowerSgd ps_;
  DeviceBuffer factors_;  // the P factors, then the Q factors: grown, never per call
  std::size_t wire_bytes_ = 0;
};

}  // namespace hopwise::comm
