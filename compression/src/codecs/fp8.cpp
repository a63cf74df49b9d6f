// fp8: float8 e4m3 (OCP's "FN" variant: bias 7, largest 448, no infinities, NaN 0x7f / 0xff) with a float32 scale
// per block of `block` elements, like torchft's row-wise FP8 allreduce. s = the block's max |x| on this rank / 448
// (codec_math.h's fp8_scale: rounded so that 448 s never overflows, and up for tiny blocks so that a nonzero block
// never gets s = 0); each element is x / s (clamped to +-448) rounded to the nearest e4m3, ties to even, subnormals
// (m * 2^-9) included, never NaN from finite input; decode: e4m3 value * s. A block of zeros (s = 0) decodes to
// zeros; one holding an infinity has s = inf and decodes to NaN. Error of one element: <= 2^-4 |x| where |x| / s >=
// 2^-6 (e4m3's normal range), <= 2^-10 s below it: within 2^-4 |x| + 2^-9 s in all, float rounding included (but
// for float's own subnormal step, 2^-149, in blocks whose max is below 2^-117). Deterministic: for_models.
// Gather; payload: per block of m elements (m = block, or what is left for the last one), [float32 s][m e4m3
// bytes]: payload_bytes(n) = 4 * ceil(n / block) + n, 1 B per element + 4 B per block. Scales sit at any byte
// offset (the communicator gathers payloads at a stride of payload_bytes(n)) and are read as bytes: alignment 1.
#include <array>
#include <cstdint>

#include "codec_internal.h"

namespace hopwise::compression::detail {

namespace {

// Every code's value, NaN for 0x7f and 0xff.
const std::array<float, 256>& fp8_values() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (std::uint32_t c = 0; c < 256; ++c) t[c] = fp8_e4m3_value(c);
    return t;
  }();
  return table;
}

template <bool Acc>
void fp8_decode_block(const std::uint8_t* in, std::size_t m, float* out, float s, const float* value) {
  for (std::size_t i = 0; i < m; ++i) put<Acc>(out, i, value[in[i]] * s);
}

class Fp8Codec final : public RowCodec {
 public:
  Fp8Codec(const CodecRow& row, std::string name, std::size_t block) : RowCodec(row, std::move(name)), block_(block) {}
  DataType payload_dtype() const override { return DataType::kUInt8; }
  std::size_t payload_count(std::size_t n) const override { return 4 * ((n + block_ - 1) / block_) + n; }
  std::size_t payload_alignment() const override { return 1; }  // scales at any offset, read as bytes

 protected:
  void do_encode(const float* g, std::size_t n, std::byte* p, CodecState&, const float*) const override {
    for (std::size_t i0 = 0; i0 < n; i0 += block_) {
      const std::size_t m = std::min(block_, n - i0);
      const float s = fp8_scale(max_abs(g + i0, m));
      store_f32(p, s);
      auto* o = reinterpret_cast<std::uint8_t*>(p + 4);
      const float* x = g + i0;
      for (std::size_t i = 0; i < m; ++i) o[i] = fp8_e4m3(safe_ratio(x[i], s));
      p += 4 + m;
    }
  }
  void do_decode(const std::byte* p, std::size_t n, float* out, const CodecState&, const float*,
                 bool acc) const override {
    const float* value = fp8_values().data();
    for (std::size_t i0 = 0; i0 < n; i0 += block_) {
      const std::size_t m = std::min(block_, n - i0);
      const float s = load_f32(p);
      const auto* in = reinterpret_cast<const std::uint8_t*>(p + 4);
      if (acc)
        fp8_decode_block<true>(in, m, out + i0, s, value);
      else
        fp8_decode_block<false>(in, m, out + i0, s, value);
      p += 4 + m;
    }
  }

 private:
  std::size_t block_;
};

std::unique_ptr<Codec> make(const CodecRow& row, std::string name, const ParamValues& v) {
  return std::make_unique<Fp8Codec>(row, std::move(name), static_cast<std::size_t>(v.integer("block")));
}

constexpr ParamDef kParams[] = {
    int_param("block", "128", 1, 1 << 24, "elements per scale (this rank's max |x| / 448)"),
    ef_param("0"),
};

}  // namespace

extern constinit const CodecRow kFp8Row{"fp8", kParams, std::size(kParams), Pattern::kGather, &make, {0, false}, true};

}  // namespace hopwise::compression::detail
