// The tuner: its schedule alone (one rank, synthetic times: rounds, pruning, the median, drift), then through the
// communicator over in-process ranks: every rank makes the same choice even where each rank alone would choose
// differently, measuring beats a wrong cost model, a drifting choice is tuned again, and the tuning file's round
// trip, its errors and the cases where it is ignored.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <thread>
#include <vector>

#include <unistd.h>

#include "../comm/src/tuner/tuner.h"
#include "hopwise/comm/algorithm.h"
#include "hopwise/comm/cost_model.h"
#include "hopwise/comm/transports/inproc_transport.h"
#include "hopwise/comm/tuning.h"
#include "hopwise/common/error.h"
#include "hopwise/common/reduce.h"
#include "inproc_group.h"

namespace {

using namespace hwtest;
using hc::Algorithm;
using hc::Collective;
using hc::TuningChoice;
using hopwise::DataType;
using hopwise::ReduceOp;

// ---------------------------------------------------------------- the schedule alone (one rank, no collective)
struct OneRank {
  hc::detail::Tuner tuner;
  hc::detail::TuneKey key{Collective::kAllreduce, "float", 20};
  std::vector<TuningChoice> cands{{Algorithm::kRing}, {Algorithm::kTree}, {Algorithm::kOneShot}};
  int agreements = 0;
  explicit OneRank(hc::detail::TunerSettings s = {}) : tuner(s) {}
  // One call: what the tuner picks, timed as `time_of` says.
  TuningChoice call(const std::function<double(Algorithm)>& time_of) {
    auto pick = tuner.next(
        key, [&] { return cands; }, [&](std::vector<double>&) { ++agreements; }, 0);
    EXPECT_TRUE(pick.has_value());
    tuner.record(key, pick->choice, time_of(pick->choice.algorithm));
    return pick->choice;
  }
  // One call timed as `time_of(algorithm, lined_up)` says (lined up: a trial; else a confirmation block or the job).
  TuningChoice call2(const std::function<double(Algorithm, bool)>& time_of) {
    auto pick = tuner.next(
        key, [&] { return cands; }, [&](std::vector<double>&) { ++agreements; }, 0);
    EXPECT_TRUE(pick.has_value());
    tuner.record(key, pick->choice, time_of(pick->choice.algorithm, pick->trial));
    return pick->choice;
  }
};

TEST(TunerSchedule, EachCandidateEachRoundThenTheFastestMedian) {
  OneRank t;
  std::map<Algorithm, int> runs;
  // tree is fastest but for one outlier; one_shot, 6x tree, is dropped after one round.
  int tree_calls = 0;
  auto time_of = [&](Algorithm a) {
    ++runs[a];
    if (a == Algorithm::kTree) return ++tree_calls == 2 ? 9e-3 : 1e-3;
    return a == Algorithm::kRing ? 2e-3 : 6e-3;
  };
  for (int i = 0; i < 40; ++i) t.call(time_of);
  ASSERT_TRUE(t.tuner.decided(t.key).has_value());
  EXPECT_EQ(t.tuner.decided(t.key)->algorithm, Algorithm::kTree) << "median, not mean: one outlier does not count";
  EXPECT_EQ(runs[Algorithm::kOneShot], 1) << "above 4x the best after one round: dropped";
  const auto st = t.tuner.stats();
  EXPECT_EQ(st.trial_calls, 1u + 3u + 3u);  // direct once, ring and tree three rounds each
  EXPECT_EQ(t.agreements, 1 + 3) << "the file check, then one agreement per round";
  EXPECT_NEAR(st.excess_s, (6e-3 - 1e-3) + 3 * (2e-3 - 1e-3) + (9e-3 - 1e-3), 1e-9);
  const auto e = t.tuner.entries();
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].measured.size(), 3u);
  EXPECT_EQ(e[0].measured[2], std::make_pair(std::string("one_shot"), 6e-3)) << "the median of the rounds it ran";
  // A candidate 3x the best survives round 1 (a slow first call must not cost it its place), not round 2.
}

TEST(TunerSchedule, ADriftTunesTheClassAgainAndOnlyThen) {
  OneRank t;
  double ring = 1e-3, tree = 2e-3;
  auto time_of = [&](Algorithm a) { return a == Algorithm::kRing ? ring : a == Algorithm::kTree ? tree : 9e-3; };
  for (int i = 0; i < 300; ++i) t.call(time_of);
  EXPECT_EQ(t.tuner.decided(t.key)->algorithm, Algorithm::kRing);
  EXPECT_EQ(t.tuner.stats().retunes, 0u) << "steady times never re-tune";
  ring = 1.3e-3;  // within the drift factor
  for (int i = 0; i < 300; ++i) t.call(time_of);
  EXPECT_EQ(t.tuner.stats().retunes, 0u);
  ring = 5e-3;  // past it: tree is now the faster
  for (int i = 0; i < 200; ++i) t.call(time_of);
  EXPECT_EQ(t.tuner.stats().retunes, 1u);
  EXPECT_EQ(t.tuner.decided(t.key)->algorithm, Algorithm::kTree);
}

TEST(TunerSchedule, CloseFinalistsAreDecidedByCallsInARow) {
  OneRank t;
  std::map<Algorithm, int> in_a_row;
  // Lined up, ring is 20% faster; in the job's rhythm (not lined up) tree is: tree must win.
  auto time_of = [&](Algorithm a, bool lined_up) {
    if (!lined_up) ++in_a_row[a];
    if (a == Algorithm::kOneShot) return 9e-3;
    if (lined_up) return a == Algorithm::kRing ? 1.0e-3 : 1.2e-3;
    return a == Algorithm::kRing ? 1.6e-3 : 1.1e-3;
  };
  int calls = 0;
  while (!t.tuner.decided(t.key) && calls < 200) {
    t.call2(time_of);
    ++calls;
  }
  ASSERT_TRUE(t.tuner.decided(t.key).has_value());
  EXPECT_EQ(t.tuner.decided(t.key)->algorithm, Algorithm::kTree);
  EXPECT_EQ(in_a_row[Algorithm::kRing], 18) << "two passes, each one call to settle, then a block of 8";
  EXPECT_EQ(in_a_row[Algorithm::kTree], 18 + 1) << "and the first call decided (the loop's last)";
  EXPECT_EQ(in_a_row[Algorithm::kOneShot], 0) << "9x: no finalist";
  const int agreements_when_decided = t.agreements;
  EXPECT_EQ(agreements_when_decided, 1 + 3 + 1) << "the file check, each round, the blocks";
  // Slow calls (past confirm_budget_s / 4) skip the blocks: the trials decide.
  OneRank slow;
  slow.key.size_class = 28;
  calls = 0;
  while (!slow.tuner.decided(slow.key) && calls < 200) {
    slow.call2([&](Algorithm a, bool lined_up) { return 100 * time_of(a, lined_up); });
    ++calls;
  }
  ASSERT_TRUE(slow.tuner.decided(slow.key).has_value());
  EXPECT_EQ(slow.tuner.decided(slow.key)->algorithm, Algorithm::kRing);
}

TEST(TunerSchedule, ThePassesInARowRotateTheFinalists) {
  OneRank t;
  std::vector<Algorithm> seq;  // the calls in a row, in order
  auto time_of = [&](Algorithm a, bool lined_up) {
    if (!lined_up) seq.push_back(a);
    if (a == Algorithm::kOneShot) return 9e-3;
    return lined_up ? (a == Algorithm::kRing ? 1.0e-3 : 1.1e-3) : 1e-3;
  };
  for (int calls = 0; !t.tuner.decided(t.key) && calls < 200; ++calls) t.call2(time_of);
  ASSERT_TRUE(t.tuner.decided(t.key).has_value());
  ASSERT_EQ(seq.size(), 4u * 9 + 1);
  const Algorithm r = Algorithm::kRing, tr = Algorithm::kTree;
  for (std::size_t i = 0; i < 36; ++i)
    EXPECT_EQ(seq[i], (i < 9 || i >= 27) ? r : tr) << "ring, tree, then tree, ring: call " << i;
}

TEST(TunerSchedule, CallsInARowCountByTheirMeanNotTheirMedian) {
  OneRank t;
  // In a row tree alternates fast and slow calls (a late rank finds the data ready): its mean, 1.25 ms, beats
  // ring's steady 1.4 ms, where its median (the slow half's) would not. Lined up they are alike.
  int tree_calls = 0;
  auto time_of = [&](Algorithm a, bool lined_up) {
    if (a == Algorithm::kOneShot) return 9e-3;
    if (lined_up) return a == Algorithm::kRing ? 1.0e-3 : 1.05e-3;
    if (a == Algorithm::kRing) return 1.4e-3;
    return ++tree_calls % 2 ? 0.5e-3 : 2.0e-3;
  };
  for (int calls = 0; !t.tuner.decided(t.key) && calls < 200; ++calls) t.call2(time_of);
  ASSERT_TRUE(t.tuner.decided(t.key).has_value());
  EXPECT_EQ(t.tuner.decided(t.key)->algorithm, Algorithm::kTree);
}

TEST(TunerSchedule, ACheapCandidateIsNotDroppedForItsColdFirstCall) {
  OneRank t;
  // one_shot's first call is cold (5x the others), then it is the fastest; all of it well under cheap_s.
  int one_shot_calls = 0;
  auto time_of = [&](Algorithm a) {
    if (a == Algorithm::kOneShot) return ++one_shot_calls == 1 ? 50e-6 : 6e-6;
    return a == Algorithm::kRing ? 10e-6 : 9e-6;
  };
  for (int calls = 0; !t.tuner.decided(t.key) && calls < 200; ++calls) t.call(time_of);
  ASSERT_TRUE(t.tuner.decided(t.key).has_value());
  EXPECT_EQ(t.tuner.decided(t.key)->algorithm, Algorithm::kOneShot);
  EXPECT_GE(one_shot_calls, 3) << "it ran every round";
}

TEST(TunerSchedule, ALargerClassSkipsWhatWasFarSlowerOneClassBelow) {
  OneRank t;
  auto time_of = [&](Algorithm a) { return a == Algorithm::kRing ? 1e-3 : a == Algorithm::kTree ? 1.5e-3 : 2.5e-3; };
  for (int i = 0; i < 80; ++i) t.call(time_of);  // class 20 (1 MiB): direct measured 2.5x ring
  t.key.size_class = 21;
  std::map<Algorithm, int> runs;
  for (int i = 0; i < 80; ++i)
    t.call([&](Algorithm a) {
      ++runs[a];
      return 2 * time_of(a);
    });
  EXPECT_EQ(runs[Algorithm::kOneShot], 0) << "2.5x the winner at 1 MiB: not tried at 2 MiB";
  EXPECT_GT(runs[Algorithm::kTree], 0) << "1.5x: still tried";
  EXPECT_EQ(t.tuner.decided(t.key)->algorithm, Algorithm::kRing);
}

TEST(TunerSchedule, TuningOffLeavesTheChoiceToTheCostModel) {
  hc::detail::TunerSettings s;
  s.online = false;
  OneRank t(s);
  auto pick = t.tuner.next(
      t.key, [&] { return t.cands; }, [](std::vector<double>&) {}, 0);
  EXPECT_FALSE(pick.has_value());
}

// ---------------------------------------------------------------- through the communicator, in-process ranks
hc::Options tuned_options(int rounds = 3) {
  hc::Options o = test_options();
  o.tune = true;
  o.tune_rounds = rounds;
  return o;
}

// Rows registered by this test: a ring allreduce followed by a sleep on one rank only (so that only that rank
// sees it slow), and rows whose estimate undercuts every built-in but which sleep (a wrong cost model).
std::atomic<int> g_sleep_a_us{0}, g_sleep_b_us{0};
constexpr std::size_t kSkewCount = 3001, kWrongModelCount = 1999, kDriftCount = std::size_t{4} << 20;

Algorithm row(const std::string& name, std::size_t at_count, std::function<void(int rank)> after) {
  hc::AlgorithmInfo r;
  r.name = name;
  r.collectives = {Collective::kAllreduce};
  r.summary = "a ring allreduce with a sleep (registered by a test)";
  r.estimate = [at_count](const hc::CostQuery& q) {
    return q.bytes == at_count * sizeof(float) ? 1e-15 : static_cast<double>(INFINITY);
  };
  r.run = [after](hc::AlgorithmContext& ctx, const hc::CollectiveCall& c) {
    hc::algorithm_info(Algorithm::kRing).run(ctx, c);
    after(ctx.transport.rank());
  };
  return hc::register_algorithm(r);
}

void sleep_us(int us) { std::this_thread::sleep_for(std::chrono::microseconds(us)); }

Algorithm late_on(int rank) {
  static const Algorithm a0 = row("test-late-on-0", kSkewCount, [](int r) {
    if (r == 0) sleep_us(3000);
  });
  static const Algorithm a1 = row("test-late-on-1", kSkewCount, [](int r) {
    if (r == 1) sleep_us(3000);
  });
  return rank == 0 ? a0 : a1;
}
Algorithm slow_but_cheap_on_paper() {
  static const Algorithm a = row("test-slow", kWrongModelCount, [](int) { sleep_us(2000); });
  return a;
}
Algorithm drift_a() {
  static const Algorithm a = row("test-drift-a", kDriftCount, [](int) { sleep_us(g_sleep_a_us.load()); });
  return a;
}
Algorithm drift_b() {
  static const Algorithm a = row("test-drift-b", kDriftCount, [](int) { sleep_us(g_sleep_b_us.load()); });
  return a;
}

// `calls` float sum-allreduces of `count` on every rank, each checked against the exact sum.
std::string allreduces(Group& g, std::size_t count, int calls) {
  return g.run([&](int r, hc::Communicator& c) {
    std::vector<float> x(count), y(count);
    for (int k = 0; k < calls; ++k) {
      for (std::size_t i = 0; i < count; ++i) x[i] = static_cast<float>((r + 1) * (i % 5 + 1) + k);
      c.allreduce(x.data(), y.data(), count, DataType::kFloat32, ReduceOp::kSum);
      const int n = c.size();
      for (std::size_t i = 0; i < count; i += 97) {
        const float want = static_cast<float>(n * (n + 1) / 2 * (i % 5 + 1) + n * k);
        if (y[i] != want) throw hopwise::Error(fmt::format("call {}: y[{}] = {}, want {}", k, i, y[i], want));
      }
    }
  });
}

// Allreduces of `count` until the tuner has decided its class (every rank decides at the same call), at most 500.
std::string settle(Group& g, std::size_t count) {
  return g.run([&](int, hc::Communicator& c) {
    std::vector<float> x(count, 1.0f), y(count);
    for (int k = 0; k < 500 && !c.tuned_choice(Collective::kAllreduce, count * 4); ++k)
      c.allreduce(x.data(), y.data(), count, DataType::kFloat32, ReduceOp::kSum);
    if (!c.tuned_choice(Collective::kAllreduce, count * 4)) throw hopwise::Error("not tuned after 500 calls");
  });
}

TEST(TunerChoice, EveryRankChoosesTheSameWhereEachAloneWouldNot) {
  late_on(0);
  for (int n : {2, 3, 5}) {
    SCOPED_TRACE(fmt::format("{} ranks", n));
    hc::Options o = tuned_options();
    o.check = true;  // every call's algorithm is compared across the ranks before it runs
    Group g(n, o);
    ASSERT_EQ(allreduces(g, kSkewCount, 20), "");
    ASSERT_EQ(settle(g, kSkewCount), "");
    const auto first = g.comm(0).tuned_choice(Collective::kAllreduce, kSkewCount * 4);
    ASSERT_TRUE(first.has_value());
    EXPECT_NE(first->algorithm, late_on(0)) << "rank 0 saw it slow: the slowest rank's time counts";
    EXPECT_NE(first->algorithm, late_on(1)) << "rank 1 saw it slow";
    for (int r = 1; r < n; ++r) EXPECT_EQ(g.comm(r).tuned_choice(Collective::kAllreduce, kSkewCount * 4), first);
    const auto st = g.comm(0).stats();
    EXPECT_GT(st.tuning_trials, 0u);
    EXPECT_GT(st.tuning_agreements, 0u);
  }
}

TEST(TunerChoice, MeasuringOverrulesAWrongCostModel) {
  const Algorithm slow = slow_but_cheap_on_paper();
  {
    Group g(3, test_options());  // tuning off: the model's pick
    EXPECT_EQ(g.comm(0).algorithm_for(Collective::kAllreduce, kWrongModelCount * 4), slow);
  }
  Group g(3, tuned_options());
  ASSERT_EQ(allreduces(g, kWrongModelCount, 20), "");
  ASSERT_EQ(settle(g, kWrongModelCount), "");
  const Algorithm got = g.comm(0).algorithm_for(Collective::kAllreduce, kWrongModelCount * 4);
  EXPECT_NE(got, slow);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(g.comm(r).algorithm_for(Collective::kAllreduce, kWrongModelCount * 4), got);
  // Its row was dropped after two rounds: 2 ms against tens of microseconds.
  const auto entries = g.comm(0).tuning().entries;
  ASSERT_EQ(entries.size(), 1u);
  for (const auto& [name, t] : entries[0].measured)
    if (name == "test-slow") {
      EXPECT_GE(t, 2e-3);
    }
}

TEST(TunerChoice, ADriftingChoiceIsTunedAgainOnEveryRank) {
  // At 16 MiB only the two test rows are tried: the built-ins' estimates are far above theirs and above 1 ms.
  const Algorithm a = drift_a(), b = drift_b();
  g_sleep_a_us = 0;
  g_sleep_b_us = 20000;
  Group g(2, tuned_options());
  ASSERT_EQ(allreduces(g, kDriftCount, 80), "");  // decided, and the first check set its steady time
  ASSERT_TRUE(g.comm(0).tuned_choice(Collective::kAllreduce, kDriftCount * 4).has_value());
  EXPECT_EQ(g.comm(0).tuned_choice(Collective::kAllreduce, kDriftCount * 4)->algorithm, a);
  g_sleep_a_us = 40000;
  g_sleep_b_us = 0;
  ASSERT_EQ(allreduces(g, kDriftCount, 90), "");
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(g.comm(r).stats().retunes, 1u);
    EXPECT_EQ(g.comm(r).tuned_choice(Collective::kAllreduce, kDriftCount * 4)->algorithm, b);
  }
}

// ---------------------------------------------------------------- the tuning file
std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / fmt::format("hopwise-{}-{}", ::getpid(), name)).string();
}
void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(TuningFile, RoundTripThenUsedWithoutTrials) {
  const std::string path = temp_path("tuning.json");
  hc::TuningFile made;
  {
    Group g(3, tuned_options());
    for (std::size_t count : {std::size_t{5}, std::size_t{4099}, std::size_t{70000}}) {
      ASSERT_EQ(allreduces(g, count, 10), "");
      ASSERT_EQ(settle(g, count), "");
    }
    made = g.comm(0).tuning();
  }
  ASSERT_EQ(made.entries.size(), 3u);
  EXPECT_EQ(made.job, (hc::JobShape{3, 1, 3}));
  hc::write_tuning_file(made, path);
  const hc::TuningFile back = hc::read_tuning_file(path);
  EXPECT_EQ(back.job, made.job);
  EXPECT_EQ(back.version, hc::hopwise_version());
  EXPECT_FALSE(back.machine.empty());
  ASSERT_EQ(back.entries.size(), made.entries.size());
  for (std::size_t i = 0; i < back.entries.size(); ++i) {
    EXPECT_EQ(back.entries[i].choice, made.entries[i].choice);
    EXPECT_EQ(back.entries[i].size_class, made.entries[i].size_class);
    EXPECT_NEAR(back.entries[i].seconds, made.entries[i].seconds, 1e-7);
  }
  hc::Options o = tuned_options();
  o.tuning_file = path;
  Group g(3, o);
  for (const auto& e : made.entries)
    for (int r = 0; r < 3; ++r)
      EXPECT_EQ(g.comm(r).tuned_choice(Collective::kAllreduce, hc::size_class_max_bytes(e.size_class)), e.choice);
  ASSERT_EQ(allreduces(g, 4099, 20), "");
  EXPECT_EQ(g.comm(0).stats().tuning_trials, 0u) << "a class the file holds needs no trial";
  ASSERT_EQ(allreduces(g, 300, 20), "");
  EXPECT_GT(g.comm(0).stats().tuning_trials, 0u) << "a class it lacks is tuned online";
  std::remove(path.c_str());
}

TEST(TuningFile, ErrorsNameTheFileAndLine) {
  const std::string path = temp_path("bad.json");
  auto error_of = [&](const std::string& text) {
    write_text(path, text);
    try {
      hc::read_tuning_file(path);
    } catch (const hopwise::InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string head =
      "{\n  \"format\": \"hopwise-tuning/1\",\n  \"job\": {\"ranks\": 2, \"hosts\": 1, \"ranks_per_host\": 2},\n"
      "  \"entries\": [\n";
  const std::string good =
      "    {\"collective\": \"allreduce\", \"dtype\": \"float\", \"max_bytes\": 4096, \"algorithm\": \"ring\", "
      "\"time_us\": 10}";
  std::string e = error_of(head + good + ",\n" + good + "\n  ]\n}\n");
  EXPECT_EQ(e, "no error");
  e = error_of(head + good +
               ",\n    {\"collective\": \"allreduce\", \"dtype\": \"float\", \"max_bytes\": 8192, "
               "\"algorithm\": \"warp\", \"time_us\": 3}\n  ]\n}\n");
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("line 6"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown algorithm 'warp'"), std::string::npos) << e;
  e = error_of(head + good +
               ",\n    {\"collective\": \"allreduce\", \"dtype\": \"float\", \"algorithm\": \"ring\"}\n]}");
  EXPECT_NE(e.find("line 6"), std::string::npos) << e;
  EXPECT_NE(e.find("max_bytes"), std::string::npos) << e;
  e = error_of(head + good +
               ",\n    {\"collective\": \"allreduce\", \"dtype\": \"float\", \"max_bytes\": 5000, "
               "\"algorithm\": \"ring\", \"time_us\": 1}]}");
  EXPECT_NE(e.find("power of two"), std::string::npos) << e;
  e = error_of(head + good +
               ",\n    {\"collective\": \"broadcast\", \"dtype\": \"float\", \"max_bytes\": 64, "
               "\"algorithm\": \"shm\", \"time_us\": 1}]}");
  EXPECT_NE(e.find("does not implement broadcast"), std::string::npos) << e;
  e = error_of(head + good + "\n    oops\n]}");
  EXPECT_NE(e.find("line 6"), std::string::npos) << e;
  EXPECT_NE(e.find("not valid JSON"), std::string::npos) << e;
  e = error_of("88888e8888");  // a number past a double's range (found by fuzz_tuning_file)
  EXPECT_NE(e.find("not readable JSON"), std::string::npos) << e;
  e = error_of("{\"format\": \"other/2\", \"job\": {}, \"entries\": []}");
  EXPECT_NE(e.find("format"), std::string::npos) << e;
  std::remove(path.c_str());
  try {
    hc::read_tuning_file(path);
    ADD_FAILURE() << "a missing file read";
  } catch (const hopwise::InvalidArgument& x) {
    EXPECT_NE(std::string(x.what()).find("hopwise-tune"), std::string::npos) << x.what();
  }
}

// HOPWISE_TUNING_FILE is read as untrusted: a device or a huge file is refused at once, naming the limit, and the
// entries of a file made for another job are never parsed.
TEST(TuningFile, OnlyARegularFileWithinTheLimitIsReadAndTheHeaderFirst) {
  auto error_of = [](const std::string& path) {
    try {
      hc::read_tuning_file(path);
    } catch (const hopwise::InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string e = error_of("/dev/zero");
  EXPECT_NE(e.find("/dev/zero: not a regular file"), std::string::npos) << e;
  const std::string big = temp_path("big.json");
  std::ofstream(big).put('{');
  std::filesystem::resize_file(big, hc::kMaxTuningFileBytes + 1);  // sparse: no disk, nothing read
  e = error_of(big);
  EXPECT_NE(e.find("past the limit of 16 MiB"), std::string::npos) << e;
  std::remove(big.c_str());
  // A valid file of another shape with many entries: its header alone is read.
  hc::TuningFile f;
  f.job = {4, 2, 2};
  for (int i = 0; i < 20000; ++i)
    f.entries.push_back({Collective::kAllreduce, "float", 10 + i % 20, {Algorithm::kRing}, 1e-5, {}});
  const std::string path = temp_path("many.json");
  hc::write_tuning_file(f, path);
  const hc::TuningFile head = hc::read_tuning_file(path, true);
  EXPECT_EQ(head.job, f.job);
  EXPECT_TRUE(head.entries.empty());
  EXPECT_EQ(hc::read_tuning_file(path).entries.size(), f.entries.size());
  std::remove(path.c_str());
}

TEST(TuningFile, AnotherJobShapeIsIgnoredWithAWarning) {
  const std::string path = temp_path("shape.json");
  hc::TuningFile f;
  f.job = {4, 2, 2};
  f.entries.push_back({Collective::kAllreduce, "float", 14, {Algorithm::kTree}, 1e-5, {}});
  hc::write_tuning_file(f, path);
  hc::Options o = tuned_options();
  o.tuning_file = path;
  testing::internal::CaptureStderr();
  Group g(2, o);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("was made for 4 ranks on 2 hosts, 2 per host"), std::string::npos) << err;
  EXPECT_NE(err.find("ranks 4 (this job 2)"), std::string::npos) << err;
  EXPECT_FALSE(g.comm(0).tuned_choice(Collective::kAllreduce, 16384).has_value());
  // The same shape over another transport: its timings do not carry over (MPI's native exists only over MPI).
  f.job = {2, 1, 2};
  f.transport = "mpi";
  hc::write_tuning_file(f, path);
  testing::internal::CaptureStderr();
  Group same_shape(2, o);
  const std::string err2 = testing::internal::GetCapturedStderr();
  EXPECT_NE(err2.find("transport mpi (this job inproc)"), std::string::npos) << err2;
  EXPECT_FALSE(same_shape.comm(0).tuned_choice(Collective::kAllreduce, 16384).has_value());
  std::remove(path.c_str());
}

TEST(TuningFile, RanksWithDifferentFilesAllIgnoreThem) {
  const std::string p1 = temp_path("rank0.json"), p2 = temp_path("rank1.json");
  hc::TuningFile f;
  f.job = {2, 1, 2};
  f.entries.push_back({Collective::kAllreduce, "float", 14, {Algorithm::kTree}, 1e-5, {}});
  hc::write_tuning_file(f, p1);
  f.entries[0].choice = {Algorithm::kRing};
  hc::write_tuning_file(f, p2);
  auto world = hc::make_inprocess_world(2);
  std::vector<std::unique_ptr<hc::Communicator>> comms;
  for (int r = 0; r < 2; ++r) {
    hc::Options o = tuned_options();
    o.tuning_file = r == 0 ? p1 : p2;
    comms.push_back(std::make_unique<hc::Communicator>(std::make_unique<hc::InProcessTransport>(world, r), o));
  }
  testing::internal::CaptureStderr();
  std::vector<std::thread> ts;
  std::vector<float> out(2);
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      std::vector<float> x(3000, 1.0f), y(3000);
      for (int k = 0; k < 500 && (k == 0 || !comms[r]->tuned_choice(Collective::kAllreduce, 12000)); ++k)
        comms[r]->allreduce(x.data(), y.data(), x.size(), DataType::kFloat32);
      out[r] = y[0];
    });
  for (auto& t : ts) t.join();
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("different tuning files"), std::string::npos) << err;
  EXPECT_EQ(out[0], 2.0f);
  EXPECT_EQ(out[1], 2.0f);
  const auto c0 = comms[0]->tuned_choice(Collective::kAllreduce, 12000),
             c1 = comms[1]->tuned_choice(Collective::kAllreduce, 12000);
  ASSERT_TRUE(c0.has_value());
  EXPECT_EQ(c0, c1) << "tuned online alike instead";
  std::remove(p1.c_str());
  std::remove(p2.c_str());
}

}  // namespace

namespace {

// hd across hosts: every rank of a host sends its first halving steps through the host's one NIC. On 32 hosts of
// 8 ranks (25 Gbit/s links) the simulation ran hd at 1/7 of the ring's bandwidth from 1 MiB, where the model that
// gave each rank a NIC of its own chose hd at every size (hopwise-sim's auto/best 0.14-0.30).
TEST(CostModelHosts, HdPaysForTheHostsSharedNic) {
  hc::CostParams p;
  p.alpha = 4e-6;
  p.beta = 1 / 3.125e9;
  p.gamma = 1 / 4.8e9;
  const hc::CostModel m(p);
  hc::CostQuery q;
  q.ranks = 256;
  q.hosts = 32;
  q.tree_depth = 12;
  q.bytes = 8u << 20;
  EXPECT_LT(m.estimate(Algorithm::kRing, q), m.estimate(Algorithm::kHalvingDoubling, q));
  q.bytes = 16u << 10;  // latency-bound: hd's log2(256) rounds against the ring's 510
  EXPECT_LT(m.estimate(Algorithm::kHalvingDoubling, q), m.estimate(Algorithm::kRing, q));
  // One rank a host: the same as on one host of that many ranks (no NIC is shared).
  q.ranks = 32;
  q.bytes = 8u << 20;
  const double spread = m.estimate(Algorithm::kHalvingDoubling, q);
  q.hosts = 1;
  EXPECT_NEAR(m.estimate(Algorithm::kHalvingDoubling, q), spread, 1e-12);
}

}  // namespace
