// The monitor's arithmetic, apart from any communication: every rank's samples of a window in, an interval's
// report out (means per step, arrival lags from the buckets' times, the likely cause of low utilization).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "hopwise/training/monitor.h"

namespace hopwise::comm::monitor {

// A step as one rank measured it, the monitor's own additions included. Packed as kRecord doubles for the gather.
struct RankStep {
  double step_ms = 0, compute_ms = 0, exposed_ms = 0, comm_ms = 0, codec_ms = 0;
  double host_bytes = 0, network_bytes = 0;
  double monitor_ms = 0;  // the monitor's own time on the trainer's thread (the previous step's record())
  std::vector<double> bucket_ms;
};

constexpr std::size_t kMaxBuckets = 64;  // beyond these a step's buckets are not compared (none of ours has as many)
constexpr std::size_t kHeader = 9;
constexpr std::size_t kRecord = kHeader + kMaxBuckets;

void pack(const RankStep& s, double* out);  // kRecord doubles
RankStep unpack(const double* in);

// One step across the ranks: each bucket's skew and the rank that came last to it, and each rank's lag.
struct StepArrival {
  std::vector<double> bucket_skew_ms;
  std::vector<int> bucket_last_rank;
  std::vector<double> lag_ms;  // per rank
};
StepArrival arrival(const std::vector<RankStep>& ranks);  // ranks[r]: rank r's sample of the same step

// Sums an interval's steps; report() gives the means.
class Interval {
 public:
  void add(const std::vector<RankStep>& step);  // one step, every rank
  bool empty() const { return steps_ == 0; }
  std::size_t steps() const { return steps_; }
  // `first_step`: the index of the interval's first step; `seconds`: its wall time on rank 0.
  MonitorReport report(std::size_t first_step, double seconds) const;
  void reset();

 private:
  std::size_t steps_ = 0;
  std::vector<RankStep> sum_;  // per rank
  std::vector<double> lag_;
  std::vector<double> skew_;            // per bucket
  std::vector<std::vector<int>> last_;  // per bucket, per rank: times it came last
};

// "12.3 MB/s", "1.05 GB/s", "310 kB/s": what the lines say of bytes per second.
std::string rate(double bytes_per_s);

// Names what most likely holds utilization down: a straggler, codec time, or exposed communication and its link.
std::string likely_cause(const MonitorReport& r);

// One JSON line for a step (type "step"): every rank's figures and the buckets' arrival.
std::string step_json(std::size_t step, const std::vector<RankStep>& ranks, const StepArrival& a);
std::string interval_json(const MonitorReport& r, double util_alert = 0);
std::string alert_json(const MonitorReport& r, const std::string& line);

}  // namespace hopwise::comm::monitor
