// diloco:auto over a run, the one thing Outer asks (outer.cpp): the probe (kProbeSteps steps under probe_settings,
// each fragment synced blocking so that compute runs alone between the syncs and is timed there; then the link and
// the codecs measured and the settings picked: pick_outer), then the check of that choice on the windows of steps
// that follow (decide_check). Where the schedule leaves too few steps without a sync at work to read compute from
// (a fragment on every step), the tuner has Outer sync blocking for a quiet window of its own and says so: each
// fragment is still synced on time, and compute and the schedule's step are read in the same minutes. Every
// decision is taken on figures agreed over the ranks (the slowest's), at a step where no fragment is in flight, so
// every rank takes the same one at the same step.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "auto_pick.h"
#include "hopwise/training/averaging_method.h"
#include "outer_state.h"

namespace hopwise::comm::detail {

class AutoTuner {
 public:
  using Clock = std::chrono::steady_clock;

  explicit AutoTuner(AveragingContext& ctx);

  bool probing() const { return probing_; }
  bool checking() const { return checking_; }
  // A quiet window: Outer syncs each due fragment at once (launched and applied in one after_step) while true.
  bool holding() const { return hold_left_ > 0; }
  // What auto chose or decided last, and why (empty before the choice).
  const std::string& said() const { return said_; }
  // What the probe's pick said (empty before it, and after a restore: the saved choice stands).
  const std::string& picked() const { return picked_; }

  // After step t, in the probe: the choice once the probe is done (collective then, every rank alike); its warmup
  // is t, the schedule counting from here, where the probe's closing average left every rank equal. A step's
  // compute is read from the last step_done to `now`.
  std::optional<OuterSettings> probe(std::int64_t t, Clock::time_point now);
  // After step t, once its fragment (if due) was applied and before the next launch: the settings to change to, if
  // any (collective where a window ends; `in_flight` defers that to the next step with nothing in flight). Their
  // warmup is t; the caller averages every rank to one synced model before taking them.
  std::optional<OuterSettings> check(std::int64_t t, Clock::time_point now, const OuterSettings& s, bool in_flight);
  // At the end of after_step: whether a sync is at work in the step that follows and what this after_step waited for
  // a fragment's all-reduce (both land on the step ending at the next after_step).
  void step_done(bool syncing, double waited_ms);
  // A fragment's all-reduce took `ms` from its launch to its end.
  void sync_ended(double ms);
  // From a checkpoint: still probing (it starts again), or the saved choice standing (not checked again).
  void restore(bool probing, std::string said);

 private:
  void decided(const std::string& why);

  AveragingContext& ctx_;
  bool probing_ = true;
  bool checking_ = false;
  std::string said_;
  std::string picked_;
  // the probe
  int probe_steps_ = 0;
  std::vector<double> probe_ms_;
  Clock::time_point last_;
  Clock::time_point resumed_;                  // the last after_step's end: compute starts there
  std::pair<double, double> resumed_cpu_;      // the machine's CPU ticks (busy, all) there
  std::pair<double, double> probe_cpu_{0, 0};  // the ticks (busy, all) summed over the probe's compute
  std::vector<double> probe_waits_;            // the probe's blocking fragment syncs, each after_step's wait
  // the check
  double probe_step_ms_ = 0;       // a local step's time in the probe (the slowest rank's)
  std::vector<CodecCost> codecs_;  // the probe's, for a lighter codec before a longer period
  std::vector<CheckedStep> window_;
  std::vector<double> syncs_ms_;  // the window's fragments' all-reduce times
  bool next_syncing_ = false;     // a sync at work in the step under way
  double next_waited_ms_ = 0;     // what the last after_step waited
  std::int64_t out_of_loop_ = 0;  // the trainer's own averages seen so far
  bool resyncing_ = false;        // a change's resync lands on the step under way: a pause
  int hold_left_ = 0;             // steps of the quiet window still to run
  bool held_ = false;             // this window has had its quiet window
  int below_ = 0;                 // windows in a row read below kLengthenBelow
};

// Averages the model (timed: the link), times each candidate codec on it, and agrees on the slowest rank's figures.
// Collective.
// cores_busy: this rank's reading of the machine's busy cores over the probe's steps; waits: what each of its probe's
// blocking fragment syncs waited (agreed sync by sync as the least over the ranks: the last to arrive waits for no
// one; then the median).
LinkProbe measure_link(AveragingContext& ctx, double step_ms, double cores_busy, std::vector<double> waits);

}  // namespace hopwise::comm::detail
