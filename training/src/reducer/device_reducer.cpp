// The DeviceGradientReducer (device_reducer.h) over the reducers' schedule (schedule.h), as the host reducer:
// what stays here is memory and launches. Buckets lie back to back in one device buffer; gradients are copied in
// on a copy stream after their producers, each bucket averaged on the DeviceCommunicator's stream once complete,
// and copied back on finish()'s stream. The schedule's fingerprints and observed order travel through the
// communicator's store. Built into hopwise_comm_nccl.
#include "hopwise/training/device_reducer.h"

#include <cuda_runtime.h>
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <thread>

#include "hopwise/comm/communicator.h"
#include "hopwise/common/cuda_check.h"
#include "hopwise/common/device_buffer.h"
#include "hopwise/common/error.h"
#include "hopwise/compression/device_codec.h"
#include "hopwise/compression/spec.h"
#include "schedule.h"

namespace hopwise::comm {

using cuda::CurrentGuard;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::size_t kAlignFloats = 64;  // buckets start 256-byte aligned inside the flat buffer

struct BucketMemory {
  std::size_t offset = 0;  // elements from the start of the flat buffer
  std::size_t wire_bytes = 0;
  DeviceWork work;
  std::unique_ptr<compression::DeviceCodecState> codec_state;  // per bucket: residual and step
};

}  // namespace

struct DeviceGradientReducer::Impl {
  DeviceCommunicator& comm;
  ReducerOptions options;
  int rank = 0, size = 1, device = 0;
  std::vector<float*> grads;                // per gradient, the caller's
  std::vector<cudaEvent_t> produced;        // per gradient, recorded on the producer's stream by mark_ready
  std::vector<BucketMemory> bucket_memory;  // per bucket
  DeviceBuffer flat;                        // every bucket, back to back
  cudaStream_t copy_stream = nullptr;       // copies gradients into buckets, after their producers
  cudaEvent_t copied_out = nullptr;         // finish()'s copy-out done: the next copy-in may overwrite the buckets
  std::unique_ptr<compression::DeviceCodec> codec;  // null: plain average
  std::vector<DeviceWork> previous;                 // last step's buckets, host-waited at the next finish
  std::optional<reducer::Schedule> schedule;

  Impl(DeviceCommunicator& c, ReducerOptions o)
      : comm(c), options(std::move(o)), rank(c.rank()), size(c.size()), device(c.device()) {
    if (split_compression_scope(options.compression).first == CompressionScope::kNetwork)
      throw InvalidArgument(fmt::format(
          "DeviceGradientReducer: compression '{}' (between hosts only) runs on host gradients; on the GPU use a "
          "codec over every link (e.g. int8) or none",
          options.compression));
    const auto spec = compression::parse_codec_spec(options.compression);
    if (spec.name == "powersgd")
      throw InvalidArgument(
          "DeviceGradientReducer: PowerSGD is not available on device gradients; use a codec "
          "(HOPWISE_COMPRESSION=fp16, int8, topk:ratio=..., ...) or none");
    if (spec.name != "none") codec = std::make_unique<compression::DeviceCodec>(options.compression);
    reducer::Collectives collectives{
        [this](std::uint64_t mine) {
          const std::vector<std::string> got =
              comm.host_allgather("reducer_layout", std::string(reinterpret_cast<const char*>(&mine), sizeof(mine)));
          std::vector<std::uint64_t> all(got.size(), 0);
          for (std::size_t r = 0; r < got.size(); ++r)
            if (got[r].size() == sizeof(std::uint64_t)) std::memcpy(&all[r], got[r].data(), sizeof(std::uint64_t));
          return all;
        },
        [this](std::vector<std::int32_t>& order) {
          const std::string got = comm.host_broadcast(
              "reducer_order",
              std::string(reinterpret_cast<const char*>(order.data()), order.size() * sizeof(std::int32_t)), 0);
          if (got.size() != order.size() * sizeof(std::int32_t))
            throw InvalidArgument(
                fmt::format("rank {}: rank 0 observed {} gradients ready but this rank registered {}; "
                            "every rank must register the same parameters",
                            rank, got.size() / sizeof(std::int32_t), order.size()));
          if (!order.empty()) std::memcpy(order.data(), got.data(), got.size());
        },
        [](std::vector<double>&) {}};  // no tuning here (below)
    // The tuner measures a step up to the end of finish(), which on the device does not wait for the buckets.
    schedule.emplace(
        options, rank, "device gradient", std::move(collectives), [this] { lay_out(); }, false,
        "the device reducer's finish() does not wait for its buckets, so no step span measures a cap");
    CurrentGuard guard(device);
    cuda::check(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", rank);
    const cudaError_t e = cudaEventCreateWithFlags(&copied_out, cudaEventDisableTiming);
    if (e != cudaSuccess) {
      cudaStreamDestroy(copy_stream);
      cuda::check(e, "cudaEventCreate", rank);
    }
  }

  ~Impl() {
    CurrentGuard guard(device);
    // Never free buffers that queued work still uses.
    for (DeviceWork& w : previous) try {
        w.wait();
      } catch (...) {
      }
    for (BucketMemory& m : bucket_memory)
      if (m.work.valid()) try {
          m.work.wait();
        } catch (...) {
        }
    if (copy_stream) cudaStreamSynchronize(copy_stream);
    for (cudaEvent_t e : produced)
      if (e) cudaEventDestroy(e);
    if (copied_out) cudaEventDestroy(copied_out);
    if (copy_stream) cudaStreamDestroy(copy_stream);
  }

  float* bucket_data(int k) const { return flat.as<float>() + bucket_memory[static_cast<std::size_t>(k)].offset; }

  // The buckets back to back in the flat buffer, each 256-byte aligned.
  void lay_out() {
    const auto& buckets = schedule->buckets();
    bucket_memory.clear();
    bucket_memory.resize(buckets.size());
    std::size_t total = 0;
    for (std::size_t k = 0; k < buckets.size(); ++k) {
      bucket_memory[k].offset = total;
      total += (buckets[k].count + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
      if (codec) bucket_memory[k].codec_state = std::make_unique<compression::DeviceCodecState>(0x6e75 + k, rank, size);
    }
    CurrentGuard guard(device);
    flat.reserve(std::max<std::size_t>(total, 1) * sizeof(float));
  }

  // The copy stream is the bucket's producer: the allreduce starts once its copy-ins are done.
  void launch(int k) {
    const std::size_t count = schedule->buckets()[static_cast<std::size_t>(k)].count;
    BucketMemory& m = bucket_memory[static_cast<std::size_t>(k)];
    float* data = bucket_data(k);
    if (codec) {
      m.wire_bytes = codec->host().payload_bytes(count) + codec->host().scale_count(count) * sizeof(float);
      m.work = comm.allreduce_compressed_async(data, data, count, *codec, *m.codec_state, ReduceOp::kAvg, copy_stream);
    } else {
      m.wire_bytes = count * sizeof(float);
      m.work = comm.allreduce_async(data, data, count, DataType::kFloat32, ReduceOp::kAvg, copy_stream);
    }
  }
};

DeviceGradientReducer::DeviceGradientReducer(DeviceCommunicator& comm, ReducerOptions options)
    : impl_(std::make_unique<Impl>(comm, std::move(options))) {}

DeviceGradientReducer::~DeviceGradientReducer() = default;

int DeviceGradientReducer::add_parameter(std::string name, float* grad, std::size_t count) {
  Impl& m = *impl_;
  cuda::check_device_pointer(grad, count, fmt::format("rank {}: add_parameter('{}')", m.rank, name), "gradient",
                             m.device, "GradientReducer");
  const int index = m.schedule->add(std::move(name), 1, count);
  m.grads.push_back(grad);
  m.produced.push_back(nullptr);
  return index;
}

void DeviceGradientReducer::finalize() {
  Impl& m = *impl_;
  if (m.schedule->finalized()) return;
  {
    CurrentGuard guard(m.device);
    for (cudaEvent_t& e : m.produced)
      if (!e) cuda::check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate", m.rank);
  }
  m.schedule->finalize();
}

void DeviceGradientReducer::mark_ready(int index, void* stream) {
  Impl& m = *impl_;
  const reducer::Gradient& g = m.schedule->mark_ready(index);
  {
    CurrentGuard guard(m.device);
    cudaEvent_t produced = m.produced[static_cast<std::size_t>(index)];
    cuda::check(cudaEventRecord(produced, static_cast<cudaStream_t>(stream)),
                fmt::format("cudaEventRecord on the stream that produced gradient '{}' (a valid stream of device {}?)",
                            g.name, m.device),
                m.rank);
    cuda::check(cudaStreamWaitEvent(m.copy_stream, produced, 0), "cudaStreamWaitEvent", m.rank);
    if (g.count > 0)
      cuda::check(cudaMemcpyAsync(m.bucket_data(g.bucket) + g.offset, m.grads[static_cast<std::size_t>(index)],
                                  g.count * sizeof(float), cudaMemcpyDeviceToDevice, m.copy_stream),
                  fmt::format("cudaMemcpyAsync (gradient '{}' into its bucket)", g.name), m.rank);
  }
  if (m.schedule->overlaps()) m.schedule->launch_ready([&](int k) { m.launch(k); });
}

void DeviceGradientReducer::mark_ready(std::string_view name, void* stream) {
  mark_ready(impl_->schedule->index_of(name), stream);
}

StepStats DeviceGradientReducer::finish(void* stream, bool synchronize) {
  Impl& m = *impl_;
  m.schedule->begin_finish([&](int k) { m.launch(k); });
  // Last step's buckets are normally long done: waiting surfaces their errors and timeouts.
  for (DeviceWork& w : m.previous) w.wait();
  m.previous.clear();
  StepStats s;
  auto st = static_cast<cudaStream_t>(stream);
  const auto& buckets = m.schedule->buckets();
  {
    CurrentGuard guard(m.device);
    for (std::size_t k = 0; k < buckets.size(); ++k) {
      BucketMemory& b = m.bucket_memory[k];
      b.work.wait_on_stream(stream);
      for (int i : buckets[k].gradients) {
        const reducer::Gradient& g = m.schedule->gradients()[static_cast<std::size_t>(i)];
        if (g.count > 0)
          cuda::check(
              cudaMemcpyAsync(m.grads[static_cast<std::size_t>(i)], m.bucket_data(static_cast<int>(k)) + g.offset,
                              g.count * sizeof(float), cudaMemcpyDeviceToDevice, st),
              fmt::format("cudaMemcpyAsync (averaged gradient '{}' back)", g.name), m.rank);
      }
      s.bytes += b.wire_bytes;
    }
    // The next step's copy-ins (copy stream) must not overwrite a bucket before it is copied out.
    cuda::check(cudaEventRecord(m.copied_out, st), "cudaEventRecord on finish()'s stream", m.rank);
    cuda::check(cudaStreamWaitEvent(m.copy_stream, m.copied_out, 0), "cudaStreamWaitEvent", m.rank);
  }
  s.buckets = static_cast<int>(buckets.size());
  if (synchronize) {
    const auto t0 = Clock::now();
    for (BucketMemory& b : m.bucket_memory) {
      b.work.wait();
      s.comm_ms += b.work.elapsed_ms();
    }
    CurrentGuard guard(m.device);
    cudaError_t e;
    while ((e = cudaEventQuery(m.copied_out)) == cudaErrorNotReady) std::this_thread::yield();
    cuda::check(e, "copying the averaged gradients back", m.rank);
    s.exposed_comm_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    s.overlap_pct = s.comm_ms > 0 ? std::clamp(100.0 * (1.0 - s.exposed_comm_ms / s.comm_ms), 0.0, 100.0) : 100.0;
  } else {
    for (BucketMemory& b : m.bucket_memory) m.previous.push_back(b.work);
  }
  // The old buffers go only after their work: lay_out()'s reserve may free the flat buffer, and cudaFree waits for
  // the device.
  m.schedule->end_step([&] {
    for (DeviceWork& w : m.previous) w.wait();
    m.previous.clear();
  });
  return s;
}

std::size_t DeviceGradientReducer::bucket_count() const { return impl_->schedule->buckets().size(); }

std::vector<std::vector<std::string>> DeviceGradientReducer::bucket_names() const {
  return impl_->schedule->bucket_names();
}

}  // namespace hopwise::comm
