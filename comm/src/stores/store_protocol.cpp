#include "store_protocol.h"

#include <fmt/core.h>

#include <charconv>
#include <cstring>

#include "hopwise/common/error.h"

namespace hopwise::comm::store_protocol {

namespace {

std::string shown(const std::string& key) { return key.size() <= 80 ? key : key.substr(0, 80) + "..."; }

}  // namespace

std::string too_many_wait_keys(std::size_t keys) {
  return fmt::format(
      "a wait for {} keys; one wait may name at most {} keys (kMaxWaitKeys): wait for them in parts "
      "of at most {} keys each",
      keys, kMaxWaitKeys, kMaxWaitKeys);
}

void check_limits(const Request& r) {
  if (r.keys.size() > kMaxKeys)
    throw InvalidArgument(fmt::format("store: {} keys in one request; the limit is {}", r.keys.size(), kMaxKeys));
  if (r.op == kWait && r.keys.size() > kMaxWaitKeys)
    throw InvalidArgument("store: " + too_many_wait_keys(r.keys.size()));
  std::size_t total = 0;
  for (const auto& k : r.keys) {
    if (k.size() > kMaxKeyBytes)
      throw InvalidArgument(fmt::format("store: key '{}' is {} bytes; a key may have at most {} bytes", shown(k),
                                        k.size(), kMaxKeyBytes));
    total += 4 + k.size();
  }
  if (total > kMaxKeyListBytes)
    throw InvalidArgument(
        fmt::format("store: the keys of one request take {} bytes; the limit is {}", total, kMaxKeyListBytes));
  if (r.value.size() > kMaxValueBytes)
    throw InvalidArgument(fmt::format(
        "store: the value of key '{}' is {} bytes; a value may have at most {} bytes "
        "({} MiB): send it in parts under several keys",
        r.keys.empty() ? std::string() : shown(r.keys.front()), r.value.size(), kMaxValueBytes, kMaxValueBytes >> 20));
}

std::string pack(const Request& r) {
  check_limits(r);
  return pack_unchecked(r);
}

// op, id, delta, key count, then (length, bytes) per key, then (length, bytes) of the value.
std::string pack_unchecked(const Request& r) {
  std::string b;
  auto put = [&](const void* p, std::size_t n) { b.append(static_cast<const char*>(p), n); };
  auto put_string = [&](const std::string& s) {
    const auto n = static_cast<std::uint32_t>(s.size());  // within the limits pack() checks
    put(&n, 4);
    put(s.data(), s.size());
  };
  const auto nk = static_cast<std::uint32_t>(r.keys.size());
  put(&r.op, 4);
  put(&r.id, 4);
  put(&r.delta, 8);
  put(&nk, 4);
  for (const auto& k : r.keys) put_string(k);
  put_string(r.value);
  return b;
}

Request unpack(std::string_view b) {
  Request r;
  std::size_t at = 0;
  auto get = [&](void* p, std::size_t n) {
    if (n > b.size() - at) throw Error("store: a malformed request (cut short) reached the serving rank");
    std::memcpy(p, b.data() + at, n);
    at += n;
  };
  auto get_string = [&](std::size_t limit, const char* what) {
    std::uint32_t n = 0;
    get(&n, 4);
    if (n > b.size() - at) throw Error("store: a malformed request (string past its end) reached the serving rank");
    if (n > limit)
      throw Error(
          fmt::format("store: a request with a {}-byte {} (limit {}) reached the serving rank", n, what, limit));
    std::string s(b.data() + at, n);
    at += n;
    return s;
  };
  std::uint32_t nk = 0;
  get(&r.op, 4);
  get(&r.id, 4);
  get(&r.delta, 8);
  get(&nk, 4);
  if (nk > kMaxKeys || nk > (b.size() - at) / 4)
    throw Error("store: a malformed request (key count) reached the serving rank");
  r.keys.reserve(nk);
  for (std::uint32_t i = 0; i < nk; ++i) r.keys.push_back(get_string(kMaxKeyBytes, "key"));
  r.value = get_string(kMaxValueBytes, "value");
  if (at != b.size()) throw Error("store: a malformed request (bytes past its end) reached the serving rank");
  if (r.op < kSet || r.op > kHello || ((r.op == kSet || r.op == kGet || r.op == kAdd) && r.keys.size() != 1) ||
      (r.op == kHello && r.keys.size() > 1))
    throw Error("store: a malformed request (operation) reached the serving rank");
  return r;
}

std::string job_attempt(const std::string& job, int attempt) {
  return attempt ? fmt::format("{} (attempt {})", job, attempt) : job;
}

std::pair<std::string, int> split_attempt(const std::string& text) {
  constexpr std::string_view mark = " (attempt ";
  const auto at = text.rfind(mark);
  if (at == std::string::npos || text.back() != ')') return {text, 0};
  const auto n = parse_integer(text.substr(at + mark.size(), text.size() - 1 - at - mark.size()));
  if (!n || *n < 1 || *n >= (1 << 30)) return {text, 0};
  return {text.substr(0, at), static_cast<int>(*n)};
}

std::optional<std::int64_t> parse_integer(const std::string& text) {
  std::int64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [p, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || p != end || text.empty()) return std::nullopt;
  return v;
}

std::int64_t checked_add(const std::string& key, const std::string* now, std::int64_t delta, const std::string& where) {
  const std::optional<std::int64_t> was = now ? parse_integer(*now) : std::int64_t{0};
  if (!was)
    throw InvalidArgument(
        fmt::format("{}key '{}' holds a non-integer value ({} bytes); add works on keys that only "
                    "add has written",
                    where, shown(key), now->size()));
  std::int64_t sum = 0;
  if (__builtin_add_overflow(*was, delta, &sum))
    throw InvalidArgument(fmt::format("{}adding {} to key '{}' (now {}) would overflow a 64-bit integer", where, delta,
                                      shown(key), *was));
  return sum;
}

}  // namespace hopwise::comm::store_protocol
