// randomk: k = ceil(ratio * n) values at indices drawn from (seed, step) only, identical on every rank: one index
// uniformly inside each of k equal strata of [0, n). Not rescaled; error feedback on by default. Aggregatable;
// payload: k float32 (summed as float32; decode needs the state of this step's encode for the indices).
#include <fmt/core.h>

#include <algorithm>
#include <cstdint>

#include "codec_internal.h"
#include "hopwise/common/error.h"

namespace hopwise::compression::detail {

namespace {

class RandomKCodec final : public RowCodec {
 public:
  RandomKCodec(const CodecRow& row, std::string name, double ratio) : RowCodec(row, std::move(name)), ratio_(ratio) {}
  DataType payload_dtype() const override { return DataType::kFloat32; }
  std::size_t payload_count(std::size_t n) const override { return kept_count(ratio_, n); }

 protected:
  void do_encode(const float* g, std::size_t n, std::byte* p, CodecState& state, const float*) const override {
    const std::size_t k = kept_count(ratio_, n);
    const std::uint64_t key = shared_key(state);
    auto* out = reinterpret_cast<float*>(p);
    for (std::size_t j = 0; j < k; ++j) out[j] = g[index(key, j, n, k)];
  }
  void do_decode(const std::byte* p, std::size_t n, float* out, const CodecState& state, const float*,
                 bool acc) const override {
    const std::size_t k = kept_count(ratio_, n);
    const std::uint64_t key = shared_key(state);
    const auto* in = reinterpret_cast<const float*>(p);
    if (!acc) std::fill(out, out + n, 0.0f);
    for (std::size_t j = 0; j < k; ++j) out[index(key, j, n, k)] += in[j];
  }

 private:
  std::uint64_t shared_key(const CodecState& s) const {
    if (s.step == 0)
      throw InvalidArgument(
          fmt::format("codec '{}': decode before any encode on this state; the indices come from "
                      "the step of the latest encode",
                      name()));
    return randomk_key(s.seed, s.step - 1);
  }
  static std::size_t index(std::uint64_t key, std::size_t j, std::size_t n, std::size_t k) {
    return randomk_index(key, j, n, k);
  }
  double ratio_;
};

std::unique_ptr<Codec> make(const CodecRow& row, std::string name, const ParamValues& v) {
  return std::make_unique<RandomKCodec>(row, std::move(name), v.ratio("ratio"));
}

constexpr ParamDef kParams[] = {
    ratio_param("ratio", "0.01", "fraction of the elements kept: k = ceil(ratio * n), one per stratum"),
    ef_param("1"),
};

}  // namespace

extern constinit const CodecRow kRandomKRow{"randomk",  kParams, std::size(kParams), Pattern::kAggregatable, &make,
                                            {0, false}, false};

}  // namespace hopwise::compression::detail
