// Ranks simulated on SimGrid (comm/src/transports/simgrid; hopwise/comm/transports/simgrid_transport.h): the
// transport's contract (order per pair and tag, sizes, many in flight, cancel, test, a timeout in simulated time naming
// the peer), every algorithm row that runs there against a serial reference at 1-16 ranks on awkward sizes and several
// dtypes, and the simulated time of a transfer against the platform's link. The platform: tests/sim/cluster8.xml (8
// hosts, 1 Gbit/s each; HOPWISE_SIM_PLATFORM).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include "actor_side_by_side.h"
#include "hopwise/common/error.h"
#include "hopwise/sim/rank_collectives.h"
#include "sim_platform.h"

namespace {

namespace hc = hopwise::comm;
namespace sim = hopwise::comm::sim;
using hopwise::DataType;
using hopwise::ReduceOp;

using hopwise::comm::sim::testing::load;

// n ranks over the platform's 8 hosts: rank r on host r % 8, so that from 9 ranks on some hosts hold two.
std::vector<std::string> placed(int n) {
  const auto hosts = sim::host_names();
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r) out.push_back(hosts[static_cast<std::size_t>(r) % hosts.size()]);
  return out;
}

std::vector<int> host_ids(int n) {
  std::vector<int> out;
  for (int r = 0; r < n; ++r) out.push_back(r % 8);
  return out;
}

TEST(SimTransport, OrderPerPairAndTagAndSizesFromZeroToMegabytes) {
  load();
  for (int n : {1, 2, 3, 9}) {
    sim::run_ranks(placed(n), [n](int me, hc::Transport& t) {
      ASSERT_EQ(t.rank(), me);
      ASSERT_EQ(t.size(), n);
      const std::vector<std::size_t> sizes{0, 1, 7, 4096, 65537, 1u << 20};
      for (int peer = 0; peer < n; ++peer) {
        if (peer == me) continue;
        std::vector<std::vector<char>> out(sizes.size()), in(sizes.size());
        std::vector<hc::Request> reqs;
        for (std::size_t i = 0; i < sizes.size(); ++i) {  // the same tag: order alone tells them apart
          out[i].assign(sizes[i], static_cast<char>(me * 16 + static_cast<int>(i)));
          in[i].assign(sizes[i] + 3, 0);
          reqs.push_back(t.irecv(in[i].data(), in[i].size(), peer, 5));
          reqs.push_back(t.isend(out[i].data(), out[i].size(), peer, 5));
        }
        t.wait_all(reqs);
        for (std::size_t i = 0; i < sizes.size(); ++i)
          for (std::size_t k = 0; k < sizes[i]; ++k)
            ASSERT_EQ(in[i][k], static_cast<char>(peer * 16 + static_cast<int>(i))) << "message " << i << " byte " << k;
      }
    });
  }
}

// Tags 64 apart share a mailbox (SimGrid keeps every mailbox to the end): in the order sent they arrive whole, each
// at its own receive; received the other way round, the transport names both tags rather than mixing them up.
TEST(SimTransport, TagsThatShareAMailboxArriveInOrderOrAreNamed) {
  load();
  for (bool in_order : {true, false}) {
    std::string error;
    sim::run_ranks(placed(2), [&](int me, hc::Transport& t) {
      std::vector<int> a(3, 0), b(3, 0);
      if (me == 0) {
        std::vector<int> x{1, 2, 3}, y{4, 5, 6};
        std::vector<hc::Request> reqs{t.isend(x.data(), 12, 1, 3), t.isend(y.data(), 12, 1, 3 + 64)};
        t.wait_all(reqs);
        return;
      }
      std::vector<hc::Request> reqs;
      if (in_order)
        reqs = {t.irecv(a.data(), 12, 0, 3), t.irecv(b.data(), 12, 0, 3 + 64)};
      else
        reqs = {t.irecv(b.data(), 12, 0, 3 + 64), t.irecv(a.data(), 12, 0, 3)};
      try {
        t.wait_all(reqs);
      } catch (const hopwise::TransportError& e) {
        error = e.what();
        return;
      }
      EXPECT_EQ(a, (std::vector<int>{1, 2, 3}));
      EXPECT_EQ(b, (std::vector<int>{4, 5, 6}));
    });
    if (in_order) {
      EXPECT_EQ(error, "");
    } else {
      EXPECT_NE(error.find("a message of tag 3 from rank 0 met the receive posted for tag 67"), std::string::npos)
          << error;
    }
  }
}

TEST(SimTransport, HundredsInFlightTestNeverBlocksAndACancelledReceiveNeverWrites) {
  load();
  sim::run_ranks(placed(3), [](int me, hc::Transport& t) {
    if (me == 2) return;
    const int peer = 1 - me;
    std::vector<int> out(300), in(300, -1);
    std::vector<hc::Request> reqs;
    for (int i = 0; i < 300; ++i) {
      out[static_cast<std::size_t>(i)] = me * 1000 + i;
      reqs.push_back(t.isend(&out[static_cast<std::size_t>(i)], sizeof(int), peer, i % 7));
      reqs.push_back(t.irecv(&in[static_cast<std::size_t>(i)], sizeof(int), peer, i % 7));
    }
    t.wait_all(reqs);
    for (int i = 0; i < 300; ++i) ASSERT_EQ(in[static_cast<std::size_t>(i)], peer * 1000 + i);
    // Rank 0 tests a receive that rank 1 sends only a simulated second later: false, and no time passes.
    int late = -1, late_out = 42;
    if (me == 0) {
      hc::Request r = t.irecv(&late, sizeof late, 1, 99);
      const double before = sim::now();
      EXPECT_FALSE(t.test(r));
      EXPECT_EQ(sim::now(), before);
      t.wait(r);
      EXPECT_EQ(late, 42);
      EXPECT_GE(sim::now(), before + 1.0);
      // A receive cancelled before rank 1's send: the send finds no taker and its bytes never land here.
      int never = -1;
      hc::Request c = t.irecv(&never, sizeof never, 1, 100);
      t.cancel(c);
      EXPECT_FALSE(c.active);
      sim::sleep_for(2.0);
      EXPECT_EQ(never, -1);
    } else {
      sim::sleep_for(1.0);
      hc::Request r = t.isend(&late_out, sizeof late_out, 0, 99);
      t.wait(r);
      hc::Request orphan = t.isend(&late_out, sizeof late_out, 0, 100);
      sim::sleep_for(3.0);
      t.cancel(orphan);
    }
  });
}

TEST(SimTransport, ATimeoutInSimulatedTimeNamesThePendingPeerAndAnOverflowIsAnError) {
  load();
  sim::RunOptions o;
  o.timeout_s = 5;
  sim::run_ranks(
      placed(3),
      [](int me, hc::Transport& t) {
        if (me != 0) return;
        int x = 0;
        const double t0 = sim::now();
        try {
          hc::Request r = t.irecv(&x, sizeof x, 2, 1);
          t.wait(r);
          ADD_FAILURE() << "a receive nobody sends to completed";
        } catch (const hopwise::TimeoutError& e) {
          EXPECT_EQ(e.pending_ranks(), std::vector<int>{2});
          EXPECT_NE(std::string(e.what()).find("rank(s) 2"), std::string::npos) << e.what();
        }
        EXPECT_NEAR(sim::now() - t0, 5.0, 1e-6);
      },
      o);
  sim::run_ranks(placed(2), [](int me, hc::Transport& t) {
    std::vector<char> big(100, 'x'), small(10);
    if (me == 0) {
      hc::Request r = t.isend(big.data(), big.size(), 1, 3);
      try {
        t.wait(r);
      } catch (const hopwise::Error&) {  // the receiver's overflow may fail the send too
      }
    } else {
      hc::Request r = t.irecv(small.data(), small.size(), 0, 3);
      try {
        t.wait(r);
        ADD_FAILURE() << "a 100-byte message fit a 10-byte receive";
      } catch (const hopwise::TransportError& e) {
        EXPECT_NE(std::string(e.what()).find("overflows the 10-byte receive"), std::string::npos) << e.what();
      }
    }
  });
}

TEST(SimTransport, ABadPlatformOrHostIsNamed) {
  load();
  EXPECT_EQ(sim::host_names(), (std::vector<std::string>{"h0", "h1", "h2", "h3", "h4", "h5", "h6", "h7"}));
  EXPECT_THROW(sim::load_platform("/nonexistent/other.xml"), hopwise::InvalidArgument);
  try {
    sim::run_ranks({"h0", "nosuchhost"}, [](int, hc::Transport&) {});
    ADD_FAILURE() << "a host the platform lacks was taken";
  } catch (const hopwise::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("nosuchhost"), std::string::npos) << e.what();
  }
}

// Small integers: every order of summation gives the same float, so the algorithms' results compare exactly.
double value(int rank, std::size_t i) {
  return static_cast<double>((rank * 31 + static_cast<int>(i % 1000) * 7) % 17) - 8;
}

template <class T>
void fill(std::vector<T>& v, int rank, std::size_t offset = 0) {
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<T>(value(rank, i + offset));
}

template <class T>
DataType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DataType::kFloat32;
  if constexpr (std::is_same_v<T, double>) return DataType::kFloat64;
  return DataType::kInt32;
}

// One collective on n ranks with algorithm a, every rank's result checked against the serial one.
template <class T>
void check_collective(hc::Algorithm a, hc::Collective kind, int n, std::size_t count, ReduceOp op) {
  SCOPED_TRACE(testing::Message() << hc::to_string(a) << " " << hc::to_string(kind) << " n=" << n << " count=" << count
                                  << " op=" << static_cast<int>(op));
  const int root = n > 2 ? n - 2 : 0;
  std::vector<int> ring(static_cast<std::size_t>(n));
  std::iota(ring.begin(), ring.end(), 0);
  std::reverse(ring.begin() + n / 2, ring.end());  // not rank order: the plan's ring is what counts
  sim::run_ranks(placed(n), [&](int me, hc::Transport& t) {
    hc::sim::RankCollectives coll(t, ring, host_ids(n), 4096);
    const std::size_t in_count = kind == hc::Collective::kReduceScatter ? count * static_cast<std::size_t>(n) : count;
    const std::size_t out_count = kind == hc::Collective::kAllgather ? count * static_cast<std::size_t>(n) : in_count;
    std::vector<T> in(in_count), out(kind == hc::Collective::kReduceScatter ? count : out_count, T(-99));
    fill(in, me);
    if (kind == hc::Collective::kBroadcast) out = in;
    coll.run(a, kind, in.data(), out.data(), count, dtype_of<T>(), op, root);
    auto reduced = [&](std::size_t i) {  // the serial reduction of element i over every rank
      double r = value(0, i);
      for (int q = 1; q < n; ++q) {
        const double v = value(q, i);
        r = op == ReduceOp::kMax ? std::max(r, v) : op == ReduceOp::kMin ? std::min(r, v) : r + v;
      }
      return op == ReduceOp::kAvg ? static_cast<double>(static_cast<T>(r) * static_cast<T>(1.0 / n)) : r;
    };
    for (std::size_t i = 0; i < out.size(); ++i) {
      double want = 0;
      switch (kind) {
        case hc::Collective::kAllreduce: want = reduced(i); break;
        case hc::Collective::kReduceScatter: want = reduced(static_cast<std::size_t>(me) * count + i); break;
        case hc::Collective::kAllgather: want = value(static_cast<int>(i / count), i % count); break;
        case hc::Collective::kBroadcast: want = value(root, i); break;
        case hc::Collective::kReduce:
          if (me != root) return;
          want = reduced(i);
          break;
        default: return;
      }
      const double tolerance = op == ReduceOp::kAvg && !std::is_integral_v<T> ? 1e-5 * std::abs(want) : 0;
      ASSERT_NEAR(static_cast<double>(out[i]), want, tolerance) << "rank " << me << " element " << i;
    }
  });
}

TEST(SimCollectives, EveryRowMatchesTheSerialReference) {
  load();
  const std::vector<hc::Algorithm> rows = sim::sim_algorithms();
  ASSERT_GE(rows.size(), 3u);
  for (hc::Algorithm a : rows)
    for (int n : {1, 2, 3, 5, 8, 16})
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{13}, std::size_t{1031}}) {
        for (hc::Collective kind : {hc::Collective::kAllreduce, hc::Collective::kReduceScatter,
                                    hc::Collective::kAllgather, hc::Collective::kBroadcast, hc::Collective::kReduce}) {
          if (!hc::implements(a, kind)) continue;
          check_collective<float>(a, kind, n, count, ReduceOp::kSum);
        }
        if (hc::implements(a, hc::Collective::kAllreduce)) {
          check_collective<double>(a, hc::Collective::kAllreduce, n, count, ReduceOp::kAvg);
          check_collective<std::int32_t>(a, hc::Collective::kAllreduce, n, count, ReduceOp::kMax);
        }
      }
}

TEST(SimCollectives, ALargeAllreduceMatchesOnUnevenHosts) {
  load();
  for (hc::Algorithm a : sim::sim_algorithms())
    if (hc::implements(a, hc::Collective::kAllreduce))
      check_collective<float>(a, hc::Collective::kAllreduce, 11, (1u << 18) + 3, ReduceOp::kSum);
}

// hier's pipeline runs its phases as parts of a call side by side: on simulated ranks each part is an actor of the
// rank's host, and a part that waits for another's progress waits in simulated time (an OS wait would stop every
// actor). Three parts that each compute 1 s take 1 s, not 3; a part waiting for a counter goes on when another
// advances it; a failed part wakes the waiters.
TEST(SimSideBySide, PartsRunAtOnceAndWaitForEachOtherInSimulatedTime) {
  load();
  const double seconds = sim::run_ranks({"h0", "h1"}, [&](int, hc::Transport&) {
    const double t0 = sim::now();  // the clock goes on from earlier runs
    hc::algo::SideBySide& parts = hc::algo::side_by_side();
    const auto progress = parts.progress(1);
    double waited_until = -1, second_advance = -1;
    parts.run({[&] {
                 ASSERT_TRUE(progress->wait_past(0, 1));  // both of the other part's advances
                 waited_until = sim::now();
               },
               [&] {
                 sim::sleep_for(0.5);
                 progress->advance(0);
                 sim::sleep_for(0.5);
                 progress->advance(0);
                 second_advance = sim::now();
               },
               [&] { sim::sleep_for(1.0); }});
    EXPECT_NEAR(waited_until, second_advance, 1e-9);
    EXPECT_NEAR(waited_until - t0, 1.0, 1e-6);
    const auto failing = parts.progress(1);
    bool woke_false = true;
    parts.run({[&] { woke_false = failing->wait_past(0, 0); },
               [&] {
                 sim::sleep_for(0.25);
                 failing->fail();
               }});
    EXPECT_FALSE(woke_false);
    EXPECT_TRUE(failing->failed());
  });
  EXPECT_NEAR(seconds, 1.25, 1e-6) << "the parts ran one after another, not side by side";
}

// The simulated time against the platform: 2 hosts on 125 MB/s links exchange 64 MiB (a ring allreduce of 2 ranks
// sends half each way, twice): 2 x 32 MiB / 125 MB/s = 0.537 s; SimGrid's TCP model takes 97% of a link's rate.
sim::RunOptions big_enough() {
  sim::RunOptions o;
  o.max_held_bytes = std::size_t{1} << 30;
  return o;
}

TEST(SimCollectives, ARingOfTwoHostsTakesTheLinksTime) {
  load();
  const std::size_t count = (64u << 20) / sizeof(float);
  const double seconds = sim::run_ranks(
      {"h0", "h1"},
      [&](int, hc::Transport& t) {
        hc::sim::RankCollectives coll(t, {0, 1}, {0, 1}, 1u << 20);
        std::vector<float> buf(count, 1.0f);
        coll.run(hc::Algorithm::kRing, hc::Collective::kAllreduce, buf.data(), buf.data(), count, DataType::kFloat32);
        EXPECT_EQ(buf[count - 1], 2.0f);
      },
      big_enough());
  const double wire = 2.0 * (32u << 20) / 125e6;
  std::printf("a ring allreduce of 64 MiB on 2 hosts: %.4f simulated s, the links' time %.4f s\n", seconds, wire);
  EXPECT_GT(seconds, wire);
  EXPECT_LT(seconds, 1.15 * wire) << "simulated " << seconds << " s against the wire's " << wire;
}

}  // namespace
