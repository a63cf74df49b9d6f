// int8 with per-block scales agreed by all ranks and headroom for p ranks. Aggregatable; payload: n int8 (1 B per
// element, payload dtype kUInt8: two's-complement bytes whose wrap-around addition is int8 addition while the sum
// fits), plus an agreed max-allreduce of ceil(n / block) float32 scales before encoding (scale_count).
// Every rank quantizes x to round(x / s * q) with s = the block's max |x| over ALL ranks and q = floor(127 / p)
// (p = world size), so the sum of p payloads stays in [-127, 127]. decode: sum * s / q. Error of one rank's value:
// <= s / (2q) (round=nearest), < s / q (round=stochastic, unbiased); of the decoded sum of p ranks: <= p * s / (2q)
// (nearest). q shrinks with p: 127 (p=1), 63 (p=2), 31 (p=4), 15 (p=8), 1 (p=64..127); more than 127 ranks is an
// InvalidArgument.
#include <fmt/core.h>

#include <algorithm>
#include <cstdint>

#include "codec_internal.h"
#include "hopwise/common/error.h"

namespace hopwise::compression::detail {

namespace {

HOPWISE_CODEC_CLONES
void int8_stochastic_kernel(const float* x, std::size_t m, std::int8_t* o, float inv, int q, Stream rs,
                            std::size_t base) {
  for (std::size_t i = 0; i < m; ++i) o[i] = int8_stochastic(x[i], inv, q, rs.uniform(base + i));
}

class Int8Codec final : public RowCodec {
 public:
  Int8Codec(const CodecRow& row, std::string name, std::size_t block, bool stochastic)
      : RowCodec(row, std::move(name)), block_(block), stochastic_(stochastic) {}
  DataType payload_dtype() const override { return DataType::kUInt8; }  // two's-complement int8, summed wrapping
  std::size_t payload_count(std::size_t n) const override { return n; }
  std::size_t scale_count(std::size_t n) const override { return (n + block_ - 1) / block_; }

  void local_scales(const float* g, std::size_t n, float* scales, const CodecState&) const override {
    for (std::size_t b = 0, i = 0; i < n; ++b, i += block_) scales[b] = max_abs(g + i, std::min(block_, n - i));
  }

 protected:
  void do_encode(const float* g, std::size_t n, std::byte* p, CodecState& state, const float* scales) const override {
    const int q = levels(state.world_size);
    auto* out = reinterpret_cast<std::int8_t*>(p);
    const Stream rs = state_stream(state, row().device.stream_salt);
    for (std::size_t b = 0, i0 = 0; i0 < n; ++b, i0 += block_) {
      const std::size_t m = std::min(block_, n - i0);
      const float s = scales[b];
      const float inv = safe_ratio(static_cast<float>(q), s);
      const float* x = g + i0;
      std::int8_t* o = out + i0;
      if (stochastic_) {
        int8_stochastic_kernel(x, m, o, inv, q, rs, i0);
      } else {
        for (std::size_t i = 0; i < m; ++i) o[i] = int8_nearest(x[i], inv, q);
      }
    }
  }
  void do_decode(const std::byte* p, std::size_t n, float* out, const CodecState& state, const float* scales,
                 bool acc) const override {
    if (acc)
      run<true>(p, n, out, levels(state.world_size), scales);
    else
      run<false>(p, n, out, levels(state.world_size), scales);
  }

 private:
  template <bool Acc>
  void run(const std::byte* p, std::size_t n, float* out, int q, const float* scales) const {
    const auto* in = reinterpret_cast<const std::int8_t*>(p);
    for (std::size_t b = 0, i0 = 0; i0 < n; ++b, i0 += block_) {
      const std::size_t m = std::min(block_, n - i0);
      const float f = scales[b] / static_cast<float>(q);
      for (std::size_t i = 0; i < m; ++i) put<Acc>(out, i0 + i, static_cast<float>(in[i0 + i]) * f);
    }
  }
  int levels(int world_size) const { return int8_levels(name(), world_size); }
  std::size_t block_;
  bool stochastic_;
};

}  // namespace

int int8_levels(const std::string& codec, int world_size) {
  if (world_size > 127)
    throw InvalidArgument(
        fmt::format("codec '{}': the payloads of {} ranks cannot be summed in int8 (at most 127 ranks); use fp16, "
                    "bf16 or a gather codec",
                    codec, world_size));
  return 127 / std::max(1, world_size);
}

namespace {

std::unique_ptr<Codec> make(const CodecRow& row, std::string name, const ParamValues& v) {
  return std::make_unique<Int8Codec>(row, std::move(name), static_cast<std::size_t>(v.integer("block")),
                                     v.choice("round") == "stochastic");
}

constexpr ParamDef kParams[] = {
    int_param("block", "256", 1, 1 << 24, "elements per agreed scale"),
    choice_param("round", "nearest", "nearest|stochastic", "rounding of x / s * q (stochastic: unbiased)"),
    ef_param("0"),
};

}  // namespace

extern constinit const CodecRow kInt8Row{"int8",          kParams, std::size(kParams), Pattern::kAggregatable, &make,
                                         {0x1e78, false}, true};

}  // namespace hopwise::compression::detail
