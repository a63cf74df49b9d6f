#include "hopwise/common/env.h"

#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <limits>

#include "hopwise/common/error.h"

namespace hopwise::env {

std::optional<std::string> get(std::string_view name) {
  const char* v = std::getenv(std::string(name).c_str());
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

std::string get_or(std::string_view name, std::string_view fallback) {
  auto v = get(name);
  return v ? *v : std::string(fallback);
}

double get_double(std::string_view name, double fallback) {
  auto v = get(name);
  if (!v) return fallback;
  char* end = nullptr;
  const double d = std::strtod(v->c_str(), &end);
  if (end == v->c_str() || *end != '\0')
    throw InvalidArgument(fmt::format("{}='{}' is not a number; set it to e.g. {}", name, *v, fallback));
  return d;
}

long long get_int(std::string_view name, long long fallback) {
  auto v = get(name);
  if (!v) return fallback;
  long long x = 0;
  auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), x);
  if (ec != std::errc() || p != v->data() + v->size())
    throw InvalidArgument(fmt::format("{}='{}' is not an integer; set it to e.g. {}", name, *v, fallback));
  return x;
}

bool list_contains(std::string_view name, std::string_view word) {
  const std::string v = get_or(name, "");
  std::string w;
  for (std::size_t i = 0; i <= v.size(); ++i) {
    const char c = i < v.size() ? v[i] : ',';
    if (c == ',' || c == ';' || c == ' ') {
      if (w.size() == word.size() && std::equal(w.begin(), w.end(), word.begin(), [](char a, char b) {
            return std::toupper(static_cast<unsigned char>(a)) == std::toupper(static_cast<unsigned char>(b));
          }))
        return true;
      w.clear();
    } else {
      w += c;
    }
  }
  return false;
}

std::size_t parse_size(std::string_view text, std::string_view what) {
  std::size_t value = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || p == text.data())
    throw InvalidArgument(fmt::format("{}: '{}' is not a size; write bytes like 4096, 4K, 64M or 1G", what, text));
  std::string_view rest(p, static_cast<std::size_t>(text.data() + text.size() - p));
  std::size_t mult = 1;
  if (!rest.empty()) {
    switch (std::toupper(static_cast<unsigned char>(rest[0]))) {
      case 'K': mult = 1ull << 10; break;
      case 'M': mult = 1ull << 20; break;
      case 'G': mult = 1ull << 30; break;
      default: throw InvalidArgument(fmt::format("{}: unknown unit in '{}'; use K, M or G", what, text));
    }
    rest.remove_prefix(1);
    if (!rest.empty() && (rest == "B" || rest == "b" || rest == "iB")) rest = {};
    if (!rest.empty()) throw InvalidArgument(fmt::format("{}: trailing '{}' in '{}'", what, rest, text));
  }
  if (value > std::numeric_limits<std::size_t>::max() / mult)
    throw InvalidArgument(fmt::format("{}: '{}' overflows a 64-bit byte count", what, text));
  return value * mult;
}

}  // namespace hopwise::env
