// diloco:auto's measuring and deciding over a run (auto_tuner.h); the rules it applies are auto_pick.h's.
#include "auto_tuner.h"

#include <fmt/core.h>

#include <algorithm>
#include <fstream>
#include <utility>

#include "hopwise/common/log.h"
#include "hopwise/compression/codec.h"

namespace hopwise::comm::detail {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }
double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// The machine's CPU time so far, busy and in all, in clock ticks (/proc/stat's first line); {0, 0} where unreadable.
std::pair<double, double> cpu_ticks() {
  std::ifstream in("/proc/stat");
  std::string name;
  double v[8] = {};
  if (!(in >> name) || name != "cpu") return {0, 0};
  for (double& x : v) in >> x;  // user nice system idle iowait irq softirq steal
  if (!in) return {0, 0};
  double all = 0;
  for (const double x : v) all += x;
  return {all - v[3] - v[4], all};
}

// Candidates in order of the bits they lose: none, then 8 bits, then 4.
constexpr const char* kCandidates[] = {"none", "int8", "fp8", "int4"};

// A probe step whose after_step waited for no sync (a rank's minimum over the others' waits skips it).
constexpr double kNoSync = 1e300;

}  // namespace

AutoTuner::AutoTuner(AveragingContext& ctx) : ctx_(ctx) {}

void AutoTuner::decided(const std::string& why) {
  said_ = why;
  if (ctx_.comm->rank() == 0) log::info("{}", said_);
}

std::optional<OuterSettings> AutoTuner::probe(std::int64_t t, Clock::time_point now) {
  if (t <= ctx_.spec.warmup) return std::nullopt;
  // Compute alone: from the end of the last after_step (its blocking sync done) to this one's start.
  const std::pair<double, double> ticks = cpu_ticks();
  if (probe_steps_ > 0) {
    probe_ms_.push_back(ms_between(resumed_, now));
    probe_cpu_.first += ticks.first - resumed_cpu_.first;
    probe_cpu_.second += ticks.second - resumed_cpu_.second;
  }
  resumed_ = now;  // where no step_done follows (a caller timing the probe alone)
  resumed_cpu_ = ticks;
  if (++probe_steps_ <= kProbeSteps) return std::nullopt;
  const double cores_busy = probe_cpu_.second > 0 ? probe_cpu_.first / probe_cpu_.second : 0;
  const LinkProbe link = measure_link(ctx_, median(probe_ms_), cores_busy, probe_waits_);
  const AutoChoice c = pick_outer(link, ctx_.spec, ctx_.comm->size());
  OuterSettings chosen = c.settings;
  chosen.warmup = static_cast<int>(t);
  probing_ = false;
  checking_ = true;
  probe_step_ms_ = link.step_ms;
  codecs_ = link.codecs;
  out_of_loop_ = ctx_.out_of_loop;
  decided(c.why);
  picked_ = c.why;
  last_ = Clock::now();  // the link's measurement is not the first checked step's
  return chosen;
}

void AutoTuner::step_done(bool syncing, double waited_ms) {
  next_syncing_ = syncing;
  next_waited_ms_ = waited_ms;
  if (probing_) {
    if (probe_steps_ > 0) probe_waits_.push_back(waited_ms > 0 ? waited_ms : kNoSync);  // one a probe step
    resumed_ = Clock::now();
    resumed_cpu_ = cpu_ticks();
  }
}

void AutoTuner::sync_ended(double ms) {
  if (checking_ && !resyncing_) syncs_ms_.push_back(ms);  // a change's resync is not the new settings' sync
}

void AutoTuner::restore(bool probing, std::string said) {
  probing_ = probing;
  checking_ = false;  // a saved choice stands: the check is not run again
  said_ = std::move(said);
  picked_.clear();
  probe_steps_ = 0;  // a probe cut short by the restart starts again
  probe_ms_.clear();
  probe_cpu_ = {0, 0};
  probe_waits_.clear();
  window_.clear();
  syncs_ms_.clear();
  hold_left_ = 0;
  held_ = false;
}

std::optional<OuterSettings> AutoTuner::check(std::int64_t t, Clock::time_point now, const OuterSettings& s,
                                              bool in_flight) {
  const bool paused = ctx_.out_of_loop != out_of_loop_ || resyncing_;
  out_of_loop_ = ctx_.out_of_loop;
  resyncing_ = false;
  window_.push_back({ms_between(last_, now), next_syncing_, paused, hold_left_ > 0, next_waited_ms_});
  last_ = now;
  if (hold_left_ > 0 && --hold_left_ > 0) return std::nullopt;
  const std::size_t size = static_cast<std::size_t>(std::max(16, 2 * s.period));  // two periods, 16 steps at least
  if ((!held_ && window_.size() < size) || in_flight) return std::nullopt;
  WindowReading w = read_window(window_, syncs_ms_);
  // the slowest rank's figures, and the fewest quiet steps (0 where any rank read too few)
  double figures[5] = {w.step_ms, w.compute_ms, w.wait_ms, w.sync_ms, -static_cast<double>(w.quiet)};
  ctx_.comm->allreduce(figures, figures, 5, DataType::kFloat64, ReduceOp::kMax);
  w = {figures[0], figures[1], figures[2], figures[3], static_cast<int>(-figures[4])};
  if (w.quiet == 0 && !held_) {
    // A fragment at work on every step: compute is read on a few steps auto keeps quiet itself, in these minutes.
    held_ = true;
    hold_left_ = kQuietSteps;
    decided(
        fmt::format("diloco:auto blocks on its syncs for {} steps: no step of the last {} went without a sync at "
                    "work, so it reads compute on a quiet window of its own, each fragment still synced on time ({})",
                    kQuietSteps, window_.size(), s.to_string()));
    return std::nullopt;
  }
  const CheckDecision cd = decide_check(s, w, codecs_, ctx_.spec.target, ctx_.spec.inner, below_);
  below_ = cd.below ? below_ + 1 : 0;
  window_.clear();
  syncs_ms_.clear();
  held_ = false;
  decided(cd.why);
  last_ = Clock::now();
  if (cd.kind == CheckDecision::Kind::kKeep) checking_ = false;
  if (cd.kind != CheckDecision::Kind::kChange) return std::nullopt;
  OuterSettings next = cd.next;
  next.warmup = static_cast<int>(t);
  resyncing_ = true;  // the resync that follows is no step of the new settings': a pause
  return next;
}

LinkProbe measure_link(AveragingContext& ctx, double step_ms, double cores_busy, std::vector<double> waits) {
  LinkProbe link;
  const std::size_t n = ctx.count;
  link.bytes = n * sizeof(float);
  // The probe's local steps end in a plain average, which every rank needs (the chosen schedule starts from one
  // model): it is the timed all-reduce of the whole model too, so a slow link is crossed once, not three times.
  const auto t0 = Clock::now();
  ctx.average_world();
  const double best = ms_since(t0);
  std::vector<float> scratch(n);
  std::vector<double> figures = {step_ms, best, cores_busy};
  const auto known = compression::known_codecs();
  for (const char* name : kCandidates) {
    if (std::find(known.begin(), known.end(), name) == known.end()) continue;
    CodecCost c{name, 1.0, 0.0};
    if (c.codec != "none") {
      const auto codec = compression::make_codec(c.codec);
      compression::CodecState st(1, ctx.comm->rank(), ctx.comm->size());
      std::vector<std::byte> payload(codec->payload_bytes(n));
      std::vector<float> scales(codec->scale_count(n));
      const auto t0 = Clock::now();
      if (!scales.empty()) codec->local_scales(ctx.params, n, scales.data(), st);
      codec->encode(ctx.params, n, payload.data(), st, scales.data());
      codec->decode(payload.data(), n, scratch.data(), st, scales.data());
      c.cpu_ms = ms_since(t0);
      const double payload_ratio =
          static_cast<double>(codec->payload_bytes(n) + codec->scale_count(n) * sizeof(float)) /
          static_cast<double>(std::max<std::size_t>(1, link.bytes));
      // An aggregatable payload is all-reduced as the floats are; a gathered one travels to every rank.
      c.wire_ratio = codec->pattern() == compression::Pattern::kAggregatable
                         ? payload_ratio
                         : payload_ratio * std::max(1.0, ctx.comm->size() / 2.0);
    }
    link.codecs.push_back(c);
    figures.push_back(c.cpu_ms);
  }
  ctx.comm->allreduce(figures.data(), figures.data(), figures.size(), DataType::kFloat64, ReduceOp::kMax);
  // Each sync's least wait over the ranks (the last to arrive waits for no one; the others' waits hold its late
  // arrival), then their median. The ranks took the same probe steps, in the same order.
  waits.resize(kProbeSteps, kNoSync);
  ctx.comm->allreduce(waits.data(), waits.data(), waits.size(), DataType::kFloat64, ReduceOp::kMin);
  std::erase(waits, kNoSync);
  link.fragment_ms = median(waits);
  link.step_ms = figures[0];
  link.full_ms = figures[1];
  link.cores_busy = std::clamp(figures[2], 0.0, 1.0);
  for (std::size_t i = 0; i < link.codecs.size(); ++i) link.codecs[i].cpu_ms = figures[3 + i];
  return link;
}

}  // namespace hopwise::comm::detail
