// HOPWISE_DEBUG=CHECK over the in-process transport: ranks that agree run as before; a rank calling with another
// collective, count, dtype, op, root or algorithm makes every rank throw InvalidArgument naming the field and the
// ranks that disagree; a rank that never calls is named by every other rank's timeout.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../comm/src/algorithms/algorithms.h"
#include "hopwise/comm/transports/inproc_transport.h"
#include "hopwise/common/error.h"
#include "hopwise/compression/powersgd.h"
#include "inproc_group.h"

namespace {

using namespace hwtest;
using hopwise::DataType;
using hopwise::ReduceOp;

hc::Options check_options(double timeout_s = 30) {
  hc::Options o = test_options(hc::Algorithm::kAuto, 256 << 10, timeout_s);
  o.check = true;
  return o;
}

// Runs fn on every rank of a 4-rank group with the check on; returns each rank's error text ("" when none) and
// whether it was an InvalidArgument.
struct Outcome {
  std::vector<std::string> what;
  // char, not bool: the ranks' threads write their own elements at once, and vector<bool> packs them in one word.
  std::vector<char> invalid_argument, timeout;
};

Outcome run4(const std::function<void(int, hc::Communicator&)>& fn, double timeout_s = 30) {
  Group g(4, check_options(timeout_s));
  Outcome o{std::vector<std::string>(4), std::vector<char>(4, 0), std::vector<char>(4, 0)};
  g.run([&](int r, hc::Communicator& c) {
    try {
      fn(r, c);
    } catch (const hopwise::InvalidArgument& e) {
      o.what[static_cast<std::size_t>(r)] = e.what();
      o.invalid_argument[static_cast<std::size_t>(r)] = true;
    } catch (const hopwise::TimeoutError& e) {
      o.what[static_cast<std::size_t>(r)] = e.what();
      o.timeout[static_cast<std::size_t>(r)] = true;
    } catch (const std::exception& e) {
      o.what[static_cast<std::size_t>(r)] = e.what();
    }
  });
  return o;
}

// Every rank threw an InvalidArgument whose text contains every one of `parts`.
void expect_every_rank_reports(const Outcome& o, const std::vector<std::string>& parts) {
  for (std::size_t r = 0; r < o.what.size(); ++r) {
    EXPECT_TRUE(o.invalid_argument[r]) << "rank " << r << ": " << o.what[r];
    for (const auto& p : parts)
      EXPECT_NE(o.what[r].find(p), std::string::npos) << "rank " << r << " lacks '" << p << "': " << o.what[r];
  }
}

TEST(CollectiveCheck, AgreeingCallsRunAndGiveTheRightResults) {
  const Outcome o = run4([](int r, hc::Communicator& c) {
    std::vector<float> v(1000, static_cast<float>(r + 1)), all(4000), block(250);
    c.allreduce(v.data(), v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
    for (float x : v) ASSERT_EQ(x, 10.0f);
    c.allreduce_async(v.data(), v.data(), v.size(), DataType::kFloat32, ReduceOp::kMax).wait();
    c.allgather(v.data(), all.data(), v.size(), DataType::kFloat32);
    c.reduce_scatter(all.data(), block.data(), block.size(), DataType::kFloat32, ReduceOp::kSum);
    EXPECT_EQ(block[0], 40.0f);
    v.assign(v.size(), static_cast<float>(r));
    c.broadcast(v.data(), v.size(), DataType::kFloat32, 3);
    EXPECT_EQ(v[0], 3.0f);
    c.reduce(v.data(), r == 1 ? all.data() : nullptr, v.size(), DataType::kFloat32, ReduceOp::kSum, 1);
    if (r == 1) {
      EXPECT_EQ(all[0], 12.0f);
    }
    c.barrier();
  });
  for (const auto& w : o.what) EXPECT_EQ(w, "");
}

TEST(CollectiveCheck, CountMismatchIsNamedOnEveryRank) {
  const Outcome o = run4([](int r, hc::Communicator& c) {
    std::vector<float> v(1024);
    c.allreduce(v.data(), v.data(), r == 2 ? 512 : 1024, DataType::kFloat32, ReduceOp::kSum);
  });
  expect_every_rank_reports(
      o, {"HOPWISE_DEBUG=CHECK", "rank 2 differs from ranks 0,1,3", "count: 1024 on ranks 0,1,3, 512 on rank 2"});
}

// PowerSGD's spec is part of the call, as a codec's is: another rank on one rank is named.
TEST(CollectiveCheck, PowerSgdSpecMismatch) {
  const Outcome o = run4([](int r, hc::Communicator& c) {
    const auto ps = hopwise::compression::PowerSgd::from_spec(r == 3 ? "powersgd:rank=4" : "powersgd:rank=2");
    hopwise::compression::PowerSgdState st(1);
    std::vector<float> m(32 * 16, 1.0f);
    const hc::PowerSgdTensor t{m.data(), m.data(), 32, 16, &st};
    c.allreduce_powersgd(std::span<const hc::PowerSgdTensor>(&t, 1), ps);
  });
  expect_every_rank_reports(o, {"rank 3 differs from ranks 0-2", "codec:", "powersgd:ef=1,rank=4"});
}

TEST(CollectiveCheck, DtypeMismatch) {
  const Outcome o = run4([](int r, hc::Communicator& c) {
    std::vector<double> v(64);
    c.allreduce(v.data(), v.data(), 64, r == 0 ? DataType::kFloat64 : DataType::kFloat32, ReduceOp::kSum);
  });
  expect_every_rank_reports(o, {"rank 0 differs from ranks 1-3", "dtype: float64 on rank 0, float32 on ranks 1-3"});
}

TEST(CollectiveCheck, OpMismatch) {
  const Outcome o = run4([](int r, hc::Communicator& c) {
    std::vector<float> v(64);
    c.allreduce(v.data(), v.data(), 64, DataType::kFloat32, r == 3 ? ReduceOp::kMax : ReduceOp::kSum);
  });
  expect_every_rank_reports(o, {"rank 3 differs", "op: sum on ranks 0-2, max on rank 3"});
}

TEST(CollectiveCheck, RootMismatch) {
  const Outcome o = run4([](int r, hc::Communicator& c) {
    std::vector<float> v(64);
    c.broadcast(v.data(), 64, DataType::kFloat32, r == 1 ? 1 : 0);
  });
  expect_every_rank_reports(o, {"rank 1 differs", "root: 0 on ranks 0,2,3, 1 on rank 1"});
}

TEST(CollectiveCheck, CollectiveMismatch) {
  const Outcome o = run4([](int r, hc::Communicator& c) {
    std::vector<float> v(64), all(256);
    if (r == 1)
      c.allgather(v.data(), all.data(), 64, DataType::kFloat32);
    else
      c.allreduce(v.data(), v.data(), 64, DataType::kFloat32, ReduceOp::kSum);
  });
  expect_every_rank_reports(o, {"rank 1 differs", "collective: allreduce on ranks 0,2,3, allgather on rank 1"});
}

TEST(CollectiveCheck, AlgorithmForcedOnOneRankOnly) {
  const Outcome o = run4([](int r, hc::Communicator& c) {
    if (r == 0)
      c.set_algorithm(hc::Algorithm::kRing);
    else
      c.set_algorithm(hc::Algorithm::kTree);
    std::vector<float> v(4096);
    c.allreduce(v.data(), v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
  });
  expect_every_rank_reports(o, {"rank 0 differs", "algorithm: ring on rank 0, tree on ranks 1-3"});
}

TEST(CollectiveCheck, EvenSplitNamesTheHalfWithoutRankZero) {
  const Outcome o = run4([](int r, hc::Communicator& c) {
    std::vector<float> v(64);
    c.allreduce(v.data(), v.data(), r % 2 == 0 ? 64 : 32, DataType::kFloat32, ReduceOp::kSum);
  });
  expect_every_rank_reports(o, {"ranks 1,3 differ from ranks 0,2", "count: 64 on ranks 0,2, 32 on ranks 1,3"});
}

TEST(CollectiveCheck, CallNumberLocatesTheCall) {
  const Outcome o = run4([](int r, hc::Communicator& c) {
    std::vector<float> v(64);
    for (int i = 0; i < 3; ++i) c.allreduce(v.data(), v.data(), 64, DataType::kFloat32, ReduceOp::kSum);
    c.allreduce(v.data(), v.data(), r == 2 ? 63 : 64, DataType::kFloat32, ReduceOp::kSum);
  });
  expect_every_rank_reports(o, {"call #3 on this communicator", "rank 2 differs"});
}

TEST(CollectiveCheck, MismatchLeavesTheCommunicatorUnusable) {
  const Outcome o = run4([](int r, hc::Communicator& c) {
    std::vector<float> v(64);
    try {
      c.allreduce(v.data(), v.data(), r == 2 ? 32 : 64, DataType::kFloat32, ReduceOp::kSum);
    } catch (const hopwise::InvalidArgument&) {
    }
    c.allreduce(v.data(), v.data(), 64, DataType::kFloat32, ReduceOp::kSum);
  });
  for (const auto& w : o.what) EXPECT_NE(w.find("unusable after an earlier error"), std::string::npos) << w;
}

TEST(CollectiveCheck, ARankThatNeverCallsIsNamedByEveryOther) {
  const Outcome o = run4(
      [](int r, hc::Communicator& c) {
        if (r == 2) return;
        std::vector<float> v(1 << 16);  // large enough for a ring: the check still names rank 2 everywhere
        c.set_algorithm(hc::Algorithm::kRing);
        c.allreduce(v.data(), v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
      },
      1.0);
  for (int r : {0, 1, 3}) {
    EXPECT_TRUE(o.timeout[static_cast<std::size_t>(r)]) << o.what[static_cast<std::size_t>(r)];
    EXPECT_NE(o.what[static_cast<std::size_t>(r)].find("waiting for rank(s) 2;"), std::string::npos)
        << o.what[static_cast<std::size_t>(r)];
  }
  EXPECT_EQ(o.what[2], "");
}

// Without the check, through a ring: each rank waits on a different neighbour, and still every rank names the
// one that never called, from the notes the others send once they give up.
TEST(TimeoutExplained, EveryRankNamesTheRankThatNeverCalled) {
  hc::Options opts = test_options(hc::Algorithm::kRing, 256 << 10, 1.0);
  Group g(4, opts);
  std::vector<std::string> what(4);
  g.run([&](int r, hc::Communicator& c) {
    if (r == 2) return;
    std::vector<float> v(1 << 16);
    try {
      c.allreduce(v.data(), v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
    } catch (const hopwise::TimeoutError& e) {
      what[static_cast<std::size_t>(r)] = e.what();
    }
  });
  for (int r : {0, 1, 3})
    EXPECT_NE(what[static_cast<std::size_t>(r)].find("rank 2 did not answer within 0.5 s while ranks 0,1,3 gave up"),
              std::string::npos)
        << what[static_cast<std::size_t>(r)];
}

// Rank 0 runs `call0`, rank 1 `call1`, over the in-process ring; returns the InvalidArgument each raised ("" none).
std::vector<std::string> two_ranks_calling(const std::function<void(hc::Communicator&)>& call0,
                                           const std::function<void(hc::Communicator&)>& call1) {
  Group g(2, test_options(hc::Algorithm::kRing, 256 << 10, 30));
  std::vector<std::string> what(2);
  g.run([&](int r, hc::Communicator& c) {
    try {
      (r == 0 ? call0 : call1)(c);
    } catch (const hopwise::InvalidArgument& e) {
      what[static_cast<std::size_t>(r)] = e.what();
    }
  });
  return what;
}

// Different collectives on two ranks, through the ring's messages: the default call check names them at once.
TEST(DefaultCallCheck, DifferentCollectivesAreNamedAtOnce) {
  std::vector<float> v0(1024), v1(1024), all(2048);
  const auto what = two_ranks_calling(
      [&](hc::Communicator& c) { c.allreduce(v0.data(), v0.data(), v0.size(), DataType::kFloat32, ReduceOp::kSum); },
      [&](hc::Communicator& c) { c.allgather(v1.data(), all.data(), v1.size(), DataType::kFloat32); });
  for (const auto& w : what) {
    EXPECT_NE(w.find("checked by default"), std::string::npos) << w;
    EXPECT_NE(w.find("ranks 0,1 disagree; collective: allreduce on rank 0, allgather on rank 1"), std::string::npos)
        << w;
  }
}

// The same bytes as another dtype: without the check a float32 rank took a float64 peer's bytes as floats.
TEST(DefaultCallCheck, DtypeNamedWhereTheBytesWouldMatch) {
  std::vector<double> d(4, 1.0);
  std::vector<float> f(8, 1.0f);
  const auto what = two_ranks_calling(
      [&](hc::Communicator& c) { c.allreduce(d.data(), d.data(), d.size(), DataType::kFloat64, ReduceOp::kSum); },
      [&](hc::Communicator& c) { c.allreduce(f.data(), f.data(), f.size(), DataType::kFloat32, ReduceOp::kSum); });
  for (const auto& w : what) EXPECT_NE(w.find("dtype: float64 on rank 0, float32 on rank 1"), std::string::npos) << w;
}

// Counts the messages a rank sends, and those on the call stamps' tag.
class CountingTransport final : public hc::Transport {
 public:
  explicit CountingTransport(std::unique_ptr<hc::Transport> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return inner_->name(); }
  hc::Request isend(const void* buf, std::size_t bytes, int peer, int tag) override {
    ++sends;
    if (tag == hc::algo::kTagStamp) ++on_stamp_tag;
    return inner_->isend(buf, bytes, peer, tag);
  }
  hc::Request irecv(void* buf, std::size_t bytes, int peer, int tag) override {
    return inner_->irecv(buf, bytes, peer, tag);
  }
  void wait_all(std::span<hc::Request> reqs) override {
    inner_->set_timeout(timeout());
    inner_->wait_all(reqs);
  }
  bool test(hc::Request& r) override { return inner_->test(r); }
  void cancel(hc::Request& r) override { inner_->cancel(r); }
  std::atomic<int> sends{0}, on_stamp_tag{0};

 private:
  std::unique_ptr<hc::Transport> inner_;
};

// Messages per allreduce and rank over `algo` (n ranks, `count` floats each), checking the sums.
std::pair<double, double> messages_per_call(int n, hc::Algorithm algo, std::size_t count) {
  auto world = hc::make_inprocess_world(n);
  std::vector<CountingTransport*> counted;
  std::vector<std::unique_ptr<hc::Communicator>> comms;
  for (int r = 0; r < n; ++r) {
    auto t = std::make_unique<CountingTransport>(std::make_unique<hc::InProcessTransport>(world, r));
    counted.push_back(t.get());
    comms.push_back(std::make_unique<hc::Communicator>(std::move(t), test_options(algo)));
  }
  constexpr int kCalls = 5;
  const auto errors = hwtest::on_threads(n, [&](int r) {
    for (int call = 0; call < kCalls; ++call) {
      std::vector<float> v(count, static_cast<float>(r + call));
      comms[static_cast<std::size_t>(r)]->allreduce(v.data(), v.data(), count, DataType::kFloat32, ReduceOp::kSum);
      const float want = static_cast<float>(n * (n - 1) / 2 + n * call);
      for (float x : v)
        if (x != want) throw std::runtime_error(fmt::format("call {}: {} where the sum is {}", call, x, want));
    }
  });
  EXPECT_EQ(hwtest::joined_errors(errors), "");
  return {static_cast<double>(counted[0]->sends) / kCalls, static_cast<double>(counted[0]->on_stamp_tag) / kCalls};
}

// A small call's stamp costs no message: it leads the first message to each peer. A large call sends it alone.
TEST(DefaultCallCheck, SmallCallsCarryTheStampInTheirFirstMessage) {
  // Ring, 2 ranks: one reduce-scatter and one allgather message per call, to the one peer.
  EXPECT_EQ(messages_per_call(2, hc::Algorithm::kRing, 1024), std::make_pair(2.0, 1.0));
  // Halving-doubling, 4 ranks: two rounds each way, with two partners.
  EXPECT_EQ(messages_per_call(4, hc::Algorithm::kHalvingDoubling, 1000), std::make_pair(4.0, 2.0));
  // 256 KiB: the two data messages and the stamp's own.
  EXPECT_EQ(messages_per_call(2, hc::Algorithm::kRing, 1 << 16), std::make_pair(3.0, 1.0));
}

TEST(DefaultCallCheck, SmallCallsOfDifferentCountsAreNamed) {
  std::vector<float> a(1001), b(1001);
  const auto what = two_ranks_calling(
      [&](hc::Communicator& c) { c.allreduce(a.data(), a.data(), 1000, DataType::kFloat32, ReduceOp::kSum); },
      [&](hc::Communicator& c) { c.allreduce(b.data(), b.data(), 1001, DataType::kFloat32, ReduceOp::kSum); });
  for (const auto& w : what) EXPECT_NE(w.find("count: 1000 on rank 0, 1001 on rank 1"), std::string::npos) << w;
}

// One rank's call small (its stamp in its first message), the other's large (its stamp alone): the stamps still
// meet on their tag, and the rank that compares them names the count; neither waits for its timeout.
TEST(DefaultCallCheck, SmallAgainstLargeCallIsNamed) {
  Group g(2, test_options(hc::Algorithm::kRing, 256 << 10, 20));
  std::vector<std::string> what(2);
  const auto t0 = std::chrono::steady_clock::now();
  g.run([&](int r, hc::Communicator& c) {
    std::vector<float> v(100000);
    try {
      c.allreduce(v.data(), v.data(), r == 0 ? 1000 : v.size(), DataType::kFloat32, ReduceOp::kSum);
    } catch (const hopwise::Error& e) {
      what[static_cast<std::size_t>(r)] = e.what();
    }
  });
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0);
  EXPECT_TRUE(what[0].find("count: 1000 on rank 0, 100000 on rank 1") != std::string::npos ||
              what[1].find("count: 1000 on rank 0, 100000 on rank 1") != std::string::npos)
      << what[0] << "\n"
      << what[1];
  EXPECT_NE(what[0], "");
  EXPECT_NE(what[1], "");
}

TEST(TimeoutExplained, NoRankMissingMeansTheyWaitOnEachOther) {
  hc::Options o = test_options(hc::Algorithm::kRing, 256 << 10, 0.5);
  o.stamp_calls = false;  // HOPWISE_CALL_CHECK=0: nothing names the calls, the timeout must explain
  Group g(2, o);
  std::vector<std::string> what(2);
  g.run([&](int r, hc::Communicator& c) {
    std::vector<float> v(1024), all(2048);
    try {
      // Different collectives (without the check): each waits for messages the other never sends.
      if (r == 0)
        c.allreduce(v.data(), v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
      else
        c.allgather(v.data(), all.data(), v.size(), DataType::kFloat32);
    } catch (const hopwise::TimeoutError& e) {
      what[static_cast<std::size_t>(r)] = e.what();
    }
  });
  for (const auto& w : what)
    EXPECT_NE(w.find("every rank gave up in this call, none is missing"), std::string::npos) << w;
}

TEST(CollectiveCheck, TurnedOnByHopwiseDebug) {
  for (const char* v : {"CHECK", "INFO,CHECK", "check", "INFO CHECK"}) {
    setenv("HOPWISE_DEBUG", v, 1);
    EXPECT_TRUE(hc::Options::from_env().check) << v;
  }
  for (const char* v : {"INFO", "CHECKS", ""}) {
    setenv("HOPWISE_DEBUG", v, 1);
    EXPECT_FALSE(hc::Options::from_env().check) << v;
  }
  unsetenv("HOPWISE_DEBUG");
  EXPECT_FALSE(hc::Options::from_env().check);
}

}  // namespace
