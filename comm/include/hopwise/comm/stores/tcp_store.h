// A store over TCP: one rank (rank 0) serves the keys, and every rank, the server's own included, is a client of
// that address. For jobs without MPI (torchrun, a test harness): the address is all the ranks need to know. Each
// client first introduces itself with its job's name (and the job's token, when it has one); a server of another
// job (a reused port) refuses it. The server listens on the store host's own address unless told otherwise, and
// bounds what any connection can make it hold (README, "Trust and limits").
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "hopwise/comm/store.h"

namespace hopwise::comm {

struct TcpStoreOptions {
  // The address the serving rank listens on: empty for the store host's address as it resolves here, "0.0.0.0"
  // for every interface. HOPWISE_STORE_BIND.
  std::string bind;
  // A secret every rank of the job shares, checked when a client introduces itself; empty for none.
  // HOPWISE_STORE_TOKEN.
  std::string token;
  // How long a new connection may take to introduce itself before the server closes it.
  Store::Seconds hello_timeout{5.0};
  // Past this much of a client's replies unsent, the server stops reading that client until it catches up.
  std::size_t max_pending_output = 64u << 20;
  // Connections that have not introduced themselves yet (and at most a quarter of the process's descriptors); past
  // it one silent for a second is closed to make room, or accepting waits (the rest wait in the kernel's backlog).
  std::size_t max_strangers = 256;
  // Ports to look over, from the constructor's: the serving rank listens on the first free one, and the others
  // connect to each in turn until the job's own server answers. A launcher's port beside its own store (torchrun's
  // MASTER_PORT + 1) may be taken by another program's connection the moment the job starts.
  int ports = 1;
  // The options above from HOPWISE_STORE_BIND and HOPWISE_STORE_TOKEN (the rest as they are).
  static TcpStoreOptions from_environment();
};

class TcpStore final : public Store {
 public:
  // serve: listen on `port` (0: the kernel picks one, see port(); with options.ports > 1 the first free one of the
  // span) and serve. Then connect to host:port (each port of the span in turn), retrying until `timeout`
  // (TimeoutError naming the address when nobody serves it), and introduce this rank as one of `job` (with one
  // port: Error naming both jobs when the server belongs to another, or saying the token is wrong; with a span such a
  // server is passed over).
  TcpStore(std::string host, int port, bool serve, std::string job, Seconds timeout = Seconds(300),
           TcpStoreOptions options = {});
  ~TcpStore() override;
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  // Keys up to 8 KiB and values up to 256 MiB (InvalidArgument naming the key and the limit, before sending).
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, Seconds timeout) override;
  void wait(const std::vector<std::string>& keys, Seconds timeout) override;
  // Error naming the key when it holds text that is not an integer, or when the sum would overflow.
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;

  int port() const { return port_; }
  // "tcp://host:port", as errors name it.
  std::string address() const;
  // Where the server listens ("127.0.0.1:29500"); empty on a rank that does not serve.
  std::string listening_on() const;
  // The IPv4 address `host` resolves to here ("127.0.0.1"); InvalidArgument naming it when it does not.
  static std::string resolve(const std::string& host);

 private:
  struct Server;
  std::string call(int op, const std::vector<std::string>& keys, const std::string& value, std::int64_t delta,
                   Seconds timeout);
  void connect_and_introduce(const std::string& job, Seconds timeout);
  // Connects to ip:port and introduces this rank; false (with what went wrong in `why`) where it may yet succeed,
  // there or (span: more than one port) at another port.
  bool introduce_at(const std::string& ip, int port, bool span, const std::string& job,
                    std::chrono::steady_clock::time_point deadline, std::string& why, bool& earlier_attempt);
  std::unique_ptr<Server> server_;
  std::string host_;
  int port_ = 0;       // the port found (before that, the span's first)
  int last_port_ = 0;  // the span's last
  int fd_ = -1;
  Seconds timeout_;
  std::string token_;
  std::mutex mutex_;  // one request at a time on this connection
  std::int32_t next_id_ = 1;
  std::string inbox_;  // bytes read past the last reply (a frame may arrive in pieces)
};

}  // namespace hopwise::comm
