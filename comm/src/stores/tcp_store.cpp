// TcpStore: frames of [u32 length][bytes] over one connection per client (store_server.h says what they hold).
// The server is one thread polling the listening socket, its clients and a wake-up pipe, moving bytes between the
// sockets and store_server::Core; nothing a peer sends can end that thread. A client that timed out leaves a late
// reply behind, which the next request skips by its id.
#include "hopwise/comm/stores/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/core.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "hopwise/common/env.h"
#include "hopwise/common/error.h"
#include "hopwise/common/log.h"
#include "store_protocol.h"
#include "store_server.h"

namespace hopwise::comm {

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kMaxReply = 5 + store_protocol::kMaxValueBytes;

std::string errno_text() { return std::strerror(errno); }

// The server belongs to an earlier attempt of this rank's job: connect_and_introduce tries again.
struct ServesEarlierAttempt : TransportError {
  using TransportError::TransportError;
};

std::string text_of(const sockaddr_in& a) {
  char ip[INET_ADDRSTRLEN] = {0};
  ::inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
  return fmt::format("{}:{}", ip, ntohs(a.sin_port));
}

// Takes one whole reply frame off the front of `in`, if there is one.
bool take_frame(std::string& in, std::string& frame, const std::string& from) {
  if (in.size() < 4) return false;
  std::uint32_t n = 0;
  std::memcpy(&n, in.data(), 4);
  if (n > kMaxReply) throw TransportError(fmt::format("store: {} sent a {}-byte reply; not a hopwise store", from, n));
  if (in.size() < 4 + static_cast<std::size_t>(n)) return false;
  frame.assign(in, 4, n);
  in.erase(0, 4 + static_cast<std::size_t>(n));
  return true;
}

}  // namespace

TcpStoreOptions TcpStoreOptions::from_environment() {
  TcpStoreOptions o;
  o.bind = env::get_or("HOPWISE_STORE_BIND", "");
  o.token = env::get_or("HOPWISE_STORE_TOKEN", "");
  return o;
}

std::string TcpStore::resolve(const std::string& host) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res); rc != 0)
    throw InvalidArgument(
        fmt::format("store: cannot resolve '{}': {}; use a host name or IPv4 address every rank can "
                    "reach",
                    host, ::gai_strerror(rc)));
  sockaddr_in a{};
  std::memcpy(&a, res->ai_addr, sizeof a);
  ::freeaddrinfo(res);
  char ip[INET_ADDRSTRLEN] = {0};
  ::inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
  return ip;
}

struct TcpStore::Server {
  int listen_fd = -1, wake[2] = {-1, -1};
  std::thread thread;
  store_server::Core core;
  TcpStoreOptions options;
  Clock::time_point accept_again{};  // accepting pauses while strangers fill their share
  std::size_t max_strangers = 0;

  Server(const std::string& job, TcpStoreOptions o)
      : core(job, o.token, {1024, o.max_pending_output, o.hello_timeout}), options(std::move(o)) {
    // Strangers may hold a quarter of the process's descriptors at most.
    rlimit files{};
    ::getrlimit(RLIMIT_NOFILE, &files);
    const auto quarter = static_cast<std::size_t>(std::min<rlim_t>(files.rlim_cur, 1u << 20) / 4);
    max_strangers = std::max<std::size_t>(2, std::min(options.max_strangers, quarter));
  }

  void drop(int fd) {
    core.close(fd);
    ::close(fd);
  }

  // A real client introduces itself within milliseconds of connecting: one silent for longer may make way.
  static constexpr auto kGrace = std::chrono::seconds(1);

  // Whether a stranger may be let in now: under the cap, or after closing one that has been silent for kGrace.
  // Otherwise accepting pauses until the oldest's grace is over (the rest wait in the kernel's backlog, holding
  // none of this process's descriptors, which its transports need too).
  bool make_room(bool out_of_descriptors) {
    if (!out_of_descriptors && core.strangers() < max_strangers) return true;
    const int oldest = core.oldest_stranger();
    const auto now = Clock::now();
    if (oldest >= 0 && now - core.opened(oldest) >= kGrace) {
      core.warn(
          "room",
          fmt::format("store: {}; closed the connection from {}, silent for {:.1f} s",
                      out_of_descriptors
                          ? fmt::format("out of descriptors ({} connections open; raise `ulimit -n`?)", core.clients())
                          : fmt::format("{} connections have not introduced themselves", core.strangers()),
                      core.peer(oldest), std::chrono::duration<double>(now - core.opened(oldest)).count()));
      drop(oldest);
      return true;
    }
    accept_again = oldest >= 0 ? core.opened(oldest) + kGrace : now + std::chrono::milliseconds(100);
    return false;
  }

  void accept_all() {
    for (int i = 0; i < 64; ++i) {
      if (!make_room(false)) return;
      sockaddr_in a{};
      socklen_t len = sizeof a;
      const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&a), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          core.warn("accept", fmt::format("store: cannot accept a connection: {}", errno_text()));
          if (make_room(true)) continue;
        }
        return;  // EAGAIN: none left; anything else: try again on the next wake
      }
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      core.open(fd, text_of(a), Clock::now());
    }
  }

  void serve(int fd, short revents, char* buf, std::size_t size) {
    bool gone = (revents & (POLLERR | POLLHUP | POLLNVAL)) && !(revents & POLLIN);
    if ((revents & POLLIN) && core.wants_input(fd)) {
      const ssize_t n = ::read(fd, buf, size);
      if (n > 0)
        core.receive(fd, buf, static_cast<std::size_t>(n));
      else if (n == 0 || (errno != EAGAIN && errno != EINTR))
        gone = true;
    }
    while (!gone) {
      const std::string_view out = core.pending(fd);
      if (out.empty()) break;
      const ssize_t n = ::send(fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        core.sent(fd, static_cast<std::size_t>(n));
      } else {
        gone = errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
        break;
      }
    }
    if (gone || core.finished(fd)) drop(fd);
  }

  // One round: wait for sockets or a deadline, then accept, read, send and expire. False once asked to stop.
  bool round(std::vector<pollfd>& fds, std::vector<char>& buf) {
    const auto now = Clock::now();
    const bool accepting = now >= accept_again;
    fds.clear();
    fds.push_back({wake[0], POLLIN, 0});
    fds.push_back({listen_fd, static_cast<short>(accepting ? POLLIN : 0), 0});
    for (int fd : core.client_ids()) {
      const short events =
          static_cast<short>((core.wants_input(fd) ? POLLIN : 0) | (core.pending(fd).empty() ? 0 : POLLOUT));
      fds.push_back({fd, events, 0});
    }
    auto until = core.next_deadline();
    if (!accepting) until = std::min(until, accept_again);
    int wait_ms = -1;
    if (until != Clock::time_point::max())
      wait_ms = static_cast<int>(std::clamp<long long>(
          std::chrono::duration_cast<std::chrono::milliseconds>(until - now).count() + 1, 0, 60'000));
    if (::poll(fds.data(), fds.size(), wait_ms) < 0 && errno != EINTR) throw TransportError("poll: " + errno_text());
    if (fds[0].revents) return false;
    for (std::size_t i = 2; i < fds.size(); ++i)
      if (fds[i].revents) serve(fds[i].fd, fds[i].revents, buf.data(), buf.size());
    if (fds[1].revents & POLLIN) accept_all();
    for (int fd : core.expire(Clock::now())) ::close(fd);
    return true;
  }

  void loop() {
    std::vector<pollfd> fds;
    std::vector<char> buf(64u << 10);
    for (;;) {
      try {
        if (!round(fds, buf)) return;
      } catch (const std::exception& e) {  // never ends the server: a round that failed is tried again
        core.warn("round", fmt::format("store: the server's round failed: {}", e.what()));
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      } catch (...) {
        core.warn("round", "store: the server's round failed");
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  }

  ~Server() {
    if (wake[1] >= 0) {
      const ssize_t woken = ::write(wake[1], "x", 1);  // a pipe with room: this does not fail
      (void)woken;
    }
    if (thread.joinable()) thread.join();
    for (int fd : core.client_ids()) ::close(fd);
    for (int fd : {listen_fd, wake[0], wake[1]})
      if (fd >= 0) ::close(fd);
  }
};

TcpStore::TcpStore(std::string host, int port, bool serve, std::string job, Seconds timeout, TcpStoreOptions options)
    : host_(std::move(host)), port_(port), timeout_(timeout), token_(options.token) {
  if (port < 0 || port > 65535)
    throw InvalidArgument(fmt::format("store: port {} is not a TCP port; use 0..65535 (0: any free port)", port));
  if (options.ports < 1 || options.ports > 1024 || port + options.ports - 1 > 65535)
    throw InvalidArgument(fmt::format("store: a span of {} ports from {} does not fit; use 1..1024 ports up to 65535",
                                      options.ports, port));
  last_port_ = port == 0 ? 0 : port + options.ports - 1;
  if (const auto hello = store_protocol::pack({store_protocol::kHello, 0, 0, {token_}, job}); hello.size() > 1000)
    throw InvalidArgument(
        fmt::format("store: the job's name and token take {} bytes; together they may take at most "
                    "about 1000 (shorten TORCHELASTIC_RUN_ID or HOPWISE_STORE_TOKEN)",
                    hello.size()));
  if (serve) {
    const std::string bind_ip = options.bind.empty() ? resolve(host_) : resolve(options.bind);
    server_ = std::make_unique<Server>(job, options);
    Server& s = *server_;
    s.listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s.listen_fd < 0) throw TransportError("store: socket: " + errno_text());
    const int one = 1;
    ::setsockopt(s.listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    ::inet_pton(AF_INET, bind_ip.c_str(), &a.sin_addr);
    int err = 0;
    for (int p = port; p <= last_port_; ++p) {  // a failed bind leaves the socket unbound: try the next port
      a.sin_port = htons(static_cast<std::uint16_t>(p));
      err = ::bind(s.listen_fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 ? 0 : errno;
      if (err != EADDRINUSE) break;
    }
    if (err == 0 && ::listen(s.listen_fd, 1024) != 0) err = errno;
    if (err != 0)
      throw TransportError(fmt::format(
          "store: cannot serve on {}:{}{}{}: {} ({})", bind_ip, port,
          last_port_ > port ? fmt::format(" or any port up to {}", last_port_) : std::string(),
          options.bind.empty() ? fmt::format(" (the address '{}' resolves to)", host_) : std::string(),
          std::strerror(err),
          err == EADDRNOTAVAIL ? "is this rank on that host? HOPWISE_STORE_BIND=0.0.0.0 listens on every interface"
                               : "another job there? pick another port"));
    socklen_t len = sizeof a;
    ::getsockname(s.listen_fd, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = last_port_ = ntohs(a.sin_port);  // this rank's own connection goes straight to it
    if (::pipe2(s.wake, O_CLOEXEC) != 0) throw TransportError("store: pipe: " + errno_text());
    s.thread = std::thread([&s] { s.loop(); });
  }
  connect_and_introduce(job, timeout);
}

namespace {

// connect() within `limit` (a blocking one waits out the kernel's SYN retries, minutes, where a firewall drops
// them); the socket is blocking again afterwards. 0 or the errno.
int connect_within(int fd, const sockaddr_in& a, std::chrono::milliseconds limit) {
  const int flags = ::fcntl(fd, F_GETFL);
  ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  int err = ::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0 ? 0 : errno;
  if (err == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::max<long long>(limit.count(), 1)));
    socklen_t len = sizeof err;
    if (ready <= 0)
      err = ETIMEDOUT;
    else if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
      err = errno;
  }
  ::fcntl(fd, F_SETFL, flags);
  return err;
}

}  // namespace

bool TcpStore::introduce_at(const std::string& ip, int port, bool span, const std::string& job,
                            Clock::time_point deadline, std::string& why, bool& earlier_attempt) {
  port_ = port;  // as errors name it
  sockaddr_in a{};
  a.sin_family = AF_INET;
  ::inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  earlier_attempt = false;
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) {
    why = "socket: " + errno_text();
    return false;
  }
  auto left = [&] { return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()); };
  // With a span, a port that answers slowly or not as the job's server costs a few seconds, not the whole wait.
  const auto per_port = std::chrono::milliseconds(span ? 5000 : 60000);
  if (const int err = connect_within(fd_, a, std::max(std::min(left(), per_port), std::chrono::milliseconds(100)));
      err != 0) {
    why = fmt::format("port {}: {}", port, std::strerror(err));
  } else {
    const int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    const Seconds hello_limit = span ? std::min<Seconds>(left(), std::chrono::milliseconds(per_port)) : left();
    try {
      call(store_protocol::kHello, token_.empty() ? std::vector<std::string>{} : std::vector{token_}, job, 0,
           std::max(hello_limit, Seconds(0.1)));
      return true;
    } catch (const ServesEarlierAttempt& e) {
      why = e.what();
      earlier_attempt = true;
    } catch (const TransportError& e) {
      why = e.what();
    } catch (const Error& e) {  // another job's server, a wrong token, no answer: final where there is one port
      if (!span) throw;
      why = e.what();
    }
  }
  ::close(fd_);
  fd_ = -1;
  inbox_.clear();
  return false;
}

// Connects, retrying while nobody listens yet (rank 0 may start last), while the server closes this connection
// before answering (it was full of connections that never introduced themselves), or while it still serves an
// earlier attempt of this job (this rank's launcher restarted it before the others'). With a span of ports each is
// tried in turn on every pass.
void TcpStore::connect_and_introduce(const std::string& job, Seconds timeout) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout);
  const std::string ip = resolve(host_);  // a name that does not resolve is an InvalidArgument, not a wait
  const int first = port_, last = last_port_;
  auto pause = std::chrono::milliseconds(10);
  std::string last_why;
  bool earlier_attempt = false;
  for (;;) {
    for (int p = first; p <= last; ++p) {
      bool earlier = false;
      if (introduce_at(ip, p, last > first, job, deadline, last_why, earlier)) return;
      earlier_attempt = earlier_attempt || earlier;
    }
    if (Clock::now() + pause > deadline) {
      const std::string where =
          last > first ? fmt::format("tcp://{}:{}-{}", host_, first, last) : fmt::format("tcp://{}:{}", host_, first);
      if (earlier_attempt)
        throw TimeoutError(fmt::format("{} (waited {:.1f} s; did that attempt's rank 0 not fail? raise "
                                       "HOPWISE_TIMEOUT_S if it is only slow)",
                                       last_why, timeout.count()),
                           {0});
      throw TimeoutError(fmt::format("store: nobody serves {} (tried for {:.1f} s, last: {}); is rank 0 up, and is "
                                     "this its address? (raise HOPWISE_TIMEOUT_S if it is only slow)",
                                     where, timeout.count(), last_why),
                         {0});
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
  }
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
  server_.reset();
}

std::string TcpStore::address() const { return fmt::format("tcp://{}:{}", host_, port_); }

std::string TcpStore::listening_on() const {
  if (!server_) return {};
  sockaddr_in a{};
  socklen_t len = sizeof a;
  ::getsockname(server_->listen_fd, reinterpret_cast<sockaddr*>(&a), &len);
  return text_of(a);
}

std::string TcpStore::call(int op, const std::vector<std::string>& keys, const std::string& value, std::int64_t delta,
                           Seconds timeout) {
  std::lock_guard lock(mutex_);
  const std::int32_t id = next_id_++;
  const std::string request = store_protocol::pack({op, id, delta, keys, value});  // checks the limits first
  std::string out(4, '\0');
  const auto n32 = static_cast<std::uint32_t>(request.size());
  std::memcpy(out.data(), &n32, 4);
  out += request;
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
    while (take_frame(inbox_, frame, address())) {
      if (frame.size() < 5) throw TransportError(fmt::format("store: a malformed reply from {}", address()));
      std::int32_t got = 0;
      std::memcpy(&got, frame.data(), 4);
      if (got != id) continue;                        // the late answer to a request that timed out
      if (frame[4] == store_server::kEarlierAttempt)  // retried by connect_and_introduce
        throw ServesEarlierAttempt(fmt::format("store {}: {}", address(), frame.substr(5)));
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
          fmt::format("store: {} closed the connection (rank 0 gone, or it refused this rank)", address()));
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
  const std::string reply = call(store_protocol::kAdd, {key}, {}, delta, timeout_);
  if (const auto v = store_protocol::parse_integer(reply)) return *v;
  throw TransportError(
      fmt::format("store {}: add on '{}' returned '{}', not an integer", address(), key, reply.substr(0, 40)));
}
bool TcpStore::check(const std::vector<std::string>& keys) {
  return call(store_protocol::kCheck, keys, {}, 0, timeout_) == "1";
}

}  // namespace hopwise::comm
