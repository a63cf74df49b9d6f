// The codecs of codec.h on device memory (CUDA): the same spec strings, payload formats and state rules, so that a
// payload made on a GPU decodes on a CPU and the other way round. Every call is asynchronous on `stream`
// (cudaStream_t as void*, nullptr = the legacy default stream) except where said.
//
// Agreement with the CPU codecs (tests/test_cuda_codecs.cpp checks each on random data of awkward sizes):
//   none, fp16, bf16, sign (bits), int8, int4, fp8, topk, randomk: payloads equal byte for byte (NaN inputs aside:
//   the GPU's half conversions may give another NaN bit pattern);
//   qsgd and sign's header (an L2 norm / mean |x| summed in double in another order): equal within 1e-6
//   relative, and qsgd's levels then differ by at most one at a few elements;
//   int8 and int4 stochastic, qsgd and terngrad draw from the same counter-based streams (seed, rank, step, index) as
//   the CPU codecs, so their payloads are equal wherever the scale agrees.
// Error feedback (ef=1) keeps the residual in device memory in the DeviceCodecState.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "hopwise/common/device_buffer.h"
#include "hopwise/compression/codec.h"

namespace hopwise::compression {

// Per-tensor state of a device codec; keep one per (tensor, codec) across steps, as CodecState.
struct DeviceCodecState {
  DeviceCodecState() = default;
  DeviceCodecState(std::uint64_t seed, int rank, int world_size) : host(seed, rank, world_size) {}
  CodecState host;             // seed, rank, world size and step, as on the CPU (its vectors stay empty)
  DeviceBuffer residual;       // ef=1: n floats, zeroed at the first encode
  std::size_t residual_n = 0;  // elements of the residual (0 until the first ef=1 encode)
  DeviceBuffer scratch;        // working memory of the kernels (grown once, kept)
};

class DeviceCodec {
 public:
  // Any spec make_codec takes ("topk:ratio=0.001", "int8:round=stochastic,ef=1", ...), with the same errors.
  explicit DeviceCodec(std::string_view spec);
  ~DeviceCodec();
  DeviceCodec(DeviceCodec&&) noexcept;
  DeviceCodec& operator=(DeviceCodec&&) noexcept;

  // The CPU codec of the same spec: name(), pattern(), payload_dtype(), payload_count/bytes(), scale_count().
  const Codec& host() const { return *host_; }
  std::string name() const { return host_->name(); }

  // Device pointers throughout. `scales` (scale_count(n) floats) as in Codec.
  void local_scales(const float* grad, std::size_t n, float* scales, DeviceCodecState& state, void* stream) const;
  void encode(const float* grad, std::size_t n, std::byte* payload, DeviceCodecState& state, const float* scales,
              void* stream) const;
  void decode(const std::byte* payload, std::size_t n, float* out, DeviceCodecState& state, const float* scales,
              void* stream) const;
  void decode_add(const std::byte* payload, std::size_t n, float* out, DeviceCodecState& state, const float* scales,
                  void* stream) const;
  // Whether decode() and decode_add() synchronize `stream` (top-k does, to report out-of-range indices as the CPU
  // codec does); a caller with a timeout waits for the stream first.
  bool decode_synchronizes() const;
  // The error-feedback residual copied to the host (synchronizes `stream`); empty with ef=0 or before any encode.
  std::vector<float> residual(const DeviceCodecState& state, void* stream) const;

  struct Impl;

 private:
  std::unique_ptr<Codec> host_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hopwise::compression
