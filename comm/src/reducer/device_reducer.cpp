// The DeviceGradientReducer (device_reducer.h): buckets planned by bucket_plan.h (as the host reducer's) and laid
// out back to back in one device buffer; gradients copied in on a copy stream after their producers, each bucket
// averaged on the DeviceCommunicator's stream once complete, and copied back on finish()'s stream. Fingerprints
// and the observed order travel through the communicator's store. Built into hopwise_comm_nccl.
#include "hopwise/comm/device_reducer.h"

#include <cuda_runtime.h>
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <unordered_map>

#include "bucket_plan.h"
#include "hopwise/common/cuda_check.h"
#include "hopwise/common/device_buffer.h"
#include "hopwise/common/error.h"
#include "hopwise/compression/device_codec.h"
#include "hopwise/compression/spec.h"

namespace hopwise::comm {

using cuda::CurrentGuard;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::size_t kAlignFloats = 64;  // buckets start 256-byte aligned inside the flat buffer

struct Param {
  std::string name;
  float* grad = nullptr;
  std::size_t count = 0;
  int bucket = -1;
  std::size_t offset = 0;  // elements from the start of its bucket
  bool ready = false;
  cudaEvent_t produced = nullptr;  // recorded on the producer's stream by mark_ready
};

struct Bucket {
  std::vector<int> params;  // in the order they sit in the bucket
  std::size_t count = 0;
  std::size_t offset = 0;  // elements from the start of the flat buffer
  int pending = 0;
  bool launched = false;
  std::size_t wire_bytes = 0;
  DeviceWork work;
  std::unique_ptr<compression::DeviceCodecState> codec_state;  // per bucket: residual and step
};

}  // namespace

struct DeviceGradientReducer::Impl {
  DeviceCommunicator& comm;
  ReducerOptions options;
  int rank = 0, size = 1, device = 0;
  std::vector<Param> params;
  std::unordered_map<std::string, int> by_name;
  std::vector<Bucket> buckets;
  DeviceBuffer flat;                   // every bucket, back to back
  cudaStream_t copy_stream = nullptr;  // copies gradients into buckets, after their producers
  cudaEvent_t copied_out = nullptr;    // finish()'s copy-out done: the next copy-in may overwrite the buckets
  int next_launch = 0;
  bool finalized = false;
  int steps = 0;                                    // finish() calls that completed
  std::vector<int> ready_order;                     // this step's mark_ready order (for the rebuild after step 1)
  std::unique_ptr<compression::DeviceCodec> codec;  // null: plain average
  std::vector<DeviceWork> previous;                 // last step's buckets, host-waited at the next finish

  Impl(DeviceCommunicator& c, ReducerOptions o)
      : comm(c), options(std::move(o)), rank(c.rank()), size(c.size()), device(c.device()) {
    if (!(options.bucket_mb > 0) || !(options.first_bucket_mb > 0))
      throw InvalidArgument(
          "DeviceGradientReducer: bucket_mb and first_bucket_mb must be positive (HOPWISE_BUCKET_MB)");
    const auto spec = compression::parse_codec_spec(options.compression);
    if (spec.name == "powersgd")
      throw InvalidArgument(
          "DeviceGradientReducer: PowerSGD is not available on device gradients; use a codec "
          "(HOPWISE_COMPRESSION=fp16, int8, topk:ratio=..., ...) or none");
    if (spec.name != "none") codec = std::make_unique<compression::DeviceCodec>(options.compression);
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
    for (Bucket& b : buckets)
      if (b.launched && b.work.valid()) try {
          b.work.wait();
        } catch (...) {
        }
    if (copy_stream) cudaStreamSynchronize(copy_stream);
    for (Param& p : params)
      if (p.produced) cudaEventDestroy(p.produced);
    if (copied_out) cudaEventDestroy(copied_out);
    if (copy_stream) cudaStreamDestroy(copy_stream);
  }

  float* bucket_data(const Bucket& b) const { return flat.as<float>() + b.offset; }

  std::vector<bucket_plan::Gradient> gradients() const {
    std::vector<bucket_plan::Gradient> g;
    for (const Param& p : params) g.push_back({p.name, p.count, 1});
    return g;
  }

  // Buckets in `order` (bucket_plan::assign), back to back in the flat buffer, each 256-byte aligned.
  void assign(const std::vector<int>& order) {
    buckets.clear();
    for (bucket_plan::Planned& planned : bucket_plan::assign(gradients(), order, options)) {
      Bucket& b = buckets.emplace_back();
      b.params = std::move(planned.members);
      b.count = planned.count;
      std::size_t at = 0;
      for (int i : b.params) {
        Param& p = params[static_cast<std::size_t>(i)];
        p.bucket = static_cast<int>(buckets.size()) - 1;
        p.offset = at;
        at += p.count;
      }
    }
    std::size_t total = 0;
    for (std::size_t k = 0; k < buckets.size(); ++k) {
      Bucket& b = buckets[k];
      b.offset = total;
      total += (b.count + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
      if (codec) b.codec_state = std::make_unique<compression::DeviceCodecState>(0x6e75 + k, rank, size);
    }
    CurrentGuard guard(device);
    flat.reserve(std::max<std::size_t>(total, 1) * sizeof(float));
  }

  // The layout's fingerprint, gathered through the communicator's store and compared with rank 0's.
  void check_layout() {
    std::vector<bucket_plan::Planned> planned;
    for (const Bucket& b : buckets) planned.push_back({b.params, b.count});
    const std::uint64_t mine = bucket_plan::fingerprint(gradients(), options.compression, planned);
    const std::vector<std::string> got =
        comm.host_allgather("reducer_layout", std::string(reinterpret_cast<const char*>(&mine), sizeof(mine)));
    std::vector<std::uint64_t> all(got.size(), 0);
    for (std::size_t r = 0; r < got.size(); ++r)
      if (got[r].size() == sizeof(std::uint64_t)) std::memcpy(&all[r], got[r].data(), sizeof(std::uint64_t));
    bucket_plan::check_same_layout(all, rank, "device gradient");
  }

  void launch_ready() {
    while (next_launch < static_cast<int>(buckets.size()) &&
           buckets[static_cast<std::size_t>(next_launch)].pending == 0) {
      Bucket& b = buckets[static_cast<std::size_t>(next_launch)];
      float* data = bucket_data(b);
      // The copy stream is the bucket's producer: the allreduce starts once its copy-ins are done.
      if (codec) {
        b.wire_bytes = codec->host().payload_bytes(b.count) + codec->host().scale_count(b.count) * sizeof(float);
        b.work =
            comm.allreduce_compressed_async(data, data, b.count, *codec, *b.codec_state, ReduceOp::kAvg, copy_stream);
      } else {
        b.wire_bytes = b.count * sizeof(float);
        b.work = comm.allreduce_async(data, data, b.count, DataType::kFloat32, ReduceOp::kAvg, copy_stream);
      }
      b.launched = true;
      ++next_launch;
    }
  }

  void start_step() {
    for (Bucket& b : buckets) {
      b.pending = static_cast<int>(b.params.size());
      b.launched = false;
      b.work = DeviceWork();
    }
    for (Param& p : params) p.ready = false;
    ready_order.clear();
    next_launch = 0;
  }
};

DeviceGradientReducer::DeviceGradientReducer(DeviceCommunicator& comm, ReducerOptions options)
    : impl_(std::make_unique<Impl>(comm, std::move(options))) {}

DeviceGradientReducer::~DeviceGradientReducer() = default;

int DeviceGradientReducer::add_parameter(std::string name, float* grad, std::size_t count) {
  Impl& m = *impl_;
  if (m.finalized)
    throw InvalidArgument(
        fmt::format("rank {}: add_parameter('{}') after finalize(); register every parameter first", m.rank, name));
  if (m.by_name.count(name) != 0)
    throw InvalidArgument(
        fmt::format("rank {}: add_parameter('{}'): a parameter of that name is already registered; "
                    "names must be unique",
                    m.rank, name));
  cuda::check_device_pointer(grad, count, fmt::format("rank {}: add_parameter('{}')", m.rank, name), "gradient",
                             m.device, "GradientReducer");
  Param p;
  p.name = name;
  p.grad = grad;
  p.count = count;
  m.params.push_back(std::move(p));
  const int index = static_cast<int>(m.params.size()) - 1;
  m.by_name.emplace(std::move(name), index);
  return index;
}

void DeviceGradientReducer::finalize() {
  Impl& m = *impl_;
  if (m.finalized) return;
  {
    CurrentGuard guard(m.device);
    for (Param& p : m.params)
      if (!p.produced)
        cuda::check(cudaEventCreateWithFlags(&p.produced, cudaEventDisableTiming), "cudaEventCreate", m.rank);
  }
  m.assign(bucket_plan::reverse_order(m.params.size()));
  m.check_layout();
  m.finalized = true;
  m.start_step();
}

void DeviceGradientReducer::mark_ready(int index, void* stream) {
  Impl& m = *impl_;
  if (!m.finalized) throw InvalidArgument("mark_ready() before finalize(); call finalize() once after add_parameter()");
  if (index < 0 || index >= static_cast<int>(m.params.size()))
    throw InvalidArgument(fmt::format("rank {}: mark_ready({}): no such parameter; indices run 0..{}", m.rank, index,
                                      static_cast<long long>(m.params.size()) - 1));
  Param& p = m.params[static_cast<std::size_t>(index)];
  if (p.ready)
    throw InvalidArgument(
        fmt::format("rank {}: gradient '{}' was marked ready twice in one step; mark each "
                    "parameter once per step, then call finish()",
                    m.rank, p.name));
  Bucket& b = m.buckets[static_cast<std::size_t>(p.bucket)];
  {
    CurrentGuard guard(m.device);
    cuda::check(cudaEventRecord(p.produced, static_cast<cudaStream_t>(stream)),
                fmt::format("cudaEventRecord on the stream that produced gradient '{}' (a valid stream of device {}?)",
                            p.name, m.device),
                m.rank);
    cuda::check(cudaStreamWaitEvent(m.copy_stream, p.produced, 0), "cudaStreamWaitEvent", m.rank);
    if (p.count > 0)
      cuda::check(cudaMemcpyAsync(m.bucket_data(b) + p.offset, p.grad, p.count * sizeof(float),
                                  cudaMemcpyDeviceToDevice, m.copy_stream),
                  fmt::format("cudaMemcpyAsync (gradient '{}' into its bucket)", p.name), m.rank);
  }
  p.ready = true;
  m.ready_order.push_back(index);
  --b.pending;
  if (m.options.overlap) m.launch_ready();
}

void DeviceGradientReducer::mark_ready(std::string_view name, void* stream) {
  Impl& m = *impl_;
  const auto it = m.by_name.find(std::string(name));
  if (it == m.by_name.end())
    throw InvalidArgument(
        fmt::format("rank {}: mark_ready('{}'): no parameter of that name was registered", m.rank, name));
  mark_ready(it->second, stream);
}

StepStats DeviceGradientReducer::finish(void* stream, bool synchronize) {
  Impl& m = *impl_;
  if (!m.finalized) throw InvalidArgument("finish() before finalize()");
  std::vector<std::string> missing;
  for (const Param& p : m.params)
    if (!p.ready) missing.push_back(p.name);
  if (!missing.empty())
    throw InvalidArgument(
        fmt::format("rank {}: finish(): gradient(s) {} were never marked ready this step; call "
                    "mark_ready() for every registered parameter in backward (or register only "
                    "the parameters that get gradients)",
                    m.rank, fmt::join(missing, ", ")));
  // Last step's buckets are normally long done: waiting surfaces their errors and timeouts.
  for (DeviceWork& w : m.previous) w.wait();
  m.previous.clear();
  m.launch_ready();
  StepStats s;
  auto st = static_cast<cudaStream_t>(stream);
  {
    CurrentGuard guard(m.device);
    for (Bucket& b : m.buckets) {
      b.work.wait_on_stream(stream);
      for (int i : b.params) {
        const Param& p = m.params[static_cast<std::size_t>(i)];
        if (p.count > 0)
          cuda::check(cudaMemcpyAsync(p.grad, m.bucket_data(b) + p.offset, p.count * sizeof(float),
                                      cudaMemcpyDeviceToDevice, st),
                      fmt::format("cudaMemcpyAsync (averaged gradient '{}' back)", p.name), m.rank);
      }
      s.bytes += b.wire_bytes;
    }
    // The next step's copy-ins (copy stream) must not overwrite a bucket before it is copied out.
    cuda::check(cudaEventRecord(m.copied_out, st), "cudaEventRecord on finish()'s stream", m.rank);
    cuda::check(cudaStreamWaitEvent(m.copy_stream, m.copied_out, 0), "cudaStreamWaitEvent", m.rank);
  }
  s.buckets = static_cast<int>(m.buckets.size());
  if (synchronize) {
    const auto t0 = Clock::now();
    for (Bucket& b : m.buckets) {
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
    for (Bucket& b : m.buckets) m.previous.push_back(b.work);
  }
  // After the first step, rebuild the buckets from the order gradients really arrived in (rank 0's, so that every
  // rank builds the same buckets). The old buffers go only after their work: assign()'s reserve may free the flat
  // buffer, and cudaFree waits for the device.
  if (++m.steps == 1 && m.options.rebuild) {
    std::vector<std::int32_t> order(m.ready_order.begin(), m.ready_order.end());
    const std::string got = m.comm.host_broadcast(
        "reducer_order", std::string(reinterpret_cast<const char*>(order.data()), order.size() * sizeof(std::int32_t)),
        0);
    if (got.size() != order.size() * sizeof(std::int32_t))
      throw InvalidArgument(
          fmt::format("rank {}: rank 0 observed {} gradients ready but this rank registered {}; "
                      "every rank must register the same parameters",
                      m.rank, got.size() / sizeof(std::int32_t), order.size()));
    if (!order.empty()) std::memcpy(order.data(), got.data(), got.size());
    const std::vector<int> observed(order.begin(), order.end());
    if (const auto rebuilt = bucket_plan::rebuild_order(observed, m.params.size())) {
      for (DeviceWork& w : m.previous) w.wait();
      m.previous.clear();
      m.assign(*rebuilt);
    }
  }
  m.start_step();
  return s;
}

std::size_t DeviceGradientReducer::bucket_count() const { return impl_->buckets.size(); }

std::vector<std::vector<std::string>> DeviceGradientReducer::bucket_names() const {
  return bucket_plan::names_of(impl_->buckets, impl_->params);
}

}  // namespace hopwise::comm
