#include "store_protocol.h"

#include <cstring>

#include "hopwise/common/error.h"

namespace hopwise::comm::store_protocol {

// op, id, delta, key count, then (length, bytes) per key, then (length, bytes) of the value.
std::string pack(const Request& r) {
  std::string b;
  auto put = [&](const void* p, std::size_t n) { b.append(static_cast<const char*>(p), n); };
  auto put_string = [&](const std::string& s) {
    const auto n = static_cast<std::uint32_t>(s.size());
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

Request unpack(const std::string& b) {
  Request r;
  std::size_t at = 0;
  auto get = [&](void* p, std::size_t n) {
    if (at + n > b.size()) throw Error("store: a malformed request (cut short) reached the serving rank");
    std::memcpy(p, b.data() + at, n);
    at += n;
  };
  auto get_string = [&] {
    std::uint32_t n = 0;
    get(&n, 4);
    if (n > b.size() - at) throw Error("store: a malformed request (string past its end) reached the serving rank");
    std::string s(b.data() + at, n);
    at += n;
    return s;
  };
  std::uint32_t nk = 0;
  get(&r.op, 4);
  get(&r.id, 4);
  get(&r.delta, 8);
  get(&nk, 4);
  if (nk > b.size()) throw Error("store: a malformed request (key count) reached the serving rank");
  for (std::uint32_t i = 0; i < nk; ++i) r.keys.push_back(get_string());
  r.value = get_string();
  if (r.op < kSet || r.op > kHello || ((r.op == kSet || r.op == kGet || r.op == kAdd) && r.keys.size() != 1))
    throw Error("store: a malformed request (operation) reached the serving rank");
  return r;
}

bool Table::ready(const Request& r) const {
  for (const auto& k : r.keys)
    if (!values_.count(k)) return false;
  return true;
}

void Table::answer(int client, const Request& r, const Reply& reply) const {
  reply(client, r, r.op == kGet ? values_.at(r.keys.front()) : std::string());
}

void Table::handle(int client, Request r, const Reply& reply) {
  switch (r.op) {
    case kSet:
      values_[r.keys.front()] = r.value;
      reply(client, r, {});
      break;
    case kAdd: {
      std::string& s = values_[r.keys.front()];
      const std::int64_t v = (s.empty() ? 0 : std::stoll(s)) + r.delta;
      s = std::to_string(v);
      reply(client, r, s);
      break;
    }
    case kCheck: reply(client, r, ready(r) ? "1" : "0"); return;
    case kHello: reply(client, r, {}); return;
    default:
      if (ready(r))
        answer(client, r, reply);
      else
        parked_.emplace_back(client, std::move(r));
      return;
  }
  for (std::size_t i = 0; i < parked_.size();) {  // a set or add may complete parked requests
    if (ready(parked_[i].second)) {
      answer(parked_[i].first, parked_[i].second, reply);
      parked_.erase(parked_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
}

void Table::drop(int client) {
  std::erase_if(parked_, [&](const auto& p) { return p.first == client; });
}

}  // namespace hopwise::comm::store_protocol
