// Codec base class, the error-feedback wrapper and the make_codec factory (its rows, parameter defaults and checks:
// codec_registry.h).
#include "hopwise/compression/codec.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <utility>

#include "codec_internal.h"
#include "hopwise/common/env.h"
#include "hopwise/common/error.h"
#include "hopwise/common/reduce.h"
#include "hopwise/compression/codec_table.h"
#include "spec_params.h"

namespace hopwise::compression {

std::string_view to_string(Pattern p) { return p == Pattern::kAggregatable ? "aggregatable" : "gather"; }

CodecState::CodecState(std::uint64_t seed_, int rank_, int world_size_)
    : seed(seed_), rank(rank_), world_size(world_size_) {
  if (world_size_ < 1 || rank_ < 0 || rank_ >= world_size_)
    throw InvalidArgument(fmt::format("CodecState: rank {} of world size {} is invalid; need 0 <= rank < world_size",
                                      rank_, world_size_));
}

std::size_t Codec::payload_bytes(std::size_t n) const { return payload_count(n) * dtype_size(payload_dtype()); }

namespace {

// `floats` / `payload`: the float array and the payload of the call (null is fine only where they hold 0 bytes;
// gather codecs have a header even for n == 0).
void check_args(const Codec& c, std::size_t n, const void* floats, const void* payload, const float* scales,
                std::string_view what) {
  if (floats == nullptr && n > 0)
    throw InvalidArgument(fmt::format("{} of codec '{}': null float buffer for {} elements", what, c.name(), n));
  if (payload == nullptr && c.payload_bytes(n) > 0)
    throw InvalidArgument(fmt::format("{} of codec '{}': null payload; it needs payload_bytes({}) = {} bytes", what,
                                      c.name(), n, c.payload_bytes(n)));
  if (scales == nullptr && c.scale_count(n) > 0)
    throw InvalidArgument(
        fmt::format("{} of codec '{}' needs the {} agreed scales (local_scales() max-allreduced over ranks); got none",
                    what, c.name(), c.scale_count(n)));
}

}  // namespace

void Codec::encode(const float* grad, std::size_t n, std::byte* payload, CodecState& state, const float* scales) const {
  check_args(*this, n, grad, payload, scales, "encode");
  ++state.step;  // codecs read the index of this step as state.step - 1, in encode and in decode alike
  try {
    do_encode(grad, n, payload, state, scales);
  } catch (...) {
    --state.step;  // a rejected call is not a step
    throw;
  }
}

void Codec::decode(const std::byte* payload, std::size_t n, float* out, const CodecState& state,
                   const float* scales) const {
  check_args(*this, n, out, payload, scales, "decode");
  do_decode(payload, n, out, state, scales, false);
}

void Codec::decode_add(const std::byte* payload, std::size_t n, float* out, const CodecState& state,
                       const float* scales) const {
  check_args(*this, n, out, payload, scales, "decode_add");
  do_decode(payload, n, out, state, scales, true);
}

void Codec::sum_payloads(std::byte* acc, const std::byte* other, std::size_t n) const {
  if (pattern() != Pattern::kAggregatable)
    throw InvalidArgument(
        fmt::format("codec '{}' is a gather codec: its payloads cannot be summed; all-gather them "
                    "and decode_add() each one",
                    name()));
  reduce_into(payload_dtype(), ReduceOp::kSum, acc, acc, other, payload_count(n));
}

// residual += grad; payload = encode(residual); residual -= decode(payload).
class ErrorFeedbackCodec final : public Codec {
 public:
  explicit ErrorFeedbackCodec(std::unique_ptr<Codec> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  Pattern pattern() const override { return inner_->pattern(); }
  DataType payload_dtype() const override { return inner_->payload_dtype(); }
  std::size_t payload_count(std::size_t n) const override { return inner_->payload_count(n); }
  std::size_t scale_count(std::size_t n) const override { return inner_->scale_count(n); }
  std::size_t payload_alignment() const override { return inner_->payload_alignment(); }

  void local_scales(const float* grad, std::size_t n, float* scales, const CodecState& state) const override {
    if (state.residual.empty()) return inner_->local_scales(grad, n, scales, state);
    check_residual(state, n);
    std::vector<float> sum(n);
    for (std::size_t i = 0; i < n; ++i) sum[i] = state.residual[i] + grad[i];
    inner_->local_scales(sum.data(), n, scales, state);
  }

 protected:
  void do_encode(const float* grad, std::size_t n, std::byte* payload, CodecState& state,
                 const float* scales) const override {
    if (state.residual.empty()) state.residual.assign(n, 0.0f);
    check_residual(state, n);
    float* r = state.residual.data();
    for (std::size_t i = 0; i < n; ++i) r[i] += grad[i];
    inner_->do_encode(r, n, payload, state, scales);
    state.scratch.resize(n);
    float* d = state.scratch.data();
    inner_->do_decode(payload, n, d, state, scales, false);
    for (std::size_t i = 0; i < n; ++i) r[i] -= d[i];
  }
  void do_decode(const std::byte* payload, std::size_t n, float* out, const CodecState& state, const float* scales,
                 bool accumulate) const override {
    inner_->do_decode(payload, n, out, state, scales, accumulate);
  }

 private:
  void check_residual(const CodecState& state, std::size_t n) const {
    if (state.residual.size() != n)
      throw InvalidArgument(fmt::format(
          "codec '{}': the state holds an error-feedback residual of {} elements but this tensor has {}; keep one "
          "CodecState per tensor",
          name(), state.residual.size(), n));
  }
  std::unique_ptr<Codec> inner_;
};

namespace {

std::unique_ptr<Codec> with_ef(std::unique_ptr<Codec> c, bool ef) {
  if (!ef) return c;
  return std::make_unique<ErrorFeedbackCodec>(std::move(c));
}

}  // namespace

std::vector<std::string> known_codecs() {
  std::vector<std::string> v;
  for (const detail::CodecRow* row : detail::codec_rows()) v.emplace_back(row->name);
  return v;
}

std::vector<std::string> codecs_for_models() {
  std::vector<std::string> v;
  for (const detail::CodecRow* row : detail::codec_rows())
    if (row->for_models) v.emplace_back(row->name);
  return v;
}

std::unique_ptr<Codec> make_codec(const CodecSpec& spec) {
  if (const detail::CodecRow* row = detail::find_codec_row(spec.name)) {
    const detail::ParamValues v = detail::check_params(*row, spec);
    return with_ef(row->make(*row, v.canonical(), v), v.has("ef") && v.flag("ef"));
  }
  if (spec.name == "powersgd")
    throw InvalidArgument(
        fmt::format("codec spec '{}': powersgd needs two allreduces per step and a matrix shape, "
                    "so it is not a Codec; build it with PowerSgd::from_spec "
                    "(hopwise/compression/powersgd.h)",
                    spec.to_string()));
  throw InvalidArgument(fmt::format("codec spec '{}': unknown codec '{}'; known codecs: {}", spec.to_string(),
                                    spec.name, detail::join(known_codecs())));
}

std::unique_ptr<Codec> make_codec(std::string_view spec) { return make_codec(parse_codec_spec(spec)); }

CodecSpec default_codec_spec() {
  const std::string text = env::get_or("HOPWISE_COMPRESSION", "none");
  try {
    CodecSpec spec = parse_codec_spec(text);
    make_codec(spec);  // validate now, so that a typo fails at start-up
    return spec;
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("HOPWISE_COMPRESSION={}: {}", text, e.what()));
  }
}

namespace detail {

std::size_t kept_count(double ratio, std::size_t n) {
  if (n == 0) return 0;
  const double x = ratio * static_cast<double>(n);
  const double r = std::round(x);
  double k = std::fabs(x - r) <= 1e-9 * std::max(1.0, x) ? r : std::ceil(x);
  k = std::clamp(k, 1.0, static_cast<double>(n));
  return static_cast<std::size_t>(k);
}

}  // namespace detail

}  // namespace hopwise::compression
