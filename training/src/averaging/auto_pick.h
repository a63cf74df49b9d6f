// diloco:auto (outer.cpp): what it measures in the first steps and how it picks the period, fragments, delay, codec
// and outer settings from that. pick_outer is pure: the measurements in, the choice and its reasons out.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "hopwise/training/averaging_method.h"
#include "outer_state.h"

namespace hopwise::comm::detail {

constexpr int kProbeSteps = 10;  // local steps timed before the choice

struct ProbeState {
  int steps = 0;
  std::vector<double> step_ms;
  std::chrono::steady_clock::time_point last;
};

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
};

struct AutoChoice {
  OuterSettings settings;
  double utilization = 0;  // predicted
  std::string why;
};

double median(std::vector<double> v);

// One step in diloco:auto's check: its time from one after_step to the next, whether a sync was at work in it
// (launched, in flight or applied: the syncs' cost lands on these steps) and whether the trainer left the loop in
// it (an average for an evaluation, a checkpoint: not the syncs' cost).
struct CheckedStep {
  double ms = 0;
  bool syncing = false;
  bool paused = false;
};
struct WindowReading {
  double step_ms = 0;     // the mean step, paused steps left out
  double compute_ms = 0;  // the mean quiet step (no sync at work), or the probe's figure where too few were quiet
  int quiet = 0;          // the quiet steps it read
};
// The window's mean step and what compute alone took in the same window: both read on the same minutes of a VM
// whose speed swings by 15%, so their ratio is the syncs' share and not the VM's drift since the probe. A quiet step
// above 3x the quiet median is a pause too (the trainer's own); a syncing step always counts.
WindowReading read_window(const std::vector<CheckedStep>& steps, double probe_ms);
// The period to try next where the window read below the target: the syncs' time per step falls with the period,
// so the period grows by the power of two that brings it within what the target allows (2x at least, 512 at most).
int lengthened_period(int period, const WindowReading& w, double target);
// The codec to swap to, before the period grows, where the window read below the target: the one with the most bits
// whose wire share, scaled from the current codec's measured cost, brings the syncs within what the target allows
// (on the language model a longer period cost more loss than fewer bits: 3.48 -> 3.61 bits per byte from H = 4 to 8,
// int4 with error feedback within 0.3% of uncompressed plain averaging); "" where none would.
std::string lighter_codec(const std::string& codec, const std::vector<CodecCost>& codecs, const WindowReading& w,
                          double target);
// The outer step (lr, momentum, nesterov) for the inner optimizer's family ("sgd", "adam") at s.period, set in s;
// returns why.
std::string set_outer_rule(OuterSettings& s, const std::string& inner);
// The probe's settings: plain local steps, nothing synced until the choice.
OuterSettings probe_settings(const AveragingSpec& spec);
// Averages the model (timed: the link), times each candidate codec on it, and agrees on the slowest rank's figures.
// Collective.
LinkProbe measure_link(AveragingContext& ctx, double step_ms);
// The shortest period (then the shortest delay, the fewest lost bits, the fewest fragments) whose predicted compute
// utilization reaches spec.target, and outer settings for spec.inner. Every rank gets the same choice from the
// same figures.
AutoChoice pick_outer(const LinkProbe& link, const AveragingSpec& spec, int world);

}  // namespace hopwise::comm::detail
