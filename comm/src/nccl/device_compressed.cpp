// The DeviceCommunicator's compressed allreduce: the recipe the host runs too (compressed/compressed_recipe.h)
// over a device backend, whose steps are enqueued on the communicator's stream: the DeviceCodec's kernels and
// NCCL allreduces and allgathers of the scales and payloads. Two device differences: every gathered payload is
// padded to 256 bytes (gather_stride()), so that each starts aligned for the decoder; and a decode that
// synchronizes its stream (top-k) is preceded by a bounded drain (before_gathered_decode()), so that a dead peer
// is a TimeoutError rather than a hang.
#include <fmt/core.h>

#include "../call_checks.h"
#include "../compressed/compressed_recipe.h"
#include "device_impl.h"
#include "hopwise/compression/device_codec.h"

namespace hopwise::comm {

using Impl = detail::DeviceCommunicatorImpl;

namespace {

class DeviceCodecBackend {
 public:
  DeviceCodecBackend(Impl& impl, const compression::DeviceCodec& codec, compression::DeviceCodecState& st,
                     const float* in, float* out, std::size_t n, const std::string& what)
      : impl_(impl), codec_(codec), c_(codec.host()), st_(st), in_(in), out_(out), n_(n), what_(what) {
    // Workspaces first: growing one drains the stream, which must not happen between the steps below.
    payload_ = static_cast<std::byte*>(impl_.grow(impl_.payload, gather_stride(), what_));
    if (!aggregatable())
      gathered_ = static_cast<std::byte*>(
          impl_.grow(impl_.gathered, gather_stride() * static_cast<std::size_t>(impl_.size), what_));
    if (scale_count() > 0)
      scales_ = static_cast<float*>(impl_.grow(impl_.scales, scale_count() * sizeof(float), what_));
  }
  std::size_t scale_count() const { return c_.scale_count(n_); }
  std::size_t payload_bytes() const { return c_.payload_bytes(n_); }
  std::size_t gather_stride() const { return (payload_bytes() + 255) / 256 * 256; }
  bool aggregatable() const { return c_.pattern() != compression::Pattern::kGather; }
  float* scales() { return scales_; }
  std::byte* payload() { return payload_; }
  std::byte* gathered() { return gathered_; }
  void local_scales(float* s) { codec_.local_scales(in_, n_, s, st_, impl_.stream); }
  void allreduce_max(float* s, std::size_t k) {
    impl_.settle(ncclAllReduce(s, s, k, ncclFloat32, ncclMax, impl_.comm, impl_.stream),
                 what_ + " (agreeing on scales)");
  }
  void encode(std::byte* p, const float* s) { codec_.encode(in_, n_, p, st_, s, impl_.stream); }
  // Payloads add up element-wise in the payload dtype (uint8 wraps: int8 codes sum as two's complement).
  void allreduce_payload(std::byte* p) {
    impl_.settle(
        ncclAllReduce(p, p, c_.payload_count(n_), nccl_dtype(c_.payload_dtype()), ncclSum, impl_.comm, impl_.stream),
        what_);
  }
  void allgather_payloads(const std::byte* mine, std::byte* all) {
    impl_.settle(ncclAllGather(mine, all, gather_stride(), ncclUint8, impl_.comm, impl_.stream), what_);
  }
  void before_gathered_decode() {
    if (codec_.decode_synchronizes()) impl_.drain(what_);
  }
  void decode(const std::byte* p, const float* s) { codec_.decode(p, n_, out_, st_, s, impl_.stream); }
  void decode_add(const std::byte* p, const float* s) { codec_.decode_add(p, n_, out_, st_, s, impl_.stream); }
  void divide_by_ranks() { impl_.scale_down(DataType::kFloat32, out_, n_); }
  void add_wire_bytes(std::size_t b) { impl_.stats.wire_bytes += b; }

 private:
  Impl& impl_;
  const compression::DeviceCodec& codec_;
  const compression::Codec& c_;
  compression::DeviceCodecState& st_;
  const float* in_;
  float* out_;
  std::size_t n_;
  const std::string& what_;
  std::byte* payload_ = nullptr;
  std::byte* gathered_ = nullptr;
  float* scales_ = nullptr;
};

}  // namespace

void Impl::compressed(const float* in, float* out, std::size_t n, const compression::DeviceCodec& codec,
                      compression::DeviceCodecState& st, ReduceOp op, const std::string& what) {
  if (n == 0) return;
  DeviceCodecBackend b(*this, codec, st, in, out, n, what);
  compressed::allreduce(b, n, op, size);
}

DeviceWork DeviceCommunicator::allreduce_compressed_async(const float* in, float* out, std::size_t count,
                                                          const compression::DeviceCodec& codec,
                                                          compression::DeviceCodecState& state, ReduceOp op,
                                                          void* stream) {
  Impl& m = *impl_;
  checks::sum_or_avg("allreduce_compressed", op, "codecs sum");
  const std::size_t bytes = checked_bytes(count, DataType::kFloat32, "allreduce_compressed");
  m.check_ptr(in, count, "allreduce_compressed", "input buffer");
  m.check_ptr(out, count, "allreduce_compressed", "output buffer");
  return m.run(fmt::format("compressed allreduce of {} float32 (codec {})", count, codec.name()), stream, bytes,
               [&](const std::string& what) { m.compressed(in, out, count, codec, state, op, what); });
}

void DeviceCommunicator::allreduce_compressed(const float* in, float* out, std::size_t count,
                                              const compression::DeviceCodec& codec,
                                              compression::DeviceCodecState& state, ReduceOp op, void* stream) {
  allreduce_compressed_async(in, out, count, codec, state, op, stream).wait();
}

}  // namespace hopwise::comm
