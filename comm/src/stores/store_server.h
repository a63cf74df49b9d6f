// The TCP store's server without its sockets: what each connection has sent, what it is owed, and when it must go.
// TcpStore's thread moves bytes between this and the sockets; the fuzz target (tests/fuzz/fuzz_store_server.cpp)
// drives it directly. It assumes every peer may be hostile: a connection must introduce itself (its job, and the
// token when the store has one) in a small first frame within a few seconds; after that frames are capped by the
// request limits, what it may leave parked by the table's (store_protocol::Table: keys per wait, waits per client),
// and a client that does not read its replies is not read from until it has caught up.
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "store_protocol.h"

namespace hopwise::comm::store_server {

using Clock = std::chrono::steady_clock;

struct Limits {
  std::size_t hello_bytes = 1024;          // the largest frame a connection may send before it has introduced itself
  std::size_t pending_output = 64u << 20;  // past this much unsent reply, stop reading the client
  std::chrono::duration<double> hello_timeout{5.0};  // time to introduce itself after connecting
};

// Warns at most once per `every` per kind of event, counting what it held back.
class RateLimitedWarning {
 public:
  static RateLimitedWarning& process_wide();
  explicit RateLimitedWarning(std::chrono::duration<double> every = std::chrono::seconds(10)) : every_(every) {}
  void operator()(const std::string& kind, const std::string& message);

 private:
  struct Seen {
    Clock::time_point last;
    std::size_t held = 0;
  };
  std::chrono::duration<double> every_;
  std::mutex mutex_;
  std::map<std::string, Seen> seen_;
};

// Frames: [u32 length][bytes]. A reply's bytes are [i32 request id][u8 status][value or reason]; status 0 ok, 1
// refused, kEarlierAttempt refused because this server belongs to an earlier attempt of the client's job (retry).
constexpr char kEarlierAttempt = 2;

class Core {
 public:
  Core(std::string job, std::string token, Limits limits);

  // A new connection, `peer` its address for warnings.
  void open(int client, std::string peer, Clock::time_point now);
  // Bytes read from `client`. Never throws: what goes wrong closes that client (with a warning).
  void receive(int client, const char* data, std::size_t n);
  // The next bytes owed to `client` (empty when none), and that `n` of them were sent.
  std::string_view pending(int client) const;
  void sent(int client, std::size_t n);
  // Whether to read from `client` now: it is not closing, and its unsent replies are under the cap.
  bool wants_input(int client) const;
  // Bytes of replies it has not taken yet, and whether it has introduced itself.
  std::size_t unsent(int client) const;
  bool introduced(int client) const;
  // Whether its socket should be closed now: it was refused or broke the protocol, and its last reply went.
  bool finished(int client) const;
  // Its socket is gone.
  void close(int client);
  // Closes connections that did not introduce themselves in time (their sockets must be closed); returns them.
  std::vector<int> expire(Clock::time_point now);
  // When the next connection's introduction falls due (Clock::time_point::max() when none waits).
  Clock::time_point next_deadline() const;
  // The connection that has waited longest without introducing itself, or -1: the first to go when room is short.
  int oldest_stranger() const;
  Clock::time_point opened(int client) const { return clients_.at(client).opened; }
  std::size_t clients() const { return clients_.size(); }
  std::vector<int> client_ids() const;
  std::size_t strangers() const;
  const std::string& peer(int client) const;
  // For the socket side's own warnings (accept failing, a full table of connections).
  void warn(const std::string& kind, const std::string& message) { warning_(kind, message); }

 private:
  struct Client {
    std::string peer;
    Clock::time_point opened;
    bool introduced = false, closing = false;
    std::string in;
    std::size_t in_at = 0;                                          // bytes of `in` already taken
    std::deque<std::pair<store_protocol::Value, std::size_t>> out;  // chunks owed, with the offset sent of the first
    std::size_t out_bytes = 0;
  };
  void on_frame(int id, Client& c, std::string_view frame);
  void push_reply(Client& c, std::int32_t request_id, bool ok, const store_protocol::Value& value);
  void push_status(Client& c, std::int32_t request_id, char status, const store_protocol::Value& value);
  void refuse(Client& c, std::int32_t request_id, const std::string& why, char status = 1);
  void refuse_other_job(Client& c, std::int32_t request_id, const std::string& theirs);
  void abandon(Client& c);
  std::string job_, token_;
  Limits limits_;
  std::map<int, Client> clients_;
  store_protocol::Table table_;
  RateLimitedWarning& warning_;  // one for the process: a flood across servers still prints a line per 10 s
};

}  // namespace hopwise::comm::store_server
