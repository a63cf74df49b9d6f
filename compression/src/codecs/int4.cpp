// int4: block-scaled 4-bit integers. Per block of `block` elements, s = the block's max |x| on THIS rank (nothing
// agreed across ranks, so 4-bit sums could not be added in bytes: gather), and every element quantized to
// l = round(x / s * 7) in [-7, 7]; decode: (l / 7) * s. Error of one element: <= s / 14 (round=nearest, ties to even),
// < s / 7 (round=stochastic: floor(x / s * 7 + u) with u from this rank's stream, unbiased), plus float rounding
// (<= 2^-22 s, and float's own subnormal step where s < 2^-126). A block of zeros (s = 0) decodes to zeros; a block
// holding an infinity has s = inf and decodes to NaN. Gather; payload: per block of m elements (m = block, or what is
// left for the last one), [float32 s][ceil(m / 2) bytes: element 2j in the low nibble of byte j, element 2j + 1 in its
// high nibble, each level's 4-bit two's complement; an odd m leaves the last high nibble 0]. payload_bytes(n) = 4 *
// ceil(n / block) + sum of ceil(m / 2): 0.5 B per element + 4 B per block (block even). The scales sit at any byte
// offset (an odd block, and the communicator gathers payloads at a stride of payload_bytes(n)): they are read and
// written as bytes, so payload_alignment() is 1. for_models: with round=nearest every element is kept deterministically
// at an error bounded by its block's scale; the row is shared with round=stochastic, which adds noise (as int8's is).
#include <array>
#include <cstdint>

#include "codec_internal.h"

namespace hopwise::compression::detail {

namespace {

HOPWISE_CODEC_CLONES
void int4_stochastic_kernel(const float* x, std::size_t m, std::uint8_t* o, float s, Stream rs, std::size_t base) {
  for (std::size_t j = 0; 2 * j + 1 < m; ++j)
    o[j] = static_cast<std::uint8_t>(int4_stochastic(x[2 * j], s, rs.uniform(base + 2 * j)) |
                                     int4_stochastic(x[2 * j + 1], s, rs.uniform(base + 2 * j + 1)) << 4);
  if (m % 2) o[m / 2] = static_cast<std::uint8_t>(int4_stochastic(x[m - 1], s, rs.uniform(base + m - 1)));
}

void int4_nearest_kernel(const float* x, std::size_t m, std::uint8_t* o, float s) {
  for (std::size_t j = 0; 2 * j + 1 < m; ++j)
    o[j] = static_cast<std::uint8_t>(int4_nearest(x[2 * j], s) | int4_nearest(x[2 * j + 1], s) << 4);
  if (m % 2) o[m / 2] = static_cast<std::uint8_t>(int4_nearest(x[m - 1], s));
}

template <bool Acc>
void int4_decode_block(const std::uint8_t* in, std::size_t m, float* out, float s) {
  std::array<float, 16> value;
  for (std::uint32_t c = 0; c < 16; ++c) value[c] = int4_value(c, s);
  for (std::size_t j = 0; 2 * j + 1 < m; ++j) {
    put<Acc>(out, 2 * j, value[in[j] & 15u]);
    put<Acc>(out, 2 * j + 1, value[in[j] >> 4]);
  }
  if (m % 2) put<Acc>(out, m - 1, value[in[m / 2] & 15u]);
}

class Int4Codec final : public RowCodec {
 public:
  Int4Codec(const CodecRow& row, std::string name, std::size_t block, bool stochastic)
      : RowCodec(row, std::move(name)), block_(block), stochastic_(stochastic) {}
  DataType payload_dtype() const override { return DataType::kUInt8; }
  std::size_t payload_count(std::size_t n) const override {
    const std::size_t full = n / block_, last = n % block_;
    return 4 * (full + (last ? 1 : 0)) + full * ((block_ + 1) / 2) + (last + 1) / 2;
  }
  std::size_t payload_alignment() const override { return 1; }  // scales at any offset, read as bytes

 protected:
  void do_encode(const float* g, std::size_t n, std::byte* p, CodecState& state, const float*) const override {
    const Stream rs = state_stream(state, row().device.stream_salt);
    for (std::size_t i0 = 0; i0 < n; i0 += block_) {
      const std::size_t m = std::min(block_, n - i0);
      const float s = max_abs(g + i0, m);
      store_f32(p, s);
      auto* o = reinterpret_cast<std::uint8_t*>(p + 4);
      if (stochastic_)
        int4_stochastic_kernel(g + i0, m, o, s, rs, i0);
      else
        int4_nearest_kernel(g + i0, m, o, s);
      p += 4 + (m + 1) / 2;
    }
  }
  void do_decode(const std::byte* p, std::size_t n, float* out, const CodecState&, const float*,
                 bool acc) const override {
    for (std::size_t i0 = 0; i0 < n; i0 += block_) {
      const std::size_t m = std::min(block_, n - i0);
      const float s = load_f32(p);
      const auto* in = reinterpret_cast<const std::uint8_t*>(p + 4);
      if (acc)
        int4_decode_block<true>(in, m, out + i0, s);
      else
        int4_decode_block<false>(in, m, out + i0, s);
      p += 4 + (m + 1) / 2;
    }
  }

 private:
  std::size_t block_;
  bool stochastic_;
};

std::unique_ptr<Codec> make(const CodecRow& row, std::string name, const ParamValues& v) {
  return std::make_unique<Int4Codec>(row, std::move(name), static_cast<std::size_t>(v.integer("block")),
                                     v.choice("round") == "stochastic");
}

constexpr ParamDef kParams[] = {
    int_param("block", "64", 1, 1 << 24, "elements per scale (this rank's max |x|)"),
    choice_param("round", "nearest", "nearest|stochastic", "rounding of x / s * 7 (stochastic: unbiased)"),
    ef_param("0"),
};

}  // namespace

extern constinit const CodecRow kInt4Row{"int4",          kParams, std::size(kParams), Pattern::kGather, &make,
                                         {0x4b17, false}, true};

}  // namespace hopwise::compression::detail
