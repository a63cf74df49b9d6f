// hopwise-store-bench: how fast the TCP store's server answers set and add on unrelated keys while other clients
// keep waits parked on it (docs/results/store.md). Each row starts a server in this process, parks W waits of K keys
// each over raw connections (at most 50 waits per connection, under the server's cap per client), then times set
// and add from a TcpStore client of its own: the median latency per operation.
//
// By default every wait names K-1 keys that are already set and one that never is: the case that cost a scan of
// every parked wait's keys per set or add when the server kept its waits in one list. --all-missing names K unset
// keys instead.
#include <arpa/inet.h>
#include <fmt/core.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../comm/src/stores/store_protocol.h"
#include "hopwise/comm/stores/tcp_store.h"

namespace {

namespace hc = hopwise::comm;
namespace sp = hopwise::comm::store_protocol;
using Clock = std::chrono::steady_clock;

constexpr const char* kJob = "store-bench";
constexpr int kWaitsPerConnection = 50;

constexpr const char* kUsage = R"(usage: hopwise-store-bench [options]
  --waits LIST    comma list of parked waits W, default 0,20,200
  --keys LIST     comma list of keys per wait K, default 4096,50001
  --all-missing   every key a wait names is unset (default: all but its last are set)
  --budget S      seconds of timing per operation and row, default 2 (at least 5 operations each)
  -h              this help
Prints one row per (W, K): set and add median latency in microseconds.
)";

struct Options {
  std::vector<std::size_t> waits{0, 20, 200}, keys{4096, 50001};
  bool all_missing = false;
  double budget_s = 2.0;
};

std::vector<std::size_t> parse_list(const std::string& text) {
  std::vector<std::size_t> out;
  for (std::size_t at = 0; at <= text.size();) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    out.push_back(std::stoul(text.substr(at, comma - at)));
    at = comma + 1;
  }
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return std::string(argv[++i]);
    };
    if (a == "--waits")
      o.waits = parse_list(next());
    else if (a == "--keys")
      o.keys = parse_list(next());
    else if (a == "--all-missing")
      o.all_missing = true;
    else if (a == "--budget")
      o.budget_s = std::stod(next());
    else
      throw std::invalid_argument("unknown option " + a);
  }
  return o;
}

std::string framed(const sp::Request& r) {
  std::string body = sp::pack(r);
  const auto n = static_cast<std::uint32_t>(body.size());
  return std::string(reinterpret_cast<const char*>(&n), 4) + body;
}

// A connection that sends requests without waiting for their answers, as a client parking many waits does.
class RawClient {
 public:
  explicit RawClient(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) throw std::runtime_error("connect failed");
    send(framed({sp::kHello, 0, 0, {}, kJob}));
    expect_reply(0);
  }
  ~RawClient() { ::close(fd_); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  void send(const std::string& bytes) {
    for (std::size_t at = 0; at < bytes.size();) {
      const ssize_t n = ::send(fd_, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
      if (n <= 0) throw std::runtime_error("send failed");
      at += static_cast<std::size_t>(n);
    }
  }
  // Reads replies until the one to `id` (the server answers a connection's requests in order, parked ones aside).
  void expect_reply(std::int32_t id) {
    for (;;) {
      while (in_.size() >= 9) {
        std::uint32_t n = 0;
        std::int32_t got = 0;
        std::memcpy(&n, in_.data(), 4);
        if (in_.size() < 4 + std::size_t{n}) break;
        std::memcpy(&got, in_.data() + 4, 4);
        const char status = in_[8];
        const std::string why = in_.substr(9, n - 5);
        in_.erase(0, 4 + std::size_t{n});
        if (status != 0) throw std::runtime_error("the server refused a request: " + why);
        if (got == id) return;
      }
      char buf[1 << 16];
      const ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n <= 0) throw std::runtime_error("the server closed the connection");
      in_.append(buf, static_cast<std::size_t>(n));
    }
  }

 private:
  int fd_ = -1;
  std::string in_;
};

std::string present_key(std::size_t i) { return fmt::format("p{}", i); }

// Sets keys p0..p{n-1} in one burst, then waits for the last answer.
void set_present(int port, std::size_t n) {
  if (n == 0) return;
  RawClient c(port);
  std::string burst;
  for (std::size_t i = 0; i < n; ++i)
    burst += framed({sp::kSet, static_cast<std::int32_t>(i + 1), 0, {present_key(i)}, "v"});
  c.send(burst);
  c.expect_reply(static_cast<std::int32_t>(n));
}

// Parks `waits` waits of `keys` keys each; returns once the server holds all of them (a check sent after them on each
// connection has been answered).
std::vector<std::unique_ptr<RawClient>> park(int port, std::size_t waits, std::size_t keys, bool all_missing) {
  std::vector<std::unique_ptr<RawClient>> parkers;
  for (std::size_t w = 0; w < waits; ++w) {
    if (w % kWaitsPerConnection == 0) parkers.push_back(std::make_unique<RawClient>(port));
    sp::Request r{sp::kWait, static_cast<std::int32_t>(w + 1), 0, {}, ""};
    for (std::size_t k = 0; k + 1 < keys; ++k)
      r.keys.push_back(all_missing ? fmt::format("m{}/{}", w, k) : present_key(k));
    r.keys.push_back(fmt::format("never/{}", w));
    parkers.back()->send(framed(r));
  }
  for (auto& p : parkers) {
    p->send(framed({sp::kCheck, -1, 0, {"never"}, ""}));
    p->expect_reply(-1);
  }
  return parkers;
}

double median_us(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return t.empty() ? 0 : t[t.size() / 2];
}

// Times `op` until `budget_s` has passed (and at least 5 times, at most 20000).
template <typename Op>
double time_op(double budget_s, Op op) {
  std::vector<double> us;
  const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(budget_s));
  for (int i = 0; i < 20000 && (i < 5 || Clock::now() < end); ++i) {
    const auto t0 = Clock::now();
    op(i);
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  return median_us(std::move(us));
}

void row(const Options& o, std::size_t waits, std::size_t keys) {
  hc::TcpStore server("127.0.0.1", 0, true, kJob);
  const auto t0 = Clock::now();
  if (!o.all_missing && waits > 0) set_present(server.port(), keys - 1);
  auto parkers = park(server.port(), waits, keys, o.all_missing);
  const double park_s = std::chrono::duration<double>(Clock::now() - t0).count();
  hc::TcpStore client("127.0.0.1", server.port(), false, kJob, std::chrono::seconds(600));
  const double set_us = time_op(o.budget_s, [&](int i) { client.set(fmt::format("bench/set/{}", i), "v"); });
  const double add_us = time_op(o.budget_s, [&](int) { client.add("bench/add", 1); });
  std::printf("| %zu | %zu | %.1f | %.1f | %.1f |\n", waits, keys, set_us, add_us, park_s);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc > 1 && (std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0)) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    const Options o = parse(argc, argv);
    std::printf("| waits parked | keys per wait (%s) | set median µs | add median µs | parking s |\n",
                o.all_missing ? "all unset" : "all set but one");
    std::printf("|---|---|---|---|---|\n");
    for (std::size_t k : o.keys)
      for (std::size_t w : o.waits) row(o, w, k);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hopwise-store-bench: %s\n%s", e.what(), kUsage);
    return 2;
  }
}
