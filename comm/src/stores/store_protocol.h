// What the served stores (MpiStore, TcpStore) share: the request as it travels, and the table the serving rank
// keeps (the keys, and the gets and waits parked until a set completes them). One implementation of the store's
// meaning, whatever carries the bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace hopwise::comm::store_protocol {

enum Op : std::int32_t { kSet = 1, kGet = 2, kWait = 3, kAdd = 4, kCheck = 5, kHello = 6 };

struct Request {
  std::int32_t op = 0;
  std::int32_t id = 0;  // echoed in the reply, so that a late reply to a request that timed out is recognized
  std::int64_t delta = 0;
  std::vector<std::string> keys;
  std::string value;
};

std::string pack(const Request& r);
// Throws Error for bytes that are not a request.
Request unpack(const std::string& bytes);

class Table {
 public:
  using Reply = std::function<void(int client, const Request& r, std::string value)>;
  // Handles `r` from `client`: replies at once, or parks a get or wait until a later set or add completes it.
  void handle(int client, Request r, const Reply& reply);
  // The client went away: its parked requests go too.
  void drop(int client);

 private:
  bool ready(const Request& r) const;
  void answer(int client, const Request& r, const Reply& reply) const;
  std::map<std::string, std::string> values_;
  std::vector<std::pair<int, Request>> parked_;
};

}  // namespace hopwise::comm::store_protocol
