// terngrad: x ~ max|x| * {-1, 0, 1}, stochastic, unbiased. Gather; payload: [float32 max|x|][2 bits per element:
// 0 -> 0, 1 -> +s, 2 -> -s, 4 per byte, low bits first] (4 + ceil(n / 4) bytes).
#include <cstdint>

#include "codec_internal.h"

namespace hopwise::compression::detail {

namespace {

HOPWISE_CODEC_CLONES
void terngrad_kernel(const float* g, std::size_t n, std::uint8_t* out, float inv, Stream rs) {
  auto code = [&](std::size_t i) { return terngrad_code(g[i], inv, rs.uniform(i)); };
  const std::size_t full = n / 4;
  for (std::size_t j = 0; j < full; ++j)
    out[j] =
        static_cast<std::uint8_t>(code(4 * j) | code(4 * j + 1) << 2 | code(4 * j + 2) << 4 | code(4 * j + 3) << 6);
  if (n % 4) {
    std::uint32_t b = 0;
    for (std::size_t i = 4 * full; i < n; ++i) b |= code(i) << (2 * (i - 4 * full));
    out[full] = static_cast<std::uint8_t>(b);
  }
}

// One byte of codes per iteration, the element's value selected without branches.
template <bool Acc>
void tern_decode(const std::uint8_t* in, std::size_t n, float* out, float s) {
  auto val = [s](std::uint32_t c) { return c == 1u ? s : (c == 2u ? -s : 0.0f); };
  const std::size_t full = n / 4;
  for (std::size_t j = 0; j < full; ++j) {
    const std::uint32_t b = in[j];
    for (std::uint32_t k = 0; k < 4; ++k) put<Acc>(out, 4 * j + k, val((b >> (2 * k)) & 3u));
  }
  for (std::size_t i = 4 * full; i < n; ++i) put<Acc>(out, i, val((in[full] >> (2 * (i - 4 * full))) & 3u));
}

class TernGradCodec final : public RowCodec {
 public:
  using RowCodec::RowCodec;
  DataType payload_dtype() const override { return DataType::kUInt8; }
  std::size_t payload_count(std::size_t n) const override { return 4 + (n + 3) / 4; }

 protected:
  void do_encode(const float* g, std::size_t n, std::byte* p, CodecState& state, const float*) const override {
    const float s = max_abs(g, n);
    store_f32(p, s);
    auto* out = reinterpret_cast<std::uint8_t*>(p + 4);
    const float inv = safe_ratio(1.0f, s);
    terngrad_kernel(g, n, out, inv, state_stream(state, row().device.stream_salt));
  }
  void do_decode(const std::byte* p, std::size_t n, float* out, const CodecState&, const float*,
                 bool acc) const override {
    const float s = load_f32(p);
    const auto* in = reinterpret_cast<const std::uint8_t*>(p + 4);
    if (acc)
      tern_decode<true>(in, n, out, s);
    else
      tern_decode<false>(in, n, out, s);
  }
};

std::unique_ptr<Codec> make(const CodecRow& row, std::string name, const ParamValues&) {
  return std::make_unique<TernGradCodec>(row, std::move(name));
}

constexpr ParamDef kParams[] = {ef_param("0")};

}  // namespace

extern constinit const CodecRow kTernGradRow{"terngrad",      kParams, std::size(kParams), Pattern::kGather, &make,
                                             {0x7e44, false}, false};

}  // namespace hopwise::compression::detail
