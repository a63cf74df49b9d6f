// The bucketed gradient reducer on device gradients (the host GradientReducer's design over DeviceCommunicator):
// float32 gradients registered in forward order are grouped into buckets in reverse order (backward produces them
// that way), each bucket one contiguous device buffer. mark_ready(p, stream) records an event on the stream that
// produced gradient p; the reducer's copy stream waits on it and copies the gradient into its bucket; when a bucket
// is complete its average (ncclAvg) is enqueued on the communicator's stream, buckets in bucket order on every
// rank, while backward computes the rest. finish(stream) makes `stream` wait for every bucket and copies the
// averages back into the gradients, on `stream`, without blocking the host.
//
// Options as the host reducer's (ReducerOptions::from_env: HOPWISE_BUCKET_MB, HOPWISE_COMPRESSION with any
// DeviceCodec spec; PowerSGD is not available here). After the first step the buckets are rebuilt from the order
// the gradients were marked ready in (rank 0's; ReducerOptions::rebuild), as the host reducer does.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "hopwise/comm/device_communicator.h"
#include "hopwise/training/reducer.h"  // ReducerOptions, StepStats

namespace hopwise::comm {

class DeviceGradientReducer {
 public:
  explicit DeviceGradientReducer(DeviceCommunicator& comm, ReducerOptions options = ReducerOptions::from_env());
  // Waits (up to the timeout) for buckets still in flight.
  ~DeviceGradientReducer();
  DeviceGradientReducer(const DeviceGradientReducer&) = delete;
  DeviceGradientReducer& operator=(const DeviceGradientReducer&) = delete;

  // Registers a float32 gradient of `count` elements in device memory (forward order); returns its index. The
  // memory stays the caller's and must live as long as the reducer. Names must be unique.
  int add_parameter(std::string name, float* grad, std::size_t count);
  // Assigns buckets, allocates their buffers and checks, once, that every rank has the same layout (names the
  // ranks that differ). Collective.
  void finalize();
  // Backward wrote gradient `index` with work on `stream` (cudaStream_t; nullptr = legacy default stream).
  // Never blocks the host. Throws InvalidArgument for a second mark in one step.
  void mark_ready(int index, void* stream = nullptr);
  void mark_ready(std::string_view name, void* stream = nullptr);
  // Makes `stream` wait for every bucket and copies the averaged gradients back (enqueued on `stream`). Throws
  // InvalidArgument naming the gradients never marked this step. Host-waits for the previous step's buckets
  // (normally long done), so that an NCCL error or timeout surfaces at most one step late; synchronize = true
  // host-waits for this step instead and fills comm_ms, exposed_comm_ms and overlap_pct.
  StepStats finish(void* stream = nullptr, bool synchronize = false);

  std::size_t bucket_count() const;
  std::vector<std::vector<std::string>> bucket_names() const;  // per bucket, in bucket order

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hopwise::comm
