// The point-to-point contract every Transport keeps (transport.h), checked over every world of worlds.h: messages
// between one pair with one tag arrive in order; sizes from 0 bytes to megabytes arrive intact; hundreds of
// requests may be in flight; a receive may be larger than its send; a cancelled receive never writes its buffer,
// even when a matching message comes later; a wait gives up after the timeout naming the peers it waited for;
// test() never blocks; and a rank that abandons its transport after a failed peer is not held up by it.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <numeric>
#include <regex>
#include <thread>
#include <vector>

#include "hopwise/common/error.h"
#include "worlds.h"

namespace {

using namespace hwtest;
using Clock = std::chrono::steady_clock;
constexpr int kSyncTag = 9000;

// Every rank has reached this point (dissemination over the transport itself).
void sync(hc::Transport& t) {
  const int p = t.size(), r = t.rank();
  char token = 0, sink = 0;
  for (int dist = 1, round = 0; dist < p; dist *= 2, ++round) {
    hc::Request reqs[2] = {t.irecv(&sink, 1, (r - dist + p) % p, kSyncTag + round),
                           t.isend(&token, 1, (r + dist) % p, kSyncTag + round)};
    t.wait_all(reqs);
  }
}

void each(const std::function<void(hc::Transport&)>& body) {
  for (int n : world().sizes()) {
    SCOPED_TRACE(fmt::format("{} world of {} ranks", world().name, n));
    world().run(n, [&](std::unique_ptr<hc::Transport> t) {
      t->set_timeout(std::chrono::duration<double>(60));
      body(*t);
      sync(*t);
    });
  }
}

std::vector<std::uint8_t> pattern(std::size_t n, int from, int salt) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<std::uint8_t>(i * 131 + static_cast<std::size_t>(from) * 17 + salt);
  return v;
}

TEST(TransportContract, OrderPerPairAndTag) {
  each([](hc::Transport& t) {
    const int p = t.size(), me = t.rank();
    if (p == 1) return;
    constexpr int kMessages = 40;
    // To every peer: kMessages numbered messages on tag 1 and on tag 2, interleaved; receives posted tag 2 first.
    std::vector<std::int32_t> out(kMessages);
    std::iota(out.begin(), out.end(), 0);
    std::vector<std::vector<std::int32_t>> got(static_cast<std::size_t>(2 * p),
                                               std::vector<std::int32_t>(kMessages, -1));
    hc::Requests reqs(t);
    for (int tag : {2, 1})
      for (int peer = 0; peer < p; ++peer)
        if (peer != me)
          for (int i = 0; i < kMessages; ++i)
            reqs.push_back(
                t.irecv(&got[static_cast<std::size_t>(2 * peer + tag - 1)][static_cast<std::size_t>(i)], 4, peer, tag));
    for (int i = 0; i < kMessages; ++i)
      for (int tag : {1, 2})
        for (int peer = 0; peer < p; ++peer)
          if (peer != me) reqs.push_back(t.isend(&out[static_cast<std::size_t>(i)], 4, peer, tag));
    t.wait_all(reqs);
    reqs.clear();
    for (int peer = 0; peer < p; ++peer) {
      if (peer == me) continue;
      for (int tag : {1, 2}) {
        EXPECT_EQ(got[static_cast<std::size_t>(2 * peer + tag - 1)], out) << "from " << peer << " tag " << tag;
      }
    }
  });
}

TEST(TransportContract, SizesFromZeroToMegabytes) {
  each([](hc::Transport& t) {
    const int p = t.size(), me = t.rank(), next = (me + 1) % p, prev = (me + p - 1) % p;
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{4096}, std::size_t{4097},
                          std::size_t{65539}, std::size_t{(8u << 20) + 1}}) {
      const auto send = pattern(n, me, 3);
      std::vector<std::uint8_t> recv(n + 1, 0xEE);
      hc::Request reqs[2] = {t.irecv(recv.data(), n, prev, 3), t.isend(send.data(), n, next, 3)};
      t.wait_all(reqs);
      const auto want = pattern(n, prev, 3);
      EXPECT_TRUE(std::equal(want.begin(), want.end(), recv.begin())) << n << " bytes from " << prev;
      EXPECT_EQ(recv[n], 0xEE) << "a " << n << "-byte message wrote past its end";
    }
  });
}

TEST(TransportContract, HundredsInFlightAndLargerReceives) {
  each([](hc::Transport& t) {
    const int p = t.size(), me = t.rank(), next = (me + 1) % p, prev = (me + p - 1) % p;
    constexpr int kInFlight = 300;
    std::vector<std::vector<std::uint8_t>> send, recv;
    hc::Requests reqs(t);
    for (int i = 0; i < kInFlight; ++i) {
      send.push_back(pattern(static_cast<std::size_t>(i % 17) * 61, me, i));
      recv.emplace_back(send.back().size() + 100, 0);  // larger than the send
    }
    for (int i = 0; i < kInFlight; ++i)
      reqs.push_back(
          t.irecv(recv[static_cast<std::size_t>(i)].data(), recv[static_cast<std::size_t>(i)].size(), prev, 4));
    for (int i = 0; i < kInFlight; ++i)
      reqs.push_back(
          t.isend(send[static_cast<std::size_t>(i)].data(), send[static_cast<std::size_t>(i)].size(), next, 4));
    t.wait_all(reqs);
    reqs.clear();
    for (int i = 0; i < kInFlight; ++i) {
      const auto want = pattern(static_cast<std::size_t>(i % 17) * 61, prev, i);
      EXPECT_TRUE(std::equal(want.begin(), want.end(), recv[static_cast<std::size_t>(i)].begin())) << "message " << i;
    }
  });
}

TEST(TransportContract, CancelledReceiveNeverWritesItsBuffer) {
  each([](hc::Transport& t) {
    const int p = t.size(), me = t.rank(), next = (me + 1) % p, prev = (me + p - 1) % p;
    if (p == 1) return;
    std::vector<std::uint8_t> stale(64, 0xAB), fresh(64, 0);
    hc::Request r = t.irecv(stale.data(), stale.size(), prev, 5);
    EXPECT_FALSE(t.test(r));
    t.cancel(r);
    EXPECT_FALSE(r.active);
    sync(t);  // every rank has cancelled before anyone sends on tag 5
    const auto send = pattern(64, me, 5);
    hc::Request reqs[2] = {t.irecv(fresh.data(), fresh.size(), prev, 5), t.isend(send.data(), send.size(), next, 5)};
    t.wait_all(reqs);
    EXPECT_EQ(fresh, pattern(64, prev, 5));
    EXPECT_EQ(stale, std::vector<std::uint8_t>(64, 0xAB)) << "the cancelled receive wrote into its buffer";
  });
}

TEST(TransportContract, TestNeverBlocks) {
  each([](hc::Transport& t) {
    const int p = t.size(), me = t.rank(), next = (me + 1) % p, prev = (me + p - 1) % p;
    if (p == 1) return;
    int in = 0, out = me;
    hc::Request r = t.irecv(&in, sizeof in, prev, 6);
    const auto t0 = Clock::now();
    EXPECT_FALSE(t.test(r));  // nobody has sent yet: every rank posts its receive before the sync below
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 0.5);
    sync(t);
    hc::Request s = t.isend(&out, sizeof out, next, 6);
    while (!t.test(r)) std::this_thread::yield();
    t.wait(s);
    EXPECT_EQ(in, prev);
  });
}

TEST(TransportContract, TimeoutNamesThePendingPeers) {
  each([](hc::Transport& t) {
    const int p = t.size(), me = t.rank(), prev = (me + p - 1) % p;
    if (p == 1) return;
    int sink = 0;
    t.set_timeout(std::chrono::duration<double>(0.3));
    hc::Requests reqs(t);
    reqs.push_back(t.irecv(&sink, sizeof sink, prev, 7));  // nobody sends on tag 7
    const auto t0 = Clock::now();
    try {
      t.wait_all(reqs);
      ADD_FAILURE() << "a receive nobody sends completed";
    } catch (const hopwise::TimeoutError& e) {
      EXPECT_EQ(e.pending_ranks(), std::vector<int>{prev}) << e.what();
      EXPECT_NE(std::string(e.what()).find(std::to_string(prev)), std::string::npos) << e.what();
    }
    const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
    EXPECT_GE(waited, 0.25);
    EXPECT_LT(waited, 10.0);
    reqs.clear();  // cancels what is still pending
    t.set_timeout(std::chrono::duration<double>(60));
  });
}

TEST(TransportContract, AbandonAfterAFailedPeerDoesNotWait) {
  if (!world().can_abandon) GTEST_SKIP() << world().name << ": abandon() leaves the job unusable for later cases";
  if (world().ranks != World::Ranks::kThreads && world().sizes()[0] < 3)
    GTEST_SKIP() << "needs a job of at least 3 ranks";
  world().run(3, [](std::unique_ptr<hc::Transport> t) {
    if (t->rank() == 2) return;  // the failed peer: gone without a word
    t->set_timeout(std::chrono::duration<double>(0.3));
    int sink = 0;
    const auto t0 = Clock::now();
    try {
      hc::Request r = t->irecv(&sink, sizeof sink, 2, 8);
      t->wait(r);
      ADD_FAILURE() << "a receive from a gone rank completed";
    } catch (const hopwise::TimeoutError& e) {
      EXPECT_EQ(e.pending_ranks(), std::vector<int>{2});
      t->abandon();
    } catch (const hopwise::TransportError& e) {  // a transport that sees the peer go (UCX) says so sooner, or
      // that another waiting rank gave up first
      const auto& f = e.failed_ranks();
      EXPECT_TRUE(f == std::vector<int>{2} || (f.size() == 1 && f[0] != t->rank() &&
                                               std::string(e.what()).find("gave up on this job") != std::string::npos))
          << e.what();
      t->abandon();
    }
    t.reset();  // teardown must not wait for rank 2
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0);
  });
}

// A rank that gave up makes no more calls, so no collective completes: a rank waiting on another peer (one merely
// stalled) fails soon after, naming it, rather than at its own later timeout (UCX: through the store's marks). In a
// world of more than 3 ranks the others wait on rank 2 too.
TEST(TransportContract, ARankThatGaveUpEndsTheWaitsOfTheOthers) {
  if (!world().can_abandon) GTEST_SKIP() << world().name << ": abandon() leaves the job unusable for later cases";
  if (world().ranks != World::Ranks::kThreads && world().sizes()[0] < 3)
    GTEST_SKIP() << "needs a job of at least 3 ranks";
  world().run(3, [](std::unique_ptr<hc::Transport> t) {
    if (!dynamic_cast<hc::UcxTransport*>(t.get())) return;  // MPI and threads: each waits for its own timeout
    int sink = 0;
    const auto t0 = Clock::now();
    if (t->rank() == 2) {  // stalled: alive, sending nothing
      std::this_thread::sleep_for(std::chrono::seconds(4));
      return;
    }
    t->set_timeout(std::chrono::duration<double>(t->rank() == 1 ? 0.3 : 30.0));
    try {
      hc::Request r = t->irecv(&sink, sizeof sink, 2, 8);
      t->wait(r);
      ADD_FAILURE() << "a receive from a stalled rank completed";
    } catch (const hopwise::TimeoutError& e) {
      EXPECT_EQ(t->rank(), 1) << "rank 0 waited for its own timeout: " << e.what();
      t->abandon();
    } catch (const hopwise::TransportError& e) {  // rank 1's giving up, or that of a rank that learnt it first
      EXPECT_NE(t->rank(), 1) << e.what();
      ASSERT_EQ(e.failed_ranks().size(), 1u) << e.what();
      const int q = e.failed_ranks()[0];
      EXPECT_TRUE(q != t->rank() && q != 2) << e.what();
      EXPECT_NE(std::string(e.what()).find(fmt::format("rank {} gave up on this job", q)), std::string::npos)
          << e.what();
      t->abandon();
    }
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 3.5) << "rank " << t->rank();
  });
}

// UCX's lanes: shared memory or CMA within a host, TCP alone between hosts (emulated hosts share /dev/shm and the
// kernel, so anything else would be a shortcut a real network does not have).
TEST(UcxTransport, SharedMemoryWithinAHostTcpAloneBetweenHosts) {
  each([](hc::Transport& t) {
    auto* ucx = dynamic_cast<hc::UcxTransport*>(&t);
    if (ucx == nullptr) return;
    const std::regex same_kernel("posix|sysv|cma|xpmem|knem");
    for (int q = 0; q < t.size(); ++q) {
      if (q == t.rank()) continue;
      const std::string lanes = ucx->lanes(q);
      SCOPED_TRACE(
          fmt::format("rank {} to rank {} (hosts {} and {}):\n{}", t.rank(), q, t.host_id(), ucx->host_of(q), lanes));
      if (ucx->host_of(q) == t.host_id()) {
        EXPECT_TRUE(std::regex_search(lanes, same_kernel));
      } else {
        EXPECT_NE(lanes.find("tcp"), std::string::npos);
        EXPECT_FALSE(std::regex_search(lanes, same_kernel));
      }
    }
  });
}

// ---- the rendezvous contract (store.h), over each world's way to meet ----
void each_store(const StoreBody& body) {
  for (const auto& [kind, run] : world().stores)
    for (int n : world().sizes()) {
      SCOPED_TRACE(fmt::format("{} world, {} store, {} ranks", world().name, kind, n));
      run(n, body);
    }
}

TEST(StoreContract, SetGetWaitAddCheck) {
  each_store([](hc::Store& s, int rank, int size) {
    const std::string base = fmt::format("contract/{}", size);
    s.set(fmt::format("{}/r{}", base, rank), std::string("\0value of ", 10) + std::to_string(rank));
    std::vector<std::string> keys;
    for (int r = 0; r < size; ++r) keys.push_back(fmt::format("{}/r{}", base, r));
    s.wait(keys, std::chrono::seconds(30));
    EXPECT_TRUE(s.check(keys));
    EXPECT_FALSE(s.check({base + "/never"}));
    for (int r = 0; r < size; ++r)
      EXPECT_EQ(s.get(keys[static_cast<std::size_t>(r)], std::chrono::seconds(30)),
                std::string("\0value of ", 10) + std::to_string(r));
    // add is atomic across ranks: every rank adds rank+1, so the last value seen is size(size+1)/2.
    const std::int64_t v = s.add(base + "/counter", rank + 1);
    EXPECT_GE(v, rank + 1);
    s.set(fmt::format("{}/added/{}", base, rank), "1");
    for (int r = 0; r < size; ++r) s.wait({fmt::format("{}/added/{}", base, r)}, std::chrono::seconds(30));
    EXPECT_EQ(s.add(base + "/counter", 0), static_cast<std::int64_t>(size) * (size + 1) / 2);
    // A large value (a megabyte) arrives intact.
    if (rank == 0) s.set(base + "/big", std::string(1 << 20, 'x'));
    EXPECT_EQ(s.get(base + "/big", std::chrono::seconds(30)).size(), std::size_t{1} << 20);
  });
}

TEST(StoreContract, AllgatherAndBroadcast) {
  each_store([](hc::Store& s, int rank, int size) {
    const std::string name = fmt::format("bootstrap/{}", size);
    const auto all =
        hc::store_allgather(s, name + "/ag", rank, size, "rank" + std::to_string(rank), std::chrono::seconds(30));
    ASSERT_EQ(all.size(), static_cast<std::size_t>(size));
    for (int r = 0; r < size; ++r) EXPECT_EQ(all[static_cast<std::size_t>(r)], "rank" + std::to_string(r));
    const int root = size - 1;
    EXPECT_EQ(
        hc::store_broadcast(s, name + "/bc", rank, root, rank == root ? "from the root" : "", std::chrono::seconds(30)),
        "from the root");
  });
}

TEST(StoreContract, TimeoutNamesTheRanksThatNeverArrived) {
  each_store([](hc::Store& s, int rank, int size) {
    if (size == 1) return;
    // The last rank never joins this allgather; the others give up naming it.
    const std::string name = fmt::format("late/{}", size);
    if (rank == size - 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(600));  // past the others' timeout
      return;
    }
    const auto t0 = Clock::now();
    try {
      hc::store_allgather(s, name, rank, size, "x", std::chrono::duration<double>(0.3));
      ADD_FAILURE() << "an allgather that a rank never joined completed";
    } catch (const hopwise::TimeoutError& e) {
      EXPECT_EQ(e.pending_ranks(), std::vector<int>{size - 1}) << e.what();
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0);
  });
}

}  // namespace

#include "world_main.h"
