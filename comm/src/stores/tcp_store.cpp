// TcpStore: frames of [u32 length][bytes] over one connection per client. A request is store_protocol's; a reply
// is [i32 request id][u8 status: 0 ok, 1 refused][bytes]. The server is one thread polling the listening socket,
// its clients and a wake-up pipe; what it writes waits in a per-client buffer, so a client that stopped reading
// never stalls it. A client that timed out leaves a late reply behind, which the next request skips by its id.
#include "hopwise/comm/stores/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/core.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>

#include "hopwise/common/error.h"
#include "store_protocol.h"

namespace hopwise::comm {

namespace {

using Clock = std::chrono::steady_clock;
using StoreRequest = store_protocol::Request;
constexpr std::uint32_t kMaxFrame = 1u << 30;

std::string errno_text() { return std::strerror(errno); }

void append_frame(std::string& out, const std::string& payload) {
  const auto n = static_cast<std::uint32_t>(payload.size());
  out.append(reinterpret_cast<const char*>(&n), 4);
  out += payload;
}

// Takes one whole frame off the front of `in`, if there is one.
bool take_frame(std::string& in, std::string& frame) {
  if (in.size() < 4) return false;
  std::uint32_t n = 0;
  std::memcpy(&n, in.data(), 4);
  if (n > kMaxFrame) throw Error(fmt::format("store: a {}-byte frame is past the limit; not a hopwise store peer", n));
  if (in.size() < 4 + static_cast<std::size_t>(n)) return false;
  frame.assign(in, 4, n);
  in.erase(0, 4 + static_cast<std::size_t>(n));
  return true;
}

std::string reply_payload(std::int32_t id, bool ok, const std::string& bytes) {
  std::string p(reinterpret_cast<const char*>(&id), 4);
  p.push_back(ok ? 0 : 1);
  return p + bytes;
}

}  // namespace

struct TcpStore::Server {
  int listen_fd = -1, wake[2] = {-1, -1};
  std::string job;
  std::thread thread;
  struct Client {
    std::string in, out;
    bool introduced = false, closing = false;
  };
  std::map<int, Client> clients;  // by socket
  store_protocol::Table table;

  void reply(int fd, const StoreRequest& r, bool ok, const std::string& bytes) {
    auto it = clients.find(fd);
    if (it != clients.end()) append_frame(it->second.out, reply_payload(r.id, ok, bytes));
  }

  void on_frame(int fd, Client& c, const std::string& frame) {
    StoreRequest r;
    try {
      r = store_protocol::unpack(frame);
    } catch (const Error&) {
      c.closing = true;
      return;
    }
    if (!c.introduced) {
      if (r.op != store_protocol::kHello) {
        c.closing = true;
        return;
      }
      if (r.value != job) {
        reply(fd, r, false,
              fmt::format("this store serves job '{}', not '{}' (a port reused by another job?)", job, r.value));
        c.closing = true;
        return;
      }
      c.introduced = true;
    }
    table.handle(fd, std::move(r), [this](int to, const StoreRequest& q, std::string v) { reply(to, q, true, v); });
  }

  void loop() {
    std::vector<pollfd> fds;
    char buf[64 << 10];
    for (;;) {
      fds.clear();
      fds.push_back({wake[0], POLLIN, 0});
      fds.push_back({listen_fd, POLLIN, 0});
      for (auto& [fd, c] : clients) fds.push_back({fd, static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
      if (::poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) return;
      if (fds[0].revents) return;  // shutting down
      if (fds[1].revents & POLLIN) {
        const int fd = ::accept(listen_fd, nullptr, nullptr);
        if (fd >= 0) {
          const int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          ::fcntl(fd, F_SETFL, O_NONBLOCK);
          clients[fd];
        }
      }
      for (std::size_t i = 2; i < fds.size(); ++i) {
        const int fd = fds[i].fd;
        auto it = clients.find(fd);
        if (it == clients.end()) continue;
        Client& c = it->second;
        bool gone = (fds[i].revents & (POLLERR | POLLHUP | POLLNVAL)) && !(fds[i].revents & POLLIN);
        if (fds[i].revents & POLLIN) {
          const ssize_t n = ::read(fd, buf, sizeof buf);
          if (n <= 0)
            gone = true;
          else
            c.in.append(buf, static_cast<std::size_t>(n));
          std::string frame;
          try {
            while (!c.closing && take_frame(c.in, frame)) on_frame(fd, c, frame);
          } catch (const Error&) {
            c.closing = true;
          }
        }
        if (!c.out.empty()) {
          const ssize_t n = ::send(fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
          if (n > 0)
            c.out.erase(0, static_cast<std::size_t>(n));
          else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            gone = true;
        }
        if (gone || (c.closing && c.out.empty())) {
          table.drop(fd);
          ::close(fd);
          clients.erase(it);
        }
      }
    }
  }

  ~Server() {
    if (wake[1] >= 0) {
      const ssize_t woken = ::write(wake[1], "x", 1);  // a pipe with room: this does not fail
      (void)woken;
    }
    if (thread.joinable()) thread.join();
    for (auto& [fd, c] : clients) ::close(fd);
    for (int fd : {listen_fd, wake[0], wake[1]})
      if (fd >= 0) ::close(fd);
  }
};

TcpStore::TcpStore(std::string host, int port, bool serve, std::string job, Seconds timeout)
    : host_(std::move(host)), port_(port), timeout_(timeout) {
  if (port < 0 || port > 65535)
    throw InvalidArgument(fmt::format("store: port {} is not a TCP port; use 0..65535 (0: any free port)", port));
  if (serve) {
    server_ = std::make_unique<Server>();
    server_->job = job;
    Server& s = *server_;
    s.listen_fd = ::socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    ::setsockopt(s.listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    if (::bind(s.listen_fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(s.listen_fd, 256) != 0)
      throw TransportError(
          fmt::format("store: cannot serve on port {}: {} (another job there? pick another port)", port, errno_text()));
    socklen_t len = sizeof a;
    ::getsockname(s.listen_fd, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    if (::pipe(s.wake) != 0) throw TransportError("store: pipe: " + errno_text());
    s.thread = std::thread([&s] { s.loop(); });
  }
  // Connect, retrying while nobody listens yet (rank 0 may start last).
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout);
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (const int rc = ::getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &res); rc != 0)
    throw InvalidArgument(
        fmt::format("store: cannot resolve '{}': {}; use a host name or address every rank can "
                    "reach",
                    host_, ::gai_strerror(rc)));
  auto pause = std::chrono::milliseconds(10);
  std::string last;
  for (;;) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(fd_, res->ai_addr, res->ai_addrlen) == 0) break;
    last = errno_text();
    ::close(fd_);
    fd_ = -1;
    if (Clock::now() + pause > deadline) {
      ::freeaddrinfo(res);
      throw TimeoutError(fmt::format("store: nobody serves {} (tried for {:.1f} s, last: {}); is rank 0 up, and is "
                                     "this its address? (raise HOPWISE_TIMEOUT_S if it is only slow)",
                                     address(), timeout.count(), last),
                         {0});
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
  }
  ::freeaddrinfo(res);
  const int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  call(store_protocol::kHello, {}, job, 0, timeout);
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
  server_.reset();
}

std::string TcpStore::address() const { return fmt::format("tcp://{}:{}", host_, port_); }

std::string TcpStore::call(int op, const std::vector<std::string>& keys, const std::string& value, std::int64_t delta,
                           Seconds timeout) {
  std::lock_guard lock(mutex_);
  const std::int32_t id = next_id_++;
  std::string out;
  append_frame(out, store_protocol::pack({op, id, delta, keys, value}));
  for (std::size_t at = 0; at < out.size();) {
    const ssize_t n = ::send(fd_, out.data() + at, out.size() - at, MSG_NOSIGNAL);
    if (n <= 0)
      throw TransportError(fmt::format("store: sending to {} failed: {} (rank 0 gone?)", address(), errno_text()));
    at += static_cast<std::size_t>(n);
  }
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout);
  std::string frame;
  char buf[64 << 10];
  for (;;) {
    while (take_frame(inbox_, frame)) {
      if (frame.size() < 5) throw TransportError(fmt::format("store: a malformed reply from {}", address()));
      std::int32_t got = 0;
      std::memcpy(&got, frame.data(), 4);
      if (got != id) continue;  // the late answer to a request that timed out
      if (frame[4] != 0) throw Error(fmt::format("store {}: {}", address(), frame.substr(5)));
      return frame.substr(5);
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      std::string list;
      for (const auto& k : keys) list += (list.empty() ? "'" : ", '") + k + "'";
      throw TimeoutError(fmt::format("store {}: no answer for {} within {:.1f} s: the key is not set, or rank 0 is "
                                     "stalled (raise HOPWISE_TIMEOUT_S if it is only slow)",
                                     address(), list.empty() ? "the introduction" : list, timeout.count()),
                         {0});
    }
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000))) <= 0) continue;
    const ssize_t n = ::read(fd_, buf, sizeof buf);
    if (n <= 0)
      throw TransportError(
          fmt::format("store: {} closed the connection (rank 0 gone, or it refused this job)", address()));
    inbox_.append(buf, static_cast<std::size_t>(n));
  }
}

void TcpStore::set(const std::string& key, const std::string& value) {
  call(store_protocol::kSet, {key}, value, 0, timeout_);
}
std::string TcpStore::get(const std::string& key, Seconds timeout) {
  return call(store_protocol::kGet, {key}, {}, 0, timeout);
}
void TcpStore::wait(const std::vector<std::string>& keys, Seconds timeout) {
  call(store_protocol::kWait, keys, {}, 0, timeout);
}
std::int64_t TcpStore::add(const std::string& key, std::int64_t delta) {
  return std::stoll(call(store_protocol::kAdd, {key}, {}, delta, timeout_));
}
bool TcpStore::check(const std::vector<std::string>& keys) {
  return call(store_protocol::kCheck, keys, {}, 0, timeout_) == "1";
}

}  // namespace hopwise::comm
