// diloco and the outer path local, hier and async now share (training/src/averaging/outer.cpp): local keeps the
// bits it always had, diloco with outer lr 1 and no momentum is local, a state saved mid-period resumes bit for
// bit, a codec with error feedback tracks the uncompressed course, diloco:auto's choice, and the spec's errors.
// (Every diloco spec of averaging_problem.h's kSpecs is checked against the serial reference in test_averaging.)
#include <fmt/core.h>
#include <gtest/gtest.h>

#include <cstring>

#include "../training/src/averaging/auto_pick.h"
#include "averaging_inproc.h"
#include "hopwise/common/error.h"
#include "hopwise/training/averaging.h"

namespace hc = hopwise::comm;
namespace hd = hopwise::comm::detail;

namespace {

using namespace hwtest::averaging;

bool same_bits(const Models& a, const Models& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t r = 0; r < a.size(); ++r)
    if (a[r].size() != b[r].size() || std::memcmp(a[r].data(), b[r].data(), a[r].size() * sizeof(float)) != 0)
      return false;
  return true;
}

// Post-local SGD as it was written before the outer path: the parameters all-reduced in place every H steps after
// W synchronous ones, and at each full average.
std::vector<float> old_local_rank(int r, hc::Communicator& comm, const Run& run, int period, int warmup) {
  std::vector<float> x(kDim), v(kDim, 0.0f), grad(kDim);
  for (std::size_t i = 0; i < kDim; ++i) x[i] = std::cos(static_cast<float>(i));
  for (std::int64_t t = 1; t <= run.steps; ++t) {
    gradient(r, t, x.data(), grad.data());
    if (t <= warmup)
      comm.allreduce(grad.data(), grad.data(), kDim, hopwise::DataType::kFloat32, hopwise::ReduceOp::kAvg);
    sgd(x.data(), v.data(), grad.data());
    if (t > warmup && (t - warmup) % period == 0)
      comm.allreduce(x.data(), x.data(), kDim, hopwise::DataType::kFloat32, hopwise::ReduceOp::kAvg);
    if (t % run.eval_every == 0)  // the full average, even where the step averaged already
      comm.allreduce(x.data(), x.data(), kDim, hopwise::DataType::kFloat32, hopwise::ReduceOp::kAvg);
  }
  comm.allreduce(x.data(), x.data(), kDim, hopwise::DataType::kFloat32, hopwise::ReduceOp::kAvg);
  return x;
}

}  // namespace

TEST(Diloco, LocalKeepsItsBitsAndDilocoWithOuterLrOneAndNoMomentumIsLocal) {
  for (int n : {1, 2, 3, 5, 8}) {
    hwtest::Group g(n, hwtest::test_options());
    for (const auto& [period, warmup] : {std::pair{4, 3}, std::pair{1, 0}, std::pair{7, 0}}) {
      const hwtest::averaging::Run local{fmt::format("local:period={},warmup={}", period, warmup)};
      Models old(static_cast<std::size_t>(n));
      ASSERT_EQ(g.run([&](int r, hc::Communicator& comm) {
        old[static_cast<std::size_t>(r)] = old_local_rank(r, comm, local, period, warmup);
      }),
                "");
      const Models now = train(g, local);
      EXPECT_TRUE(same_bits(now, old)) << local.spec << " on " << n << " ranks";
      const Models diloco = train(
          g, {fmt::format("diloco:period={},warmup={},outer_lr=1,momentum=0,codec=none,fragments=1", period, warmup)});
      EXPECT_TRUE(same_bits(diloco, now)) << "diloco as local, period " << period << " on " << n << " ranks";
    }
  }
}

// A state saved mid-period (a fragment in flight, residuals, momentum), loaded by a fresh averager after the
// constructor's broadcast, continues exactly where the run that was not interrupted goes.
TEST(Diloco, AStateSavedMidPeriodResumesBitForBit) {
  for (const std::string spec :
       {"diloco:period=8,fragments=2,delay=1,codec=int8", "diloco:period=6", "async:period=4,codec=int8",
        "diloco:period=4,fragments=4,delay=1,alpha=0.5,codec=topk", "local:period=5"}) {
    hwtest::Group g(3, hwtest::test_options());
    Models straight(3), resumed(3);
    const std::string err = g.run([&](int r, hc::Communicator& comm) {
      for (const bool interrupt : {false, true}) {
        std::vector<float> x(kDim), v(kDim, 0.0f), grad(kDim);
        for (std::size_t i = 0; i < kDim; ++i) x[i] = std::cos(static_cast<float>(i));
        auto avg = std::make_unique<hc::ModelAverager>(comm, hc::AveragingSpec::parse(spec), x.data(), kDim);
        for (std::int64_t t = 1; t <= 23; ++t) {
          gradient(r, t, x.data(), grad.data());
          sgd(x.data(), v.data(), grad.data());
          avg->after_step();
          if (interrupt && t == 11) {  // mid-period: 11 is no multiple of any period above
            const std::string saved = avg->save();
            const std::vector<float> own = x;
            avg.reset();
            std::fill(x.begin(), x.end(), 7.0f);
            avg = std::make_unique<hc::ModelAverager>(comm, hc::AveragingSpec::parse(spec), x.data(), kDim);
            x = own;  // the trainer's own parameters come back from its checkpoint
            avg->load(saved);
            if (avg->steps() != 11) throw std::runtime_error("steps not restored");
          }
        }
        avg->full_average();
        (interrupt ? resumed : straight)[static_cast<std::size_t>(r)] = x;
      }
    });
    ASSERT_EQ(err, "") << spec;
    EXPECT_TRUE(same_bits(straight, resumed)) << spec;
  }
}

// int8 and fp16 keep every element: the course stays within their rounding, amplified by the outer momentum (an
// error in one sync's average moves the synced model by lr * (1 + momentum) / (1 - momentum) in all). topk and sign
// send a fraction: what they leave out waits in the residual, so over 6 syncs the model lags far behind; they must
// still leave every rank with the same bits.
TEST(Diloco, ACodecWithErrorFeedbackTracksTheUncompressedCourse) {
  for (int n : {2, 4}) {
    hwtest::Group g(n, hwtest::test_options());
    const std::vector<int> one_host(static_cast<std::size_t>(n), 0);
    for (const std::string spec : {"diloco:period=4,fragments=2,delay=1", "diloco:period=4,outer_lr=1,momentum=0"})
      for (const auto& [codec, tolerance] :
           {std::pair{"int8", 0.15}, std::pair{"fp16", 0.01}, std::pair{"topk", 1e9}, std::pair{"sign", 1e9}}) {
        const Models got = train(g, {spec + ",codec=" + codec});
        const Models want = simulate({spec}, n, one_host, g.comm(0).ring_order());
        for (std::size_t r = 0; r < got.size(); ++r) {
          EXPECT_EQ(std::memcmp(got[r].data(), got[0].data(), kDim * sizeof(float)), 0) << codec << " rank " << r;
          for (float v : got[r]) ASSERT_TRUE(std::isfinite(v)) << codec;
          EXPECT_EQ(compare(got[r], want[r], tolerance), "") << spec << "," << codec << " on " << n << " ranks";
        }
      }
  }
}

TEST(Diloco, TheAverageKeepsTheStateItSays) {
  hwtest::Group g(2, hwtest::test_options());
  ASSERT_EQ(g.run([](int, hc::Communicator& comm) {
    std::vector<float> x(1000, 1.0f);
    const auto bytes = [&](const std::string& spec) {
      hc::ModelAverager a(comm, hc::AveragingSpec::parse(spec), x.data(), x.size());
      return a.stats().state_bytes;
    };
    if (bytes("local:period=4") != 0) throw std::runtime_error("local keeps state");
    if (bytes("async:period=4") != 8000) throw std::runtime_error("async keeps other than two buffers");
    // synced 4000 + momentum 4000 + send/receive 2 * 2000 (two fragments)
    if (const auto b = bytes("diloco:period=4,fragments=2"); b != 12000)
      throw std::runtime_error(fmt::format("diloco keeps {}", b));
    if (const auto b = bytes("diloco:period=4,codec=int8,momentum=0"); b != 16000)  // synced, residual, 2 buffers
      throw std::runtime_error(fmt::format("diloco with int8 keeps {}", b));
  }),
            "");
}

TEST(DilocoAuto, PicksTheShortestPeriodThatReachesTheTarget) {
  const hc::AveragingSpec spec = hc::AveragingSpec::parse("diloco:auto,target=0.9");
  for (const double full_ms : {0.5, 20.0, 400.0, 5000.0}) {
    hd::LinkProbe link;
    link.step_ms = 10;
    link.full_ms = full_ms;
    link.bytes = 4 << 20;
    link.codecs = {{"none", 1.0, 0.0}, {"int8", 0.26, 3.0}, {"int4", 0.14, 4.0}};
    const hd::AutoChoice c = hd::pick_outer(link, spec, 2);
    EXPECT_GE(c.utilization, 0.9) << full_ms;
    EXPECT_NE(c.why.find("reaching the target 90%"), std::string::npos) << c.why;
    // no shorter period reaches the target, whatever the rest
    for (int h = 1; h < c.settings.period; h *= 2)
      for (const auto& codec : link.codecs)
        for (int f = 1; f <= std::min(8, h); f *= 2)
          for (int d = 0; d <= std::min(h / f, 16); ++d) {
            const double per = (full_ms * codec.wire_ratio + codec.cpu_ms) / f;
            const double exposed = d == 0 ? per : std::max(0.0, per - d * 10.0);
            const double util = h * 10.0 / (h * 10.0 + f * exposed + std::max(0.0, f * per - h * 10.0));
            EXPECT_LT(util, 0.9) << "period " << h << " would do: " << c.why;
          }
    EXPECT_EQ(c.settings.lr, c.settings.period >= 128 ? 0.7 : 1.0) << "inner sgd: plain averaging below 128";
  }
  hd::LinkProbe none_reach{10, 1e9, 4 << 20, {{"none", 1.0, 0.0}}};
  const hd::AutoChoice c = hd::pick_outer(none_reach, hc::AveragingSpec::parse("diloco:auto,inner=adam"), 2);
  EXPECT_NE(c.why.find("short of the target"), std::string::npos) << c.why;
  EXPECT_EQ(c.settings.lr, 1.0) << "inner adam: plain averaging";
  EXPECT_EQ(c.settings.momentum, 0.0);
}

TEST(DilocoAuto, MeasuresInTheFirstStepsAndEveryRankTakesTheSameChoice) {
  hwtest::Group g(2, hwtest::test_options());
  Models got = train(g, {"diloco:auto,target=0.5", 40, 100});
  EXPECT_EQ(std::memcmp(got[0].data(), got[1].data(), kDim * sizeof(float)), 0);
  std::vector<std::string> choices(2);
  ASSERT_EQ(g.run([&](int r, hc::Communicator& comm) {
    std::vector<float> x(kDim, 1.0f);
    hc::ModelAverager a(comm, hc::AveragingSpec::parse("diloco:auto"), x.data(), kDim);
    for (int t = 0; t <= hd::kProbeSteps; ++t) a.after_step();
    choices[static_cast<std::size_t>(r)] = a.choice();
    const std::string saved = a.save();
    hc::ModelAverager b(comm, hc::AveragingSpec::parse("diloco:auto"), x.data(), kDim);
    b.load(saved);
    if (b.choice() != a.choice()) throw std::runtime_error("the choice is not restored");
  }),
            "");
  EXPECT_NE(choices[0].find("diloco:auto chose period="), std::string::npos) << choices[0];
  EXPECT_EQ(choices[0], choices[1]);
}

// After its choice auto times the steps that follow and keeps it or lengthens the period; every rank decides alike.
TEST(DilocoAuto, ChecksItsChoiceOnTheStepsThatFollow) {
  hwtest::Group g(2, hwtest::test_options());
  std::vector<std::string> said(2);
  Models x(2);
  ASSERT_EQ(g.run([&](int r, hc::Communicator& comm) {
    std::vector<float> v(kDim, 0.0f), grad(kDim);
    std::string last;
    auto& p = x[static_cast<std::size_t>(r)];
    p.assign(kDim, 0.0f);
    hc::ModelAverager a(comm, hc::AveragingSpec::parse("diloco:auto,target=0.99"), p.data(), kDim);
    for (std::int64_t t = 1; t <= 400; ++t) {
      gradient(r, t, p.data(), grad.data());
      sgd(p.data(), v.data(), grad.data());
      a.after_step();
      if (std::string c = a.choice(); c != last && !c.empty()) {
        said[static_cast<std::size_t>(r)] += c + "\n";
        last = std::move(c);
      }
    }
    a.full_average();
  }),
            "");
  EXPECT_EQ(said[0], said[1]);  // the same decisions at the same steps (their figures are agreed)
  EXPECT_NE(said[0].find("diloco:auto chose"), std::string::npos) << said[0];
  const bool checked = said[0].find("diloco:auto keeps") != std::string::npos ||
                       said[0].find("diloco:auto lengthens the period") != std::string::npos;
  EXPECT_TRUE(checked) << said[0];
  EXPECT_EQ(std::memcmp(x[0].data(), x[1].data(), kDim * sizeof(float)), 0);
}

TEST(DilocoSpec, ParsesAndNamesWhatIsWrong) {
  const auto error_of = [](const std::string& text) {
    try {
      hc::AveragingSpec::parse(text);
    } catch (const hopwise::InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(hc::AveragingSpec::parse("diloco:period=32").to_string(), "diloco:period=32");
  EXPECT_EQ(hc::AveragingSpec::parse("diloco:auto").to_string(), "diloco:auto");
  EXPECT_EQ(hc::AveragingSpec::parse("diloco:auto,inner=adam,target=0.9").to_string(),
            "diloco:auto,inner=adam,target=0.9");
  const std::string full =
      "diloco:alpha=0.5,codec=topk,delay=2,fragments=4,momentum=0.8,nesterov=0,outer_lr=0.5,period=16";
  EXPECT_EQ(hc::AveragingSpec::parse(full).to_string(), full);
  EXPECT_NE(error_of("diloco:period=6,fragments=4").find("not a multiple of fragments=4"), std::string::npos);
  EXPECT_NE(error_of("diloco:period=8,fragments=2,delay=5").find("use delay=0..4"), std::string::npos);
  EXPECT_NE(error_of("diloco:auto,period=8").find("picks period itself"), std::string::npos);
  EXPECT_NE(error_of("diloco:period=8,target=0.9").find("goes with diloco:auto"), std::string::npos);
  EXPECT_NE(error_of("diloco:auto=2").find("auto takes no value"), std::string::npos);
  EXPECT_NE(error_of("diloco:period=8,momentum=1").find("momentum=1 must be a number in [0, 1)"), std::string::npos);
  EXPECT_NE(error_of("diloco:period=8,outer_lr=0").find("outer_lr=0 must be a number in (0, 10]"), std::string::npos);
  EXPECT_NE(error_of("diloco:period=8,codec=zip").find("codec=zip is not a codec"), std::string::npos);
  EXPECT_NE(error_of("diloco:period=8,inner=lion").find("inner=lion is not sgd or adam"), std::string::npos);
  EXPECT_NE(error_of("diloco:momentum=0.5").find("diloco needs period=H"), std::string::npos);
  EXPECT_NE(error_of("local:period=8,outer_lr=0.5").find("local takes period, warmup, not outer_lr"),
            std::string::npos);
  EXPECT_NE(error_of("diloco:auto,").find("ends with ','"), std::string::npos);
}

// A saved state is taken whole or refused naming why: a model of another size, another spec's settings, bytes cut.
TEST(Diloco, ALoadRefusesAStateThatDoesNotFit) {
  hwtest::Group g(2, hwtest::test_options());
  ASSERT_EQ(g.run([](int, hc::Communicator& comm) {
    std::vector<float> x(200, 1.0f);
    const auto spec = hc::AveragingSpec::parse("diloco:period=4,codec=int8");
    hc::ModelAverager small(comm, spec, x.data(), 100);
    for (int t = 0; t < 6; ++t) small.after_step();
    const std::string saved = small.save();
    const auto refusal = [&](const std::string& state, const std::string& spec_text, std::size_t n) {
      hc::ModelAverager big(comm, hc::AveragingSpec::parse(spec_text), x.data(), n);
      try {
        big.load(state);
      } catch (const hopwise::InvalidArgument& e) {
        return std::string(e.what());
      }
      return std::string("(accepted)");
    };
    if (refusal(saved, "diloco:period=4,codec=int8", 200).find("does not fit") == std::string::npos)
      throw std::runtime_error("a state of 100 parameters loaded into 200");
    if (refusal(saved.substr(0, saved.size() - 3), "diloco:period=4,codec=int8", 100).find("not a saved") ==
        std::string::npos)
      throw std::runtime_error("a cut state loaded");
    if (refusal(saved, "diloco:period=4,codec=int8", 100) != "(accepted)") throw std::runtime_error("refused its own");
  }),
            "");
}

// auto's check reads compute from the same window's quiet steps: syncs that slow some steps count, the trainer's
// pauses (an evaluation's average, a stray slow step) do not, and a VM that slowed since the probe is not taken for
// the syncs' cost.
TEST(DilocoAuto, CheckReadsComputeFromTheWindowsQuietSteps) {
  std::vector<hd::CheckedStep> w;
  for (int i = 0; i < 40; ++i) w.push_back({i % 5 < 2 ? 28.0 : 12.0, i % 5 < 2, false});  // 16 of 40 wait on a sync
  w.push_back({900.0, false, true});   // an evaluation between two steps
  w.push_back({200.0, false, false});  // a stall of the trainer's own (above 3x the quiet median)
  const hd::WindowReading r = hd::read_window(w, /*probe_ms=*/10.0);
  EXPECT_EQ(r.quiet, 24);
  EXPECT_DOUBLE_EQ(r.compute_ms, 12.0);  // the window's own, not the probe's 10 ms
  EXPECT_NEAR(r.step_ms, (24 * 12.0 + 16 * 28.0) / 40, 1e-9);
  // A fragment at work on every step: no quiet step to read, so the probe's figure stands.
  std::vector<hd::CheckedStep> busy(32, {14.0, true, false});
  const hd::WindowReading b = hd::read_window(busy, 10.0);
  EXPECT_EQ(b.quiet, 0);
  EXPECT_DOUBLE_EQ(b.compute_ms, 10.0);
  EXPECT_DOUBLE_EQ(b.step_ms, 14.0);
  EXPECT_EQ(hd::read_window({}, 10.0).step_ms, 0.0);
}

// The next period brings the syncs' time per step within the target in one move where the measurement says how far.
TEST(DilocoAuto, LengthensByWhatTheWindowMeasured) {
  // 5 ms a step of syncs at period 4 against 8 ms of compute; 95% leaves them 0.42 ms: 4 * 5 / 0.42 = 47.5 -> 64.
  EXPECT_EQ(hd::lengthened_period(4, {13.0, 8.0, 10}, 0.95), 64);
  EXPECT_EQ(hd::lengthened_period(32, {8.5, 8.0, 10}, 0.95), 64);     // a little over: doubled
  EXPECT_EQ(hd::lengthened_period(256, {80.0, 8.0, 10}, 0.95), 512);  // the longest
  EXPECT_EQ(hd::lengthened_period(8, {9.0, 9.0, 0}, 0.95), 16);       // nothing over (a noisy window): doubled
}

// Before a longer period, a codec with fewer bits where its share of the measured cost fits what the target allows.
TEST(DilocoAuto, SwapsToFewerBitsBeforeALongerPeriod) {
  const std::vector<hd::CodecCost> codecs{{"none", 1.0, 0}, {"int8", 0.25, 1}, {"int4", 0.125, 1}};
  // 88 ms a step against 80 of compute: 8 ms of syncs at int8; 95% leaves 4.2 ms; int4 (half) makes 4 -> int4
  EXPECT_EQ(hd::lighter_codec("int8", codecs, {88.0, 80.0, 0}, 0.95), "int4");
  EXPECT_EQ(hd::lighter_codec("int8", codecs, {100.0, 80.0, 0}, 0.95), "");     // 10 ms at int4: the period grows
  EXPECT_EQ(hd::lighter_codec("none", codecs, {84.0, 80.0, 0}, 0.95), "int8");  // the most bits that fit
  EXPECT_EQ(hd::lighter_codec("int4", codecs, {84.0, 80.0, 0}, 0.95), "");      // none lighter
  EXPECT_EQ(hd::lighter_codec("fp8", codecs, {84.0, 80.0, 0}, 0.95), "");       // not among the probe's
}

// The outer step follows the period auto runs at, also after its check lengthened it: SGD-momentum inner steps get
// plain averaging below 128 and the papers' Nesterov step from there; Adam-family ones plain averaging at any period.
TEST(DilocoAuto, OuterStepFollowsThePeriod) {
  hd::OuterSettings s;
  s.period = 64;
  hd::set_outer_rule(s, "sgd");
  EXPECT_EQ(s.lr, 1.0);
  EXPECT_EQ(s.momentum, 0.0);
  EXPECT_FALSE(s.nesterov);
  s.period = 128;
  EXPECT_NE(hd::set_outer_rule(s, "sgd").find("long period"), std::string::npos);
  EXPECT_EQ(s.lr, 0.7);
  EXPECT_EQ(s.momentum, 0.9);
  EXPECT_TRUE(s.nesterov);
  for (const int period : {8, 512}) {
    s.period = period;
    hd::set_outer_rule(s, "adam");
    EXPECT_EQ(s.lr, 1.0) << "inner adam at " << period << ": plain averaging";
    EXPECT_EQ(s.momentum, 0.0);
    EXPECT_FALSE(s.nesterov);
  }
}
