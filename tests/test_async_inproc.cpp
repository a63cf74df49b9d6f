// Async collectives, Work handles, argument errors and timeouts over the in-process transport.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "collective_reference.h"
#include "hopwise/common/error.h"
#include "inproc_group.h"

namespace {

using namespace hwtest;
using hc::Algorithm;

using Clock = std::chrono::steady_clock;

std::vector<const void*> ptrs(const std::vector<Bytes>& v) {
  std::vector<const void*> p;
  for (const auto& b : v) p.push_back(b.data());
  return p;
}

std::string run_threads(int n, const std::function<void(int)>& fn) {
  return hwtest::joined_errors(hwtest::on_threads(n, fn));
}

using hwtest::message_of;

// Inputs and references for one allreduce over n ranks.
struct AllreduceData {
  DataType dt;
  ReduceOp op;
  std::size_t count;
  std::vector<Bytes> in, out;
  Expected want;
  AllreduceData(int n, DataType dt_, ReduceOp op_, std::size_t count_, std::uint64_t seed)
      : dt(dt_), op(op_), count(count_) {
    for (int r = 0; r < n; ++r) {
      in.push_back(make_input(dt, op, count, r, n, seed));
      out.push_back(make_garbage(count * hopwise::dtype_size(dt), seed + static_cast<std::uint64_t>(r)));
    }
    want = reference(dt, op, ptrs(in), 0, count);
  }
  void* in_of(int r) { return in[static_cast<std::size_t>(r)].data(); }
  void* out_of(int r) { return out[static_cast<std::size_t>(r)].data(); }
  void check(const std::string& what, bool in_place = false) {
    for (std::size_t r = 0; r < in.size(); ++r)
      EXPECT_EQ(compare(want, (in_place ? in[r] : out[r]).data(), 0, count), "") << what << ", rank " << r;
  }
};

// ================================================================================ async collectives
TEST(Async, AllreduceThenWait) {
  const std::uint64_t seed = base_seed();
  SCOPED_TRACE(seed_note(seed));
  std::vector<Algorithm> algorithms = own_algorithms();
  algorithms.insert(algorithms.begin(), Algorithm::kAuto);
  for (Algorithm a : algorithms) {
    SCOPED_TRACE(std::string(hc::to_string(a)));
    Group g(4, test_options(a));
    AllreduceData d(4, DataType::kFloat32, ReduceOp::kSum, 100003, seed);
    const std::string err = g.run([&](int r, hc::Communicator& c) {
      hc::Work w = c.allreduce_async(d.in_of(r), d.out_of(r), d.count, d.dt, d.op);
      EXPECT_TRUE(w.valid());
      w.wait();
      EXPECT_TRUE(w.test());
      EXPECT_EQ(w.error(), "");
      w.wait();  // waiting twice is harmless
    });
    ASSERT_EQ(err, "");
    d.check("allreduce_async");
  }
}

// Several async collectives of different kinds and sizes queued back to back, then waited for.
void back_to_back(int n, bool reverse_wait, std::uint64_t seed) {
  Group g(n, test_options(Algorithm::kAuto, 4096));
  AllreduceData a1(n, DataType::kFloat32, ReduceOp::kSum, 1000, seed + 1);
  AllreduceData a2(n, DataType::kFloat64, ReduceOp::kAvg, 100003, seed + 2);  // in place
  AllreduceData a3(n, DataType::kFloat16, ReduceOp::kMax, 7, seed + 3);
  AllreduceData a4(n, DataType::kInt64, ReduceOp::kProd, 3001, seed + 4);  // sync, queued behind the rest
  const std::size_t rc = 77;
  std::vector<Bytes> rs_in, rs_out, ag_in, ag_out, bc, red_in;
  Bytes red_out = make_garbage(333 * 2, seed);
  for (int r = 0; r < n; ++r) {
    rs_in.push_back(make_input(DataType::kInt32, ReduceOp::kSum, rc * static_cast<std::size_t>(n), r, n, seed + 5));
    rs_out.push_back(Bytes(rc * 4));
    ag_in.push_back(make_garbage(13, seed + 100 + static_cast<std::uint64_t>(r)));
    ag_out.push_back(Bytes(13 * static_cast<std::size_t>(n)));
    bc.push_back(make_garbage(5000 * 8, seed + 200 + static_cast<std::uint64_t>(r)));
    red_in.push_back(make_input(DataType::kBFloat16, ReduceOp::kMax, 333, r, n, seed + 6));
  }
  const int bc_root = n - 1, red_root = 1 % n;
  const Bytes bc_want = bc[static_cast<std::size_t>(bc_root)];
  const Expected rs_want =
      reference(DataType::kInt32, ReduceOp::kSum, ptrs(rs_in), 0, rc * static_cast<std::size_t>(n));
  const Expected red_want = reference(DataType::kBFloat16, ReduceOp::kMax, ptrs(red_in), 0, 333);
  Bytes ag_want;
  for (const auto& b : ag_in) ag_want.insert(ag_want.end(), b.begin(), b.end());

  const std::string err = g.run([&](int r, hc::Communicator& c) {
    const auto i = static_cast<std::size_t>(r);
    std::vector<hc::Work> w;
    w.push_back(c.allreduce_async(a1.in_of(r), a1.out_of(r), a1.count, a1.dt, a1.op));
    w.push_back(c.reduce_scatter_async(rs_in[i].data(), rs_out[i].data(), rc, DataType::kInt32, ReduceOp::kSum));
    w.push_back(c.allgather_async(ag_in[i].data(), ag_out[i].data(), 13, DataType::kUInt8));
    w.push_back(c.allreduce_async(a2.in_of(r), a2.in_of(r), a2.count, a2.dt, a2.op));
    w.push_back(c.broadcast_async(bc[i].data(), 5000, DataType::kFloat64, bc_root));
    w.push_back(c.reduce_async(red_in[i].data(), r == red_root ? red_out.data() : nullptr, 333, DataType::kBFloat16,
                               ReduceOp::kMax, red_root));
    w.push_back(c.barrier_async());
    w.push_back(c.allreduce_async(a3.in_of(r), a3.out_of(r), a3.count, a3.dt, a3.op));
    // A sync call while async work is queued runs after it, in call order.
    c.allreduce(a4.in_of(r), a4.out_of(r), a4.count, a4.dt, a4.op);
    EXPECT_TRUE(w.back().test()) << "the sync call returned before earlier async work finished";
    if (reverse_wait)
      for (auto it = w.rbegin(); it != w.rend(); ++it) it->wait();
    else
      for (auto& x : w) x.wait();
    for (auto& x : w) EXPECT_TRUE(x.test());
  });
  ASSERT_EQ(err, "");
  a1.check("allreduce float32");
  a2.check("allreduce float64 avg, in place", true);
  a3.check("allreduce float16");
  a4.check("sync allreduce int64 after the async calls");
  for (int r = 0; r < n; ++r) {
    const auto i = static_cast<std::size_t>(r);
    EXPECT_EQ(compare(rs_want, rs_out[i].data(), i * rc, rc), "") << "reduce_scatter, rank " << r;
    EXPECT_EQ(compare_bytes(ag_out[i].data(), ag_want.data(), ag_want.size()), "") << "allgather, rank " << r;
    EXPECT_EQ(compare_bytes(bc[i].data(), bc_want.data(), bc_want.size()), "") << "broadcast, rank " << r;
  }
  EXPECT_EQ(compare(red_want, red_out.data(), 0, 333), "") << "reduce";
}

TEST(Async, BackToBackMixedCollectivesWaitInOrder) {
  const std::uint64_t seed = base_seed();
  SCOPED_TRACE(seed_note(seed));
  for (int n : {1, 2, 3, 5, 8}) {
    SCOPED_TRACE(std::to_string(n) + " ranks");
    back_to_back(n, false, seed);
  }
}

TEST(Async, BackToBackMixedCollectivesWaitInReverse) {
  const std::uint64_t seed = base_seed();
  SCOPED_TRACE(seed_note(seed));
  for (int n : {2, 4, 7}) {
    SCOPED_TRACE(std::to_string(n) + " ranks");
    back_to_back(n, true, seed);
  }
}

TEST(Async, TwoCommunicatorsFromTheSameThreads) {
  const std::uint64_t seed = base_seed();
  SCOPED_TRACE(seed_note(seed));
  const int n = 4;
  Group ga(n, test_options(Algorithm::kRing, 1024)), gb(n, test_options(Algorithm::kTree, 512));
  AllreduceData x(n, DataType::kFloat32, ReduceOp::kSum, 50001, seed + 1);  // on A
  AllreduceData y(n, DataType::kInt32, ReduceOp::kMax, 50001, seed + 2);    // on B
  AllreduceData z(n, DataType::kFloat64, ReduceOp::kMin, 999, seed + 3);    // on B, sync
  AllreduceData u(n, DataType::kBFloat16, ReduceOp::kSum, 4097, seed + 4);  // on A, sync
  const std::string err = run_threads(n, [&](int r) {
    hc::Communicator& a = ga.comm(r);
    hc::Communicator& b = gb.comm(r);
    hc::Work wa, wb;
    // Odd ranks start on B, even ones on A: the two communicators must not care.
    if (r % 2 == 0) {
      wa = a.allreduce_async(x.in_of(r), x.out_of(r), x.count, x.dt, x.op);
      wb = b.allreduce_async(y.in_of(r), y.out_of(r), y.count, y.dt, y.op);
    } else {
      wb = b.allreduce_async(y.in_of(r), y.out_of(r), y.count, y.dt, y.op);
      wa = a.allreduce_async(x.in_of(r), x.out_of(r), x.count, x.dt, x.op);
    }
    hc::Work wz = b.allreduce_async(z.in_of(r), z.out_of(r), z.count, z.dt, z.op);
    a.allreduce(u.in_of(r), u.out_of(r), u.count, u.dt, u.op);
    if (r % 2 == 0) {
      wb.wait();
      wa.wait();
    } else {
      wa.wait();
      wb.wait();
    }
    wz.wait();
  });
  ASSERT_EQ(err, "");
  x.check("communicator A, allreduce_async");
  y.check("communicator B, allreduce_async");
  z.check("communicator B, second allreduce_async");
  u.check("communicator A, sync allreduce");
}

TEST(Async, TestEventuallyTrue) {
  const std::uint64_t seed = base_seed();
  SCOPED_TRACE(seed_note(seed));
  Group g(3, test_options(Algorithm::kRing, 4096));
  AllreduceData d(3, DataType::kFloat64, ReduceOp::kSum, 1 << 20, seed);
  const std::string err = g.run([&](int r, hc::Communicator& c) {
    hc::Work w = c.allreduce_async(d.in_of(r), d.out_of(r), d.count, d.dt, d.op);
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    long polls = 0;
    while (!w.test()) {
      ++polls;
      if (Clock::now() > deadline) throw std::runtime_error("Work::test() never became true");
      std::this_thread::yield();
    }
    EXPECT_TRUE(w.test());
    w.wait();
  });
  ASSERT_EQ(err, "");
  d.check("allreduce_async polled with test()");
}

TEST(Async, PointToPointTestIsFalseUntilTheSendIsPosted) {
  Group g(2, test_options());
  std::promise<void> checked;
  std::vector<int> src(1000), dst(1000, -1);
  std::iota(src.begin(), src.end(), 42);
  bool was_false = false;
  const std::string err = g.run([&](int r, hc::Communicator& c) {
    if (r == 1) {
      hc::Work w = c.recv_async(dst.data(), dst.size(), DataType::kInt32, 0, 5);
      was_false = !w.test();
      checked.set_value();
      const auto deadline = Clock::now() + std::chrono::seconds(30);
      while (!w.test()) {
        if (Clock::now() > deadline) throw std::runtime_error("recv never completed");
        std::this_thread::yield();
      }
      w.wait();
    } else {
      checked.get_future().wait();  // send only after rank 1 has seen test() false
      c.send(src.data(), src.size(), DataType::kInt32, 1, 5);
    }
  });
  ASSERT_EQ(err, "");
  EXPECT_TRUE(was_false) << "test() was true before anything was sent";
  EXPECT_EQ(dst, src);
}

// Once every Work has been waited for, nothing is in flight: changing the plan must be allowed.
TEST(Async, SetRingOrderRightAfterWait) {
  Group g(1, test_options());
  hc::Communicator& c = g.comm(0);
  float x = 1.0f;
  int refused = 0;
  std::string first;
  constexpr int kRounds = 20000;  // the window is short: many rounds make a refusal near-certain while it exists
  for (int i = 0; i < kRounds; ++i) {
    hc::Work w = c.allreduce_async(&x, &x, 1, DataType::kFloat32);
    w.wait();
    try {
      if (i % 2 == 0)
        c.set_ring_order({0});
      else
        c.set_trees(hopwise::topology::binary_tree({0}));
    } catch (const hopwise::InvalidArgument& e) {
      if (refused++ == 0) first = e.what();
    }
  }
  EXPECT_EQ(refused, 0) << refused << " of " << kRounds
                        << " plan changes right after wait() were refused; first: " << first;
}

TEST(Async, EmptyWorkHandle) {
  hc::Work w;
  EXPECT_FALSE(w.valid());
  EXPECT_TRUE(w.test());
  EXPECT_EQ(w.error(), "");
  EXPECT_THROW(w.wait(), hopwise::InvalidArgument);
}

// ================================================================================ argument errors
TEST(Errors, NullBuffersAreRejectedNamingNull) {
  Group g(2, test_options());
  hc::Communicator& c = g.comm(0);
  float buf[8] = {};
  const std::vector<std::pair<std::string, std::function<void()>>> calls = {
      {"allreduce null in", [&] { c.allreduce(nullptr, buf, 4, DataType::kFloat32); }},
      {"allreduce null out", [&] { c.allreduce(buf, nullptr, 4, DataType::kFloat32); }},
      {"allreduce_async null in", [&] { c.allreduce_async(nullptr, buf, 4, DataType::kFloat32); }},
      {"reduce_scatter null in", [&] { c.reduce_scatter(nullptr, buf, 1, DataType::kFloat32); }},
      {"reduce_scatter_async null out", [&] { c.reduce_scatter_async(buf, nullptr, 1, DataType::kFloat32); }},
      {"allgather null in", [&] { c.allgather(nullptr, buf, 1, DataType::kFloat32); }},
      {"allgather_async null out", [&] { c.allgather_async(buf, nullptr, 1, DataType::kFloat32); }},
      {"broadcast null", [&] { c.broadcast(nullptr, 3, DataType::kFloat32, 0); }},
      {"broadcast_async null", [&] { c.broadcast_async(nullptr, 3, DataType::kFloat32, 1); }},
      {"reduce null in", [&] { c.reduce(nullptr, buf, 3, DataType::kFloat32, ReduceOp::kSum, 0); }},
      {"reduce null out at the root", [&] { c.reduce(buf, nullptr, 3, DataType::kFloat32, ReduceOp::kSum, 0); }},
      {"reduce_async null out at the root",
       [&] { c.reduce_async(buf, nullptr, 3, DataType::kFloat32, ReduceOp::kSum, 0); }},
      {"send null", [&] { c.send(nullptr, 3, DataType::kFloat32, 1); }},
      {"recv_async null", [&] { c.recv_async(nullptr, 3, DataType::kFloat32, 1); }},
  };
  for (const auto& [what, call] : calls) {
    SCOPED_TRACE(what);
    try {
      call();
      ADD_FAILURE() << "no exception";
    } catch (const hopwise::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("null"), std::string::npos) << e.what();
    }
  }
  // count 0 needs no buffer.
  EXPECT_NO_THROW(c.allreduce(nullptr, nullptr, 0, DataType::kFloat32));
  EXPECT_NO_THROW(c.allreduce_async(nullptr, nullptr, 0, DataType::kFloat64).wait());
}

TEST(Errors, RootOutOfRange) {
  Group g(3, test_options());
  hc::Communicator& c = g.comm(0);
  float buf[4] = {};
  for (int root : {-1, 3, 100}) {
    SCOPED_TRACE("root " + std::to_string(root));
    const std::string b = message_of([&] { c.broadcast(buf, 4, DataType::kFloat32, root); });
    EXPECT_NE(b.find("root " + std::to_string(root)), std::string::npos) << b;
    EXPECT_THROW(c.broadcast_async(buf, 4, DataType::kFloat32, root), hopwise::InvalidArgument);
    EXPECT_THROW(c.reduce(buf, buf, 4, DataType::kFloat32, ReduceOp::kSum, root), hopwise::InvalidArgument);
    EXPECT_THROW(c.reduce_async(buf, buf, 4, DataType::kFloat32, ReduceOp::kMax, root), hopwise::InvalidArgument);
  }
}

TEST(Errors, AvgOnIntegers) {
  Group g(2, test_options());
  hc::Communicator& c = g.comm(1);
  std::int64_t buf[4] = {};
  for (DataType dt : {DataType::kInt32, DataType::kInt64, DataType::kUInt8}) {
    SCOPED_TRACE(std::string(hopwise::to_string(dt)));
    const std::string m = message_of([&] { c.allreduce(buf, buf, 2, dt, ReduceOp::kAvg); });
    EXPECT_NE(m.find("avg"), std::string::npos) << m;
    EXPECT_THROW(c.allreduce(buf, buf, 2, dt, ReduceOp::kAvg), hopwise::InvalidArgument);
    EXPECT_THROW(c.allreduce_async(buf, buf, 2, dt, ReduceOp::kAvg), hopwise::InvalidArgument);
    EXPECT_THROW(c.reduce_scatter(buf, buf, 1, dt, ReduceOp::kAvg), hopwise::InvalidArgument);
    EXPECT_THROW(c.reduce(buf, buf, 2, dt, ReduceOp::kAvg, 0), hopwise::InvalidArgument);
  }
}

TEST(Errors, RejectedCallsLeaveTheCommunicatorUsable) {
  const std::uint64_t seed = base_seed();
  SCOPED_TRACE(seed_note(seed));
  Group g(3, test_options());
  AllreduceData d(3, DataType::kFloat32, ReduceOp::kSum, 1001, seed);
  const std::string err = g.run([&](int r, hc::Communicator& c) {
    EXPECT_THROW(c.allreduce(nullptr, d.out_of(r), 5, DataType::kFloat32), hopwise::InvalidArgument);
    EXPECT_THROW(c.broadcast(d.out_of(r), 5, DataType::kFloat32, 7), hopwise::InvalidArgument);
    EXPECT_THROW(c.allreduce(d.in_of(r), d.out_of(r), 5, DataType::kInt32, ReduceOp::kAvg), hopwise::InvalidArgument);
    c.allreduce(d.in_of(r), d.out_of(r), d.count, d.dt, d.op);
  });
  ASSERT_EQ(err, "");
  d.check("allreduce after rejected calls");
  EXPECT_EQ(g.comm(0).stats().calls, 1u) << "rejected calls must not count";
}

// ================================================================================ timeouts
// Rank 1 never joins: rank 0's call must give up after timeout_s with a TimeoutError naming rank 1.
TEST(Timeout, MissingRankIsNamed) {
  for (Algorithm a : own_algorithms()) {
    for (bool async : {false, true}) {
      SCOPED_TRACE(std::string(hc::to_string(a)) + (async ? " async" : " sync"));
      Group g(2, test_options(a, 256 << 10, 1.0));
      std::vector<float> in(1000, 1.0f), out(1000);
      std::string what, work_error;
      std::vector<int> pending;
      double elapsed = -1;
      bool timed_out = false;
      const std::string err = g.run([&](int r, hc::Communicator& c) {
        if (r != 0) return;  // rank 1 skips the call
        const auto t0 = Clock::now();
        try {
          if (async) {
            hc::Work w = c.allreduce_async(in.data(), out.data(), in.size(), DataType::kFloat32);
            try {
              w.wait();
            } catch (...) {
              work_error = w.error();
              EXPECT_TRUE(w.test());
              throw;
            }
          } else {
            c.allreduce(in.data(), out.data(), in.size(), DataType::kFloat32);
          }
        } catch (const hopwise::TimeoutError& e) {
          timed_out = true;
          what = e.what();
          pending = e.pending_ranks();
        }
        elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
      });
      ASSERT_EQ(err, "");
      ASSERT_TRUE(timed_out) << "no TimeoutError";
      EXPECT_NE(what.find("waiting for rank(s) 1"), std::string::npos) << what;
      EXPECT_NE(what.find("rank 0"), std::string::npos) << what;
      EXPECT_NE(what.find("allreduce"), std::string::npos) << what;
      EXPECT_EQ(pending, std::vector<int>{1});
      EXPECT_GE(elapsed, 0.9);
      EXPECT_LT(elapsed, 15.0);
      if (async) {
        EXPECT_NE(work_error.find("waiting for rank(s) 1"), std::string::npos) << work_error;
      }
      // Later calls fail fast rather than joining a half-finished exchange.
      const auto t1 = Clock::now();
      const std::string again =
          message_of([&] { g.comm(0).allreduce(in.data(), out.data(), in.size(), DataType::kFloat32); });
      EXPECT_NE(again.find("unusable"), std::string::npos) << again;
      EXPECT_LT(std::chrono::duration<double>(Clock::now() - t1).count(), 0.5);
    }
  }
}

TEST(Timeout, BarrierAndBroadcast) {
  Group g(3, test_options(Algorithm::kAuto, 256 << 10, 1.0));
  std::string barrier_what, bcast_what;
  const std::string err = g.run([&](int r, hc::Communicator& c) {
    if (r == 2) return;
    if (r == 0) {
      try {
        c.barrier();
      } catch (const hopwise::TimeoutError& e) {
        barrier_what = e.what();
      }
    }
  });
  ASSERT_EQ(err, "");
  EXPECT_NE(barrier_what.find("waiting for rank(s)"), std::string::npos) << barrier_what;
  EXPECT_NE(barrier_what.find("barrier"), std::string::npos) << barrier_what;

  Group g2(2, test_options(Algorithm::kTree, 256 << 10, 1.0));
  std::vector<double> buf(100, 1.0);
  const std::string err2 = g2.run([&](int r, hc::Communicator& c) {
    if (r == 1) {
      try {
        c.broadcast(buf.data(), buf.size(), DataType::kFloat64, 0);  // root 0 never sends
      } catch (const hopwise::TimeoutError& e) {
        bcast_what = e.what();
      }
    }
  });
  ASSERT_EQ(err2, "");
  EXPECT_NE(bcast_what.find("waiting for rank(s) 0"), std::string::npos) << bcast_what;
}

// After a call fails with a timeout and returns, the caller owns its buffer again: a peer that arrives late must
// not write into it (the transport withdraws the failed call's receives "so that no late peer writes into them").
// Here rank 1 gives up on a chunked collective; rank 0 then joins late.
void late_peer_case(bool broadcast) {
  Group g(2, test_options(broadcast ? Algorithm::kTree : Algorithm::kRing, 256, 0.5));
  const std::size_t count = 4096;  // 64 chunks of 256 bytes
  std::vector<float> src(count * 2), buf(count * 2);
  std::iota(src.begin(), src.end(), 1.0f);
  std::promise<void> gave_up, late_done;
  bool rank1_timed_out = false;
  std::vector<float> after(count * 2);
  const std::string err = g.run([&](int r, hc::Communicator& c) {
    if (r == 1) {
      try {
        if (broadcast)
          c.broadcast(buf.data(), count, DataType::kFloat32, 0);
        else
          c.allgather(src.data() + count, buf.data(), count, DataType::kFloat32);
      } catch (const hopwise::TimeoutError&) {
        rank1_timed_out = true;
      }
      std::fill(buf.begin(), buf.end(), -7.0f);  // the caller reuses its buffer
      gave_up.set_value();
      late_done.get_future().wait();
      after = buf;
    } else {
      gave_up.get_future().wait();
      try {
        if (broadcast)
          c.broadcast(src.data(), count, DataType::kFloat32, 0);
        else
          c.allgather(src.data(), src.data(), count, DataType::kFloat32);
      } catch (const hopwise::Error&) {
        // rank 1 is gone: rank 0 may time out too
      }
      late_done.set_value();
    }
  });
  ASSERT_EQ(err, "");
  ASSERT_TRUE(rank1_timed_out);
  std::size_t changed = 0;
  for (float v : after) changed += v != -7.0f;
  EXPECT_EQ(changed, 0u) << changed << " elements of rank 1's buffer were written after its call had failed";
}

TEST(Timeout, NoLateWritesIntoTheCallersBufferBroadcast) { late_peer_case(true); }
TEST(Timeout, NoLateWritesIntoTheCallersBufferAllgather) { late_peer_case(false); }

}  // namespace
