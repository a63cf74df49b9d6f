// What the served stores (MpiStore, TcpStore) share: the request as it travels, its limits, and the table the
// serving rank keeps (the keys, and the gets and waits parked until a set completes them). One implementation of
// the store's meaning, whatever carries the bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace hopwise::comm::store_protocol {

enum Op : std::int32_t { kSet = 1, kGet = 2, kWait = 3, kAdd = 4, kCheck = 5, kHello = 6 };

// What one request may carry. A key as long as PyTorch's store allows; a value far above any address, topology
// or fingerprint the ranks exchange; enough keys to wait for every rank of a large job in one request.
constexpr std::size_t kMaxKeyBytes = 8u << 10;
constexpr std::size_t kMaxValueBytes = 256u << 20;
constexpr std::size_t kMaxKeys = 1u << 20;
constexpr std::size_t kMaxKeyListBytes = 64u << 20;  // all keys of one request together
constexpr std::size_t kHeaderBytes = 24;             // op, id, delta, key count
// What the serving rank parks. A wait names each rank's key at most (store_allgather): 64 Ki keys is four times the
// largest job the planner is sized for (16384 ranks). A client waits for one request at a time, so it has one get or
// wait parked, plus those it gave up on (timed out) whose keys were never set: past 64, its oldest is dropped.
constexpr std::size_t kMaxWaitKeys = 64u << 10;
constexpr std::size_t kMaxParkedPerClient = 64;
constexpr std::size_t kMaxRequestBytes = kHeaderBytes + kMaxKeyListBytes + 4 + kMaxValueBytes;

// A restarted job's rank introduces itself as `job (attempt N)`. The job's name and attempt, parsed back.
std::string job_attempt(const std::string& job, int attempt);
std::pair<std::string, int> split_attempt(const std::string& job_attempt);

struct Request {
  std::int32_t op = 0;
  std::int32_t id = 0;  // echoed in the reply, so that a late reply to a request that timed out is recognized
  std::int64_t delta = 0;
  std::vector<std::string> keys;
  std::string value;
};

// InvalidArgument naming the key and the limit when `r` is past one; a client checks before sending.
void check_limits(const Request& r);
// Why the server refuses a wait for `keys` keys (past kMaxWaitKeys), and what to do instead.
std::string too_many_wait_keys(std::size_t keys);
std::string pack(const Request& r);  // check_limits, then pack_unchecked
// The request's bytes without the checks: what a client that skipped them would send (the server's tests).
std::string pack_unchecked(const Request& r);
// Throws Error for bytes that are not a request, or one past the limits.
Request unpack(std::string_view bytes);

// The integer `text` holds ("-12"), or nothing when it holds anything else (spaces, a fraction, past int64).
std::optional<std::int64_t> parse_integer(const std::string& text);

// `delta` added to what key `key` holds (`now`, nullptr when unset); InvalidArgument naming the key when it holds
// something other than an integer or the sum would overflow. `where` prefixes the message (a file, say).
std::int64_t checked_add(const std::string& key, const std::string* now, std::int64_t delta,
                         const std::string& where = "");

using Value = std::shared_ptr<const std::string>;  // shared by the table and the replies that carry it

// The keys and the parked gets and waits. A parked request is listed under each key it still misses, and counts
// how many those are: a set or add looks only at the requests listed under its key, however many others are parked
// (one scan of every parked request's keys per set made a few clients parking large waits stall every rank).
class Table {
 public:
  // ok=false: the request was refused and `value` says why.
  using Reply = std::function<void(int client, const Request& r, bool ok, Value value)>;
  // Handles `r` from `client`: replies at once, or parks a get or wait until later sets or adds complete it.
  // A wait past kMaxWaitKeys is refused saying so. A client's request that would park past kMaxParkedPerClient
  // parks, and the client's oldest parked one is answered with an error naming the cap and dropped.
  void handle(int client, Request r, const Reply& reply);
  // The client went away: its parked requests go too, from every key they were listed under.
  void drop(int client);
  // Parked requests that sets and adds have looked at so far: the work they did for parked requests.
  std::uint64_t parked_visits() const { return parked_visits_; }
  std::size_t parked() const { return parked_.size(); }

 private:
  struct Parked {
    int client = 0;
    Request request;
    std::size_t missing = 0;  // its distinct keys not set yet
  };
  bool ready(const Request& r) const;
  void answer(int client, const Request& r, const Reply& reply) const;
  void get_or_wait(int client, Request r, const Reply& reply);
  void park(int client, Request r);
  void wake(const std::string& key, const Reply& reply);
  void unpark(std::uint64_t id);
  std::unordered_map<std::string, Value> values_;
  std::uint64_t next_parked_ = 0;
  std::unordered_map<std::uint64_t, Parked> parked_;
  std::unordered_map<std::string, std::set<std::uint64_t>> waiters_;  // a key's parked requests, in the order parked
  std::unordered_map<int, std::set<std::uint64_t>> parked_by_client_;
  std::uint64_t parked_visits_ = 0;
};

}  // namespace hopwise::comm::store_protocol
