// What a hostile or broken peer can do to the stores, one test per way (README, "Trust and limits"): over loopback
// against a real TcpStore server in this process, and against FileStore directories written by other processes.
// Each test waits for events (a reply, a closed connection), never for a time, and bounds what it sends.
#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/core.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <thread>
#include <tuple>

#include "../comm/src/stores/store_protocol.h"
#include "../comm/src/stores/store_server.h"
#include "hopwise/comm/stores/file_store.h"
#include "hopwise/comm/stores/tcp_store.h"
#include "hopwise/common/error.h"
#include "worlds.h"

namespace {

namespace hc = hopwise::comm;
namespace sp = hopwise::comm::store_protocol;
using namespace std::chrono_literals;

std::size_t rss_bytes() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stoul(line.substr(6)) * 1024;
  return 0;
}

double cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

// A raw TCP connection to the store: what an outsider can send.
struct Raw {
  int fd = -1;
  explicit Raw(int port) {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) throw std::runtime_error("connect failed");
  }
  ~Raw() {
    if (fd >= 0) ::close(fd);
  }
  // Sends what the socket takes now; false once the server has closed it.
  bool send_some(const std::string& b) {
    const ssize_t n = ::send(fd, b.data(), b.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    return n >= 0 || errno == EAGAIN || errno == EWOULDBLOCK;
  }
  void send_all(const std::string& b) {
    for (std::size_t at = 0; at < b.size();) {
      const ssize_t n = ::send(fd, b.data() + at, b.size() - at, MSG_NOSIGNAL);
      if (n <= 0) throw std::runtime_error("send failed");
      at += static_cast<std::size_t>(n);
    }
  }
  void send_frame(const sp::Request& r) {
    std::string f = sp::pack(r);
    const auto n = static_cast<std::uint32_t>(f.size());
    f.insert(0, reinterpret_cast<const char*>(&n), 4);
    send_all(f);
  }
  // Whether the server closed the connection within `limit` (reading and dropping what it sent).
  bool closed_within(std::chrono::duration<double> limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    char buf[4096];
    while (std::chrono::steady_clock::now() < end) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
    }
    return false;
  }
  // One reply frame: (status, bytes).
  std::pair<int, std::string> reply(std::chrono::duration<double> limit = 30s) {
    std::string in;
    const auto end = std::chrono::steady_clock::now() + limit;
    char buf[65536];
    while (std::chrono::steady_clock::now() < end) {
      if (in.size() >= 4) {
        std::uint32_t n = 0;
        std::memcpy(&n, in.data(), 4);
        if (in.size() >= 4 + std::size_t{n}) return {in[8], in.substr(9, n - 5)};
      }
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n <= 0) return {-1, "closed"};
      in.append(buf, static_cast<std::size_t>(n));
    }
    return {-1, "no reply"};
  }
};

std::string fresh_dir() {
  return (std::filesystem::temp_directory_path() / hwtest::unique_test_name("store-limits")).string();
}

TEST(StoreLimits, AddOnTextOrPastInt64IsRefusedNamingTheKeyAndTheServerGoesOn) {
  hc::TcpStore server("127.0.0.1", 0, true, "job");
  hc::TcpStore client("127.0.0.1", server.port(), false, "job", 30s);
  client.set("hopwise/world/0/hosts/0", "node-a");
  std::string e = error_of([&] { client.add("hopwise/world/0/hosts/0", 1); });
  EXPECT_NE(e.find("key 'hopwise/world/0/hosts/0' holds a non-integer"), std::string::npos) << e;
  client.set("huge", "99999999999999999999");
  e = error_of([&] { client.add("huge", 1); });
  EXPECT_NE(e.find("non-integer"), std::string::npos) << e;
  client.set("top", "9223372036854775807");
  e = error_of([&] { client.add("top", 1); });
  EXPECT_NE(e.find("overflow"), std::string::npos) << e;
  EXPECT_EQ(client.add("top", -7), 9223372036854775800);
  EXPECT_EQ(client.get("hopwise/world/0/hosts/0", 5s), "node-a") << "the server goes on";
  // The other stores say the same.
  hc::InProcessStore inproc;
  inproc.set("k", "text");
  e = error_of([&] { inproc.add("k", 1); });
  EXPECT_NE(e.find("key 'k' holds a non-integer"), std::string::npos) << e;
  const std::string dir = fresh_dir();
  hc::FileStore files(dir, true, "job");
  files.set("counter", "12abc");
  e = error_of([&] { files.add("counter", 1); });
  EXPECT_NE(e.find("key 'counter' holds a non-integer"), std::string::npos) << e;
  EXPECT_NE(e.find(dir + "/k-"), std::string::npos) << "names the file: " << e;
  std::filesystem::remove_all(dir);
}

TEST(StoreLimits, StrangersSendingHugeFramesAreClosedWithoutBeingBuffered) {
  hc::TcpStore server("127.0.0.1", 0, true, "job");
  const std::size_t before = rss_bytes();
  std::vector<std::unique_ptr<Raw>> peers;
  const std::string chunk(1 << 20, 'x');
  for (int i = 0; i < 4; ++i) {
    peers.push_back(std::make_unique<Raw>(server.port()));
    const std::uint32_t huge = 0x3FFFFFFF;
    peers.back()->send_all(std::string(reinterpret_cast<const char*>(&huge), 4));
  }
  int sent_mib = 0;
  for (int mib = 0; mib < 256; ++mib)  // what they go on sending is read by nobody
    for (auto& p : peers) sent_mib += p->send_some(chunk) ? 1 : 0;
  for (auto& p : peers) EXPECT_TRUE(p->closed_within(30s)) << "a stranger's 1 GiB frame was not refused";
  Raw http(server.port());
  http.send_all("GET / HTTP/1.0\r\n\r\n");
  EXPECT_TRUE(http.closed_within(30s)) << "an HTTP probe was held";
  const double grew_mb = (static_cast<double>(rss_bytes()) - static_cast<double>(before)) / 1e6;
  std::printf("4 strangers offered 1 GiB frames: server RSS grew %.1f MB\n", grew_mb);
  EXPECT_LT(grew_mb, 32.0);
  hc::TcpStore client("127.0.0.1", server.port(), false, "job", 30s);
  client.set("k", "v");  // it still serves
  EXPECT_EQ(client.get("k", 5s), "v");
}

TEST(StoreLimits, AConnectionThatDoesNotIntroduceItselfIsClosed) {
  hc::TcpStoreOptions o;
  o.hello_timeout = 0.5s;
  hc::TcpStore server("127.0.0.1", 0, true, "job", 30s, o);
  Raw silent(server.port());
  Raw partial(server.port());
  partial.send_all(std::string("\x10\x00", 2));  // half a length
  EXPECT_TRUE(silent.closed_within(30s));
  EXPECT_TRUE(partial.closed_within(30s));
  Raw rude(server.port());  // a request before the introduction
  rude.send_frame({sp::kGet, 1, 0, {"k"}, ""});
  EXPECT_TRUE(rude.closed_within(30s));
}

TEST(StoreLimits, TheServerListensOnTheStoreHostsAddressUnlessTold) {
  hc::TcpStore loopback("127.0.0.1", 0, true, "job");
  EXPECT_EQ(loopback.listening_on(), fmt::format("127.0.0.1:{}", loopback.port()));
  hc::TcpStoreOptions every;
  every.bind = "0.0.0.0";
  hc::TcpStore all("127.0.0.1", 0, true, "job", 30s, every);
  EXPECT_EQ(all.listening_on(), fmt::format("0.0.0.0:{}", all.port()));
  // From another address of this machine, the loopback server cannot be reached.
  ifaddrs* list = nullptr;
  ::getifaddrs(&list);
  std::string other;
  for (ifaddrs* i = list; i; i = i->ifa_next)
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET) {
      char ip[INET_ADDRSTRLEN];
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, ip, sizeof ip);
      if (std::string(ip).rfind("127.", 0) != 0) other = ip;
    }
  ::freeifaddrs(list);
  if (other.empty()) GTEST_SKIP() << "this machine has no address but loopback";
  EXPECT_THROW(hc::TcpStore(other, loopback.port(), false, "job", 0.3s), hopwise::TimeoutError) << other;
  hc::TcpStore reached(other, all.port(), false, "job", 30s);  // the every-interface one can
  reached.set("k", "v");
}

TEST(StoreLimits, ATokenIsCheckedWhenAClientIntroducesItself) {
  hc::TcpStoreOptions with;
  with.token = "s3cret";
  hc::TcpStore server("127.0.0.1", 0, true, "job", 30s, with);
  std::string e = error_of([&] { hc::TcpStore none("127.0.0.1", server.port(), false, "job", 30s); });
  EXPECT_NE(e.find("HOPWISE_STORE_TOKEN is missing or wrong"), std::string::npos) << e;
  hc::TcpStoreOptions wrong;
  wrong.token = "guess";
  e = error_of([&] { hc::TcpStore bad("127.0.0.1", server.port(), false, "job", 30s, wrong); });
  EXPECT_NE(e.find("HOPWISE_STORE_TOKEN is missing or wrong"), std::string::npos) << e;
  hc::TcpStore good("127.0.0.1", server.port(), false, "job", 30s, with);
  good.set("k", "v");
  EXPECT_EQ(server.get("k", 5s), "v");
  hc::TcpStore open_server("127.0.0.1", 0, true, "job");
  e = error_of([&] { hc::TcpStore extra("127.0.0.1", open_server.port(), false, "job", 30s, with); });
  EXPECT_NE(e.find("takes no token"), std::string::npos) << e;
}

// With few descriptors left, 100 idle connections neither spin the server nor keep a real rank out.
TEST(StoreLimits, RunningOutOfDescriptorsNeitherSpinsNorLocksOutARank) {
  rlimit old{};
  ::getrlimit(RLIMIT_NOFILE, &old);
  hc::TcpStoreOptions o;
  o.hello_timeout = 1s;
  hc::TcpStore server("127.0.0.1", 0, true, "job", 30s, o);
  const auto fds = std::filesystem::directory_iterator("/proc/self/fd");
  const int open_now = static_cast<int>(std::distance(begin(fds), end(fds)));
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  if (child == 0) {  // only system calls here: the parent has threads
    ::setrlimit(RLIMIT_NOFILE, &old);
    int held = 0;
    for (int i = 0; i < 100; ++i) {
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<std::uint16_t>(server.port()));
      held += ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    }
    const char c = static_cast<char>(held);
    if (::write(ready[1], &c, 1) != 1) ::_exit(2);
    ::pause();
    ::_exit(0);
  }
  rlimit low = old;
  low.rlim_cur = static_cast<rlim_t>(open_now + 16);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  char held = 0;
  ASSERT_EQ(::read(ready[0], &held, 1), 1);
  EXPECT_EQ(held, 100);
  const double cpu0 = cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(2s);
  const double cpu = cpu_seconds() - cpu0;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("100 idle connections, %d descriptors: the server used %.3f s of CPU in %.1f s\n",
              static_cast<int>(low.rlim_cur), cpu, wall);
  EXPECT_LT(cpu, 0.25 * wall) << "the server spins";
  std::string e = error_of([&] {
    hc::TcpStore rank("127.0.0.1", server.port(), false, "job", 120s);
    rank.set("arrived", "1");
  });
  ::setrlimit(RLIMIT_NOFILE, &old);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ::close(ready[0]);
  ::close(ready[1]);
  EXPECT_EQ(e, "no error") << "a real rank did not get in";
  EXPECT_EQ(server.get("arrived", 5s), "1");
}

TEST(StoreLimits, AClientThatDoesNotReadIsNotReadFromAndOthersAreServed) {
  hc::TcpStore server("127.0.0.1", 0, true, "job");
  hc::TcpStore writer("127.0.0.1", server.port(), false, "job", 60s);
  const std::string value(32u << 20, 'v');
  writer.set("big", value);
  const std::size_t before = rss_bytes();
  Raw greedy(server.port());
  greedy.send_frame({sp::kHello, 1, 0, {}, "job"});
  ASSERT_EQ(greedy.reply().first, 0);
  int sent = 0;
  for (int i = 0; i < 24; ++i) {  // 768 MB of replies asked for, none read
    std::string f = sp::pack({sp::kGet, 2 + i, 0, {"big"}, ""});
    const auto n = static_cast<std::uint32_t>(f.size());
    f.insert(0, reinterpret_cast<const char*>(&n), 4);
    sent += greedy.send_some(f) ? 1 : 0;
  }
  writer.set("small", "s");  // the server answers others meanwhile
  EXPECT_EQ(writer.get("small", 30s), "s");
  const double grew_mb = (static_cast<double>(rss_bytes()) - static_cast<double>(before)) / 1e6;
  std::printf("24 unread gets of a 32 MiB value: server RSS grew %.1f MB\n", grew_mb);
  EXPECT_LT(grew_mb, 64.0);
}

TEST(StoreLimits, TheCoreStopsReadingAClientPastItsCapOnReplies) {
  hc::store_server::Core core("job", "", {1024, 1u << 20, 5s});
  core.open(1, "test", hc::store_server::Clock::now());
  auto frame = [](const sp::Request& r) {
    std::string f = sp::pack(r);
    const auto n = static_cast<std::uint32_t>(f.size());
    return std::string(reinterpret_cast<const char*>(&n), 4) + f;
  };
  std::string in = frame({sp::kHello, 1, 0, {}, "job"}) + frame({sp::kSet, 2, 0, {"big"}, std::string(600000, 'v')});
  core.receive(1, in.data(), in.size());
  in = frame({sp::kGet, 3, 0, {"big"}, ""});
  core.receive(1, in.data(), in.size());
  EXPECT_TRUE(core.wants_input(1));
  core.receive(1, in.data(), in.size());
  EXPECT_FALSE(core.wants_input(1)) << core.unsent(1) << " bytes unsent";
  while (!core.pending(1).empty()) core.sent(1, core.pending(1).size());
  EXPECT_TRUE(core.wants_input(1)) << "reading resumes once it caught up";
}

TEST(StoreLimits, KeysAndValuesPastTheLimitsAreRefusedBeforeSending) {
  hc::TcpStore server("127.0.0.1", 0, true, "job");
  hc::TcpStore client("127.0.0.1", server.port(), false, "job", 30s);
  std::string e = error_of([&] { client.set("weights", std::string(sp::kMaxValueBytes + 1, 'w')); });
  EXPECT_NE(e.find("key 'weights'"), std::string::npos) << e;
  EXPECT_NE(e.find(std::to_string(sp::kMaxValueBytes)), std::string::npos) << e;
  e = error_of([&] { client.set(std::string(sp::kMaxKeyBytes + 1, 'k'), "v"); });
  EXPECT_NE(e.find("at most 8192 bytes"), std::string::npos) << e;
  client.set("after", "fine");  // the connection is whole
  EXPECT_EQ(client.get("after", 5s), "fine");
}

// ---- parked gets and waits: listed under the keys they miss, and capped per wait and per client ----

// Replies on a raw connection with the ids of the requests they answer, kept across reads.
struct Replies {
  Raw& raw;
  std::string in;
  struct One {
    std::int32_t id = 0;
    int status = -1;
    std::string body;
  };
  One next(std::chrono::duration<double> limit = 30s) {
    const auto end = std::chrono::steady_clock::now() + limit;
    char buf[65536];
    while (std::chrono::steady_clock::now() < end) {
      if (in.size() >= 9) {
        std::uint32_t n = 0;
        std::memcpy(&n, in.data(), 4);
        if (in.size() >= 4 + std::size_t{n}) {
          One o;
          std::memcpy(&o.id, in.data() + 4, 4);
          o.status = in[8];
          o.body = in.substr(9, n - 5);
          in.erase(0, 4 + std::size_t{n});
          return o;
        }
      }
      pollfd p{raw.fd, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const ssize_t n = ::read(raw.fd, buf, sizeof buf);
      if (n <= 0) return {0, -1, "closed"};
      in.append(buf, static_cast<std::size_t>(n));
    }
    return {0, -1, "no reply"};
  }
};

// What a Table answered: (client, request id, ok, value).
struct Answers {
  std::vector<std::tuple<int, std::int32_t, bool, std::string>> got;
  sp::Table::Reply reply() {
    return [this](int client, const sp::Request& r, bool ok, sp::Value v) {
      got.emplace_back(client, r.id, ok, v ? *v : std::string());
    };
  }
  // The ids answered since `from`, in order.
  std::vector<std::int32_t> ids(std::size_t from = 0) const {
    std::vector<std::int32_t> out;
    for (std::size_t i = from; i < got.size(); ++i) out.push_back(std::get<1>(got[i]));
    return out;
  }
};

TEST(StoreLimits, ASetWakesOnlyTheWaitsOnItsKeyAndEachIsAnsweredOnceItsKeysAreSet) {
  sp::Table table;
  Answers a;
  const auto reply = a.reply();
  // Three clients, overlapping keys, a key named twice in one wait, gets among the waits.
  table.handle(1, {sp::kWait, 10, 0, {"a", "b"}, ""}, reply);
  table.handle(1, {sp::kGet, 11, 0, {"b"}, ""}, reply);
  table.handle(2, {sp::kWait, 20, 0, {"b", "c", "b"}, ""}, reply);
  table.handle(2, {sp::kWait, 21, 0, {"c"}, ""}, reply);
  table.handle(3, {sp::kGet, 30, 0, {"a"}, ""}, reply);
  table.handle(3, {sp::kWait, 31, 0, {"a", "b", "c"}, ""}, reply);
  table.handle(3, {sp::kWait, 32, 0, {"d"}, ""}, reply);
  ASSERT_TRUE(a.got.empty());
  EXPECT_EQ(table.parked(), 7u);
  auto visits = table.parked_visits();
  table.handle(4, {sp::kSet, 40, 0, {"unrelated"}, "x"}, reply);
  table.handle(4, {sp::kAdd, 41, 1, {"counter"}, ""}, reply);
  EXPECT_EQ(a.ids(), (std::vector<std::int32_t>{40, 41}));
  EXPECT_EQ(table.parked_visits(), visits) << "keys no one waits for look at no parked request";
  table.handle(4, {sp::kSet, 42, 0, {"a"}, "A"}, reply);  // 10, 30, 31 wait for it; 30 is complete
  EXPECT_EQ(a.ids(2), (std::vector<std::int32_t>{42, 30}));
  EXPECT_EQ(std::get<3>(a.got[3]), "A");
  EXPECT_EQ(table.parked_visits(), visits + 3);
  table.handle(4, {sp::kAdd, 43, 5, {"b"}, ""}, reply);  // completes 10, 11 (its value: "5"), not 20 or 31
  EXPECT_EQ(a.ids(4), (std::vector<std::int32_t>{43, 10, 11}));
  EXPECT_EQ(std::get<3>(a.got[6]), "5");
  EXPECT_EQ(table.parked_visits(), visits + 3 + 4) << "10, 11, 20 and 31 wait for b, 20 only once";
  table.handle(4, {sp::kSet, 44, 0, {"c"}, "C"}, reply);  // completes 20, 21, 31 in the order they were parked
  EXPECT_EQ(a.ids(7), (std::vector<std::int32_t>{44, 20, 21, 31}));
  for (const auto& [client, id, ok, value] : a.got) EXPECT_TRUE(ok) << id;
  EXPECT_EQ(std::get<0>(a.got[8]), 2);
  EXPECT_EQ(std::get<0>(a.got[10]), 3);
  EXPECT_EQ(table.parked(), 1u) << "only 32 (for d) is left";
  table.handle(3, {sp::kWait, 33, 0, {"a", "c"}, ""}, reply);  // set already: answered at once
  EXPECT_EQ(a.ids(11), (std::vector<std::int32_t>{33}));
}

TEST(StoreLimits, AClientThatGoesTakesItsParkedRequestsOffEveryKey) {
  sp::Table table;
  Answers a;
  const auto reply = a.reply();
  table.handle(1, {sp::kWait, 10, 0, {"a", "b"}, ""}, reply);
  table.handle(1, {sp::kGet, 11, 0, {"b"}, ""}, reply);
  table.handle(2, {sp::kWait, 20, 0, {"b"}, ""}, reply);
  table.drop(1);
  EXPECT_EQ(table.parked(), 1u);
  const auto visits = table.parked_visits();
  table.handle(3, {sp::kSet, 30, 0, {"a"}, "A"}, reply);
  EXPECT_EQ(table.parked_visits(), visits) << "no one waits for a any more";
  table.handle(3, {sp::kSet, 31, 0, {"b"}, "B"}, reply);
  EXPECT_EQ(a.ids(), (std::vector<std::int32_t>{30, 31, 20}));
  EXPECT_EQ(table.parked_visits(), visits + 1);
}

// A request framed without its client-side checks: what a client that skipped them sends.
std::string unchecked_frame(const sp::Request& r) {
  const std::string b = sp::pack_unchecked(r);
  const auto n = static_cast<std::uint32_t>(b.size());
  return std::string(reinterpret_cast<const char*>(&n), 4) + b;
}

TEST(StoreLimits, AWaitPastTheKeyCapIsRefusedNamingTheCap) {
  hc::TcpStore server("127.0.0.1", 0, true, "job");
  hc::TcpStore client("127.0.0.1", server.port(), false, "job", 30s);
  std::vector<std::string> keys;
  for (std::size_t i = 0; i <= sp::kMaxWaitKeys; ++i) keys.push_back(std::to_string(i));
  const std::string cap = std::to_string(sp::kMaxWaitKeys);
  std::string e = error_of([&] { client.wait(keys, 1s); });  // refused before sending
  EXPECT_NE(e.find("at most " + cap + " keys (kMaxWaitKeys)"), std::string::npos) << e;
  EXPECT_NE(e.find("in parts"), std::string::npos) << e;
  Raw raw(server.port());  // a client that skipped the check is refused by the server, and stays connected
  Replies replies{raw, {}};
  raw.send_frame({sp::kHello, 1, 0, {}, "job"});
  ASSERT_EQ(replies.next().status, 0);
  raw.send_all(unchecked_frame({sp::kWait, 2, 0, keys, ""}));
  const auto refused = replies.next(10s);
  EXPECT_EQ(refused.id, 2);
  EXPECT_EQ(refused.status, 1) << refused.body;
  EXPECT_NE(refused.body.find("at most " + cap + " keys (kMaxWaitKeys)"), std::string::npos) << refused.body;
  client.set("0", "v");
  raw.send_frame({sp::kWait, 3, 0, {"0"}, ""});
  EXPECT_EQ(replies.next().id, 3);
}

// Past its cap a client's oldest parked request is answered with an error naming the cap and dropped: what one
// client holds stays bounded, and a client whose waits timed out (each left parked) is still answered for the one
// it waits on now.
TEST(StoreLimits, PastItsCapOnParkedWaitsAClientsOldestIsDroppedNamingItAndTheNewestGoesOn) {
  hc::TcpStore server("127.0.0.1", 0, true, "job");
  Raw raw(server.port());
  Replies replies{raw, {}};
  raw.send_frame({sp::kHello, 1, 0, {}, "job"});
  ASSERT_EQ(replies.next().status, 0);
  const auto cap = static_cast<std::int32_t>(sp::kMaxParkedPerClient);
  for (std::int32_t i = 0; i < cap; ++i) raw.send_frame({sp::kWait, 100 + i, 0, {fmt::format("k{}", i)}, ""});
  raw.send_frame({sp::kGet, 99, 0, {"one more"}, ""});
  const auto dropped = replies.next(10s);
  EXPECT_EQ(dropped.id, 100) << "the oldest goes";
  EXPECT_EQ(dropped.status, 1);
  EXPECT_NE(dropped.body.find(fmt::format("had {} gets and waits parked", cap)), std::string::npos) << dropped.body;
  EXPECT_NE(dropped.body.find("kMaxParkedPerClient"), std::string::npos) << dropped.body;
  for (std::int32_t i = 0; i < cap; ++i) server.set(fmt::format("k{}", i), "v");
  for (std::int32_t i = 1; i < cap; ++i) {
    const auto r = replies.next();
    EXPECT_EQ(r.id, 100 + i);
    EXPECT_EQ(r.status, 0);
  }
  server.set("one more", "M");
  const auto newest = replies.next();
  EXPECT_EQ(newest.id, 99);
  EXPECT_EQ(newest.body, "M");
  // TcpStore's own client: waits that timed out stay parked, twice the cap of them; the next is answered all the same.
  hc::TcpStore client("127.0.0.1", server.port(), false, "job", 30s);
  for (std::int32_t i = 0; i < 2 * cap; ++i)
    EXPECT_THROW(client.wait({fmt::format("never{}", i)}, 1ms), hopwise::TimeoutError);
  std::thread later([&] {
    std::this_thread::sleep_for(50ms);
    server.set("now", "v");
  });
  EXPECT_EQ(client.get("now", 30s), "v");
  later.join();
}

TEST(StoreLimits, ASetOrAddLooksOnlyAtTheWaitsOnItsKeyHoweverManyAreParked) {
  sp::Table table;
  Answers a;
  const auto reply = a.reply();
  constexpr int kWaits = 200;
  constexpr std::size_t kKeys = 4096;
  for (int w = 0; w < kWaits; ++w) {  // 4 clients' worth, each key named by every wait
    sp::Request r{sp::kWait, w, 0, {}, ""};
    for (std::size_t k = 0; k < kKeys; ++k) r.keys.push_back(fmt::format("k{}", k));
    table.handle(w % 4, std::move(r), reply);
  }
  ASSERT_EQ(table.parked(), std::size_t{kWaits});
  const auto visits = table.parked_visits();
  for (int i = 0; i < 100; ++i) {
    table.handle(9, {sp::kSet, 1, 0, {fmt::format("other{}", i)}, "v"}, reply);
    table.handle(9, {sp::kAdd, 2, 1, {"counter"}, ""}, reply);
  }
  EXPECT_EQ(table.parked_visits(), visits) << "unrelated keys cost nothing per parked wait";
  table.handle(9, {sp::kSet, 3, 0, {"k0"}, "v"}, reply);
  EXPECT_EQ(table.parked_visits(), visits + kWaits) << "each wait on k0 once, not each of its keys";
  EXPECT_EQ(a.got.size(), 201u) << "none complete yet";
}

// Two writers of one directory, each in a pid namespace of its own (both pid 1): their temporary files must not
// collide. Writers in plain processes run too, wherever namespaces are not allowed.
void write_keys(const std::string& dir, int writer) {
  hc::FileStore s(dir, false, "job", 30s);
  for (int i = 0; i < 300; ++i) {
    s.set(fmt::format("w{}/k{}", writer, i), fmt::format("w{}-{}", writer, i));
    s.set(fmt::format("shared/{}", i), fmt::format("w{}-{}", writer, i));
  }
}

int run_writers(const std::string& dir, bool namespaces) {
  std::vector<pid_t> kids;
  for (int w = 0; w < 2; ++w) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      if (namespaces) {
        if (::unshare(CLONE_NEWPID) != 0) ::_exit(77);
        const pid_t inner = ::fork();  // pid 1 of the new namespace
        if (inner == 0) {
          write_keys(dir, w);
          ::_exit(::getpid() == 1 ? 0 : 3);
        }
        int st = 0;
        ::waitpid(inner, &st, 0);
        ::_exit(WIFEXITED(st) ? WEXITSTATUS(st) : 4);
      }
      write_keys(dir, w);
      ::_exit(0);
    }
    kids.push_back(pid);
  }
  int worst = 0;
  for (pid_t k : kids) {
    int st = 0;
    ::waitpid(k, &st, 0);
    worst = std::max(worst, WIFEXITED(st) ? WEXITSTATUS(st) : 5);
  }
  return worst;
}

TEST(StoreLimits, FileStoreWritersInOtherPidNamespacesNeverShareATemporaryFile) {
  for (bool namespaces : {false, true}) {
    const std::string dir = fresh_dir();
    hc::FileStore s(dir, true, "job");
    const int rc = run_writers(dir, namespaces);
    if (namespaces && rc == 77) {
      std::filesystem::remove_all(dir);
      GTEST_SKIP() << "no pid namespaces here (unshare refused); plain processes passed";
    }
    ASSERT_EQ(rc, 0) << "a writer failed (namespaces " << namespaces << ")";
    int wrong = 0;
    for (int w = 0; w < 2; ++w)
      for (int i = 0; i < 300; ++i) wrong += s.get(fmt::format("w{}/k{}", w, i), 1s) != fmt::format("w{}-{}", w, i);
    for (int i = 0; i < 300; ++i) {
      const std::string v = s.get(fmt::format("shared/{}", i), 1s);
      wrong += v != fmt::format("w0-{}", i) && v != fmt::format("w1-{}", i);
    }
    EXPECT_EQ(wrong, 0) << "keys holding another writer's value (namespaces " << namespaces << ")";
    int left = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir))
      left += e.path().filename().string().rfind("tmp-", 0) == 0;
    EXPECT_EQ(left, 0) << "temporary files left behind";
    std::filesystem::remove_all(dir);
  }
}

TEST(StoreLimits, AFileStoreOfAnEarlierRunIsStaleAndAnEarlierAttemptIsCleared) {
  const std::string dir = fresh_dir();
  const pid_t pid = ::fork();
  if (pid == 0) {  // an earlier run, in another process, that did not end cleanly
    hc::FileStore s(dir, true, "job");
    s.set("hopwise/world/0/0", "old address");
    ::_exit(0);
  }
  ::waitpid(pid, nullptr, 0);
  std::string e = error_of([&] { hc::FileStore again(dir, true, "job"); });
  EXPECT_NE(e.find("stale directory"), std::string::npos) << e;
  EXPECT_NE(e.find(dir), std::string::npos) << e;
  {
    hc::FileStore restarted(dir, true, "job", 30s, 1);  // torchrun's next attempt
    EXPECT_FALSE(restarted.check({"hopwise/world/0/0"})) << "the earlier attempt's keys were kept";
    hc::FileStore other_rank(dir, false, "job", 30s, 1);
    restarted.set("k", "v");
    EXPECT_EQ(other_rank.get("k", 5s), "v");
    // A clean exit: the last of the two ranks to leave removes the keys and the directory.
    restarted.leave(2);
    EXPECT_TRUE(std::filesystem::exists(dir));
    other_rank.leave(2);
  }
  EXPECT_FALSE(std::filesystem::exists(dir)) << "the last rank to leave did not clean up";
  hc::FileStore next_run(dir, true, "job");  // so the next run finds it clean
  std::filesystem::remove_all(dir);
}

// The file store trusts nothing in its directory: what another writer of it (or a stray mkfifo, mkdir, ln -s) left
// where the store's files go is refused at once, naming the path, never followed or waited on.
bool names(const std::string& e, const std::string& path, const std::string& what) {
  return e.find("'" + path + "'") != std::string::npos && e.find(what) != std::string::npos;
}

TEST(StoreLimits, AFileStoreKeyThatIsAFifoIsRefusedAtOnceNotWaitedOn) {
  const std::string dir = fresh_dir();
  hc::FileStore s(dir, true, "job");
  const std::string fifo = dir + "/k-6b";  // key "k"
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto got = std::async(std::launch::async, [&] { return error_of([&] { s.get("k", 3s); }); });
  if (got.wait_for(20s) != std::future_status::ready) {
    ADD_FAILURE() << "get waited on a FIFO past its 3 s timeout";
    while (got.wait_for(10ms) != std::future_status::ready) {  // free the reader: open the FIFO's other end
      const int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
      if (w >= 0) ::close(w);
    }
  }
  const std::string e = got.get();
  EXPECT_TRUE(names(e, fifo, "a FIFO")) << e;
  EXPECT_NE(e.find("remove it"), std::string::npos) << "says what to do: " << e;
  EXPECT_TRUE(names(error_of([&] { s.wait({"k"}, 3s); }), fifo, "a FIFO"));
  EXPECT_TRUE(names(error_of([&] { s.check({"k"}); }), fifo, "a FIFO"));
  std::filesystem::remove_all(dir);
}

TEST(StoreLimits, AFileStoreKeyThatIsADirectoryIsRefusedNotReadAsEmpty) {
  const std::string dir = fresh_dir();
  hc::FileStore s(dir, true, "job");
  std::filesystem::create_directory(dir + "/k-6b");
  const std::string e = error_of([&] { EXPECT_NE(s.get("k", 3s), ""); });
  EXPECT_TRUE(names(e, dir + "/k-6b", "a directory")) << e;
  EXPECT_TRUE(names(error_of([&] { s.add("k", 1); }), dir + "/k-6b", "a directory"));
  std::filesystem::remove_all(dir);
}

TEST(StoreLimits, AFileStoreLockReplacedByASymlinkMakesNoFileOutsideTheDirectory) {
  const std::string dir = fresh_dir(), outside = fresh_dir() + "-outside";
  hc::FileStore s(dir, true, "job");
  EXPECT_EQ(s.add("n", 1), 1);
  std::filesystem::create_directories(outside);
  std::filesystem::remove(dir + "/lock");
  std::filesystem::create_symlink(outside + "/planted", dir + "/lock");
  const std::string e = error_of([&] { s.add("n", 1); });
  EXPECT_TRUE(names(e, dir + "/lock", "a symbolic link")) << e;
  EXPECT_FALSE(std::filesystem::exists(outside + "/planted")) << "a file was made outside the store's directory";
  std::filesystem::remove_all(outside);
  std::filesystem::remove_all(dir);
}

TEST(StoreLimits, AFileStoreFollowsNoSymlinkedKeyOrJobAndKeysStayInside) {
  const std::string dir = fresh_dir(), outside = fresh_dir() + "-outside";
  std::filesystem::create_directories(outside);
  std::ofstream(outside + "/secret") << "secret";
  std::ofstream(outside + "/job") << "job\nattempt 0\nclaim someone\n";
  {
    hc::FileStore s(dir, true, "job");
    std::filesystem::create_symlink(outside + "/secret", dir + "/k-6b");
    const std::string e = error_of([&] { EXPECT_NE(s.get("k", 3s), "secret"); });
    EXPECT_TRUE(names(e, dir + "/k-6b", "a symbolic link")) << e;
    s.set("../../k", "v");  // any bytes make a name inside the directory
    EXPECT_EQ(s.get("../../k", 3s), "v");
    EXPECT_TRUE(std::filesystem::exists(dir + "/k-2e2e2f2e2e2f6b"));
  }
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::filesystem::create_symlink(outside + "/job", dir + "/job");
  for (bool claim : {true, false}) {
    const std::string e = error_of([&] { hc::FileStore s(dir, claim, "job", 3s); });
    EXPECT_TRUE(names(e, dir + "/job", "a symbolic link")) << "claim " << claim << ": " << e;
  }
  std::ifstream secret(outside + "/secret");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(secret), {}), "secret");
  std::filesystem::remove_all(outside);
  std::filesystem::remove_all(dir);
}

TEST(StoreLimits, AFileStoreDirectoryOthersCanWriteOrOwnIsRefusedSayingHowToMakeASafeOne) {
  const std::string dir = fresh_dir();
  std::filesystem::create_directories(dir);
  ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);
  for (bool claim : {true, false}) {
    const std::string e = error_of([&] { hc::FileStore s(dir, claim, "job", 3s); });
    EXPECT_TRUE(names(e, dir, "writable by other users")) << "claim " << claim << ": " << e;
    EXPECT_NE(e.find("chmod o-w"), std::string::npos) << e;
    EXPECT_NE(e.find("mkdir -m 700"), std::string::npos) << e;
  }
  EXPECT_THROW(hc::FileStore(dir, true, "job"), hopwise::InvalidArgument);
  ASSERT_EQ(::chmod(dir.c_str(), 01777), 0);  // the sticky bit: only the owner of a file may replace it
  { hc::FileStore sticky(dir, true, "job"); }
  std::filesystem::remove_all(dir);
  // A directory of another user: its owner could replace the files. As root, one made for nobody; else "/".
  std::string other = "/";
  if (::geteuid() == 0) {
    other = fresh_dir();
    std::filesystem::create_directories(other);
    ASSERT_EQ(::chown(other.c_str(), 65534, 65534), 0);
  }
  const std::string e = error_of([&] { hc::FileStore s(other, false, "job", 3s); });
  EXPECT_TRUE(names(e, other, "belongs to user")) << e;
  EXPECT_NE(e.find("mkdir -m 700"), std::string::npos) << e;
  if (other != "/") std::filesystem::remove_all(other);
  // A directory the store makes is private.
  const std::string made = fresh_dir();
  { hc::FileStore s(made, true, "job"); }
  EXPECT_EQ(std::filesystem::status(made).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_all);
  std::filesystem::remove_all(made);
}

}  // namespace
