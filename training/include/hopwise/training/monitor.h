// The utilization monitor: where each step's time goes on each rank (compute, communication, the part of it
// compute did not hide, codec time, bytes by link class) and, for each gradient bucket, which rank arrived last
// and by how much. Every `every` steps the ranks' samples travel in one small allgather queued behind the step's
// buckets (waited for a window later, so it never stalls a step); rank 0 prints a line per interval, an alert
// when utilization stays low naming the likely cause, and rewrites a Prometheus textfile and JSON lines.
//
//   HOPWISE_MONITOR=interval=10s[,every=10][,alert_after=3]   on; a line per interval on rank 0
//                                (interval=200steps: by steps, so that what a line covers is the same however fast
//                                the machine is)
//   HOPWISE_UTIL_ALERT=0.5       alert when compute utilization stays below 50% for alert_after intervals
//   HOPWISE_METRICS_FILE=PATH    Prometheus text format, rewritten atomically (the node exporter's textfile habit)
//   HOPWISE_METRICS_JSON=PATH    JSON lines: one per step (every rank's figures), per interval and per alert
//
// Arrival without synchronized clocks: a bucket's collective ends at about the same moment on every rank, so a
// rank that started it later spent less time in it; the last to arrive is the rank with the shortest time, and
// how late it came is the longest time minus its own. That holds across hosts whose clocks disagree.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hopwise/comm/communicator.h"

namespace hopwise::comm {

struct MonitorOptions {
  bool on = false;              // HOPWISE_MONITOR (or any of the files) set
  double interval_s = 10;       // interval=10s: a line per interval on rank 0
  int interval_steps = 0;       // interval=200steps: a line per 200 steps instead (0: by time)
  int every = 10;               // every=N: steps per gather of the ranks' samples
  int alert_after = 3;          // alert_after=K: intervals below HOPWISE_UTIL_ALERT before the alert fires
  double util_alert = 0;        // HOPWISE_UTIL_ALERT: a fraction (0.5) or a percentage (50%); 0: no alerts
  bool print = true;            // the console lines (off when only files were asked for)
  std::string metrics_file;     // HOPWISE_METRICS_FILE
  std::string json_file;        // HOPWISE_METRICS_JSON
  std::string job = "hopwise";  // the job label of every metric
  // A monitor made again over a new communicator (an elastic job's next generation): the JSON lines file is
  // continued, not started afresh.
  bool continue_files = false;
  // Where rank 0's lines go (null: stdout): a trainer that draws a progress bar ends its line first.
  std::function<void(const std::string&)> print_line;
  // "interval=10s,every=10,alert_after=3" or "interval=200steps,..." (an empty spec: the defaults); errors name the
  // field and what it takes.
  static MonitorOptions parse(const std::string& spec);
  static double parse_threshold(const std::string& text);  // "0.5" or "50%"
  static MonitorOptions from_env();
};

// What one rank measured in one step. The monitor adds the codec time and the link bytes itself (from the
// communicator's counters).
struct StepSample {
  double step_ms = 0;             // the whole step
  double compute_ms = 0;          // forward, backward, optimizer step
  double exposed_ms = 0;          // waiting for communication (the part compute did not hide)
  std::vector<double> bucket_ms;  // per bucket, in launch order: its collective's time on the progress thread
};

// One interval as rank 0 saw it: means per step, per rank.
struct MonitorReport {
  std::size_t first_step = 0, steps = 0;  // the interval's steps: [first_step, first_step + steps)
  double seconds = 0;                     // rank 0's wall time over them
  int ranks = 0;
  std::vector<double> step_ms, compute_ms, exposed_ms, comm_ms, codec_ms;
  // How late the rank came, per step: over the buckets it arrived last to, the longest time in them minus its own.
  std::vector<double> lag_ms;
  std::vector<double> host_bytes_per_s, network_bytes_per_s;
  std::vector<double> monitor_ms;  // the monitor's own time per step on the trainer's thread
  int slowest_rank = 0;
  double slowest_lag_ms = 0;
  double utilization = 0;  // compute over step, the ranks' mean
  // Per bucket (the interval's last layout): mean skew (longest time in it minus the shortest) and the rank that
  // came last most often.
  std::vector<double> bucket_skew_ms;
  std::vector<int> bucket_last_rank;
  int low_intervals = 0;  // consecutive intervals below the alert threshold, this one included
  bool alerting = false;  // below the threshold for alert_after intervals or more
  bool alert = false;     // this interval's line was followed by an alert line (the first, then every K intervals)
  std::string cause;      // the likely cause of low utilization (set whenever utilization is below the threshold)
};

class Monitor {
 public:
  explicit Monitor(Communicator& comm, MonitorOptions options = MonitorOptions::from_env());
  ~Monitor();
  Monitor(const Monitor&) = delete;
  Monitor& operator=(const Monitor&) = delete;

  bool on() const;
  // Every rank, once per step, in the same order as its collectives: every `every` steps it queues the allgather.
  void record(const StepSample& s);
  // Collective: gathers what is left, reports the last (partial) interval, writes the files. Called once at the
  // end; record() after it starts a new interval.
  void finish();
  // A change of membership (an elastic job's; the caller prints its line): on rank 0 a JSON line
  // {"type": "elastic", ...} and, in the Prometheus file from now on, hopwise_elastic_events_total,
  // hopwise_elastic_stood_still_seconds_total and hopwise_ranks, from the job's totals the caller keeps.
  void membership_event(const std::string& line, int events_total, double stood_still_s_total);
  // Rank 0: the intervals reported so far, and the alert lines printed.
  const std::vector<MonitorReport>& reports() const;
  const std::vector<std::string>& alerts() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The lines the monitor prints, as functions of a report (tests and the PyTorch frontend use them).
std::string monitor_line(const MonitorReport& r);
std::string alert_line(const MonitorReport& r, double threshold, int after);
// The Prometheus text exposition of a report (# HELP, # TYPE, one sample per rank where per rank).
std::string prometheus_text(const MonitorReport& r, const std::string& job, std::uint64_t steps_total);
// The elastic families (membership_event's): events, standstill seconds, ranks now.
std::string prometheus_elastic_text(const std::string& job, int events_total, double stood_still_s_total, int ranks);

// Writes `text` to `path` through a temporary file in the same directory and a rename, so that a reader (the node
// exporter's textfile collector) never sees half a file.
void write_file_atomically(const std::string& path, const std::string& text);

}  // namespace hopwise::comm
