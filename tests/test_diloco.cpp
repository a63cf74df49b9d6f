// diloco and the outer path local, hier and async now share (training/src/averaging/outer.cpp): local keeps the
// bits it always had, diloco with outer lr 1 and no momentum is local, a state saved mid-period resumes bit for
// bit, a codec with error feedback tracks the uncompressed course, diloco:auto's choice, and the spec's errors.
// (Every diloco spec of averaging_problem.h's kSpecs is checked against the serial reference in test_averaging.)
#include <fmt/core.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "../training/src/averaging/auto_pick.h"
#include "../training/src/averaging/auto_tuner.h"
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
    if (const auto b = bytes("diloco:period=4,fragments=2,momentum=0.9"); b != 12000)
      throw std::runtime_error(fmt::format("diloco keeps {}", b));
    if (const auto b = bytes("diloco:period=4,codec=int8,momentum=0"); b != 16000)  // synced, residual, 2 buffers
      throw std::runtime_error(fmt::format("diloco with int8 keeps {}", b));
  }),
            "");
}

// The shortest period that reaches the target, from the period where the inner optimizer's outer rule takes a
// momentum step (SGD: 128) where it has one.
TEST(DilocoAuto, PicksTheShortestPeriodThatReachesTheTarget) {
  for (const auto& [inner, floor] : {std::pair{"sgd", 128}, std::pair{"adam", 1}})
    for (const double full_ms : {0.5, 20.0, 400.0, 5000.0}) {
      const hc::AveragingSpec spec = hc::AveragingSpec::parse(std::string("diloco:auto,target=0.9,inner=") + inner);
      hd::LinkProbe link;
      link.step_ms = 10;
      link.full_ms = full_ms;
      link.bytes = 4 << 20;
      link.codecs = {{"none", 1.0, 0.0}, {"int8", 0.26, 3.0}, {"int4", 0.14, 4.0}};
      const hd::AutoChoice c = hd::pick_outer(link, spec, 2);
      EXPECT_GE(c.utilization, 0.9) << full_ms;
      EXPECT_NE(c.why.find("reaching the target 90%"), std::string::npos) << c.why;
      EXPECT_GE(c.settings.period, floor) << c.why;
      // no shorter period from the floor reaches the target, whatever the rest
      for (int h = floor; h < c.settings.period; h *= 2)
        for (const auto& codec : link.codecs)
          for (int f = 1; f <= std::min(8, h); f *= 2)
            for (int d = 0; d <= std::min(h / f, 16); ++d) {
              const double per = (full_ms * codec.wire_ratio + codec.cpu_ms) / f;
              const double exposed = d == 0 ? per : std::max(0.0, per - d * 10.0);
              const double util = h * 10.0 / (h * 10.0 + f * exposed + std::max(0.0, f * per - h * 10.0));
              EXPECT_LT(util, 0.9) << "period " << h << " would do: " << c.why;
            }
      EXPECT_EQ(c.settings.lr, floor == 128 ? 0.7 : 1.0) << "inner sgd: the Nesterov step from 128; adam: plain";
    }
  hd::LinkProbe none_reach{10, 1e9, 4 << 20, {{"none", 1.0, 0.0}}};
  const hd::AutoChoice c = hd::pick_outer(none_reach, hc::AveragingSpec::parse("diloco:auto,inner=adam"), 2);
  EXPECT_NE(c.why.find("short of the target"), std::string::npos) << c.why;
  EXPECT_EQ(c.settings.lr, 1.0) << "inner adam: plain averaging";
  EXPECT_EQ(c.settings.momentum, 0.0);
}

// Where the probe found the machine's cores busy (a CPU trainer), a codec's work takes a core from compute whatever
// the delay: the setting that hid it on idle cores (the LM's figures at 100 Mbit/s) no longer reaches the target,
// and the pick starts at the streamed period the check would take anyway.
TEST(DilocoAuto, BusyCoresCountTheCodecsWorkAgainstCompute) {
  const hc::AveragingSpec spec = hc::AveragingSpec::parse("diloco:auto,inner=adam");
  hd::LinkProbe link{226, 1100, 13 << 20, {{"none", 1.0, 0.0}, {"int8", 0.26, 15.0}, {"int4", 0.14, 20.0}}};
  const hd::AutoChoice idle = hd::pick_outer(link, spec, 2);
  link.cores_busy = 0.95;
  const hd::AutoChoice busy = hd::pick_outer(link, spec, 2);
  EXPECT_EQ(idle.settings.period, 1) << idle.why;
  // on busy cores the period starts where the check would stream it: a fragment every step
  EXPECT_EQ(busy.settings.period, hd::kStreamedPeriod) << busy.why;
  EXPECT_EQ(busy.settings.fragments, hd::kStreamedPeriod) << busy.why;
  EXPECT_EQ(busy.settings.delay, 1) << busy.why;
  EXPECT_GE(busy.utilization, 0.95) << busy.why;
  EXPECT_NE(busy.why.find("counted against compute"), std::string::npos) << busy.why;
  EXPECT_NE(idle.why.find("on an idle core"), std::string::npos) << idle.why;
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

// The probe runs the streamed schedule with its syncs blocking: each fragment synced in turn while compute is timed,
// so after the probe's first period every fragment was synced (the ranks agree on it right after its sync) and no
// rank drifts for the probe's whole length.
TEST(DilocoAuto, TheProbeSyncsEveryFragmentWhileItMeasures) {
  hwtest::Group g(2, hwtest::test_options());
  ASSERT_EQ(g.run([&](int r, hc::Communicator& comm) {
    std::vector<float> x(kDim), v(kDim, 0.0f), grad(kDim);
    for (std::size_t i = 0; i < kDim; ++i) x[i] = std::cos(static_cast<float>(i));
    hc::ModelAverager a(comm, hc::AveragingSpec::parse("diloco:auto,inner=sgd"), x.data(), kDim);
    const std::size_t F = hd::kStreamedPeriod;
    for (std::int64_t t = 1; t < hd::kProbeSteps; ++t) {
      gradient(r, t, x.data(), grad.data());
      sgd(x.data(), v.data(), grad.data());
      a.after_step();
      if (!a.choice().empty()) throw std::runtime_error("chose before the probe's steps were done: " + a.choice());
      // fragment (t - 1) % 4 was just synced: every rank holds the same values there
      const std::size_t f = static_cast<std::size_t>(t - 1) % F, b = kDim * f / F, e = kDim * (f + 1) / F;
      std::vector<float> other(x.begin() + static_cast<long>(b), x.begin() + static_cast<long>(e));
      comm.broadcast(other.data(), e - b, hopwise::DataType::kFloat32, 0);
      if (std::memcmp(other.data(), x.data() + b, (e - b) * sizeof(float)) != 0)
        throw std::runtime_error(fmt::format("step {}: fragment {} differs across ranks after its sync", t, f));
    }
    if (a.stats().syncs != static_cast<std::uint64_t>(hd::kProbeSteps - 1))
      throw std::runtime_error(fmt::format("{} syncs in {} probe steps", a.stats().syncs, hd::kProbeSteps - 1));
  }),
            "");
}

// After its choice auto times the steps that follow and keeps or changes it; every rank decides alike.
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
    // Steps, not time: enough for a window at period 512 (1024 steps) and its quiet window, however fast the
    // machine and whatever period the probe read.
    for (std::int64_t t = 1; t <= 1200; ++t) {
      gradient(r, t, p.data(), grad.data());
      sgd(p.data(), v.data(), grad.data());
      a.after_step();
      if (std::string c = a.choice(); c != last && !c.empty()) {
        said[static_cast<std::size_t>(r)] += c + "\n";
        last = std::move(c);
      }
    }
    // the pick stays readable after the check's decisions: the first thing said
    if (a.pick().empty() || said[static_cast<std::size_t>(r)].rfind(a.pick() + "\n", 0) != 0)
      throw std::runtime_error("pick() is not the first decision: " + a.pick());
    a.full_average();
  }),
            "");
  EXPECT_EQ(said[0], said[1]);  // the same decisions at the same steps (their figures are agreed)
  EXPECT_NE(said[0].find("diloco:auto chose"), std::string::npos) << said[0];
  EXPECT_GE(std::count(said[0].begin(), said[0].end(), '\n'), 2) << "no word from the check: " << said[0];
  EXPECT_EQ(std::memcmp(x[0].data(), x[1].data(), kDim * sizeof(float)), 0);
}

// A schedule with a sync at work on every step: the tuner holds its launches for a quiet window, reads compute there
// and decides on it; at 77% against a 95% target with the steps not waiting on the link, it swaps to fewer bits,
// streams period 1 as 4 fragments of period 4, and then keeps the period (never lengthened further on that).
TEST(DilocoAuto, ABusyScheduleIsReadOnAQuietWindowAndNeverLengthenedOnContention) {
  hwtest::Group g(1, hwtest::test_options());
  ASSERT_EQ(g.run([](int, hc::Communicator& comm) {
    using Clock = std::chrono::steady_clock;
    std::vector<float> x(4096, 1.0f);
    const hc::AveragingSpec spec = hc::AveragingSpec::parse("diloco:auto,inner=adam");
    hc::AveragingStats stats;
    hc::AveragingContext ctx{&comm, spec, x.data(), x.size(), stats};
    hd::AutoTuner tuner(ctx);
    Clock::time_point now = Clock::now();
    std::int64_t t = 0;
    std::optional<hd::OuterSettings> chosen;
    while (!chosen) chosen = tuner.probe(++t, now += std::chrono::milliseconds(10));
    now = Clock::now();  // the tuner reads its first checked step from the end of the probe's measurement
    hd::OuterSettings s = *chosen;
    s.codec = "none";  // where a 1-rank link leaves it, for the swap below
    const auto window = [&](double busy_ms, double quiet_ms) {
      std::optional<hd::OuterSettings> d;
      for (int i = 0; i < 64 && !d; ++i) {
        const bool hold = tuner.holding();
        tuner.step_done(!hold, 0.0);
        d = tuner.check(++t, now += std::chrono::microseconds(static_cast<int>((hold ? quiet_ms : busy_ms) * 1000)), s,
                        false);
        if (!tuner.checking()) break;
        if (tuner.said().find("reads again") != std::string::npos && !d) break;
      }
      return d;
    };
    auto d = window(13.0, 10.0);
    if (!d) throw std::runtime_error("no decision: " + tuner.said());
    if (tuner.said().find("swaps the codec none -> ") == std::string::npos) throw std::runtime_error(tuner.said());
    if (d->period != s.period) throw std::runtime_error("not a codec swap: " + tuner.said());
    s = *d;
    s.codec = "int4";  // the lightest
    s.period = s.fragments = 1;
    d = window(13.0, 10.0);  // period 1 on shared cores: streamed at period 4, a fragment every step
    if (!d || d->period != hd::kStreamedPeriod || d->fragments != hd::kStreamedPeriod)
      throw std::runtime_error("period 1 not streamed at period 4: " + tuner.said());
    s = *d;
    d = window(13.0, 10.0);
    if (d || tuner.checking() || tuner.said().find("diloco:auto keeps") == std::string::npos)
      throw std::runtime_error("not kept at 77% with the lightest codec: " + tuner.said());
  }),
            "");
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
  // No outer step named: the measured rule for the inner optimizer and the period, and the spec stays as written.
  const auto outer = [](const std::string& text) {
    const hc::AveragingSpec p = hc::AveragingSpec::parse(text);
    return fmt::format("{}/{}/{}", p.outer_lr, p.momentum, p.nesterov);
  };
  EXPECT_EQ(outer("diloco:period=8"), "1/0/0") << "not named: the conservative rule";
  EXPECT_EQ(outer("diloco:period=8,inner=sgd"), "1/0/0");
  EXPECT_EQ(outer("diloco:period=128,inner=sgd"), "0.7/0.9/1") << "the papers' step, measured best at 128";
  EXPECT_EQ(outer("diloco:period=128,inner=adam"), "1/0/0");
  EXPECT_EQ(outer("diloco:period=128"), "1/0/0");
  EXPECT_EQ(outer("diloco:period=8,momentum=0.5"), "0.7/0.5/1") << "one named: the others the papers'";
  EXPECT_EQ(hc::AveragingSpec::parse("diloco:period=128,inner=sgd").to_string(), "diloco:inner=sgd,period=128");
  EXPECT_EQ(hc::AveragingSpec::parse("diloco:inner=adam,outer_lr=1,period=8").to_string(),
            "diloco:inner=adam,outer_lr=1,period=8");
  EXPECT_NE(error_of("diloco:auto=2").find("auto takes no value"), std::string::npos);
  EXPECT_NE(error_of("diloco:period=8,momentum=1").find("momentum=1 must be a number in [0, 1)"), std::string::npos);
  EXPECT_NE(error_of("diloco:period=8,outer_lr=0").find("outer_lr=0 must be a number in (0, 10]"), std::string::npos);
  EXPECT_NE(error_of("diloco:period=8,codec=zip").find("codec=zip is not a codec"), std::string::npos);
  EXPECT_NE(error_of("diloco:period=8,inner=lion").find("inner=lion is not sgd, adam, muon"), std::string::npos);
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
// the syncs' cost. Steps of a quiet window auto held count for compute, not for the schedule's step.
TEST(DilocoAuto, CheckReadsComputeFromTheWindowsQuietSteps) {
  std::vector<hd::CheckedStep> w;
  for (int i = 0; i < 40; ++i)  // 16 of 40 wait on a sync, 2 ms of each in after_step
    w.push_back({i % 5 < 2 ? 28.0 : 12.0, i % 5 < 2, false, false, i % 5 < 2 ? 2.0 : 0.0});
  w.push_back({900.0, false, true});   // an evaluation between two steps
  w.push_back({200.0, false, false});  // a stall of the trainer's own (above 3x the quiet median)
  const hd::WindowReading r = hd::read_window(w, {30.0, 10.0, 20.0});
  EXPECT_EQ(r.quiet, 24);
  EXPECT_DOUBLE_EQ(r.compute_ms, 12.0);  // the window's own
  EXPECT_NEAR(r.step_ms, (24 * 12.0 + 16 * 28.0) / 40, 1e-9);
  EXPECT_NEAR(r.wait_ms, 16 * 2.0 / 40, 1e-9);
  EXPECT_DOUBLE_EQ(r.sync_ms, 20.0);  // the median fragment
  // A fragment at work on every step: no quiet step to read, and no compute figure from other minutes either.
  std::vector<hd::CheckedStep> busy(32, {14.0, true, false});
  const hd::WindowReading b = hd::read_window(busy, {});
  EXPECT_EQ(b.quiet, 0);
  EXPECT_DOUBLE_EQ(b.compute_ms, 0.0);
  EXPECT_DOUBLE_EQ(b.step_ms, 14.0);
  // ... until auto holds its launches for a few steps: those read compute, the busy ones the schedule's step
  for (int i = 0; i < hd::kQuietSteps; ++i) busy.push_back({10.0, i == 0, false, true});
  const hd::WindowReading h = hd::read_window(busy, {});
  EXPECT_EQ(h.quiet, hd::kQuietSteps - 1);
  EXPECT_DOUBLE_EQ(h.compute_ms, 10.0);
  EXPECT_DOUBLE_EQ(h.step_ms, 14.0);
  EXPECT_EQ(hd::read_window({}, {}).step_ms, 0.0);
}

// The next period brings the syncs' time per step within the target in one move where the measurement says how far.
TEST(DilocoAuto, LengthensByWhatTheWindowMeasured) {
  const auto reading = [](double step, double compute) {
    hd::WindowReading w;
    w.step_ms = step;
    w.compute_ms = compute;
    w.quiet = 10;
    return w;
  };
  // 5 ms a step of syncs at period 4 against 8 ms of compute; 95% leaves them 0.42 ms: 4 * 5 / 0.42 = 47.5 -> 64.
  EXPECT_EQ(hd::lengthened_period(4, reading(13.0, 8.0), 0.95), 64);
  EXPECT_EQ(hd::lengthened_period(32, reading(8.5, 8.0), 0.95), 64);     // a little over: doubled
  EXPECT_EQ(hd::lengthened_period(256, reading(80.0, 8.0), 0.95), 512);  // the longest
  EXPECT_EQ(hd::lengthened_period(8, reading(9.0, 9.0), 0.95), 16);      // nothing over (a noisy window): doubled
}

// Before a longer period, a codec with fewer bits where its share of the measured cost fits what the target allows.
TEST(DilocoAuto, SwapsToFewerBitsBeforeALongerPeriod) {
  const std::vector<hd::CodecCost> codecs{{"none", 1.0, 0}, {"int8", 0.25, 1}, {"int4", 0.125, 1}};
  const auto reading = [](double step, double compute) {
    hd::WindowReading w;
    w.step_ms = step;
    w.compute_ms = compute;
    return w;
  };
  // 88 ms a step against 80 of compute: 8 ms of syncs at int8; 95% leaves 4.2 ms; int4 (half) makes 4 -> int4
  EXPECT_EQ(hd::lighter_codec("int8", codecs, reading(88.0, 80.0), 0.95), "int4");
  EXPECT_EQ(hd::lighter_codec("int8", codecs, reading(100.0, 80.0), 0.95), "");  // 10 ms at int4: none fits
  EXPECT_EQ(hd::lighter_codec("int8", codecs, reading(100.0, 80.0), 0.95, /*lightest=*/true), "int4");
  EXPECT_EQ(hd::lighter_codec("none", codecs, reading(84.0, 80.0), 0.95), "int8");    // the most bits that fit
  EXPECT_EQ(hd::lighter_codec("int4", codecs, reading(84.0, 80.0), 0.95, true), "");  // none lighter
  EXPECT_EQ(hd::lighter_codec("fp8", codecs, reading(84.0, 80.0), 0.95), "");         // not among the probe's
}

namespace {

hd::OuterSettings settings(int period, int fragments, int delay, const std::string& codec) {
  hd::OuterSettings s;
  s.period = period;
  s.fragments = fragments;
  s.delay = delay;
  s.codec = codec;
  return s;
}

hd::WindowReading window(double step, double compute, double wait, double sync) {
  hd::WindowReading w;
  w.step_ms = step;
  w.compute_ms = compute;
  w.wait_ms = wait;
  w.sync_ms = sync;
  w.quiet = 6;
  return w;
}

using Kind = hd::CheckDecision::Kind;

}  // namespace

// The check's quality rule: a delay, then more fragments where the steps waited on the link; fewer bits; and a
// longer period last, only where the link cannot carry the syncs or they take over half the step twice in a row.
TEST(DilocoAuto, TheCheckPrefersDelayFragmentsAndFewerBitsToALongerPeriod) {
  const std::vector<hd::CodecCost> codecs{{"none", 1.0, 0}, {"int8", 0.26, 3}, {"int4", 0.14, 4}};
  const auto decide = [&](const hd::OuterSettings& s, const hd::WindowReading& w, int below_before = 0) {
    return hd::decide_check(s, w, codecs, 0.95, "adam", below_before);
  };
  // no quiet step read: nothing is decided
  hd::WindowReading none = window(100, 80, 0, 10);
  none.quiet = 0;
  EXPECT_EQ(decide(settings(4, 4, 1, "int8"), none).kind, Kind::kAgain);
  // at the target: kept
  EXPECT_EQ(decide(settings(4, 4, 1, "int8"), window(82, 80, 1, 60)).kind, Kind::kKeep);
  // blocking syncs of 150 ms every 4 steps of 80: waited; the link keeps up -> a delay of 2 steps (150 / 80)
  auto d = decide(settings(4, 1, 0, "int8"), window(117.5, 80, 37.5, 150));
  EXPECT_EQ(d.kind, Kind::kChange) << d.why;
  EXPECT_EQ(d.next.delay, 2) << d.why;
  EXPECT_EQ(d.next.period, 4);
  EXPECT_NE(d.why.find("lengthens the delay 0 -> 2"), std::string::npos) << d.why;
  // the delay at its longest (the gap between two fragments): more fragments
  d = decide(settings(4, 2, 2, "int8"), window(100, 80, 20, 150));
  EXPECT_EQ(d.next.fragments, 4) << d.why;
  EXPECT_EQ(d.next.period, 4);
  EXPECT_LE(d.next.delay, d.next.period / d.next.fragments);
  // the fragments at their most: fewer bits
  d = decide(settings(4, 4, 1, "int8"), window(100, 80, 20, 70));
  EXPECT_EQ(d.next.codec, "int4") << d.why;
  EXPECT_EQ(d.next.period, 4);
  // the steps did not wait: what is left is the cores the syncs share with compute. Fewer bits first ...
  d = decide(settings(4, 4, 1, "int8"), window(104, 80, 0.5, 40));
  EXPECT_EQ(d.next.codec, "int4") << d.why;
  EXPECT_EQ(d.next.period, 4);
  // ... a period under 4 streamed as 4 fragments of period 4 ...
  d = decide(settings(2, 2, 1, "int4"), window(104, 80, 0.5, 40));
  EXPECT_EQ(d.next.period, 4) << d.why;
  EXPECT_EQ(d.next.fragments, 4) << d.why;
  EXPECT_EQ(d.next.delay, 1) << d.why;
  // ... then the period is kept above kLengthenBelow (a longer period costs more loss than the step it saves)
  d = decide(settings(4, 4, 1, "int4"), window(104, 80, 0.5, 40));
  EXPECT_EQ(d.kind, Kind::kKeep) << d.why;
  EXPECT_NE(d.why.find("cores the syncs share with compute"), std::string::npos) << d.why;
  // after SGD inner steps, which a longer period costs little, it grows below the target on the first window
  d = hd::decide_check(settings(4, 4, 1, "int4"), window(104, 80, 0.5, 40), codecs, 0.95, "sgd", 0);
  EXPECT_EQ(d.kind, Kind::kChange) << d.why;
  EXPECT_GT(d.next.period, 4) << d.why;
  EXPECT_NE(d.why.find("lengthens the period 4 -> "), std::string::npos) << d.why;
  // below it, on the second window in a row only
  EXPECT_EQ(decide(settings(4, 4, 1, "int4"), window(200, 80, 1, 40)).kind, Kind::kAgain);
  d = decide(settings(4, 4, 1, "int4"), window(200, 80, 1, 40), /*below_before=*/1);
  EXPECT_EQ(d.kind, Kind::kChange);
  EXPECT_GT(d.next.period, 4) << d.why;
  EXPECT_EQ(d.next.lr, 1.0) << "inner adam: plain averaging at any period";
  // a link that cannot carry a period's syncs within the period (4 x 900 ms > 4 x 80): the period grows at once
  d = decide(settings(4, 4, 1, "int4"), window(300, 80, 220, 900));
  EXPECT_EQ(d.kind, Kind::kChange);
  EXPECT_GT(d.next.period, 4) << d.why;
  EXPECT_EQ(d.next.period % d.next.fragments, 0);
  // period 512 is the longest
  EXPECT_EQ(decide(settings(512, 8, 1, "int4"), window(300, 80, 220, 9000)).kind, Kind::kKeep);
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
  for (const std::string inner : {"adam", "muon", ""})
    for (const int period : {8, 512}) {
      s.period = period;
      const std::string why = hd::set_outer_rule(s, inner);
      EXPECT_EQ(s.lr, 1.0) << "inner '" << inner << "' at " << period << ": plain averaging";
      EXPECT_EQ(s.momentum, 0.0);
      EXPECT_FALSE(s.nesterov);
      if (inner.empty()) {
        EXPECT_NE(why.find("not named"), std::string::npos) << why;
      }
    }
}
