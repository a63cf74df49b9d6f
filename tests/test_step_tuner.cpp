// The reducer's step tuner: its schedule alone (one rank, synthetic step spans: the arms' interleaved blocks, the
// margin, the slowest rank's median, the wait for decided classes, the guard), then through the reducer over
// in-process ranks, where the tuner's per-call choice is the one that makes the steps slower: whole steps replace
// it, and the guard reverts a later re-tuning back to it.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include "../training/src/reducer/step_tuner.h"
#include "hopwise/common/error.h"
#include "hopwise/training/reducer.h"
#include "inproc_group.h"

namespace {

using namespace hwtest;
using hc::Algorithm;
using hc::TuningChoice;
namespace rd = hopwise::comm::reducer;

// ---------------------------------------------------------------- the schedule alone
// One rank's view: the tuner's decisions per bucket size, pins applied at once, step spans from the choice in use.
struct FakeJob {
  std::map<std::size_t, std::optional<TuningChoice>> decided;
  std::map<std::size_t, std::vector<TuningChoice>> alternatives;
  std::vector<std::pair<std::size_t, TuningChoice>> pins;
  std::vector<double> other_rank;  // what another rank agrees (max) for each arm; empty: alone
  int agreements = 0;
  rd::StepTuner tuner{
      rd::StepChoices{[this](std::size_t b) { return decided[b]; }, [this](std::size_t b) { return alternatives[b]; },
                      [this](std::size_t b, const TuningChoice& c) {
                        pins.emplace_back(b, c);
                        decided[b] = c;
                      },
                      [this](std::vector<double>& v) {
                        ++agreements;
                        for (std::size_t i = 0; i < v.size() && i < other_rank.size(); ++i)
                          v[i] = std::max(v[i], other_rank[i]);
                      }},
      0};
  // Steps while trying, each span as `ms_of` says for the choice of bucket size `b`; returns the steps run.
  int run_while_trying(std::size_t b, const std::function<double(Algorithm)>& ms_of, int max_steps = 200) {
    int n = 0;
    do {
      tuner.step(ms_of(decided[b]->algorithm) * 1e-3);
      ++n;
    } while (tuner.trying() && n < max_steps);
    return n;
  }
};

constexpr std::size_t kMiB = 1u << 20;

TEST(StepTunerSchedule, AnArmWithFasterStepsReplacesTheTunedOneAfterInterleavedBlocks) {
  FakeJob j;
  j.decided[kMiB] = TuningChoice{Algorithm::kTree};
  j.alternatives[kMiB] = {{Algorithm::kRing}, {Algorithm::kHalvingDoubling}, {Algorithm::kOneShot}};
  j.tuner.reset({kMiB, kMiB, kMiB});
  std::vector<Algorithm> ran;
  j.tuner.step(0.010);  // decided: the trial starts, pinning the first arm
  ASSERT_TRUE(j.tuner.trying());
  const int steps = j.run_while_trying(kMiB, [&](Algorithm a) {
    ran.push_back(a);
    return a == Algorithm::kRing ? 8.0 : 10.0;
  });
  // Three arms (the tuned one and two others; the fourth is past max_arms), 3 rounds of 1 + 4 steps each; hd, 25%
  // slower than ring, leaves the race after the first round (the tuned one stays, the reference).
  EXPECT_EQ(steps, 3 * 5 + 2 * 2 * 5);
  ASSERT_EQ(ran.size(), 35u);
  EXPECT_EQ(ran[0], Algorithm::kTree);
  EXPECT_EQ(ran[5], Algorithm::kRing);
  EXPECT_EQ(ran[10], Algorithm::kHalvingDoubling);
  EXPECT_EQ(ran[15], Algorithm::kRing) << "round 2 starts with the next arm";
  EXPECT_EQ(ran[20], Algorithm::kTree);
  EXPECT_EQ(ran[25], Algorithm::kTree) << "round 3 rotated once more";
  EXPECT_EQ(std::count(ran.begin(), ran.end(), Algorithm::kRing), 15);
  EXPECT_EQ(std::count(ran.begin(), ran.end(), Algorithm::kHalvingDoubling), 5);
  EXPECT_EQ(std::count(ran.begin(), ran.end(), Algorithm::kOneShot), 0);
  ASSERT_EQ(j.tuner.results().size(), 1u);
  const hc::StepTuning& r = j.tuner.results()[0];
  EXPECT_EQ(r.size_class, "1 MiB");
  EXPECT_EQ(r.buckets, 3);
  ASSERT_EQ(r.arms.size(), 3u);
  EXPECT_EQ(r.arms[0].first.algorithm, Algorithm::kTree);
  EXPECT_DOUBLE_EQ(r.arms[0].second, 0.010);
  EXPECT_DOUBLE_EQ(r.arms[1].second, 0.008);
  EXPECT_EQ(r.chosen.algorithm, Algorithm::kRing);
  EXPECT_EQ(j.decided[kMiB]->algorithm, Algorithm::kRing) << "pinned for the steps after";
  EXPECT_EQ(j.agreements, 2) << "after the first round and at the end";
}

TEST(StepTunerSchedule, WithinTheMarginTheTunedOneStaysAndTheSlowestRankDecides) {
  {
    FakeJob j;  // 2% faster steps: noise, not a reason to change
    j.decided[kMiB] = TuningChoice{Algorithm::kTree};
    j.alternatives[kMiB] = {{Algorithm::kRing}};
    j.tuner.reset({kMiB});
    j.tuner.step(0.01);
    j.run_while_trying(kMiB, [](Algorithm a) { return a == Algorithm::kRing ? 9.8 : 10.0; });
    ASSERT_EQ(j.tuner.results().size(), 1u);
    EXPECT_EQ(j.tuner.results()[0].chosen.algorithm, Algorithm::kTree);
    EXPECT_EQ(j.decided[kMiB]->algorithm, Algorithm::kTree);
  }
  {
    FakeJob j;  // ring is faster here, but another rank's ring steps are the slowest of all
    j.decided[kMiB] = TuningChoice{Algorithm::kTree};
    j.alternatives[kMiB] = {{Algorithm::kRing}};
    j.other_rank = {0.0, 0.012};
    j.tuner.reset({kMiB});
    j.tuner.step(0.01);
    j.run_while_trying(kMiB, [](Algorithm a) { return a == Algorithm::kRing ? 8.0 : 10.0; });
    ASSERT_EQ(j.tuner.results().size(), 1u);
    EXPECT_EQ(j.tuner.results()[0].chosen.algorithm, Algorithm::kTree);
    EXPECT_DOUBLE_EQ(j.tuner.results()[0].arms[1].second, 0.012);
  }
}

TEST(StepTunerSchedule, WhenEveryOtherArmLeavesTheRaceTheTrialEndsAfterOneRound) {
  FakeJob j;
  j.decided[kMiB] = TuningChoice{Algorithm::kTree};
  j.alternatives[kMiB] = {{Algorithm::kRing}};
  j.tuner.reset({kMiB});
  j.tuner.step(0.01);
  const int steps = j.run_while_trying(kMiB, [](Algorithm a) { return a == Algorithm::kRing ? 20.0 : 10.0; });
  EXPECT_EQ(steps, 2 * 5);
  ASSERT_EQ(j.tuner.results().size(), 1u);
  EXPECT_EQ(j.tuner.results()[0].chosen.algorithm, Algorithm::kTree);
  EXPECT_DOUBLE_EQ(j.tuner.results()[0].arms[1].second, 0.020);
  EXPECT_EQ(j.decided[kMiB]->algorithm, Algorithm::kTree);
}

TEST(StepTunerSchedule, ClassesWaitUntilDecidedAndGoMostBytesFirst) {
  FakeJob j;
  const std::size_t small = 40000, big = 900000;
  j.decided[big] = std::nullopt;  // still under the per-call tuner's trials
  j.decided[small] = TuningChoice{Algorithm::kOneShot};
  j.alternatives[big] = {{Algorithm::kRing}};
  j.alternatives[small] = {};  // nothing else worth a try
  j.tuner.reset({small, big, big, small, 0});
  for (int i = 0; i < 5; ++i) j.tuner.step(0.01);
  EXPECT_FALSE(j.tuner.trying());
  EXPECT_TRUE(j.pins.empty()) << "nothing runs before every class is decided";
  j.decided[big] = TuningChoice{Algorithm::kTree};
  j.tuner.step(0.01);
  ASSERT_TRUE(j.tuner.trying());
  EXPECT_EQ(j.pins.at(0).first, big) << "the class with the most bytes first";
  j.run_while_trying(big, [](Algorithm) { return 10.0; });
  ASSERT_EQ(j.tuner.results().size(), 2u);
  EXPECT_EQ(j.tuner.results()[1].size_class, "64 KiB");
  EXPECT_EQ(j.tuner.results()[1].arms.size(), 1u) << "one arm: recorded, nothing run";
  EXPECT_EQ(j.tuner.results()[1].buckets, 2);
}

TEST(StepTunerSchedule, TheGuardRevertsARetuningThatMadeStepsSlowerAndKeepsOneThatDidNot) {
  FakeJob j;
  j.decided[kMiB] = TuningChoice{Algorithm::kTree};
  j.alternatives[kMiB] = {};
  j.tuner.reset({kMiB});
  j.tuner.step(0.01);  // nothing to try: guarding from here
  for (int i = 0; i < 20; ++i) j.tuner.step(0.010);
  j.decided[kMiB] = std::nullopt;  // the tuner re-tunes (a drift): its trial steps are no evidence
  for (int i = 0; i < 5; ++i) j.tuner.step(0.050);
  j.decided[kMiB] = TuningChoice{Algorithm::kRing};  // ...and decides ring, whose steps are slower
  for (int i = 0; i < 10; ++i) j.tuner.step(0.012);
  EXPECT_EQ(j.tuner.reverts(), 0) << "the step of the change and 10 after it";
  j.tuner.step(0.012);
  EXPECT_EQ(j.tuner.reverts(), 1);
  ASSERT_FALSE(j.pins.empty());
  EXPECT_EQ(j.pins.back().second.algorithm, Algorithm::kTree);
  EXPECT_EQ(j.decided[kMiB]->algorithm, Algorithm::kTree);
  // A change whose steps are no slower stays.
  for (int i = 0; i < 12; ++i) j.tuner.step(0.010);
  j.decided[kMiB] = TuningChoice{Algorithm::kHalvingDoubling};
  for (int i = 0; i < 11; ++i) j.tuner.step(0.0101);
  EXPECT_EQ(j.tuner.reverts(), 1);
  EXPECT_EQ(j.decided[kMiB]->algorithm, Algorithm::kHalvingDoubling);
}

// ---------------------------------------------------------------- through the reducer, in-process ranks
// Two rows at one size only: "fast call" is a ring allreduce that leaves its rank a debt of compute time (as an
// algorithm that holds the cores backward needs), "slow call" a ring allreduce that sleeps a little itself and
// which the cost model prefers. The test pins the fast call as the tuner's choice, so that the arms are known.
constexpr std::size_t kCount = 100003;
std::atomic<int> g_owed_ms[2];

Algorithm row(const std::string& name, double estimate, std::function<void(int rank)> after) {
  hc::AlgorithmInfo r;
  r.name = name;
  r.collectives = {hc::Collective::kAllreduce};
  r.summary = "a ring allreduce with a cost of its own (registered by a test)";
  r.estimate = [estimate](const hc::CostQuery& q) {
    return q.bytes == kCount * sizeof(float) ? estimate : static_cast<double>(INFINITY);
  };
  r.run = [after](hc::AlgorithmContext& ctx, const hc::CollectiveCall& c) {
    hc::algorithm_info(Algorithm::kRing).run(ctx, c);
    after(ctx.transport.rank());
  };
  return hc::register_algorithm(r);
}
Algorithm fast_call() {
  static const Algorithm a = row("test-fast-call-slow-step", 1e-14, [](int r) { g_owed_ms[r] += 10; });
  return a;
}
Algorithm slow_call() {
  static const Algorithm a =
      row("test-slow-call", 1e-15, [](int) { std::this_thread::sleep_for(std::chrono::milliseconds(1)); });
  return a;
}

TEST(StepTuner, WholeStepsOverruleAFastCallThatSlowsTheStepAndTheGuardRevertsALaterChangeToIt) {
  const Algorithm fast = fast_call(), slow = slow_call();
  hc::Options o = test_options();
  o.tune = true;
  Group g(2, o);
  EXPECT_EQ(g.comm(0).algorithm_for(hc::Collective::kAllreduce, kCount * sizeof(float)), slow) << "the model's";
  std::vector<std::vector<hc::StepTuning>> results(2);
  std::vector<int> reverts_before(2), reverts(2);
  std::vector<int> steps(2);
  const std::string err = g.run([&](int r, hc::Communicator& c) {
    g_owed_ms[r] = 0;
    c.pin_choice(hc::Collective::kAllreduce, kCount * sizeof(float), hopwise::DataType::kFloat32, {fast, 0, 0});
    std::vector<float> grad(kCount);
    hc::GradientReducer red(c, hc::ReducerOptions{});
    red.add_parameter("w", grad.data(), grad.size());
    red.finalize();
    int step = 0;
    auto one_step = [&] {
      for (std::size_t i = 0; i < kCount; i += 4099) grad[i] = static_cast<float>(r + step);
      red.mark_ready(0);
      // Backward's compute: 2 ms, and what this rank's calls left it owing.
      std::this_thread::sleep_for(std::chrono::milliseconds(2 + g_owed_ms[r].exchange(0)));
      red.finish();
      for (std::size_t i = 0; i < kCount; i += 4099)
        if (grad[i] != static_cast<float>(step) + 0.5f)
          throw hopwise::Error(fmt::format("step {}: {} instead of the average {}", step, grad[i], step + 0.5));
      ++step;
    };
    while (red.step_tuning().empty() && step < 200) one_step();
    results[static_cast<std::size_t>(r)] = red.step_tuning();
    // A later change of the class's choice back to the fast call (as a re-tuning after a drift would make): the
    // guard compares the steps after it with those before and reverts it.
    for (int i = 0; i < 12; ++i) one_step();
    reverts_before[static_cast<std::size_t>(r)] = red.step_tuning_reverts();
    c.pin_choice(hc::Collective::kAllreduce, kCount * sizeof(float), hopwise::DataType::kFloat32, {fast, 0, 0});
    while (red.step_tuning_reverts() == 0 && step < 300) one_step();
    reverts[static_cast<std::size_t>(r)] = red.step_tuning_reverts();
    steps[static_cast<std::size_t>(r)] = step;
  });
  ASSERT_EQ(err, "");
  EXPECT_EQ(steps[0], steps[1]) << "every rank decides at the same step";
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(fmt::format("rank {}", r));
    ASSERT_EQ(results[static_cast<std::size_t>(r)].size(), 1u);
    const hc::StepTuning& st = results[static_cast<std::size_t>(r)][0];
    ASSERT_EQ(st.arms.size(), 2u);
    EXPECT_EQ(st.arms[0].first.algorithm, fast) << "the tuner's choice first";
    EXPECT_EQ(st.arms[1].first.algorithm, slow) << "the cost model's";
    EXPECT_LT(st.arms[1].second, st.arms[0].second);
    EXPECT_EQ(st.chosen.algorithm, slow) << "by whole steps";
    EXPECT_EQ(reverts_before[static_cast<std::size_t>(r)], 0);
    EXPECT_EQ(reverts[static_cast<std::size_t>(r)], 1);
    EXPECT_EQ(g.comm(r).tuned_choice(hc::Collective::kAllreduce, kCount * sizeof(float))->algorithm, slow);
  }
  EXPECT_EQ(results[0][0].arms, results[1][0].arms) << "agreed: the same figures on every rank";
}

TEST(StepTuner, OnByDefaultOffByOptionOrWithACodec) {
  hc::Options o = test_options();
  o.tune = true;
  Group g(2, o);
  std::vector<std::vector<bool>> tuned(2);
  const std::string err = g.run([&](int r, hc::Communicator& c) {
    std::vector<float> grad(1000);
    hc::ReducerOptions off;
    off.tune_steps = false;
    hc::ReducerOptions codec;
    codec.compression = "int8";
    for (const hc::ReducerOptions& ro : {hc::ReducerOptions{}, off, codec}) {
      hc::GradientReducer red(c, ro);
      red.add_parameter("w", grad.data(), grad.size());
      red.finalize();
      for (int step = 0; step < 300 && red.step_tuning().empty(); ++step) {
        red.mark_ready(0);
        red.finish();
      }
      tuned[static_cast<std::size_t>(r)].push_back(!red.step_tuning().empty());
    }
  });
  ASSERT_EQ(err, "");
  for (const auto& t : tuned) EXPECT_EQ(t, (std::vector<bool>{true, false, false}));
}

}  // namespace
