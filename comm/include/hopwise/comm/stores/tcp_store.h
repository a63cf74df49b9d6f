// A store over TCP: one rank (rank 0) serves the keys on a port of every interface, and every rank, the server's
// own included, is a client of that address. For jobs without MPI (torchrun, a test harness): the address is all
// the ranks need to know. Each client first names its job; a server of another job (a reused port) refuses it.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "hopwise/comm/store.h"

namespace hopwise::comm {

class TcpStore final : public Store {
 public:
  // serve: listen on `port` (0: the kernel picks one, see port()) and serve. Then connect to host:port, retrying
  // until `timeout` (TimeoutError naming the address when nobody serves it), and introduce this rank as one of
  // `job` (Error naming both jobs when the server belongs to another).
  TcpStore(std::string host, int port, bool serve, std::string job, Seconds timeout = Seconds(300));
  ~TcpStore() override;
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, Seconds timeout) override;
  void wait(const std::vector<std::string>& keys, Seconds timeout) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;

  int port() const { return port_; }
  // "tcp://host:port", as errors name it.
  std::string address() const;

 private:
  struct Server;
  std::string call(int op, const std::vector<std::string>& keys, const std::string& value, std::int64_t delta,
                   Seconds timeout);
  std::unique_ptr<Server> server_;
  std::string host_;
  int port_ = 0;
  int fd_ = -1;
  Seconds timeout_;
  std::mutex mutex_;  // one request at a time on this connection
  std::int32_t next_id_ = 1;
  std::string inbox_;  // bytes read past the last reply (a frame may arrive in pieces)
};

}  // namespace hopwise::comm
