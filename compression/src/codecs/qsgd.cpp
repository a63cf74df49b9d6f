// qsgd: stochastic quantization to s levels of the L2 norm, x ~ ||x||_2 / s * l with l in [-s, s], unbiased;
// variance per element <= (||x||_2 / s)^2 / 4. Gather; payload: [float32 L2 norm][n x int8 level] (4 + n bytes).
#include <cmath>
#include <cstdint>

#include "codec_internal.h"

namespace hopwise::compression::detail {

namespace {

HOPWISE_CODEC_CLONES
void qsgd_kernel(const float* g, std::size_t n, std::int8_t* out, float inv, int s, Stream rs) {
  for (std::size_t i = 0; i < n; ++i) out[i] = qsgd_level(g[i], inv, s, rs.uniform(i));
}

class QsgdCodec final : public RowCodec {
 public:
  QsgdCodec(const CodecRow& row, std::string name, int levels) : RowCodec(row, std::move(name)), s_(levels) {}
  DataType payload_dtype() const override { return DataType::kUInt8; }
  std::size_t payload_count(std::size_t n) const override { return 4 + n; }

 protected:
  void do_encode(const float* g, std::size_t n, std::byte* p, CodecState& state, const float*) const override {
    const float norm = static_cast<float>(std::sqrt(lane_sum(g, n, [](float v) { return v * v; })));
    store_f32(p, norm);
    auto* out = reinterpret_cast<std::int8_t*>(p + 4);
    const float inv = safe_ratio(static_cast<float>(s_), norm);
    qsgd_kernel(g, n, out, inv, s_, state_stream(state, row().device.stream_salt));
  }
  void do_decode(const std::byte* p, std::size_t n, float* out, const CodecState&, const float*,
                 bool acc) const override {
    const float f = load_f32(p) / static_cast<float>(s_);
    const auto* in = reinterpret_cast<const std::int8_t*>(p + 4);
    if (acc)
      for (std::size_t i = 0; i < n; ++i) out[i] += static_cast<float>(in[i]) * f;
    else
      for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]) * f;
  }

 private:
  int s_;
};

std::unique_ptr<Codec> make(const CodecRow& row, std::string name, const ParamValues& v) {
  return std::make_unique<QsgdCodec>(row, std::move(name), static_cast<int>(v.integer("levels")));
}

constexpr ParamDef kParams[] = {
    int_param("levels", "16", 1, 127, "quantization levels s on each side of zero"),
    ef_param("0"),
};

}  // namespace

extern constinit const CodecRow kQsgdRow{"qsgd",          kParams, std::size(kParams), Pattern::kGather, &make,
                                         {0x95dd, false}, false};

}  // namespace hopwise::compression::detail
