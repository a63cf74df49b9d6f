#include "hopwise/compression/spec.h"

#include <fmt/core.h>

#include "hopwise/common/error.h"

namespace hopwise::compression {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

CodecSpec parse_codec_spec(std::string_view text) {
  CodecSpec spec;
  const auto colon = text.find(':');
  spec.name = std::string(trim(text.substr(0, colon)));
  if (spec.name.empty())
    throw InvalidArgument(
        fmt::format("codec spec '{}' has no codec name; write e.g. 'fp16' or 'topk:ratio=0.01'", text));
  if (colon == std::string_view::npos) return spec;
  std::string_view rest = text.substr(colon + 1);
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    const std::string_view item = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    if (comma != std::string_view::npos && trim(rest).empty())
      throw InvalidArgument(fmt::format("codec spec '{}' ends with ','; remove it or add a key=value after it", text));
    const auto eq = item.find('=');
    if (eq == std::string_view::npos || trim(item.substr(0, eq)).empty() || trim(item.substr(eq + 1)).empty())
      throw InvalidArgument(fmt::format("codec spec '{}': parameter '{}' is not key=value", text, item));
    const std::string key(trim(item.substr(0, eq)));
    if (!spec.params.emplace(key, std::string(trim(item.substr(eq + 1)))).second)
      throw InvalidArgument(fmt::format("codec spec '{}': parameter '{}' is given twice", text, key));
  }
  return spec;
}

std::string CodecSpec::to_string() const {
  std::string s = name;
  char sep = ':';
  for (const auto& [k, v] : params) {
    s += sep + k + "=" + v;
    sep = ',';
  }
  return s;
}

}  // namespace hopwise::compression
