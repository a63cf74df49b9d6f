// DeviceCodec: argument checks, the step counter, error feedback and the dispatch to codec_kernels.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "codec_kernels.h"
#include "codec_registry.h"
#include "hopwise/common/cuda_check.h"
#include "hopwise/common/error.h"
#include "hopwise/compression/device_codec.h"
#include "hopwise/compression/spec.h"

namespace hopwise::compression {

namespace k = cuda::kernels;
using cuda::kernels::Out;

namespace {

// The kernels of a codec: its registry row's (codec_registry.h), with the row's stream salt, so that the device
// codecs draw the same numbers as the CPU codecs.
using Kind = detail::DeviceKernel;

// Scratch layout in DeviceCodecState::scratch: header partial sums, topk's bad-index count, topk's workspace.
constexpr std::size_t kPartialsBytes = k::kReducePartials * sizeof(double);
constexpr std::size_t kBadOffset = kPartialsBytes;
constexpr std::size_t kTopkOffset = kPartialsBytes + 16;

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

}  // namespace

struct DeviceCodec::Impl {
  Kind kind = Kind::kHostOnly;
  std::uint64_t salt = 0;
  bool decode_synchronizes = false;
  bool ef = false;
  std::size_t block = 256;
  bool stochastic = false;
  int levels = 16;
};

DeviceCodec::DeviceCodec(std::string_view spec) : host_(make_codec(spec)), impl_(std::make_unique<Impl>()) {
  // The CPU factory has checked every parameter; read them back from its canonical spec through the same row.
  const CodecSpec c = parse_codec_spec(host_->name());
  const detail::CodecRow* row = detail::find_codec_row(c.name);
  if (row == nullptr || row->device.kernel == Kind::kHostOnly)
    throw InvalidArgument("DeviceCodec: codec '" + c.name + "' has no CUDA kernels");
  const detail::ParamValues v = detail::check_params(*row, c);
  Impl& m = *impl_;
  m.kind = row->device.kernel;
  m.salt = row->device.stream_salt;
  m.decode_synchronizes = row->device.decode_synchronizes;
  m.ef = v.has("ef") && v.flag("ef");
  if (v.has("block")) m.block = static_cast<std::size_t>(v.integer("block"));
  if (v.has("round")) m.stochastic = v.choice("round") == "stochastic";
  if (v.has("levels")) m.levels = static_cast<int>(v.integer("levels"));
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

detail::Stream state_stream(const DeviceCodecState& st, std::uint64_t salt) {
  return detail::rank_stream(st.host.seed, st.host.rank, st.host.step - 1, salt);
}

std::byte* scratch(DeviceCodecState& st, std::size_t n) {
  st.scratch.reserve(kTopkOffset + k::topk_workspace_bytes(n));
  return st.scratch.as<std::byte>();
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
  k::block_max_abs(grad, residual, n, impl_->block, scales, as_stream(stream));
}

// payload = encode(x); the step counter has been advanced.
static void encode_inner(const Codec& c, const DeviceCodec::Impl& m, const float* x, std::size_t n, std::byte* p,
                         DeviceCodecState& st, const float* scales, cudaStream_t s) {
  switch (m.kind) {
    case Kind::kHostOnly: break;  // rejected by the constructor
    case Kind::kCopy:
      if (n) k::check(cudaMemcpyAsync(p, x, n * sizeof(float), cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
      return;
    case Kind::kFp16: return k::half_encode(false, x, n, reinterpret_cast<std::uint16_t*>(p), s);
    case Kind::kBf16: return k::half_encode(true, x, n, reinterpret_cast<std::uint16_t*>(p), s);
    case Kind::kInt8:
      return k::int8_encode(x, n, m.block, scales, detail::int8_levels(c.name(), st.host.world_size), m.stochastic,
                            state_stream(st, m.salt), reinterpret_cast<std::int8_t*>(p), s);
    case Kind::kQsgd:
      k::write_header(k::HeaderStat::kL2Norm, x, n, p, reinterpret_cast<double*>(scratch(st, n)), s);
      return k::qsgd_encode(x, n, p, m.levels, state_stream(st, m.salt), s);
    case Kind::kTernGrad:
      k::write_header(k::HeaderStat::kMaxAbs, x, n, p, reinterpret_cast<double*>(scratch(st, n)), s);
      return k::terngrad_encode(x, n, p, state_stream(st, m.salt), s);
    case Kind::kSign:
      k::write_header(k::HeaderStat::kMeanAbs, x, n, p, reinterpret_cast<double*>(scratch(st, n)), s);
      return k::sign_encode(x, n, p, s);
    case Kind::kTopK: {
      if (n > 0xffffffffull)
        throw InvalidArgument("codec '" + c.name() + "': " + std::to_string(n) +
                              " elements do not fit its uint32 indices; split the tensor below 2^32 elements");
      const std::size_t kept = c.payload_count(n) / 8;
      return k::topk_encode(x, n, kept, p, scratch(st, n) + kTopkOffset, s);
    }
    case Kind::kRandomK:
      return k::randomk_encode(x, n, c.payload_count(n), detail::randomk_key(st.host.seed, st.host.step - 1),
                               reinterpret_cast<float*>(p), s);
  }
}

// out (mode) decode(payload). `check_indices`: topk counts out-of-range indices and throws (a host round trip).
static void decode_inner(const Codec& c, const DeviceCodec::Impl& m, const std::byte* p, std::size_t n, float* out,
                         Out mode, DeviceCodecState& st, const float* scales, cudaStream_t s, bool check_indices) {
  switch (m.kind) {
    case Kind::kHostOnly: break;  // rejected by the constructor
    case Kind::kCopy: return k::floats_into(reinterpret_cast<const float*>(p), n, out, mode, s);
    case Kind::kFp16: return k::half_decode(false, reinterpret_cast<const std::uint16_t*>(p), n, out, mode, s);
    case Kind::kBf16: return k::half_decode(true, reinterpret_cast<const std::uint16_t*>(p), n, out, mode, s);
    case Kind::kInt8:
      return k::int8_decode(reinterpret_cast<const std::int8_t*>(p), n, m.block, scales,
                            detail::int8_levels(c.name(), st.host.world_size), out, mode, s);
    case Kind::kQsgd: return k::qsgd_decode(p, n, m.levels, out, mode, s);
    case Kind::kTernGrad: return k::terngrad_decode(p, n, out, mode, s);
    case Kind::kSign: return k::sign_decode(p, n, out, mode, s);
    case Kind::kTopK: {
      auto* bad = reinterpret_cast<int*>(scratch(st, n) + kBadOffset);
      k::check(cudaMemsetAsync(bad, 0, sizeof(int), s), "cudaMemsetAsync");
      k::topk_decode(p, n, c.payload_count(n) / 8, out, mode, bad, s);
      if (!check_indices) return;
      int count = 0;
      k::check(cudaMemcpyAsync(&count, bad, sizeof count, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
      k::check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
      if (count > 0)
        throw InvalidArgument("codec '" + c.name() + "': " + std::to_string(count) +
                              " payload indices are out of range for " + std::to_string(n) +
                              " elements (corrupt payload or a different n than at encode)");
      return;
    }
    case Kind::kRandomK:
      if (st.host.step == 0)
        throw InvalidArgument("codec '" + c.name() +
                              "': decode before any encode on this state; the indices come from the step of the "
                              "latest encode");
      return k::randomk_decode(reinterpret_cast<const float*>(p), n, c.payload_count(n),
                               detail::randomk_key(st.host.seed, st.host.step - 1), out, mode, s);
  }
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
    encode_inner(*host_, *impl_, x, n, payload, state, scales, s);
    if (impl_->ef)
      decode_inner(*host_, *impl_, payload, n, state.residual.as<float>(), Out::kSubtract, state, scales, s, false);
  } catch (...) {
    --state.host.step;  // a rejected call is not a step
    throw;
  }
}

bool DeviceCodec::decode_synchronizes() const { return impl_->decode_synchronizes; }

void DeviceCodec::decode(const std::byte* payload, std::size_t n, float* out, DeviceCodecState& state,
                         const float* scales, void* stream) const {
  check_args(*host_, n, out, payload, scales, "decode");
  decode_inner(*host_, *impl_, payload, n, out, Out::kAssign, state, scales, as_stream(stream), true);
}

void DeviceCodec::decode_add(const std::byte* payload, std::size_t n, float* out, DeviceCodecState& state,
                             const float* scales, void* stream) const {
  check_args(*host_, n, out, payload, scales, "decode_add");
  decode_inner(*host_, *impl_, payload, n, out, Out::kAdd, state, scales, as_stream(stream), true);
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
