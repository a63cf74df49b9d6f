// diloco:auto's rules: how it picks the period, fragments, delay, codec and outer step from what it measured in the
// first steps (pick_outer), and what it does when a later window of steps reads otherwise (decide_check). Pure: the
// measurements in, the choice and its reasons out. The measuring itself is AutoTuner's (auto_tuner.h).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "hopwise/training/averaging_method.h"
#include "outer_state.h"

namespace hopwise::comm::detail {

constexpr int kProbeSteps = 10;  // local steps timed before the choice

struct CodecCost {
  std::string codec;      // "none", "int8", ...
  double wire_ratio = 1;  // its all-reduce's bytes on the wire over the float32 all-reduce's
  double cpu_ms = 0;      // encoding and decoding the whole model once, on one core
};

struct LinkProbe {
  double step_ms = 0;             // compute per step (median over the probe, the slowest rank's)
  double full_ms = 0;             // the whole model's float32 all-reduce (the slowest rank's)
  std::size_t bytes = 0;          // the model's float32 bytes
  std::vector<CodecCost> codecs;  // none first, then fewer bits
  double cores_busy = 0;          // the machine's cores busy during the probe's steps, 0..1 (the busiest rank's)
  double fragment_ms = 0;         // one probe fragment's blocking sync (probe_settings'), all of after_step's
                                  // part: sync by sync the least over the ranks, then the median; 0: not measured
};

struct AutoChoice {
  OuterSettings settings;
  double utilization = 0;  // predicted
  std::string why;
};

double median(std::vector<double> v);

// One step in diloco:auto's check: its time from one after_step to the next, what of it after_step waited for a
// fragment's all-reduce, whether a sync was at work in it (launched, in flight or applied: the syncs' cost lands on
// these steps), whether the trainer left the loop in it (an average for an evaluation, a checkpoint: not the syncs'
// cost) and whether it was in a quiet window of auto's own (its syncs blocking: compute, not the schedule's step).
struct CheckedStep {
  double ms = 0;
  bool syncing = false;
  bool paused = false;
  bool held = false;
  double waited_ms = 0;
};
struct WindowReading {
  double step_ms = 0;     // the schedule's mean step, paused and held steps left out
  double compute_ms = 0;  // the mean quiet step (no sync at work; a blocking sync before it left out), held ones
                          // included; 0 where too few were quiet
  double wait_ms = 0;     // per schedule step, what after_step waited for a fragment's all-reduce
  double sync_ms = 0;     // one fragment's all-reduce, from its launch to its end (median; 0: none ended)
  int quiet = 0;          // the quiet steps it read (0: too few to trust)
};
constexpr int kQuietSteps = 6;  // the steps of a quiet window auto keeps where the schedule leaves too few
// The window's mean step and what compute alone took in the same minutes: on a VM whose speed swings by 15% their
// ratio is the syncs' share, not the VM's drift since the probe. A quiet step above 3x the quiet median is a pause
// too (the trainer's own); a syncing step always counts. Too few quiet steps (fewer than 4 and than an eighth of
// the window): compute_ms 0 and quiet 0, a reading nothing may be decided on.
WindowReading read_window(const std::vector<CheckedStep>& steps, const std::vector<double>& sync_ms);
// The period to try next where the window read below the target: the syncs' time per step falls with the period,
// so the period grows by the power of two that brings it within what the target allows (2x at least, 512 at most).
int lengthened_period(int period, const WindowReading& w, double target);
// The codec to swap to, before the period grows, where the window read below the target: the one with the most bits
// whose wire share, scaled from the current codec's measured cost, brings the syncs within what the target allows;
// with `lightest`, where none would, the one with the fewest bits; "" where none is lighter.
std::string lighter_codec(const std::string& codec, const std::vector<CodecCost>& codecs, const WindowReading& w,
                          double target, bool lightest = false);
// What the check does with one window's reading (agreed over the ranks).
struct CheckDecision {
  enum class Kind { kKeep, kChange, kAgain } kind = Kind::kKeep;  // kAgain: read another window, change nothing
  OuterSettings next;  // kChange: the settings from here on (the outer step set by the rule for `inner`)
  std::string why;     // the reading and the reason, one line
  bool below = false;  // the window read under kLengthenBelow (counted towards two in a row)
};
// The quality rule: where the window reads below the target, a delay or more fragments (where the steps waited on
// the link), then fewer bits, before a longer period; the period grows only where the syncs' waits outlast what
// delay and fragments can hide, where a period shorter than kStreamedPeriod spends the cores compute shares with
// the syncs (it becomes kStreamedPeriod with as many fragments: still a fragment every step, a quarter of the work
// of period 1), or where utilization stays under kLengthenBelow on two windows in a row. On the LM (AdamW), H =
// 1 -> 4 streamed cost 0.2% of final loss for steps 1.25x faster, H = 4 -> 8 3.5%, int4 with error feedback under
// 0.3%. After inner steps whose outer rule has a momentum period (SGD, outer_rule.h), which a longer period costs
// little, the period grows below the target, as the pick's does: the pick's reading of the syncs' work on busy cores
// swings (4 to 21 ms a model over eight MLP probes) and choices on low readings (4, 7 ms) ran at 81% and 63% of
// compute. A reading without quiet steps decides nothing.
constexpr double kLengthenBelow = 0.5;
constexpr int kStreamedPeriod = 4;
CheckDecision decide_check(const OuterSettings& s, const WindowReading& w, const std::vector<CodecCost>& codecs,
                           double target, const std::string& inner, int below_before);
// The outer step (lr, momentum, nesterov) for the inner optimizer's family at s.period (outer_rule.h), set in s;
// returns why.
std::string set_outer_rule(OuterSettings& s, const std::string& inner);
// The probe's settings: the streamed schedule (kStreamedPeriod fragments of period kStreamedPeriod, kProbeCodec,
// plain averaging) synced blocking, so the replicas do not drift apart while compute is timed between the syncs.
constexpr const char* kProbeCodec = "int4";
OuterSettings probe_settings(const AveragingSpec& spec);
// The machine's cores are busy with compute (80% and more): a codec's encoding and decoding on the progress thread
// then takes a core from compute rather than an idle one, so the pick counts it against compute, hidden by no delay.
// The threshold is below what two single-threaded ranks on two cores read (79-96%: they wait for each other at the
// probe's blocking syncs), far above a GPU trainer's (one core a rank of many).
constexpr double kCoresBusy = 0.7;
// On busy cores a sync also costs the cores what the codec's timing leaves out (the reduction, the outer step, the
// copies, the transport): the probe's blocking fragment sync less its wire and codec share, scaled with a fragment's
// size, and counted against compute like the codec's work.
double sync_overhead_ms(const LinkProbe& link);
// The shortest period (then the shortest delay, the fewest lost bits, the fewest fragments) whose predicted compute
// utilization reaches spec.target, and outer settings for spec.inner. On busy cores the period starts at
// kStreamedPeriod, where the check would take it, more fragments come before a shorter delay, and the fewest bits
// first: every byte costs the cores there (on the LM at 100 Mbit/s int8's steps were 5% slower than int4's, whose
// error-fed loss was within 0.3%). Where the inner optimizer's outer rule takes a momentum step from some period on
// (SGD: 128, outer_rule.h), the period is that one at least.
// Every rank gets the same choice from the same figures.
AutoChoice pick_outer(const LinkProbe& link, const AveragingSpec& spec, int world);

}  // namespace hopwise::comm::detail
