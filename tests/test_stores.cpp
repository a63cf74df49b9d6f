// The stores' failure cases, which the contract suite (test_transport_contract) does not reach: an address nobody
// serves, a port or directory that belongs to another job, stale keys, and a late reply after a timeout.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "hopwise/comm/stores/file_store.h"
#include "hopwise/comm/stores/tcp_store.h"
#include "hopwise/common/error.h"
#include "worlds.h"

namespace {

namespace hc = hopwise::comm;
using Clock = std::chrono::steady_clock;
using std::chrono::duration;

double since(Clock::time_point t0) { return duration<double>(Clock::now() - t0).count(); }

// A port nobody listens on: bound once by the kernel's choice, then closed.
int closed_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

std::string fresh_dir() {
  return (std::filesystem::temp_directory_path() / hwtest::unique_test_name("stores")).string();
}

TEST(TcpStore, AnAddressNobodyServesIsNamedWithinTheTimeout) {
  const int port = closed_port();
  const auto t0 = Clock::now();
  try {
    hc::TcpStore s("127.0.0.1", port, false, "job", duration<double>(0.5));
    ADD_FAILURE() << "connected to a port nobody serves";
  } catch (const hopwise::TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("tcp://127.0.0.1:{}", port)), std::string::npos) << e.what();
  }
  EXPECT_GE(since(t0), 0.3);
  EXPECT_LT(since(t0), 5.0);
}

TEST(TcpStore, ARankThatStartsFirstWaitsForTheServer) {
  const int port = closed_port();
  std::thread late_server([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    hc::TcpStore server("127.0.0.1", port, true, "job");
    server.set("k", "v");
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // serve the client's get
  });
  hc::TcpStore client("127.0.0.1", port, false, "job", std::chrono::seconds(10));
  EXPECT_EQ(client.get("k", std::chrono::seconds(10)), "v");
  late_server.join();
}

TEST(TcpStore, AServerOfAnotherJobRefusesNamingBoth) {
  hc::TcpStore server("127.0.0.1", 0, true, "job-A");
  try {
    hc::TcpStore other("127.0.0.1", server.port(), false, "job-B", std::chrono::seconds(5));
    ADD_FAILURE() << "a client of another job was served";
  } catch (const hopwise::Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("job-A"), std::string::npos) << w;
    EXPECT_NE(w.find("job-B"), std::string::npos) << w;
  }
  server.set("still", "fine");  // the server goes on serving its own job
  EXPECT_EQ(server.get("still", std::chrono::seconds(5)), "fine");
}

TEST(TcpStore, ALateReplyAfterATimeoutIsNotTakenForTheNextAnswer) {
  hc::TcpStore server("127.0.0.1", 0, true, "job");
  hc::TcpStore client("127.0.0.1", server.port(), false, "job", std::chrono::seconds(5));
  EXPECT_THROW(client.get("later", duration<double>(0.2)), hopwise::TimeoutError);
  server.set("later", "the parked get's answer");  // answers the timed-out get now
  server.set("other", "the right answer");
  EXPECT_EQ(client.get("other", std::chrono::seconds(5)), "the right answer");
  EXPECT_EQ(client.get("later", std::chrono::seconds(5)), "the parked get's answer");
}

// A rank of a later attempt (its launcher restarted it first) waits for the earlier attempt's server to go and the
// new one to serve, instead of failing and spending one of its launcher's restarts.
TEST(TcpStore, ALaterAttemptWaitsForTheEarlierAttemptsServerToGo) {
  auto old_server = std::make_unique<hc::TcpStore>("127.0.0.1", 0, true, "job");
  const int port = old_server->port();
  std::promise<void> refused_once, client_done;
  std::thread restart([&] {
    refused_once.get_future().wait();  // the client has been turned away by attempt 0's server at least once
    old_server.reset();                // attempt 0's rank 0 fails and goes; attempt 1's comes up on the same port
    hc::TcpStore new_server("127.0.0.1", port, true, "job (attempt 1)");
    new_server.set("k", "attempt 1");
    client_done.get_future().wait();  // serve the client's get
  });
  // Attempt 0's server refuses attempt 1 with the retry status: seen here from a client of a short timeout.
  try {
    hc::TcpStore early("127.0.0.1", port, false, "job (attempt 1)", duration<double>(0.3));
    ADD_FAILURE() << "attempt 0's server served attempt 1";
  } catch (const hopwise::TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("still serves attempt 0"), std::string::npos) << e.what();
  }
  refused_once.set_value();
  hc::TcpStore client("127.0.0.1", port, false, "job (attempt 1)", std::chrono::seconds(60));
  EXPECT_EQ(client.get("k", std::chrono::seconds(60)), "attempt 1");
  client_done.set_value();
  restart.join();
}

TEST(TcpStore, ALaterAttemptNamesTheEarlierAttemptAtItsTimeoutAndAnEarlierOneIsRefusedAtOnce) {
  hc::TcpStore server("127.0.0.1", 0, true, "job (attempt 1)");
  try {
    hc::TcpStore later("127.0.0.1", server.port(), false, "job (attempt 2)", duration<double>(0.5));
    ADD_FAILURE() << "a later attempt was served";
  } catch (const hopwise::TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("still serves attempt 1 of job 'job', and this rank belongs to attempt 2"),
              std::string::npos)
        << e.what();
  }
  try {  // refused at once: not a TimeoutError after waiting
    hc::TcpStore earlier("127.0.0.1", server.port(), false, "job", std::chrono::seconds(60));
    ADD_FAILURE() << "an earlier attempt was served";
  } catch (const hopwise::TimeoutError& e) {
    ADD_FAILURE() << "an earlier attempt waited: " << e.what();
  } catch (const hopwise::Error& e) {
    EXPECT_NE(std::string(e.what()).find("serves job 'job (attempt 1)', not 'job'"), std::string::npos) << e.what();
  }
}

TEST(TcpStore, ServingAPortInUseIsAnErrorNamingIt) {
  hc::TcpStore first("127.0.0.1", 0, true, "job");
  try {
    hc::TcpStore second("127.0.0.1", first.port(), true, "job");
    ADD_FAILURE() << "two servers on one port";
  } catch (const hopwise::Error& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(first.port())), std::string::npos) << e.what();
  }
}

// Ports from `first` on that nobody holds now (racy as any free port, so the callers retry).
bool all_free(int first, int n) {
  for (int p = first; p < first + n; ++p) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(p));
    const bool ok = p <= 65535 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    if (!ok) return false;
  }
  return true;
}

// A span of ports (torchrun's MASTER_PORT + 1 on, where the next port alone was once taken by a connection to
// torch's own store): the server passes over a port in use, the clients over a port that refuses them and over
// another job's server, and both meet at the first free port.
TEST(TcpStore, ASpanOfPortsMeetsPastAPortInUseAndAnotherJobsServer) {
  for (int attempt = 0;; ++attempt) {
    ASSERT_LT(attempt, 50) << "found no 4 free ports in a row";
    hc::TcpStore other("127.0.0.1", 0, true, "another job");  // holds the span's first port
    const int first = other.port();
    if (!all_free(first + 1, 3)) continue;
    // The second: bound, not listening, as the local end of some program's connection is: it refuses clients.
    const int held = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(first + 1));
    if (::bind(held, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(held);
      continue;
    }
    hc::TcpStoreOptions span;
    span.ports = 4;
    std::promise<int> served_on;
    std::thread late_server([&] {  // after the client has started looking
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      hc::TcpStore server("127.0.0.1", first, true, "job", std::chrono::seconds(30), span);
      served_on.set_value(server.port());
      server.set("k", "v");
      std::this_thread::sleep_for(std::chrono::milliseconds(800));  // serve the client's get
    });
    hc::TcpStore client("127.0.0.1", first, false, "job", std::chrono::seconds(30), span);
    EXPECT_EQ(client.get("k", std::chrono::seconds(30)), "v");
    EXPECT_EQ(client.port(), first + 2);
    EXPECT_EQ(served_on.get_future().get(), first + 2);
    late_server.join();
    ::close(held);
    return;
  }
}

TEST(TcpStore, ASpanNobodyServesIsNamedWholeWithinTheTimeout) {
  const int port = closed_port();
  hc::TcpStoreOptions span;
  span.ports = 3;
  const auto t0 = Clock::now();
  try {
    hc::TcpStore s("127.0.0.1", port, false, "job", duration<double>(0.5), span);
    ADD_FAILURE() << "connected to a span nobody serves";
  } catch (const hopwise::TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("tcp://127.0.0.1:{}-{}", port, port + 2)), std::string::npos)
        << e.what();
  }
  EXPECT_LT(since(t0), 5.0);
  span.ports = 0;
  EXPECT_THROW(hc::TcpStore("127.0.0.1", port, false, "job", duration<double>(0.5), span), hopwise::InvalidArgument);
  span.ports = 2;
  EXPECT_THROW(hc::TcpStore("127.0.0.1", 65535, false, "job", duration<double>(0.5), span), hopwise::InvalidArgument);
}

TEST(FileStore, ADirectoryOfAnotherJobIsRefusedNotTrusted) {
  const std::string dir = fresh_dir();
  {
    hc::FileStore old(dir, true, "job-old");
    old.set("k", "stale value");
  }
  // The next run's claiming rank and its other ranks both refuse it, naming both jobs.
  for (bool claim : {true, false}) {
    try {
      hc::FileStore next(dir, claim, "job-new", duration<double>(0.3));
      ADD_FAILURE() << "a directory of another job was trusted (claim " << claim << ")";
    } catch (const hopwise::Error& e) {
      const std::string w = e.what();
      EXPECT_NE(w.find("job-old"), std::string::npos) << w;
      EXPECT_NE(w.find("job-new"), std::string::npos) << w;
    }
  }
  // The same job may open it again (a rank that restarts its store).
  hc::FileStore again(dir, true, "job-old");
  EXPECT_EQ(again.get("k", std::chrono::seconds(1)), "stale value");
  std::filesystem::remove_all(dir);
}

TEST(FileStore, KeysOfNoRecordedJobAreRefused) {
  const std::string dir = fresh_dir();
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/k-6b") << "left over";
  EXPECT_THROW(hc::FileStore(dir, true, "job"), hopwise::Error);
  std::filesystem::remove_all(dir);
}

TEST(FileStore, AnUnclaimedDirectoryTimesOutNamingIt) {
  const std::string dir = fresh_dir();
  const auto t0 = Clock::now();
  try {
    hc::FileStore s(dir, false, "job", duration<double>(0.3));
    ADD_FAILURE() << "an unclaimed directory was used";
  } catch (const hopwise::TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find(dir), std::string::npos) << e.what();
  }
  EXPECT_LT(since(t0), 5.0);
}

TEST(FileStore, AddIsAtomicAcrossProcesses) {
  const std::string dir = fresh_dir();
  hc::FileStore s(dir, true, "job");
  constexpr int kChildren = 4, kAdds = 200;
  std::vector<pid_t> kids;
  for (int c = 0; c < kChildren; ++c) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      hc::FileStore mine(dir, false, "job", std::chrono::seconds(10));
      for (int i = 0; i < kAdds; ++i) mine.add("counter", 1);
      ::_exit(0);
    }
    kids.push_back(pid);
  }
  for (pid_t k : kids) {
    int st = 0;
    ::waitpid(k, &st, 0);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  EXPECT_EQ(s.add("counter", 0), kChildren * kAdds);
  std::filesystem::remove_all(dir);
}

}  // namespace
