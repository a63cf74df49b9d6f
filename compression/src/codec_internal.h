// Internal to hopwise_compression: the concrete codecs (codecs.cpp) that make_codec (codec.cpp) builds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "hopwise/compression/codec.h"

namespace hopwise::compression::detail {

// `name` is the canonical spec string the codec reports.
std::unique_ptr<Codec> make_none(std::string name);
std::unique_ptr<Codec> make_fp16(std::string name);
std::unique_ptr<Codec> make_bf16(std::string name);
std::unique_ptr<Codec> make_int8(std::string name, std::size_t block, bool stochastic);
std::unique_ptr<Codec> make_qsgd(std::string name, int levels);
std::unique_ptr<Codec> make_terngrad(std::string name);
std::unique_ptr<Codec> make_sign(std::string name);
std::unique_ptr<Codec> make_topk(std::string name, double ratio);
std::unique_ptr<Codec> make_randomk(std::string name, double ratio);

// k = ceil(ratio * n) (tolerating the rounding of ratio * n), at least 1 and at most n; 0 when n == 0.
std::size_t kept_count(double ratio, std::size_t n);

}  // namespace hopwise::compression::detail
