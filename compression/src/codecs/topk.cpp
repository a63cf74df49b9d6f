// topk: keeps exactly k = ceil(ratio * n) largest |x| (ties: lower index first), the rest decode as 0; error
// feedback on by default. Gather; payload: [k x uint32 index, ascending][k x float32 value] (8 B per kept element,
// 4-byte words: payload_alignment() 4 though the payload dtype is bytes).
#include <fmt/core.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "codec_internal.h"
#include "hopwise/common/error.h"

namespace hopwise::compression::detail {

namespace {

void check_index_range(const Codec& c, std::size_t n) {
  if (n > std::numeric_limits<std::uint32_t>::max())
    throw InvalidArgument(
        fmt::format("codec '{}': {} elements do not fit its uint32 indices; split the tensor below "
                    "2^32 elements",
                    c.name(), n));
}

class TopKCodec final : public RowCodec {
 public:
  TopKCodec(const CodecRow& row, std::string name, double ratio) : RowCodec(row, std::move(name)), ratio_(ratio) {}
  DataType payload_dtype() const override { return DataType::kUInt8; }
  std::size_t payload_count(std::size_t n) const override { return 8 * kept_count(ratio_, n); }
  std::size_t payload_alignment() const override { return 4; }  // uint32 indices and float32 values

 protected:
  void do_encode(const float* g, std::size_t n, std::byte* p, CodecState&, const float*) const override {
    check_index_range(*this, n);
    const std::size_t k = kept_count(ratio_, n);
    if (k == 0) return;
    // Key: |x| as ordered bits (NaN above inf, a total order) in the high half, ~index in the low half so that
    // ties keep the lower index; the k largest keys are the k largest magnitudes.
    auto mag = [g](std::size_t i) {
      std::uint32_t bits;
      std::memcpy(&bits, g + i, sizeof bits);
      return bits & 0x7fffffffu;
    };
    // Radix pre-selection: a histogram of the top 11 bits of |x| (sign-less exponent and 3 mantissa bits) finds
    // the bin that holds the k-th largest; only elements in it or above go to nth_element. Same result as
    // selecting among all n, in a fraction of the time unless the magnitudes crowd into one bin.
    std::vector<std::size_t> hist(2048, 0);
    for (std::size_t i = 0; i < n; ++i) ++hist[mag(i) >> 20];
    std::uint32_t bin = 2047;
    for (std::size_t above = 0;; --bin) {
      above += hist[bin];
      if (above >= k || bin == 0) break;
    }
    std::vector<std::uint64_t> keys;
    for (std::size_t i = 0; i < n; ++i)
      if ((mag(i) >> 20) >= bin)
        keys.push_back(static_cast<std::uint64_t>(mag(i)) << 32 | (~static_cast<std::uint32_t>(i)));
    if (k < keys.size())
      std::nth_element(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(k - 1), keys.end(), std::greater<>());
    std::vector<std::uint32_t> idx(k);
    for (std::size_t j = 0; j < k; ++j) idx[j] = ~static_cast<std::uint32_t>(keys[j]);
    std::sort(idx.begin(), idx.end());
    std::memcpy(p, idx.data(), k * 4);
    for (std::size_t j = 0; j < k; ++j) store_f32(p + 4 * k + 4 * j, g[idx[j]]);
  }
  void do_decode(const std::byte* p, std::size_t n, float* out, const CodecState&, const float*,
                 bool acc) const override {
    const std::size_t k = kept_count(ratio_, n);
    if (!acc) std::fill(out, out + n, 0.0f);
    for (std::size_t j = 0; j < k; ++j) {
      std::uint32_t i;
      std::memcpy(&i, p + 4 * j, sizeof i);
      if (i >= n)
        throw InvalidArgument(
            fmt::format("codec '{}': payload index {} is out of range for {} elements (corrupt "
                        "payload or a different n than at encode)",
                        name(), i, n));
      out[i] += load_f32(p + 4 * k + 4 * j);
    }
  }

 private:
  double ratio_;
};

std::unique_ptr<Codec> make(const CodecRow& row, std::string name, const ParamValues& v) {
  return std::make_unique<TopKCodec>(row, std::move(name), v.ratio("ratio"));
}

constexpr ParamDef kParams[] = {
    ratio_param("ratio", "0.01", "fraction of the elements kept: k = ceil(ratio * n)"),
    ef_param("1"),
};

}  // namespace

extern constinit const CodecRow kTopKRow{
    "topk", kParams, std::size(kParams), Pattern::kGather, &make, {0, /*decode_synchronizes=*/true}, false};

}  // namespace hopwise::compression::detail
