// The device side of the codec table: one row per codec that has CUDA kernels, found by the codec's spec name, as
// the host row (codec_registry.h) is. A row reads its own parameters (configure) and encodes and decodes with its
// kernels (codec_kernels.h); DeviceCodec (device_codec.cu) does what every codec shares around them: argument
// checks, the step counter and error feedback. A codec's CUDA kernels are its kernels and one row in device_rows.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "codec_kernels.h"
#include "hopwise/compression/codec_table.h"
#include "hopwise/compression/device_codec.h"

namespace hopwise::compression::device {

// What a row read from its parameters when the codec was made.
struct Params {
  std::size_t block = 256;  // int8, int4, fp8: elements per scale
  bool stochastic = false;  // int8, int4: round=stochastic
  int levels = 16;          // qsgd
};

// One call's context: the codec (its host twin: name, payload sizes), the parameters, the tensor's state, the
// agreed scales where the codec has them, the stream.
struct Call {
  const Codec& codec;
  const Params& params;
  std::uint64_t salt;  // the row's rank-stream salt (the host row's), so that both draw the same numbers
  DeviceCodecState& state;
  const float* scales;
  cudaStream_t stream;
  std::size_t n;
};

struct Row {
  std::string_view name;  // the codec's spec name
  void (*configure)(const detail::ParamValues& v, Params& p);
  void (*encode)(const Call& c, const float* x, std::byte* payload);  // the step counter is already advanced
  // out (mode) decode(payload). check_indices: topk counts out-of-range indices and throws (a host round trip).
  void (*decode)(const Call& c, const std::byte* payload, float* out, cuda::kernels::Out mode, bool check_indices);
};

// The row of codec `name`, or null where the codec has no CUDA kernels.
const Row* find_row(std::string_view name);

}  // namespace hopwise::compression::device
