// Internal to hopwise_compression: checks a spec's parameters against the ones a codec takes (with their
// defaults) and parses their values, with errors that name the spec, the key and the range. make_codec and
// PowerSgd::from_spec use it.
#pragma once

#include <fmt/core.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "hopwise/common/error.h"
#include "hopwise/compression/spec.h"

namespace hopwise::compression::detail {

inline std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// A spec's parameters checked against `defaults` (every key the codec takes); get_* parse one and record it in
// the canonical form.
class Params {
 public:
  Params(const CodecSpec& spec, std::vector<std::pair<std::string, std::string>> defaults)
      : spec_(spec), defaults_(std::move(defaults)) {
    std::vector<std::string> allowed;
    for (const auto& [k, v] : defaults_) allowed.push_back(k);
    for (const auto& [k, v] : spec.params) {
      if (std::find(allowed.begin(), allowed.end(), k) == allowed.end()) {
        if (allowed.empty())
          throw InvalidArgument(fmt::format("codec spec '{}': codec '{}' takes no parameters (got '{}')",
                                            spec.to_string(), spec.name, k));
        throw InvalidArgument(fmt::format("codec spec '{}': codec '{}' has no parameter '{}'; it takes: {}",
                                          spec.to_string(), spec.name, k, join(allowed)));
      }
    }
    canonical_.name = spec.name;
  }

  long long get_int(const std::string& key, long long lo, long long hi) {
    const std::string text = raw(key);
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (errno != 0 || end == text.c_str() || *end != '\0' || v < lo || v > hi)
      throw InvalidArgument(
          fmt::format("codec spec '{}': {}={} is not an integer in [{}, {}]", spec_.to_string(), key, text, lo, hi));
    canonical_.params[key] = std::to_string(v);
    return v;
  }

  // A fraction in (0, 1].
  double get_ratio(const std::string& key) {
    const std::string text = raw(key);
    errno = 0;
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (errno != 0 || end == text.c_str() || *end != '\0' || !(v > 0.0 && v <= 1.0))
      throw InvalidArgument(
          fmt::format("codec spec '{}': {}={} is not a number in (0, 1]", spec_.to_string(), key, text));
    canonical_.params[key] = fmt::format("{}", v);
    return v;
  }

  bool get_flag(const std::string& key) { return get_choice(key, {"0", "1"}) == "1"; }

  std::string get_choice(const std::string& key, const std::vector<std::string>& choices) {
    const std::string text = raw(key);
    if (std::find(choices.begin(), choices.end(), text) == choices.end()) {
      std::string list;
      for (const auto& c : choices) list += (list.empty() ? "" : "|") + c;
      throw InvalidArgument(fmt::format("codec spec '{}': {}={} is not one of {}", spec_.to_string(), key, text, list));
    }
    canonical_.params[key] = text;
    return text;
  }

  std::string canonical() const { return canonical_.to_string(); }

 private:
  std::string raw(const std::string& key) const {
    if (auto it = spec_.params.find(key); it != spec_.params.end()) return it->second;
    for (const auto& [k, v] : defaults_)
      if (k == key) return v;
    return {};
  }
  const CodecSpec& spec_;
  std::vector<std::pair<std::string, std::string>> defaults_;
  CodecSpec canonical_;
};

}  // namespace hopwise::compression::detail
