// The utilization monitor (training/src/monitor/): its arithmetic on made-up samples, its options and exports, and
// the whole path (samples, background allgather, report on rank 0) on in-process ranks, one of them slowed.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "../training/src/monitor/analysis.h"
#include "hopwise/common/error.h"
#include "hopwise/training/monitor.h"
#include "hopwise/training/reducer.h"
#include "inproc_group.h"

namespace {

namespace hc = hopwise::comm;
namespace hm = hopwise::comm::monitor;

hm::RankStep sample(double step, double compute, double exposed, std::vector<double> buckets) {
  hm::RankStep s;
  s.step_ms = step;
  s.compute_ms = compute;
  s.exposed_ms = exposed;
  s.bucket_ms = std::move(buckets);
  for (double d : s.bucket_ms) s.comm_ms += d;
  return s;
}

TEST(MonitorArrival, TheShortestTimeInABucketCameLast) {
  // Rank 2 reached bucket 0 30 ms after rank 0 and 25 ms after rank 1; bucket 1 all together but rank 0 by 1 ms.
  const std::vector<hm::RankStep> ranks = {sample(50, 10, 35, {32, 2}), sample(50, 15, 30, {27, 3}),
                                           sample(50, 40, 5, {2, 3})};
  const hm::StepArrival a = hm::arrival(ranks);
  ASSERT_EQ(a.bucket_last_rank, (std::vector<int>{2, 0}));
  EXPECT_DOUBLE_EQ(a.bucket_skew_ms[0], 30);
  EXPECT_DOUBLE_EQ(a.bucket_skew_ms[1], 1);
  EXPECT_DOUBLE_EQ(a.lag_ms[2], 30);
  EXPECT_DOUBLE_EQ(a.lag_ms[0], 1);
  EXPECT_DOUBLE_EQ(a.lag_ms[1], 0);
}

TEST(MonitorArrival, UnevenBucketCountsCompareTheCommonOnesAndNoRanksIsNothing) {
  const hm::StepArrival a = hm::arrival({sample(1, 1, 0, {5, 1, 9}), sample(1, 1, 0, {4})});
  EXPECT_EQ(a.bucket_skew_ms.size(), 1u);
  EXPECT_EQ(a.bucket_last_rank[0], 1);
  EXPECT_TRUE(hm::arrival({}).lag_ms.empty());
  EXPECT_TRUE(hm::arrival({sample(1, 1, 0, {})}).bucket_skew_ms.empty());
}

TEST(MonitorArrival, PackAndUnpackKeepEveryFieldAndCapTheBuckets) {
  hm::RankStep s = sample(12.5, 7.25, 3, {1, 2, 3});
  s.codec_ms = 0.5;
  s.host_bytes = 1e6;
  s.network_bytes = 4e9;
  std::vector<double> buf(hm::kRecord, -1);
  hm::pack(s, buf.data());
  const hm::RankStep back = hm::unpack(buf.data());
  EXPECT_EQ(back.step_ms, 12.5);
  EXPECT_EQ(back.compute_ms, 7.25);
  EXPECT_EQ(back.codec_ms, 0.5);
  EXPECT_EQ(back.network_bytes, 4e9);
  EXPECT_EQ(back.bucket_ms, s.bucket_ms);
  s.bucket_ms.assign(hm::kMaxBuckets + 5, 1.0);
  hm::pack(s, buf.data());
  EXPECT_EQ(hm::unpack(buf.data()).bucket_ms.size(), hm::kMaxBuckets);
}

TEST(MonitorInterval, MeansPerStepUtilizationAndTheSlowestRank) {
  hm::Interval in;
  for (int k = 0; k < 4; ++k) in.add({sample(40, 10, 28, {25, 4}), sample(40, 36, 2, {1, 4})});
  const hc::MonitorReport r = in.report(100, 2.0);
  EXPECT_EQ(r.first_step, 100u);
  EXPECT_EQ(r.steps, 4u);
  EXPECT_EQ(r.ranks, 2);
  EXPECT_DOUBLE_EQ(r.compute_ms[1], 36);
  EXPECT_DOUBLE_EQ(r.utilization, (10.0 / 40 + 36.0 / 40) / 2);
  EXPECT_EQ(r.slowest_rank, 1);
  EXPECT_DOUBLE_EQ(r.slowest_lag_ms, 24);
  ASSERT_EQ(r.bucket_skew_ms.size(), 2u);
  EXPECT_DOUBLE_EQ(r.bucket_skew_ms[0], 24);
  EXPECT_EQ(r.bucket_last_rank[0], 1);
  in.reset();
  EXPECT_TRUE(in.empty());
}

TEST(MonitorCause, NamesTheStragglerTheCodecOrTheLink) {
  hm::Interval straggling;
  for (int k = 0; k < 3; ++k)
    straggling.add({sample(60, 12, 45, {44, 1}), sample(60, 55, 2, {1, 1}), sample(60, 13, 44, {43, 1})});
  hc::MonitorReport r = straggling.report(0, 1);
  std::string cause = hm::likely_cause(r);
  EXPECT_NE(cause.find("straggler: rank 1 arrives 43.0 ms late"), std::string::npos) << cause;
  EXPECT_NE(cause.find("its compute 55.0 ms, the others' median 12.5 ms"), std::string::npos) << cause;

  hm::Interval coding;
  hm::RankStep a = sample(30, 10, 18, {15}), b = sample(30, 10, 18, {15});
  a.codec_ms = b.codec_ms = 14;
  coding.add({a, b});
  cause = hm::likely_cause(coding.report(0, 1));
  EXPECT_EQ(cause.rfind("codec time: 14.0 ms per step", 0), 0u) << cause;

  hm::Interval waiting;
  a = sample(80, 10, 68, {70});
  b = sample(80, 10, 68, {70});
  a.network_bytes = b.network_bytes = 5e6;
  waiting.add({a, b});
  cause = hm::likely_cause(waiting.report(0, 1));
  EXPECT_NE(cause.find("exposed communication: 68.0 ms per step"), std::string::npos) << cause;
  EXPECT_NE(cause.find("the network between hosts (10.0 MB/s"), std::string::npos) << cause;
  a.network_bytes = b.network_bytes = 0;
  a.host_bytes = 2e9;
  hm::Interval local;
  local.add({a, b});
  EXPECT_NE(hm::likely_cause(local.report(0, 1)).find("the host's own links (2.00 GB/s"), std::string::npos);
}

TEST(MonitorOptionsParse, FieldsAndTheirErrors) {
  const hc::MonitorOptions o = hc::MonitorOptions::parse("interval=500ms,every=4,alert_after=2");
  EXPECT_TRUE(o.on);
  EXPECT_DOUBLE_EQ(o.interval_s, 0.5);
  EXPECT_EQ(o.every, 4);
  EXPECT_EQ(o.alert_after, 2);
  EXPECT_DOUBLE_EQ(hc::MonitorOptions::parse("interval=2m").interval_s, 120);
  EXPECT_DOUBLE_EQ(hc::MonitorOptions::parse("interval=10").interval_s, 10);
  EXPECT_TRUE(hc::MonitorOptions::parse("").on);
  EXPECT_EQ(hc::MonitorOptions::parse("interval=200steps").interval_steps, 200);
  EXPECT_EQ(hc::MonitorOptions::parse("interval=1step").interval_steps, 1);
  EXPECT_EQ(hc::MonitorOptions::parse("interval=5steps,interval=2s").interval_steps, 0);  // the last one counts
  auto error = [](const std::string& spec) {
    try {
      hc::MonitorOptions::parse(spec);
    } catch (const hopwise::InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(error("interval=0s").find("interval=0s is not a duration"), std::string::npos);
  EXPECT_NE(error("interval=10h").find("write e.g. interval=10s"), std::string::npos);
  EXPECT_NE(error("interval=0steps").find("interval=0 must be a whole number >= 1 (steps per line)"),
            std::string::npos);
  EXPECT_NE(error("interval=-3steps").find("or 200steps"), std::string::npos);
  EXPECT_NE(error("interval=9999999steps").find("must be a whole number >= 1"), std::string::npos);
  EXPECT_NE(error("every=0").find("every=0 must be a whole number >= 1"), std::string::npos);
  EXPECT_NE(error("every=2.5").find("every=2.5 must be a whole number"), std::string::npos);
  EXPECT_NE(error("period=3").find("unknown field 'period'; fields: interval, every, alert_after"), std::string::npos);
  EXPECT_NE(error("interval").find("'interval' needs a value"), std::string::npos);
  EXPECT_DOUBLE_EQ(hc::MonitorOptions::parse_threshold("50%"), 0.5);
  EXPECT_DOUBLE_EQ(hc::MonitorOptions::parse_threshold("0.25"), 0.25);
  for (const char* bad : {"150%", "1.5", "-0.1", "half", "50%%", ""})
    EXPECT_THROW(hc::MonitorOptions::parse_threshold(bad), hopwise::InvalidArgument) << bad;
}

// Every sample line belongs to a family announced by # HELP and # TYPE, its value parses, its labels are quoted.
void expect_valid_exposition(const std::string& text) {
  std::set<std::string> typed;
  std::istringstream in(text);
  std::string line;
  const std::string value = R"("(?:[^"\\]|\\.)*")";
  const std::regex sample_re("^([a-z_]+)\\{[a-z_]+=" + value + "(,[a-z_]+=" + value + ")*\\} (-?[0-9.e+-]+)$");
  int samples = 0;
  while (std::getline(in, line)) {
    if (line.rfind("# TYPE ", 0) == 0) {
      typed.insert(line.substr(7, line.find(' ', 7) - 7));
      continue;
    }
    if (line.rfind("# HELP ", 0) == 0) continue;
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, sample_re)) << line;
    EXPECT_TRUE(typed.count(m[1].str())) << "no # TYPE before " << line;
    ++samples;
  }
  EXPECT_GT(samples, 10);
}

TEST(MonitorExports, PrometheusTextAndTheAtomicFile) {
  hm::Interval in;
  in.add({sample(40, 10, 28, {25, 4}), sample(40, 36, 2, {1, 4})});
  hc::MonitorReport r = in.report(0, 1);
  r.low_intervals = 3;
  r.alerting = true;
  const std::string text = hc::prometheus_text(r, "a \"quoted\" job", 7);
  expect_valid_exposition(text);
  EXPECT_NE(text.find("hopwise_steps_total{job=\"a \\\"quoted\\\" job\"} 7"), std::string::npos) << text;
  EXPECT_NE(text.find("hopwise_arrival_lag_seconds{job=\"a \\\"quoted\\\" job\",rank=\"1\"} 0.024"), std::string::npos);
  EXPECT_NE(text.find("hopwise_utilization_alert{job=\"a \\\"quoted\\\" job\"} 1"), std::string::npos);

  const auto dir = std::filesystem::temp_directory_path() / fmt::format("hopwise-monitor-{}", ::getpid());
  std::filesystem::create_directories(dir);
  const auto path = (dir / "job.prom").string();
  hc::write_file_atomically(path, "first\n");
  hc::write_file_atomically(path, text);
  std::ifstream f(path);
  std::stringstream back;
  back << f.rdbuf();
  EXPECT_EQ(back.str(), text);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), {}), 1) << "a temporary file was left";
  std::filesystem::remove_all(dir);
  EXPECT_THROW(hc::write_file_atomically((dir / "no" / "such.prom").string(), text), hopwise::InvalidArgument);
}

TEST(MonitorExports, LinesSayWhatTheyMeasured) {
  hm::Interval in;
  for (int k = 0; k < 10; ++k) in.add({sample(40, 10, 28, {25, 4}), sample(40, 36, 2, {1, 4})});
  hc::MonitorReport r = in.report(20, 2.5);
  r.low_intervals = 3;
  r.cause = hm::likely_cause(r);
  EXPECT_EQ(hc::monitor_line(r),
            "monitor: steps 20-29 (2.5 s): utilization 57% (compute 23.0 of 40.0 ms per step), exposed comm 15.0 ms, "
            "codec 0.0 ms; slowest rank 1, 24.0 ms late per step; network 0 kB/s, host 0 kB/s; monitor 0.000 ms");
  const std::string alert = hc::alert_line(r, 0.7, 3);
  EXPECT_EQ(alert.rfind("monitor ALERT: utilization 57% below 70% for 3 intervals in a row (steps 20-29); likely "
                        "cause: straggler: rank 1",
                        0),
            0u)
      << alert;
}

// The whole path on 3 in-process ranks through the reducer: rank 2 sleeps before its backward each step.
TEST(MonitorRanks, TheReducersStragglerIsNamedWithItsLag) {
  constexpr int kRanks = 3, kSteps = 24;
  constexpr double kSleepMs = 30;
  hwtest::Group g(kRanks, hwtest::test_options());
  std::vector<hc::MonitorReport> reports;
  const std::string err = g.run([&](int rank, hc::Communicator& comm) {
    hc::MonitorOptions o;
    o.on = true;
    o.print = false;
    o.every = 4;
    o.interval_s = 1e9;  // one interval: the whole run
    hc::Monitor monitor(comm, o);
    hc::ReducerOptions ro;
    ro.bucket_mb = 0.1;
    ro.first_bucket_mb = 0.1;
    hc::GradientReducer reducer(comm, ro);
    std::vector<std::vector<float>> grads(4, std::vector<float>(30000, 1.0f));
    for (int i = 0; i < 4; ++i) reducer.add_parameter(fmt::format("w{}", i), grads[i].data(), grads[i].size());
    reducer.finalize();
    using Clock = std::chrono::steady_clock;
    for (int s = 0; s < kSteps; ++s) {
      const auto t0 = Clock::now();
      if (rank == 2) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(kSleepMs));
      for (int i = 3; i >= 0; --i) reducer.mark_ready(i);
      const auto t1 = Clock::now();
      const hc::StepStats st = reducer.finish();
      hc::StepSample x;
      x.step_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      x.compute_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
      x.exposed_ms = st.exposed_comm_ms;
      for (const auto& b : reducer.last_timings())
        x.bucket_ms.push_back(std::chrono::duration<double, std::milli>(b.end - b.start).count());
      monitor.record(x);
    }
    monitor.finish();
    if (rank == 0) reports = monitor.reports();
    if (rank != 0 && !monitor.reports().empty()) throw std::runtime_error("only rank 0 reports");
  });
  ASSERT_EQ(err, "");
  ASSERT_EQ(reports.size(), 1u);
  const hc::MonitorReport& r = reports[0];
  EXPECT_EQ(r.steps, static_cast<std::size_t>(kSteps));
  EXPECT_EQ(r.slowest_rank, 2);
  EXPECT_NEAR(r.slowest_lag_ms, kSleepMs, 0.2 * kSleepMs);
  EXPECT_LT(r.lag_ms[0], 0.2 * kSleepMs);
  EXPECT_LT(r.lag_ms[1], 0.2 * kSleepMs);
  EXPECT_GT(r.host_bytes_per_s[0], 0) << "in-process ranks share a host: their bytes are the host's";
  EXPECT_EQ(r.network_bytes_per_s[0], 0);
}

// interval=Nsteps: every line covers N steps, however long they took (the last, partial one the rest).
TEST(MonitorRanks, IntervalsCountedInStepsDoNotDependOnTheClock) {
  hwtest::Group g(2, hwtest::test_options());
  std::vector<hc::MonitorReport> reports;
  const std::string err = g.run([&](int rank, hc::Communicator& comm) {
    hc::MonitorOptions o = hc::MonitorOptions::parse("interval=6steps,every=4");
    o.print = false;
    hc::Monitor monitor(comm, o);
    for (int s = 0; s < 27; ++s) monitor.record({2, 1, 0, {1}});
    monitor.finish();
    if (rank == 0) reports = monitor.reports();
  });
  ASSERT_EQ(err, "");
  ASSERT_EQ(reports.size(), 5u);
  for (std::size_t i = 0; i < reports.size(); ++i) {
    EXPECT_EQ(reports[i].first_step, 6 * i);
    EXPECT_EQ(reports[i].steps, i + 1 < reports.size() ? 6u : 3u);
    EXPECT_DOUBLE_EQ(reports[i].utilization, 0.5);
  }
}

TEST(MonitorRanks, OffCostsNothingAndSaysNothing) {
  hwtest::Group g(2, hwtest::test_options());
  const std::string err = g.run([&](int, hc::Communicator& comm) {
    hc::Monitor monitor(comm, hc::MonitorOptions{});
    EXPECT_FALSE(monitor.on());
    for (int s = 0; s < 30; ++s) monitor.record({1, 1, 0, {1}});
    monitor.finish();
    EXPECT_TRUE(monitor.reports().empty());
  });
  EXPECT_EQ(err, "");
}

}  // namespace
