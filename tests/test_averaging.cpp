// Every averaging method against a serial simulation of the same ranks: in-process ranks train a deterministic
// quadratic problem (each rank its own curvature, centre and noise) through the GradientReducer and the
// ModelAverager; one thread replays the method's definition over all ranks' models at once. The parameters must
// agree at the end, where every rank holds the same bits. Hosts come from a HOPWISE_TOPO_FILE of several hosts.
#include <fmt/core.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "averaging_inproc.h"
#include "hopwise/common/error.h"
#include "hopwise/compression/codec.h"
#include "hopwise/topology/cluster.h"
#include "hopwise/topology/formats.h"
#include "hopwise/training/averaging.h"
#include "hopwise/training/averaging_method.h"
#include "hopwise/training/reducer.h"
#include "hosts_file.h"

namespace hc = hopwise::comm;
namespace ht = hopwise::topology;
namespace fs = std::filesystem;

namespace {

using namespace hwtest::averaging;

void expect_matches(const Models& got, const Models& want, const std::string& what) {
  for (std::size_t r = 0; r < got.size(); ++r) {
    ASSERT_EQ(got[r].size(), kDim) << what;
    EXPECT_EQ(std::memcmp(got[r].data(), got[0].data(), kDim * sizeof(float)), 0)
        << what << ": rank " << r << " ended with other bits than rank 0";
    EXPECT_EQ(compare(got[r], want[r], 2e-4), "") << what << ": rank " << r;
  }
}

TEST(Averaging, EveryMethodMatchesTheSerialSimulationOnOneToEightRanks) {
  for (int n : {1, 2, 3, 4, 5, 8}) {
    hwtest::Group g(n, hwtest::test_options());
    const std::vector<int> one_host(static_cast<std::size_t>(n), 0);
    for (const std::string& spec : kSpecs) {
      const std::string what = fmt::format("{} on {} ranks", spec, n);
      expect_matches(train(g, {spec}), simulate({spec}, n, one_host, g.comm(0).ring_order()), what);
    }
  }
}

// A model that lives elsewhere (a GPU, bfloat16) is averaged through a host copy the averager fetches and publishes
// range by range (ParameterStaging): every method, codec and fragment setting ends with the direct path's bits.
TEST(Averaging, EveryMethodOnAStagedHostCopyKeepsTheDirectPathsBits) {
  std::vector<std::string> specs = kSpecs;
  for (const char* more : {"diloco:period=4,fragments=4,delay=1,codec=int4", "diloco:period=6,fragments=2,codec=int8",
                           "diloco:period=4,fragments=2,delay=1,alpha=0.5,codec=topk", "async:period=3,codec=int8",
                           "gossip:peers=1,codec=int8", "local:period=2,warmup=2"})
    specs.emplace_back(more);
  for (int n : {1, 2, 3}) {
    hwtest::Group g(n, hwtest::test_options());
    for (const std::string& spec : specs) {
      const Models direct = train(g, {spec});
      hwtest::averaging::Run staged{spec};
      staged.staged = true;
      const Models copy = train(g, staged);
      for (std::size_t r = 0; r < direct.size(); ++r)
        EXPECT_EQ(std::memcmp(direct[r].data(), copy[r].data(), kDim * sizeof(float)), 0)
            << spec << " on " << n << " ranks, staged: rank " << r << " ended with other bits (first: " << copy[r][0]
            << " against " << direct[r][0] << ")";
    }
  }
}

// The whole model crosses from the device once per averager call at most: the constructor's broadcast and the
// outer path's synced copy share one fetch, a full average and the reference it restarts from another.
TEST(Averaging, AStagedModelIsFetchedWholeOnceACall) {
  hwtest::Group g(2, hwtest::test_options());
  for (const std::string spec : {"diloco:period=4,codec=int8", "local:period=3", "gossip:peers=1,codec=int8"}) {
    ASSERT_EQ(g.run([&](int, hc::Communicator& comm) {
      std::vector<float> model(kDim, 1.0f), host(kDim);
      CopyStaging staging(model.data(), host.data());
      hc::ModelAverager avg(comm, hc::AveragingSpec::parse(spec), host.data(), kDim, &staging);
      EXPECT_EQ(staging.fetched, kDim) << spec << ": construction";
      avg.full_average();
      EXPECT_EQ(staging.fetched, 2 * kDim) << spec << ": a full average";
    }),
              "")
        << spec;
  }
}

TEST(Averaging, HierarchicalAveragesGradientsWithinEachHost) {
  // 2 hosts x 2 ranks, 3 hosts of 2, 2 and 1, 2 hosts x 4.
  for (auto [hosts, gpus, n] : {std::tuple{2, 2, 4}, std::tuple{3, 2, 5}, std::tuple{2, 4, 8}}) {
    const fs::path file = hwtest::hosts_file(hosts, gpus);
    ::setenv("HOPWISE_TOPO_FILE", file.c_str(), 1);
    hwtest::Group g(n, hwtest::test_options());
    ::unsetenv("HOPWISE_TOPO_FILE");
    std::vector<int> host_of;
    for (int r = 0; r < n; ++r) host_of.push_back(r / gpus);
    for (int r = 0; r < n; ++r)
      EXPECT_EQ(g.comm(r).host_ranks(), r / gpus == hosts - 1 ? n - (hosts - 1) * gpus : gpus) << "rank " << r;
    for (const std::string& spec :
         {std::string("hier:period=3"), std::string("hier:period=1"), std::string("hier:period=2,warmup=3"),
          std::string("gossip:peers=1"), std::string("sync")}) {
      const std::string what = fmt::format("{} on {} hosts, {} ranks", spec, hosts, n);
      expect_matches(train(g, {spec}), simulate({spec}, n, host_of, g.comm(0).ring_order()), what);
    }
    fs::remove(file);
  }
}

TEST(Averaging, WithinHostAllreduceMatchesAPlainSumPerHost) {
  const fs::path file = hwtest::hosts_file(3, 2);
  ::setenv("HOPWISE_TOPO_FILE", file.c_str(), 1);
  hc::Options o = hwtest::test_options(hc::Algorithm::kAuto, 1024);  // small chunks: the pipelined tree
  hwtest::Group g(5, o);
  ::unsetenv("HOPWISE_TOPO_FILE");
  fs::remove(file);
  const std::string err = g.run([](int r, hc::Communicator& comm) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{70001}}) {
      for (auto op : {hopwise::ReduceOp::kSum, hopwise::ReduceOp::kAvg, hopwise::ReduceOp::kMax}) {
        std::vector<double> v(n), want(n, op == hopwise::ReduceOp::kMax ? -1e300 : 0.0);
        const int host = r / 2, first = host * 2, members = host == 2 ? 1 : 2;
        for (std::size_t i = 0; i < n; ++i) {
          auto val = [&](int q) { return static_cast<double>((i * 7 + static_cast<std::size_t>(q) * 13) % 101) - 50; };
          v[i] = val(r);
          for (int q = first; q < first + members; ++q)
            want[i] = op == hopwise::ReduceOp::kMax ? std::max(want[i], val(q)) : want[i] + val(q);
          if (op == hopwise::ReduceOp::kAvg) want[i] /= members;
        }
        comm.allreduce_within_host(v.data(), v.data(), n, hopwise::DataType::kFloat64, op);
        for (std::size_t i = 0; i < n; ++i)
          if (std::abs(v[i] - want[i]) > 1e-9)
            throw std::runtime_error(
                fmt::format("n={} op={} [{}] = {}, want {}", n, hopwise::to_string(op), i, v[i], want[i]));
      }
    }
  });
  EXPECT_EQ(err, "");
}

TEST(Averaging, GossipPairsArePerfectMatchingsThatMeetEveryone) {
  for (int n = 2; n <= 9; ++n) {
    std::set<std::pair<int, int>> met;
    const int rounds = n % 2 == 0 ? n - 1 : n;
    for (int round = 0; round < rounds; ++round) {
      int idle = 0;
      for (int p = 0; p < n; ++p) {
        const int q = hc::gossip_partner(p, n, round);
        if (q < 0) {
          ++idle;
          continue;
        }
        EXPECT_NE(q, p);
        EXPECT_EQ(hc::gossip_partner(q, n, round), p) << "n=" << n << " round " << round;
        met.insert({std::min(p, q), std::max(p, q)});
      }
      EXPECT_EQ(idle, n % 2) << "n=" << n << " round " << round;
      // The schedule repeats after `rounds`.
      for (int p = 0; p < n; ++p) EXPECT_EQ(hc::gossip_partner(p, n, round), hc::gossip_partner(p, n, round + rounds));
    }
    EXPECT_EQ(met.size(), static_cast<std::size_t>(n * (n - 1) / 2)) << "n=" << n << ": not everyone met";
  }
  EXPECT_EQ(hc::gossip_partner(0, 1, 0), -1);
}

TEST(Averaging, GossipWithInt8KeepsTheMeanAndConverges) {
  const int n = 4;
  hwtest::Group g(n, hwtest::test_options());
  std::vector<double> sums(2, 0.0);
  std::vector<double> spread(n);
  const std::string err = g.run([&](int r, hc::Communicator& comm) {
    std::vector<float> x(kDim);
    for (std::size_t i = 0; i < kDim; ++i) x[i] = std::cos(static_cast<float>(i));
    hc::ModelAverager avg(comm, hc::AveragingSpec::parse("gossip:peers=1,codec=int8"), x.data(), kDim);
    // Each rank moves its own way, then only gossip runs: the ranks' mean stays, their spread shrinks.
    for (std::size_t i = 0; i < kDim; ++i) x[i] += centre(r, i);
    double before = 0;
    for (float v : x) before += v;
    comm.allreduce(&before, &before, 1, hopwise::DataType::kFloat64);
    for (int t = 0; t < 12; ++t) {
      avg.before_step();
      avg.after_step();
    }
    avg.before_step();
    double after = 0;
    for (float v : x) after += v;
    comm.allreduce(&after, &after, 1, hopwise::DataType::kFloat64);
    std::vector<float> mean(x);
    comm.allreduce(mean.data(), mean.data(), kDim, hopwise::DataType::kFloat32, hopwise::ReduceOp::kAvg);
    double d = 0;
    for (std::size_t i = 0; i < kDim; ++i) d = std::max(d, static_cast<double>(std::abs(x[i] - mean[i])));
    spread[static_cast<std::size_t>(r)] = d;
    if (r == 0) sums = {before, after};
  });
  ASSERT_EQ(err, "");
  EXPECT_NEAR(sums[1], sums[0], 1e-3 * std::abs(sums[0]) + 0.05);
  for (double d : spread) EXPECT_LT(d, 0.05) << "the ranks' models did not come together";
}

// async with a codec all-reduces int8 differences from the last average (error feedback on): it tracks the
// uncompressed method's course within the codec's rounding, and every rank ends with the same bits.
TEST(Averaging, AsyncWithInt8TracksTheUncompressedMethod) {
  for (int n : {2, 3, 4}) {
    hwtest::Group g(n, hwtest::test_options());
    const std::vector<int> one_host(static_cast<std::size_t>(n), 0);
    for (const std::string delay : {"", ",delay=1"}) {
      const Models got = train(g, {"async:codec=int8,period=2" + delay});
      const Models want = simulate({"async:period=2" + delay}, n, one_host, g.comm(0).ring_order());
      for (std::size_t r = 0; r < got.size(); ++r) {
        EXPECT_EQ(std::memcmp(got[r].data(), got[0].data(), kDim * sizeof(float)), 0) << "rank " << r << delay;
        EXPECT_EQ(compare(got[r], want[r], 5e-2), "") << n << " ranks, rank " << r << delay;
      }
    }
  }
}

TEST(Averaging, CheckpointStateRoundTripsAndRefusesAnotherMethod) {
  hwtest::Group g(2, hwtest::test_options());
  const std::string err = g.run([](int, hc::Communicator& comm) {
    std::vector<float> x(kDim, 1.0f);
    hc::ModelAverager a(comm, hc::AveragingSpec::parse("local:period=4,warmup=2"), x.data(), kDim);
    for (int t = 0; t < 5; ++t) a.after_step();
    a.full_average();
    const std::string saved = a.save();
    hc::ModelAverager b(comm, hc::AveragingSpec::parse("local:warmup=2,period=4"), x.data(), kDim);
    b.load(saved);
    if (b.steps() != 5 || b.gradient_scope() != hc::GradientScope::kNone) throw std::runtime_error("not restored");
    hc::ModelAverager c(comm, hc::AveragingSpec::parse("async:period=4"), x.data(), kDim);
    try {
      c.load(saved);
      throw std::runtime_error("loaded another method's state");
    } catch (const hopwise::InvalidArgument& e) {
      if (std::string(e.what()).find("local:period=4,warmup=2") == std::string::npos)
        throw std::runtime_error(std::string("error does not name the saved method: ") + e.what());
    }
  });
  EXPECT_EQ(err, "");
}

TEST(AveragingSpec, ParsesEveryMethodAndNamesWhatIsWrong) {
  EXPECT_EQ(hc::AveragingSpec::parse("sync").to_string(), "sync");
  EXPECT_EQ(hc::AveragingSpec::parse("local:warmup=100,period=8").to_string(), "local:period=8,warmup=100");
  EXPECT_EQ(hc::AveragingSpec::parse("hier:period=8").period, 8);
  EXPECT_EQ(hc::AveragingSpec::parse("gossip").peers, 1);
  EXPECT_EQ(hc::AveragingSpec::parse("gossip:peers=2,codec=int8").to_string(), "gossip:codec=int8,peers=2");
  EXPECT_EQ(hc::AveragingSpec::parse("async:period=16").method, "async");
  auto error_of = [](const std::string& s) {
    try {
      hc::AveragingSpec::parse(s);
    } catch (const hopwise::InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(error_of("local:period=0").find("period=0 must be a whole number >= 1"), std::string::npos);
  EXPECT_NE(error_of("hier:period=0").find("period=0"), std::string::npos);
  EXPECT_NE(error_of("async:period=-2").find("period=-2"), std::string::npos);
  EXPECT_NE(error_of("local:period=2.5").find("period=2.5"), std::string::npos);
  EXPECT_NE(error_of("local").find("local needs period=H"), std::string::npos);
  EXPECT_NE(error_of("gossip:peers=0").find("peers=0"), std::string::npos);
  // More partners a step than gossip's reserved tags could tell apart: refused at the spec, not deep in a job.
  EXPECT_NE(error_of("gossip:peers=3001").find("peers=3001 is more partners per step than gossip has tags for"),
            std::string::npos);
  EXPECT_EQ(hc::AveragingSpec::parse("gossip:peers=3000").peers, 3000);
  EXPECT_NE(error_of("elastic:period=2").find("method 'elastic' is unknown; methods: sync, local, hier, gossip, async"),
            std::string::npos);
  EXPECT_NE(error_of("local:period=2,peers=1").find("local takes period, warmup, not peers"), std::string::npos);
  EXPECT_NE(error_of("gossip:period=2").find("gossip takes peers, codec, not period"), std::string::npos);
  EXPECT_EQ(hc::AveragingSpec::parse("async:warmup=20,period=8").to_string(), "async:period=8,warmup=20");
  EXPECT_NE(error_of("sync:period=2").find("sync takes no fields"), std::string::npos);
  EXPECT_NE(error_of("gossip:codec=topk").find("codec=topk is not one gossip sends"), std::string::npos);
  EXPECT_NE(error_of("async:period=2,codec=sign").find("codec=sign is not one async sends"), std::string::npos);
  EXPECT_NE(error_of("async:period=4,delay=5").find("delay=5 is past period=4"), std::string::npos);
  EXPECT_NE(error_of("async:period=4,delay=0").find("delay=0 must be a whole number >= 1"), std::string::npos);
  EXPECT_NE(error_of("local:period=4,delay=1").find("local takes period, warmup, not delay"), std::string::npos);
  EXPECT_EQ(hc::AveragingSpec::parse("async:delay=2,period=8,codec=int8").to_string(),
            "async:codec=int8,delay=2,period=8");
  EXPECT_EQ(hc::AveragingSpec::parse("async:delay=8,period=8").to_string(), "async:period=8") << "the default delay";
  EXPECT_EQ(hc::AveragingSpec::parse("async:period=4,codec=int8,warmup=2").to_string(),
            "async:codec=int8,period=4,warmup=2");
  EXPECT_NE(error_of("local:period").find("averaging 'local:period'"), std::string::npos);
}

TEST(Averaging, HostScopeRefusesACodec) {
  hwtest::Group g(1, hwtest::test_options());
  std::vector<float> grad(10);
  hc::ReducerOptions ro;
  ro.compression = "fp16";
  hc::GradientReducer reducer(g.comm(0), ro);
  reducer.add_parameter("w", grad.data(), grad.size());
  reducer.finalize();
  EXPECT_THROW(reducer.set_scope(hc::GradientScope::kHost), hopwise::InvalidArgument);
  reducer.set_scope(hc::GradientScope::kNone);
  reducer.mark_ready(0);
  EXPECT_EQ(reducer.finish().bytes, 0u);
}

// ---- an averaging method from outside the library: one row, no library file touched ----

// "test-halves:period=H": every H steps each rank moves halfway to the world's mean (the gradients stay local).
class Halves final : public hc::AveragingMethodBase {
 public:
  explicit Halves(hc::AveragingContext& ctx) : ctx_(ctx), mean_(ctx.count) {}
  hc::GradientScope gradient_scope(std::int64_t) const override { return hc::GradientScope::kNone; }
  void after_step(std::int64_t t) override {
    if (t % ctx_.spec.period != 0) return;
    ctx_.comm->allreduce(ctx_.params, mean_.data(), ctx_.count, hopwise::DataType::kFloat32, hopwise::ReduceOp::kAvg);
    for (std::size_t i = 0; i < ctx_.count; ++i) ctx_.params[i] = 0.5f * (ctx_.params[i] + mean_[i]);
    ++ctx_.stats.averages;
  }

 private:
  hc::AveragingContext& ctx_;
  std::vector<float> mean_;
};

void register_halves() {
  hc::register_averaging_method({"test-halves",
                                 {"period"},
                                 {"period"},
                                 {"period"},
                                 false,
                                 "halfway to the mean every H steps (registered by a test)",
                                 [](hc::AveragingContext& ctx) { return std::make_unique<Halves>(ctx); }});
}

TEST(AveragingTable, ARegisteredMethodIsParsedNamedAndRunByTheAverager) {
  register_halves();
  const hc::AveragingSpec s = hc::AveragingSpec::parse("test-halves:period=2");
  EXPECT_EQ(s.method, "test-halves");
  EXPECT_EQ(s.to_string(), "test-halves:period=2");
  try {
    hc::AveragingSpec::parse("test-halves:peers=2");
    FAIL() << "no error";
  } catch (const hopwise::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("test-halves takes period, not peers"), std::string::npos) << e.what();
  }
  try {
    hc::AveragingSpec::parse("nonesuch");
    FAIL() << "no error";
  } catch (const hopwise::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("test-halves"), std::string::npos) << "the methods listed: " << e.what();
  }
  // Three ranks, each its own parameters r + 1 (the averager broadcasts rank 0's first, so they are set after);
  // two steps: at step 2 each moves halfway to the mean 2.
  constexpr int kRanks = 3;
  hwtest::Group g(kRanks, hwtest::test_options());
  std::vector<float> got(kRanks);
  const std::string err = g.run([&](int r, hc::Communicator& comm) {
    std::vector<float> x(5, 0.0f);
    hc::ModelAverager avg(comm, s, x.data(), x.size());
    std::fill(x.begin(), x.end(), static_cast<float>(r + 1));
    if (avg.gradient_scope() != hc::GradientScope::kNone) throw std::runtime_error("scope is not the row's");
    avg.after_step();
    if (x[0] != static_cast<float>(r + 1)) throw std::runtime_error("averaged at step 1");
    avg.after_step();
    got[static_cast<std::size_t>(r)] = x[4];
    avg.full_average();
    if (x[0] != 2.0f) throw std::runtime_error("full_average did not give the mean");
  });
  EXPECT_EQ(err, "");
  for (int r = 0; r < kRanks; ++r) EXPECT_FLOAT_EQ(got[static_cast<std::size_t>(r)], 0.5f * (r + 1 + 2.0f));
  EXPECT_THROW(hc::register_averaging_method({"test-bad",
                                              {"rate"},
                                              {},
                                              {},
                                              false,
                                              "",
                                              [](hc::AveragingContext& ctx) { return std::make_unique<Halves>(ctx); }}),
               hopwise::InvalidArgument);
}

}  // namespace
