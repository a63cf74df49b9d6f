// DeviceCodec: what every codec shares on the GPU (argument checks, the step counter, error feedback) around its
// device row (device_rows.cu: its parameters, encode and decode).
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "codec_kernels.h"
#include "device_rows.h"
#include "hopwise/common/cuda_check.h"
#include "hopwise/common/error.h"
#include "hopwise/compression/codec_table.h"
#include "hopwise/compression/device_codec.h"
#include "hopwise/compression/spec.h"

namespace hopwise::compression {

namespace k = cuda::kernels;
using cuda::kernels::Out;

namespace {

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

}  // namespace

struct DeviceCodec::Impl {
  const device::Row* row = nullptr;
  device::Params params;
  std::uint64_t salt = 0;
  bool decode_synchronizes = false;
  bool ef = false;
};

DeviceCodec::DeviceCodec(std::string_view spec) : host_(make_codec(spec)), impl_(std::make_unique<Impl>()) {
  // The CPU factory has checked every parameter; read them back from its canonical spec through the same row.
  const CodecSpec c = parse_codec_spec(host_->name());
  const detail::CodecRow* row = detail::find_codec_row(c.name);
  const device::Row* on_device = device::find_row(c.name);
  if (row == nullptr || on_device == nullptr)
    throw InvalidArgument("DeviceCodec: codec '" + c.name + "' has no CUDA kernels");
  const detail::ParamValues v = detail::check_params(*row, c);
  Impl& m = *impl_;
  m.row = on_device;
  m.salt = row->device.stream_salt;
  m.decode_synchronizes = row->device.decode_synchronizes;
  m.ef = v.has("ef") && v.flag("ef");
  on_device->configure(v, m.params);
}

DeviceCodec::~DeviceCodec() = default;
DeviceCodec::DeviceCodec(DeviceCodec&&) noexcept = default;
DeviceCodec& DeviceCodec::operator=(DeviceCodec&&) noexcept = default;

namespace {

// Null buffers only where no bytes are needed; device memory; payloads aligned for their element type.
void check_args(const Codec& c, std::size_t n, const void* floats, const void* payload, const float* scales,
                const char* call, bool needs_payload = true) {
  const std::string where = std::string(call) + " of device codec '" + c.name() + "'";
  if (floats == nullptr && n > 0)
    throw InvalidArgument(where + ": null float buffer for " + std::to_string(n) + " elements");
  if (needs_payload && payload == nullptr && c.payload_bytes(n) > 0)
    throw InvalidArgument(where + ": null payload; it needs payload_bytes(" + std::to_string(n) +
                          ") = " + std::to_string(c.payload_bytes(n)) + " bytes");
  if (scales == nullptr && c.scale_count(n) > 0)
    throw InvalidArgument(where + " needs the " + std::to_string(c.scale_count(n)) +
                          " agreed scales (local_scales() max-allreduced over ranks); got none");
  const std::size_t align = c.payload_alignment();  // topk: 4-byte words in a byte payload
  if (payload != nullptr && reinterpret_cast<std::uintptr_t>(payload) % align != 0)
    throw InvalidArgument(where + ": the payload must be aligned to " + std::to_string(align) +
                          " bytes; place payloads at multiples of payload_bytes()");
  for (const void* f : {floats, static_cast<const void*>(scales)})
    if (f != nullptr && reinterpret_cast<std::uintptr_t>(f) % alignof(float) != 0)
      throw InvalidArgument(where + ": float buffers must be aligned to 4 bytes");
  // Device memory of any device (the kernels run on the current one).
  hopwise::cuda::check_device_pointer(floats, n, where, "the float buffer", -1, "Codec");
  hopwise::cuda::check_device_pointer(payload, needs_payload ? c.payload_bytes(n) : 0, where, "the payload", -1,
                                      "Codec");
  hopwise::cuda::check_device_pointer(scales, c.scale_count(n), where, "the scales", -1, "Codec");
}

}  // namespace

void DeviceCodec::local_scales(const float* grad, std::size_t n, float* scales, DeviceCodecState& state,
                               void* stream) const {
  if (host_->scale_count(n) == 0) return;
  check_args(*host_, n, grad, nullptr, scales, "local_scales", /*needs_payload=*/false);
  const float* residual = impl_->ef && state.residual_n > 0 ? state.residual.as<float>() : nullptr;
  if (residual && state.residual_n != n)
    throw InvalidArgument("codec '" + name() + "': the state holds an error-feedback residual of " +
                          std::to_string(state.residual_n) + " elements but this tensor has " + std::to_string(n) +
                          "; keep one DeviceCodecState per tensor");
  k::block_max_abs(grad, residual, n, impl_->params.block, scales, as_stream(stream));
}

// The row's call for this codec, state, scales and stream.
static device::Call call_of(const Codec& c, const DeviceCodec::Impl& m, std::size_t n, DeviceCodecState& st,
                            const float* scales, cudaStream_t s) {
  return {c, m.params, m.salt, st, scales, s, n};
}

void DeviceCodec::encode(const float* grad, std::size_t n, std::byte* payload, DeviceCodecState& state,
                         const float* scales, void* stream) const {
  check_args(*host_, n, grad, payload, scales, "encode");
  const cudaStream_t s = as_stream(stream);
  ++state.host.step;  // the kernels read this step's index as step - 1, as the CPU codecs do
  try {
    const float* x = grad;
    if (impl_->ef) {
      if (state.residual_n == 0) {
        state.residual.reserve(n * sizeof(float));
        if (n) k::check(cudaMemsetAsync(state.residual.data(), 0, n * sizeof(float), s), "cudaMemsetAsync");
        state.residual_n = n;
      } else if (state.residual_n != n) {
        throw InvalidArgument("codec '" + name() + "': the state holds an error-feedback residual of " +
                              std::to_string(state.residual_n) + " elements but this tensor has " + std::to_string(n) +
                              "; keep one DeviceCodecState per tensor");
      }
      // residual += grad; payload = encode(residual); residual -= decode(payload)
      float* r = state.residual.as<float>();
      k::add_into(r, grad, n, s);
      x = r;
    }
    const device::Call c = call_of(*host_, *impl_, n, state, scales, s);
    impl_->row->encode(c, x, payload);
    if (impl_->ef) impl_->row->decode(c, payload, state.residual.as<float>(), Out::kSubtract, false);
  } catch (...) {
    --state.host.step;  // a rejected call is not a step
    throw;
  }
}

bool DeviceCodec::decode_synchronizes() const { return impl_->decode_synchronizes; }

void DeviceCodec::decode(const std::byte* payload, std::size_t n, float* out, DeviceCodecState& state,
                         const float* scales, void* stream) const {
  check_args(*host_, n, out, payload, scales, "decode");
  impl_->row->decode(call_of(*host_, *impl_, n, state, scales, as_stream(stream)), payload, out, Out::kAssign, true);
}

void DeviceCodec::decode_add(const std::byte* payload, std::size_t n, float* out, DeviceCodecState& state,
                             const float* scales, void* stream) const {
  check_args(*host_, n, out, payload, scales, "decode_add");
  impl_->row->decode(call_of(*host_, *impl_, n, state, scales, as_stream(stream)), payload, out, Out::kAdd, true);
}

std::vector<float> DeviceCodec::residual(const DeviceCodecState& state, void* stream) const {
  std::vector<float> r(state.residual_n);
  if (r.empty()) return r;
  const cudaStream_t s = as_stream(stream);
  k::check(cudaMemcpyAsync(r.data(), state.residual.data(), r.size() * sizeof(float), cudaMemcpyDeviceToHost, s),
           "cudaMemcpyAsync");
  k::check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  return r;
}

}  // namespace hopwise::compression
