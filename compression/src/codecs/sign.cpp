// sign: x ~ mean|x| * sign(x) (0 encodes as +); error feedback on by default. Gather; payload: [float32 mean|x|]
// [1 bit per element, set = negative, 8 per byte, low bit first] (4 + ceil(n / 8) bytes).
#include <cmath>
#include <cstdint>

#include "codec_internal.h"

namespace hopwise::compression::detail {

namespace {

// One byte of bits per iteration, the element's value selected without branches.
template <bool Acc>
void sign_decode(const std::uint8_t* in, std::size_t n, float* out, float s) {
  const std::size_t full = n / 8;
  for (std::size_t j = 0; j < full; ++j) {
    const std::uint32_t b = in[j];
    for (std::uint32_t k = 0; k < 8; ++k) put<Acc>(out, 8 * j + k, ((b >> k) & 1u) ? -s : s);
  }
  for (std::size_t i = 8 * full; i < n; ++i) put<Acc>(out, i, ((in[full] >> (i - 8 * full)) & 1u) ? -s : s);
}

class SignCodec final : public RowCodec {
 public:
  using RowCodec::RowCodec;
  DataType payload_dtype() const override { return DataType::kUInt8; }
  std::size_t payload_count(std::size_t n) const override { return 4 + (n + 7) / 8; }

 protected:
  void do_encode(const float* g, std::size_t n, std::byte* p, CodecState&, const float*) const override {
    const float mean =
        n ? static_cast<float>(lane_sum(g, n, [](float v) { return std::fabs(v); }) / static_cast<double>(n)) : 0.0f;
    store_f32(p, mean);
    auto* out = reinterpret_cast<std::uint8_t*>(p + 4);
    const std::size_t full = n / 8;
    for (std::size_t j = 0; j < full; ++j) {
      std::uint32_t b = 0;
      for (std::uint32_t k = 0; k < 8; ++k) b |= static_cast<std::uint32_t>(g[8 * j + k] < 0.0f) << k;
      out[j] = static_cast<std::uint8_t>(b);
    }
    if (n % 8) {
      std::uint32_t b = 0;
      for (std::size_t i = 8 * full; i < n; ++i) b |= static_cast<std::uint32_t>(g[i] < 0.0f) << (i - 8 * full);
      out[full] = static_cast<std::uint8_t>(b);
    }
  }
  void do_decode(const std::byte* p, std::size_t n, float* out, const CodecState&, const float*,
                 bool acc) const override {
    const float s = load_f32(p);
    const auto* in = reinterpret_cast<const std::uint8_t*>(p + 4);
    if (acc)
      sign_decode<true>(in, n, out, s);
    else
      sign_decode<false>(in, n, out, s);
  }
};

std::unique_ptr<Codec> make(const CodecRow& row, std::string name, const ParamValues&) {
  return std::make_unique<SignCodec>(row, std::move(name));
}

constexpr ParamDef kParams[] = {ef_param("1")};

}  // namespace

extern constinit const CodecRow kSignRow{"sign",     kParams, std::size(kParams), Pattern::kGather, &make,
                                         {0, false}, false};

}  // namespace hopwise::compression::detail
