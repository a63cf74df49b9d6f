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
// The mean of all but the slowest `share` of the values: a window's time per step where the syncs land on some steps
// (a median would miss them when they land on fewer than half), without the pauses a trainer takes between steps
// (an evaluation every 20 steps).
double mean_without_slowest(std::vector<double> v, double share);
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
