// none: the gradient itself, exact. Aggregatable; payload: n float32 (4 B/element), summed as float32.
#include <cstring>

#include "codec_internal.h"

namespace hopwise::compression::detail {

namespace {

class NoneCodec final : public RowCodec {
 public:
  using RowCodec::RowCodec;
  DataType payload_dtype() const override { return DataType::kFloat32; }
  std::size_t payload_count(std::size_t n) const override { return n; }

 protected:
  void do_encode(const float* g, std::size_t n, std::byte* p, CodecState&, const float*) const override {
    if (n) std::memcpy(p, g, n * sizeof(float));
  }
  void do_decode(const std::byte* p, std::size_t n, float* out, const CodecState&, const float*,
                 bool acc) const override {
    if (!acc) {
      if (n) std::memcpy(out, p, n * sizeof(float));
      return;
    }
    const auto* src = reinterpret_cast<const float*>(p);
    for (std::size_t i = 0; i < n; ++i) out[i] += src[i];
  }
};

std::unique_ptr<Codec> make(const CodecRow& row, std::string name, const ParamValues&) {
  return std::make_unique<NoneCodec>(row, std::move(name));
}

}  // namespace

extern constinit const CodecRow kNoneRow{"none", nullptr, 0, Pattern::kAggregatable, &make, {0, false}, true};

}  // namespace hopwise::compression::detail
