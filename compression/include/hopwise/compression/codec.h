// Gradient-compression codecs for float32 gradients in host memory.
//
// A Codec turns n floats into a payload of payload_bytes(n) bytes (encode) and back (decode). How the
// communicator combines the payloads of p ranks depends on pattern():
//
//   kAggregatable  payloads are summed element-wise as arrays of payload_count(n) elements of payload_dtype()
//                  (an allreduce with ReduceOp::kSum and the existing dtypes; sum_payloads() is the host kernel,
//                  hopwise::reduce_into) and the sum is decoded once: decode(sum) == sum of decode(each) up to
//                  the rounding of the payload dtype (exactly for int8 and randomk's float32 payload order aside).
//   kGather        payloads are opaque bytes (payload_dtype() == kUInt8) that must be all-gathered; every rank
//                  decodes each one and adds them up (decode_add() accumulates into the output).
//
// Some aggregatable codecs need values agreed by all ranks before encoding (int8's per-block scales): when
// scale_count(n) > 0 the communicator calls local_scales(grad, ...) on every rank, max-allreduces the
// scale_count(n) float32 values, and passes the result as `scales` to encode() and decode() on every rank.
//
// Per-tensor state lives in a CodecState that the caller keeps between steps: the error-feedback residual, the
// seed of the random streams and the step counter (advanced by every encode()).
//
// Codecs: known_codecs() lists them. Each is one file, compression/src/codecs/<codec>.cpp (fp16 and bf16: half.cpp),
// whose comment says what it does, its error and its payload layout, and which defines the codec's registry row
// (hopwise/compression/codec_table.h): its spec name, its parameters with their defaults, ranges and help, its
// pattern, its factory and its CUDA kernels. make_codec's errors list the codecs and the parameters each takes.
// ef=1 wraps any lossy codec in error feedback: residual += grad; encode(residual); residual -= decode(own payload).
// PowerSGD needs a matrix shape and two allreduces with an orthogonalization in between: it is not a Codec, see
// hopwise/compression/powersgd.h (make_codec("powersgd") says so).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "hopwise/common/dtype.h"
#include "hopwise/compression/spec.h"

namespace hopwise::compression {

enum class Pattern : std::uint8_t { kAggregatable, kGather };
std::string_view to_string(Pattern p);

// Per-tensor codec state; keep one per (tensor, codec) across steps.
struct CodecState {
  CodecState() = default;
  // seed: the same on every rank for the same tensor (randomk draws its indices from it);
  // rank in [0, world_size): mixed into the private stochastic-rounding streams; world_size: ranks whose payloads
  // are summed (int8 sizes its headroom from it).
  CodecState(std::uint64_t seed, int rank, int world_size);

  std::uint64_t seed = 0;
  int rank = 0;
  int world_size = 1;
  std::uint64_t step = 0;       // encode() calls so far; decode() reads payloads of the latest one (step - 1)
  std::vector<float> residual;  // error feedback (empty until the first encode of an ef=1 codec)
  std::vector<float> scratch;   // working buffer of the error-feedback wrapper
};

class Codec {
 public:
  virtual ~Codec() = default;

  // Canonical spec string with every parameter, e.g. "topk:ef=1,ratio=0.01"; make_codec(name()) rebuilds it.
  virtual std::string name() const = 0;
  virtual Pattern pattern() const = 0;
  // Aggregatable: the element type to sum payloads with (kSum); gather: kUInt8 (opaque bytes).
  virtual DataType payload_dtype() const = 0;
  // Elements of payload_dtype() in the payload of n floats (== payload_bytes(n) / dtype_size(payload_dtype())).
  virtual std::size_t payload_count(std::size_t n) const = 0;
  std::size_t payload_bytes(std::size_t n) const;
  // The alignment a payload's address needs where it is read in words (the device codecs check it): by default the
  // size of payload_dtype(); topk's byte payload holds 4-byte indices and values.
  virtual std::size_t payload_alignment() const { return dtype_size(payload_dtype()); }

  // Values to agree on before encode (max-allreduce over ranks); 0 for codecs that need none.
  virtual std::size_t scale_count(std::size_t n) const { return 0; }
  // This rank's candidates for the agreed values (with ef=1: of residual + grad, state unchanged).
  virtual void local_scales(const float* grad, std::size_t n, float* scales, const CodecState& state) const {}

  // Writes payload_bytes(n) bytes; advances state.step (and updates state.residual with ef=1). `scales`: the
  // agreed scale_count(n) values (required when scale_count(n) > 0, ignored otherwise).
  void encode(const float* grad, std::size_t n, std::byte* payload, CodecState& state,
              const float* scales = nullptr) const;
  // out[i] = decoded value. For aggregatable codecs `payload` may be the sum of all ranks' payloads. `state` is
  // this rank's state for the tensor after encoding this step (randomk reads seed and step from it).
  void decode(const std::byte* payload, std::size_t n, float* out, const CodecState& state,
              const float* scales = nullptr) const;
  // out[i] += decoded value (to add up the gathered payloads of all ranks).
  void decode_add(const std::byte* payload, std::size_t n, float* out, const CodecState& state,
                  const float* scales = nullptr) const;

  // Aggregatable codecs only: acc = acc + other, element-wise, as the allreduce would (reduce_into with
  // payload_dtype() and kSum). Throws InvalidArgument for gather codecs.
  void sum_payloads(std::byte* acc, const std::byte* other, std::size_t n) const;

 protected:
  virtual void do_encode(const float* grad, std::size_t n, std::byte* payload, CodecState& state,
                         const float* scales) const = 0;
  virtual void do_decode(const std::byte* payload, std::size_t n, float* out, const CodecState& state,
                         const float* scales, bool accumulate) const = 0;
  friend class ErrorFeedbackCodec;
};

// Known codec names, in the order the errors list them.
std::vector<std::string> known_codecs();
// Of which those that can send model differences (gossip and async averaging): every element kept,
// deterministically, at a bounded relative error.
std::vector<std::string> codecs_for_models();

// Builds a codec; throws InvalidArgument for an unknown codec (listing the known ones), a parameter the codec
// does not take (listing the ones it takes) or a value out of range (saying the range).
std::unique_ptr<Codec> make_codec(const CodecSpec& spec);
std::unique_ptr<Codec> make_codec(std::string_view spec);

// HOPWISE_COMPRESSION (default "none"), parsed and checked by make_codec; errors name the variable.
CodecSpec default_codec_spec();

}  // namespace hopwise::compression
