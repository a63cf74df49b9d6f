// The extension points from outside the library: an algorithm registered by this test (no library file touched)
// is parsed, forced, chosen by `auto` and run by the communicator; a codec registered here is listed, parsed with
// its parameter checked, and all-reduces through the communicator; hier is among auto's candidates; and Work's
// completion callbacks run once, after the result, off every hopwise lock, and may issue collectives themselves.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <thread>
#include <vector>

#include "hopwise/comm/algorithm.h"
#include "hopwise/comm/cost_model.h"
#include "hopwise/common/error.h"
#include "hopwise/common/reduce.h"
#include "hopwise/compression/codec_table.h"
#include "inproc_group.h"

namespace {

using namespace hwtest;
using hc::Algorithm;
using hc::Collective;
using hopwise::DataType;
using hopwise::ReduceOp;

constexpr std::size_t kStarCount = 12347;  // the size at which the star's estimate undercuts every built-in
std::atomic<int> g_star_runs{0};

// A star allreduce written here: every rank sends its input to rank 0, which reduces them in rank order and sends
// the result back.
Algorithm star() {
  static const Algorithm id = [] {
    hc::AlgorithmInfo row;
    row.name = "test-star";
    row.aliases = {"star"};
    row.collectives = {Collective::kAllreduce};
    row.summary = "gather to rank 0, reduce, send back (registered by a test)";
    row.tags = 2;  // its own, from the table: apart from the user's send/recv and every other row's
    row.estimate = [](const hc::CostQuery& q) {
      return q.bytes == kStarCount * sizeof(float) ? 1e-15 : static_cast<double>(INFINITY);
    };
    row.run = [](hc::AlgorithmContext& ctx, const hc::CollectiveCall& c) {
      ++g_star_runs;
      hc::Transport& t = ctx.transport;
      const int up = ctx.first_tag, down = ctx.first_tag + 1;
      const std::size_t bytes = c.count * hopwise::dtype_size(c.dt);
      if (t.rank() == 0) {
        std::vector<char> in(bytes);
        if (c.out != c.in) std::memcpy(c.out, c.in, bytes);
        for (int r = 1; r < t.size(); ++r) {
          hc::Request q = t.irecv(in.data(), bytes, r, up);
          t.wait(q);
          hopwise::reduce_into(c.dt, c.op, c.out, c.out, in.data(), c.count);
        }
        if (c.scale != 1.0) hopwise::scale_by(c.dt, c.out, c.count, c.scale);
        hc::Requests sends(t);
        for (int r = 1; r < t.size(); ++r) sends.push_back(t.isend(c.out, bytes, r, down));
        t.wait_all(sends);
        sends.clear();
      } else {
        hc::Request s = t.isend(c.in, bytes, 0, up);
        t.wait(s);
        hc::Request q = t.irecv(c.out, bytes, 0, down);
        t.wait(q);
      }
    };
    return hc::register_algorithm(row);
  }();
  return id;
}

TEST(AlgorithmTable, ARegisteredAlgorithmIsParsedForcedChosenAndRun) {
  const Algorithm a = star();
  EXPECT_GE(static_cast<int>(a), static_cast<int>(Algorithm::kFirstRegistered));
  EXPECT_EQ(hc::parse_algorithm("test-star"), a);
  EXPECT_EQ(hc::parse_algorithm("star"), a);
  EXPECT_EQ(hc::to_string(a), "test-star");
  EXPECT_TRUE(hc::implements(a, Collective::kAllreduce));
  EXPECT_FALSE(hc::implements(a, Collective::kBroadcast));
  EXPECT_GE(hc::algorithm_info(a).first_tag, 1 << 24) << "its tags are the table's, above every built-in one";
  try {
    hc::parse_algorithm("nope");
    ADD_FAILURE() << "an unknown name parsed";
  } catch (const hopwise::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("test-star"), std::string::npos)
        << "the choices list the new row: " << e.what();
  }
  for (int n : {2, 3, 5}) {
    for (bool forced : {true, false}) {
      Group g(n, test_options(forced ? a : Algorithm::kAuto));
      for (std::size_t count : {kStarCount, std::size_t{1000}}) {
        const bool expect_star = forced || count == kStarCount;
        EXPECT_EQ(g.comm(0).algorithm_for(Collective::kAllreduce, count * sizeof(float)) == a, expect_star)
            << n << " ranks, " << count << " floats, forced " << forced;
        const int before = g_star_runs.load();
        const std::string err = g.run([&](int r, hc::Communicator& c) {
          std::vector<float> x(count), y(count, -1.0f);
          for (std::size_t i = 0; i < count; ++i) x[i] = static_cast<float>(r + 1) * 0.5f + static_cast<float>(i % 7);
          c.allreduce(x.data(), y.data(), count, DataType::kFloat32, ReduceOp::kAvg);
          for (std::size_t i = 0; i < count; ++i) {
            const float want = static_cast<float>(n + 1) * 0.25f + static_cast<float>(i % 7);
            if (std::fabs(y[i] - want) > 1e-4f) throw hopwise::Error(fmt::format("y[{}] = {}, want {}", i, y[i], want));
          }
        });
        EXPECT_EQ(err, "");
        EXPECT_EQ(g_star_runs.load() - before, expect_star ? n : 0) << "the registered row ran on every rank";
      }
      // A collective the row does not implement falls back to the table's choice.
      EXPECT_NE(g.comm(0).algorithm_for(Collective::kBroadcast, 64), a);
    }
  }
}

TEST(AlgorithmTable, RowsAreCheckedWhenRegistered) {
  hc::AlgorithmInfo dup;
  dup.name = "ring";
  dup.collectives = {Collective::kAllreduce};
  dup.run = [](hc::AlgorithmContext&, const hc::CollectiveCall&) {};
  EXPECT_THROW(hc::register_algorithm(dup), hopwise::InvalidArgument);
  hc::AlgorithmInfo no_run;
  no_run.name = "test-no-run";
  no_run.collectives = {Collective::kAllreduce};
  EXPECT_THROW(hc::register_algorithm(no_run), hopwise::InvalidArgument);
  EXPECT_THROW(hc::algorithm_info(static_cast<Algorithm>(60)), hopwise::InvalidArgument);
}

TEST(AlgorithmTable, HierIsAmongAutosCandidates) {
  EXPECT_TRUE(hc::algorithm_info(Algorithm::kHierarchical).candidate);
  hc::CostModel model;
  hc::CostQuery q;
  q.collective = Collective::kAllreduce;
  q.bytes = 1 << 20;
  q.ranks = 8;
  q.hosts = 2;
  q.tree_depth = 3;
  bool found = false;
  for (const auto& [a, t] : model.candidates(q, false))
    if (a == Algorithm::kHierarchical) {
      found = true;
      EXPECT_TRUE(std::isfinite(t)) << "hier's estimate";
      EXPECT_GT(t, 0);
    }
  EXPECT_TRUE(found);
  // Every built-in row that implements allreduce is a candidate (native only with native collectives).
  std::vector<Algorithm> got;
  for (const auto& [a, t] : model.candidates(q, true)) got.push_back(a);
  for (Algorithm a : {Algorithm::kRing, Algorithm::kHalvingDoubling, Algorithm::kTree, Algorithm::kNative,
                      Algorithm::kOneShot, Algorithm::kTwoShot, Algorithm::kHierarchical})
    EXPECT_NE(std::find(got.begin(), got.end(), a), got.end()) << hc::to_string(a);
}

TEST(AlgorithmTable, EveryRowRunsEveryCollectiveItClaims) {
  for (Algorithm a : hc::all_algorithms()) {
    const hc::AlgorithmInfo& row = hc::algorithm_info(a);
    if (row.needs_native || row.name == "test-star") continue;
    Group g(3, test_options(a));
    const std::string err = g.run([&](int r, hc::Communicator& c) {
      for (Collective col : row.collectives) {
        std::vector<double> x(9, r + 1.0), y(27, 0.0);
        switch (col) {
          case Collective::kAllreduce: c.allreduce(x.data(), y.data(), 9, DataType::kFloat64); break;
          case Collective::kReduceScatter: c.reduce_scatter(y.data(), x.data(), 9, DataType::kFloat64); break;
          case Collective::kAllgather: c.allgather(x.data(), y.data(), 9, DataType::kFloat64); break;
          case Collective::kBroadcast: c.broadcast(x.data(), 9, DataType::kFloat64, 1); break;
          case Collective::kReduce: c.reduce(x.data(), y.data(), 9, DataType::kFloat64, ReduceOp::kSum, 2); break;
          case Collective::kBarrier: c.barrier(); break;
          default: break;
        }
        if (col == Collective::kAllreduce && y[8] != 6.0) throw hopwise::Error(fmt::format("{}: {}", row.name, y[8]));
        if (col == Collective::kBroadcast && x[0] != 2.0) throw hopwise::Error(fmt::format("{}: {}", row.name, x[0]));
      }
    });
    EXPECT_EQ(err, "") << row.name;
  }
}

// ---- completion callbacks ----
TEST(WorkCallbacks, RunOnceAfterTheResultWithoutLocks) {
  Group g(3, test_options());
  const std::string err = g.run([&](int r, hc::Communicator& c) {
    std::vector<float> x(100003, static_cast<float>(r));
    std::promise<float> seen;
    std::atomic<int> calls{0};
    hc::Work w = c.allreduce_async(x.data(), x.data(), x.size(), DataType::kFloat32);
    w.on_complete([&](std::exception_ptr e) {
      ++calls;
      if (e) std::rethrow_exception(e);
      (void)c.stats();                    // takes the communicator's lock: not held here
      c.set_algorithm(Algorithm::kAuto);  // nor here
      seen.set_value(x.back());           // the result is in place
    });
    const float v = seen.get_future().get();
    w.wait();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (v != 3.0f) throw hopwise::Error(fmt::format("callback saw {} before the result (want 3)", v));
    if (calls != 1) throw hopwise::Error(fmt::format("callback ran {} times", calls.load()));
    // Registered after completion: runs at once, on this thread.
    bool inline_ran = false;
    const auto me = std::this_thread::get_id();
    w.on_complete([&](std::exception_ptr e) { inline_ran = !e && std::this_thread::get_id() == me; });
    if (!inline_ran) throw hopwise::Error("a callback on completed work did not run at once on the caller's thread");
  });
  EXPECT_EQ(err, "");
}

// What PyTorch's PowerSGD hook does: inside the callback of one allreduce, start another and wait for it.
TEST(WorkCallbacks, ACallbackMayIssueAndWaitForCollectives) {
  Group g(4, test_options());
  const std::string err = g.run([&](int r, hc::Communicator& c) {
    std::vector<float> a(5000, 1.0f), b(7000, 0.0f), d(3, 0.0f);
    std::promise<void> done;
    c.allreduce_async(a.data(), a.data(), a.size(), DataType::kFloat32).on_complete([&](std::exception_ptr e) {
      if (e) return done.set_exception(e);
      for (auto& v : b) v = a[0] + static_cast<float>(r);                          // uses the first result
      c.allreduce_async(b.data(), b.data(), b.size(), DataType::kFloat32).wait();  // async, waited inside
      c.allreduce(d.data(), d.data(), d.size(), DataType::kFloat32);               // and a sync call
      hc::Work inner = c.allreduce_async(d.data(), d.data(), d.size(), DataType::kFloat32);
      inner.on_complete([&](std::exception_ptr e2) { e2 ? done.set_exception(e2) : done.set_value(); });
    });
    if (done.get_future().wait_for(std::chrono::seconds(60)) != std::future_status::ready)
      throw hopwise::Error("the nested collectives deadlocked");
    const float want = 4 * 4.0f + 6.0f;  // sum over ranks of (4 + r)
    if (b.back() != want) throw hopwise::Error(fmt::format("nested result {} want {}", b.back(), want));
  });
  EXPECT_EQ(err, "");
}

TEST(WorkCallbacks, PointToPointCompletesWithoutAWait) {
  Group g(2, test_options());
  const std::string err = g.run([&](int r, hc::Communicator& c) {
    int v = r == 0 ? 42 : 0;
    std::promise<int> got;
    if (r == 1) {
      c.recv_async(&v, 1, DataType::kInt32, 0).on_complete([&](std::exception_ptr e) {
        e ? got.set_exception(e) : got.set_value(v);
      });
      if (got.get_future().wait_for(std::chrono::seconds(30)) != std::future_status::ready)
        throw hopwise::Error("a receive's callback never ran without a wait()");
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      c.send(&v, 1, DataType::kInt32, 1);
    }
  });
  EXPECT_EQ(err, "");
}

TEST(WorkCallbacks, AFailedCallGivesTheCallbackItsError) {
  Group g(2, test_options(Algorithm::kRing, 256 << 10, 0.5));
  const std::string err = g.run([&](int r, hc::Communicator& c) {
    if (r == 1) return;  // never joins
    float x = 1.0f;
    std::promise<std::string> got;
    c.allreduce_async(&x, &x, 1, DataType::kFloat32).on_complete([&](std::exception_ptr e) {
      try {
        if (e) std::rethrow_exception(e);
        got.set_value("");
      } catch (const std::exception& x) {
        got.set_value(x.what());
      }
    });
    const std::string what = got.get_future().get();
    if (what.find("timed out") == std::string::npos && what.find("Timeout") == std::string::npos &&
        what.find("timeout") == std::string::npos)
      throw hopwise::Error("the callback did not get the timeout: '" + what + "'");
  });
  EXPECT_EQ(err, "");
}

TEST(WorkCallbacks, PendingCallbacksRunWhenTheCommunicatorGoes) {
  std::atomic<int> ran{0};
  std::promise<void> go;
  std::shared_future<void> released = go.get_future().share();
  std::thread releaser;
  {
    Group g(2, test_options());
    const std::string err = g.run([&](int, hc::Communicator& c) {
      std::vector<float> x(1 << 16, 1.0f);
      hc::Work w = c.allreduce_async(x.data(), x.data(), x.size(), DataType::kFloat32);
      // The first callback holds the completion thread until released, so the second is still queued when the
      // communicators go.
      w.on_complete([released](std::exception_ptr) { released.wait(); });
      w.on_complete([&](std::exception_ptr) { ++ran; });
      w.wait();
    });
    EXPECT_EQ(err, "");
    EXPECT_EQ(ran.load(), 0);
    releaser = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      go.set_value();
    });
  }  // the group's destructor waits for the release, then runs the queued callbacks
  releaser.join();
  EXPECT_EQ(ran.load(), 2);
}

// ---- a codec from outside: "scaled" sends every value times 1/factor as float32 and multiplies back (exact for
// powers of two); one row with one parameter ----

namespace hcd = hopwise::compression::detail;

class ScaledCodec final : public hopwise::compression::Codec {
 public:
  ScaledCodec(std::string name, float factor) : name_(std::move(name)), factor_(factor) {}
  std::string name() const override { return name_; }
  hopwise::compression::Pattern pattern() const override { return hopwise::compression::Pattern::kAggregatable; }
  DataType payload_dtype() const override { return DataType::kFloat32; }
  std::size_t payload_count(std::size_t n) const override { return n; }

 protected:
  void do_encode(const float* grad, std::size_t n, std::byte* payload, hopwise::compression::CodecState&,
                 const float*) const override {
    auto* p = reinterpret_cast<float*>(payload);
    for (std::size_t i = 0; i < n; ++i) p[i] = grad[i] / factor_;
  }
  void do_decode(const std::byte* payload, std::size_t n, float* out, const hopwise::compression::CodecState&,
                 const float*, bool accumulate) const override {
    const auto* p = reinterpret_cast<const float*>(payload);
    for (std::size_t i = 0; i < n; ++i) out[i] = (accumulate ? out[i] : 0.0f) + p[i] * factor_;
  }

 private:
  std::string name_;
  float factor_;
};

constexpr hcd::ParamDef kScaledParams[] = {hcd::int_param("factor", "4", 1, 1024, "the divisor on the wire")};

std::unique_ptr<hopwise::compression::Codec> make_scaled(const hcd::CodecRow&, std::string name,
                                                         const hcd::ParamValues& v) {
  return std::make_unique<ScaledCodec>(std::move(name), static_cast<float>(v.integer("factor")));
}

TEST(CodecTable, ARegisteredCodecIsListedParsedCheckedAndAllReduced) {
  hcd::register_codec(
      {"scaled", kScaledParams, 1, hopwise::compression::Pattern::kAggregatable, &make_scaled, {0, false}, true});
  const auto names = hopwise::compression::known_codecs();
  EXPECT_NE(std::find(names.begin(), names.end(), "scaled"), names.end());
  const auto models = hopwise::compression::codecs_for_models();
  EXPECT_NE(std::find(models.begin(), models.end(), "scaled"), models.end());
  const auto codec = hopwise::compression::make_codec(hopwise::compression::parse_codec_spec("scaled:factor=8"));
  EXPECT_EQ(codec->name(), "scaled:factor=8");
  try {
    hopwise::compression::make_codec(hopwise::compression::parse_codec_spec("scaled:factor=0"));
    FAIL() << "factor=0 was taken";
  } catch (const hopwise::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("factor"), std::string::npos) << e.what();
  }
  // Through the communicator, as any codec: 3 ranks all-reduce small integers, exact through the codec.
  Group g(3, test_options());
  const std::size_t n = 1009;
  std::vector<std::vector<float>> out(3, std::vector<float>(n));
  const std::string errors = g.run([&](int r, hc::Communicator& c) {
    std::vector<float> in(n);
    for (std::size_t i = 0; i < n; ++i) in[i] = static_cast<float>((i % 7) + r);
    hopwise::compression::CodecState state(1, r, 3);
    c.allreduce_compressed(in.data(), out[static_cast<std::size_t>(r)].data(), n, *codec, state, ReduceOp::kSum);
  });
  ASSERT_EQ(errors, "");
  for (int r = 0; r < 3; ++r)
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(out[static_cast<std::size_t>(r)][i], static_cast<float>(3 * (i % 7) + 3)) << "rank " << r << " i " << i;
}

TEST(CodecTable, RowsAreCheckedWhenRegistered) {
  EXPECT_THROW(hcd::register_codec(
                   {"", nullptr, 0, hopwise::compression::Pattern::kAggregatable, &make_scaled, {0, false}, false}),
               hopwise::InvalidArgument);
  EXPECT_THROW(
      hcd::register_codec(
          {"bad name", nullptr, 0, hopwise::compression::Pattern::kAggregatable, &make_scaled, {0, false}, false}),
      hopwise::InvalidArgument);
  EXPECT_THROW(hcd::register_codec(
                   {"nofactory", nullptr, 0, hopwise::compression::Pattern::kAggregatable, nullptr, {0, false}, false}),
               hopwise::InvalidArgument);
}

}  // namespace

// The tags the engine keeps for the layers above it: gossip's range lies apart from every row's (registered rows
// from 1 << 24, the built-ins' and their ring channels' below 10000 + 20000 k), and an unknown user is named.
TEST(ReservedTags, GossipHasItsOwnRangeAndAnUnknownUserIsRefused) {
  const hc::TagRange g = hc::reserved_tags("gossip");
  EXPECT_GE(g.count, 1);
  EXPECT_GE(g.first, 10000) << "below 10000 the tags are the user's send/recv";
  EXPECT_LE(g.first + g.count, 20000) << "from 20000 the ring's second channel";
  for (Algorithm a : hc::all_algorithms()) {
    const hc::AlgorithmInfo& row = hc::algorithm_info(a);
    if (row.tags == 0) continue;
    EXPECT_TRUE(row.first_tag + row.tags <= g.first || row.first_tag >= g.first + g.count) << row.name;
  }
  try {
    hc::reserved_tags("diloco");
    FAIL() << "an unknown user got tags";
  } catch (const hopwise::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("gossip"), std::string::npos) << e.what();
  }
}
