// diloco:auto's rules (auto_pick.h): the pick from the probe's figures and the check's decision on a window.
//
// The model of a period of H steps, t ms of compute each, F fragments each all-reduced behind D steps:
//   one fragment's all-reduce   c = (T * r + e) / F     T: the float32 model's all-reduce, r: the codec's wire
//                                                        ratio, e: its encoding and decoding of the model
//   exposed per fragment        c if D = 0, else max(0, c - D * t); where the probe found the machine's cores busy
//                               (a CPU trainer), max(0, T * r / F - D * t) + e / F: the codec's work takes a core
//                               from compute, whatever the delay; there also the sync's other work on the
//                               cores, measured on the probe's blocking syncs (sync_overhead_ms), per fragment
//   backlog                     max(0, F * c - H * t)   (the link busier than the period: syncs queue up)
//   utilization                 H * t / (H * t + F * exposed + backlog)
// The least staleness first: the shortest H, then the shortest D, then the fewest lost bits, then the fewest
// fragments, among the settings that reach the target. On busy cores: H from kStreamedPeriod, then the most
// fragments, the shortest D, the fewest bits. H from the inner optimizer's outer momentum period where it has one
// (SGD: 128), in the first order there.
#include "auto_pick.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "outer_rule.h"

namespace hopwise::comm::detail {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

WindowReading read_window(const std::vector<CheckedStep>& steps, const std::vector<double>& sync_ms) {
  // A quiet step's compute: its time less what the after_step before it waited (a quiet window's blocking sync).
  const auto compute = [](const CheckedStep& s) { return std::max(0.0, s.ms - s.waited_ms); };
  std::vector<double> quiet;
  for (const CheckedStep& s : steps)
    if (!s.paused && !s.syncing) quiet.push_back(compute(s));
  const double pause_above = quiet.empty() ? 1e300 : 3 * median(quiet);
  WindowReading w;
  double all = 0, still = 0, waited = 0;
  int counted = 0, schedule = 0;
  for (const CheckedStep& s : steps) {
    if (s.paused || (!s.syncing && compute(s) > pause_above)) continue;
    ++counted;
    if (!s.held) {
      all += s.ms;
      waited += s.waited_ms;
      ++schedule;
    }
    if (!s.syncing) {
      still += compute(s);
      ++w.quiet;
    }
  }
  w.step_ms = schedule > 0 ? all / schedule : 0;
  w.wait_ms = schedule > 0 ? waited / schedule : 0;
  w.sync_ms = median(sync_ms);
  // A schedule with a fragment at work on almost every step leaves too few quiet steps to read compute from.
  const bool enough = w.quiet >= std::max<int>(4, counted / 8);
  w.compute_ms = enough ? still / w.quiet : 0;
  if (!enough) w.quiet = 0;
  return w;
}

namespace {

// The syncs' time per step in the window, and what the target leaves them.
struct SyncBudget {
  double over, allowed;
};
SyncBudget sync_budget(const WindowReading& w, double target) {
  return {std::max(0.0, w.step_ms - w.compute_ms), std::max(1e-9, w.compute_ms * (1 / target - 1))};
}

}  // namespace

int lengthened_period(int period, const WindowReading& w, double target) {
  const SyncBudget b = sync_budget(w, target);
  int next = period * 2;
  while (next < 512 && b.over * period / next > b.allowed) next *= 2;
  return std::min(next, 512);
}

std::string lighter_codec(const std::string& codec, const std::vector<CodecCost>& codecs, const WindowReading& w,
                          double target, bool lightest) {
  const auto now = std::find_if(codecs.begin(), codecs.end(), [&](const CodecCost& c) { return c.codec == codec; });
  if (now == codecs.end()) return "";
  const SyncBudget b = sync_budget(w, target);
  const CodecCost* fewest = nullptr;
  for (const CodecCost& c : codecs) {  // none first, then fewer bits: the first that fits loses the fewest
    if (c.wire_ratio >= now->wire_ratio) continue;
    if (b.over * c.wire_ratio / now->wire_ratio <= b.allowed) return c.codec;
    if (!fewest || c.wire_ratio < fewest->wire_ratio) fewest = &c;
  }
  return lightest && fewest ? fewest->codec : "";
}

std::string set_outer_rule(OuterSettings& s, const std::string& inner) {
  const OuterStep rule = outer_rule(inner, s.period);
  s.lr = rule.lr;
  s.momentum = rule.momentum;
  s.nesterov = rule.nesterov;
  return rule.why;
}

CheckDecision decide_check(const OuterSettings& s, const WindowReading& w, const std::vector<CodecCost>& codecs,
                           double target, const std::string& inner, int below_before) {
  CheckDecision d;
  d.next = s;
  if (w.quiet == 0 || w.compute_ms <= 0 || w.step_ms <= 0) {
    d.kind = CheckDecision::Kind::kAgain;
    d.why = fmt::format(
        "diloco:auto reads again: too few steps of the window went without a sync to read compute "
        "from, so nothing is decided on it ({})",
        s.to_string());
    return d;
  }
  const double t = w.compute_ms, u = t / std::max(w.step_ms, t);
  const double below_at = kLengthenBelow;
  d.below = u < below_at;
  const double over = std::max(0.0, w.step_ms - t), waited = std::min(w.wait_ms, over);
  const std::string reading = fmt::format(
      "measured {:.2f} ms a step against {:.2f} ms of compute ({} quiet steps), {:.2f} ms of it waiting "
      "on the link, a fragment's all-reduce {:.2f} ms: {:.0f}% compute utilization",
      w.step_ms, t, w.quiet, waited, w.sync_ms, 100 * u);
  if (u >= target) {
    d.why = fmt::format("diloco:auto keeps {}: {}", s.to_string(), reading);
    return d;
  }
  d.kind = CheckDecision::Kind::kChange;
  const int gap = s.period / s.fragments;
  const auto change = [&](const std::string& what) {
    d.why = fmt::format("diloco:auto {}: {} (< the target {:.0f}%)", what, reading, 100 * target);
  };
  // Where the steps waited on the link for most of the overhead and the link carries a period's syncs within the
  // period, a longer delay or smaller fragments hide the wait behind compute.
  const bool waits = waited >= 0.5 * over;
  const bool link_keeps_up = w.sync_ms * s.fragments <= s.period * t;
  if (waits && link_keeps_up && w.sync_ms > 0) {
    if (s.delay < gap) {
      const int steps = static_cast<int>(std::ceil(w.sync_ms / t));
      d.next.delay = std::clamp(steps, s.delay + 1, gap);
      change(fmt::format("lengthens the delay {} -> {}", s.delay, d.next.delay));
      return d;
    }
    if (s.fragments * 2 <= std::min(s.period, 8)) {
      d.next.fragments = s.fragments * 2;
      d.next.delay = std::max(1, std::min(gap / 2, s.delay));
      change(fmt::format("streams {} fragments instead of {}", d.next.fragments, s.fragments));
      return d;
    }
  }
  if (const std::string lighter = lighter_codec(s.codec, codecs, w, target, true); !lighter.empty()) {
    d.next.codec = lighter;
    change(fmt::format("swaps the codec {} -> {}", s.codec, lighter));
    return d;
  }
  // What is left is a longer period. Where the link cannot carry the syncs (the waits stay), it must grow; after inner
  // steps whose outer rule has a momentum period (SGD) it grows as the pick's does, to the period the target asks;
  // where the rest is the cores the syncs share with compute, only below kLengthenBelow and on two readings in a row.
  const bool must = (waits && !link_keeps_up) || momentum_from(inner) > 0;
  if (s.period >= 512) {
    d.kind = CheckDecision::Kind::kKeep;
    d.why = fmt::format("diloco:auto keeps {}: {}; period 512 is the longest", s.to_string(), reading);
    return d;
  }
  if (!must && s.period < kStreamedPeriod) {
    d.next.period = kStreamedPeriod;
    d.next.fragments = kStreamedPeriod;
    d.next.delay = 1;  // a fragment every step, one step behind compute
    set_outer_rule(d.next, inner);
    change(
        fmt::format("streams period {} as {} fragments of period {}: the overhead is the cores the syncs share "
                    "with compute, and a fragment every step sends {}x fewer bytes a step",
                    s.period, kStreamedPeriod, kStreamedPeriod, kStreamedPeriod / s.period));
    return d;
  }
  if (!must && (u >= below_at || below_before < 1)) {
    d.kind = u >= below_at ? CheckDecision::Kind::kKeep : CheckDecision::Kind::kAgain;
    d.why = fmt::format(
        "diloco:auto {} {}: {}; the rest is not the link's but the cores the syncs share with compute, and a longer "
        "period costs more loss than that (auto lengthens it only below {:.0f}%, on two windows in a row)",
        u >= below_at ? "keeps" : "reads again before lengthening", s.to_string(), reading, 100 * below_at);
    return d;
  }
  d.next.period = lengthened_period(s.period, w, target);
  d.next.fragments = std::min(d.next.period, s.fragments);
  d.next.delay = std::min(d.next.delay, d.next.period / d.next.fragments);
  const std::string rule = set_outer_rule(d.next, inner);
  change(fmt::format("lengthens the period {} -> {}", s.period, d.next.period));
  if (d.next.lr != s.lr || d.next.momentum != s.momentum || d.next.nesterov != s.nesterov)
    d.why += fmt::format("; now {}: {}", d.next.to_string(), rule);
  return d;
}

double sync_overhead_ms(const LinkProbe& link) {
  const auto probed =
      std::find_if(link.codecs.begin(), link.codecs.end(), [](const CodecCost& c) { return c.codec == kProbeCodec; });
  if (link.fragment_ms <= 0 || probed == link.codecs.end()) return 0;
  const double modelled = (link.full_ms * probed->wire_ratio + probed->cpu_ms) / kStreamedPeriod;
  return std::max(0.0, link.fragment_ms - modelled) * kStreamedPeriod;  // the whole model's, once
}

OuterSettings probe_settings(const AveragingSpec& spec) {
  OuterSettings o;
  o.warmup = spec.warmup;
  o.period = o.fragments = kStreamedPeriod;
  o.delay = 0;
  o.codec = kProbeCodec;
  return o;
}

namespace {

struct Candidate {
  std::tuple<int, int, int, int> key;  // H, D, codec rank, F: the least stale first (busy: H, -F, D, -codec rank)
  OuterSettings s;
  double util = -1;
};
struct Search {
  Candidate chosen;
  bool reached = false;
};

// The first candidate by key that reaches the target among periods from min_period up to max_period, else the
// highest utilization.
Search search(const LinkProbe& link, double target, bool busy, double overhead, int min_period, int max_period) {
  const double t = std::max(link.step_ms, 1e-3);
  std::vector<Candidate> fit;
  Candidate best_any{{1 << 30, 0, 0, 0}, {}, -1};
  // On busy cores the check streams any period under kStreamedPeriod at that period (the syncs' own work on the
  // cores is what they cost there): the pick starts there rather than take the change and its full average later,
  // and sends a fragment every step, the smallest burst of work on the cores. From an outer rule's momentum period
  // (SGD: 128) the syncs are rare and the idle order holds, the fewest lost bits and fragments first: on the torch
  // MLP at H = 128, 2-epoch runs crossed 85% at step 520 whole in float32 (2 runs), at 640-680 with 8 fragments,
  // int4 or both (5 runs); the accuracy hovers at 82-85% there, so a lean rather than a rule.
  const bool busy_order = busy && min_period <= kStreamedPeriod;
  for (int h = std::max(min_period, busy ? kStreamedPeriod : 1); h <= max_period; h *= 2)
    for (std::size_t ci = 0; ci < link.codecs.size(); ++ci)
      for (int f = 1; f <= 8 && f <= h; f *= 2)
        for (int d = 0; d <= std::min(h / f, 16); ++d) {
          const CodecCost& c = link.codecs[ci];
          const double wire = link.full_ms * c.wire_ratio / f, work = (c.cpu_ms + overhead) / f, per = wire + work;
          const double exposed = d == 0 ? per : busy ? std::max(0.0, wire - d * t) + work : std::max(0.0, per - d * t);
          const double backlog = std::max(0.0, f * per - h * t);
          const double util = h * t / (h * t + f * exposed + backlog);
          OuterSettings s;
          s.period = h;
          s.fragments = f;
          s.delay = d;
          s.codec = c.codec;
          Candidate cand{busy_order ? std::make_tuple(h, -f, d, -static_cast<int>(ci))
                                    : std::make_tuple(h, d, static_cast<int>(ci), f),
                         s, util};
          if (util >= target) fit.push_back(cand);
          if (util > best_any.util + 1e-9) best_any = cand;
        }
  if (fit.empty()) return {best_any, false};
  return {*std::min_element(fit.begin(), fit.end(), [](const auto& a, const auto& b) { return a.key < b.key; }), true};
}

}  // namespace

AutoChoice pick_outer(const LinkProbe& link, const AveragingSpec& spec, int world) {
  const bool busy = link.cores_busy >= kCoresBusy;
  const double overhead = busy ? sync_overhead_ms(link) : 0;
  // Where the inner optimizer's outer rule takes a momentum step from some period on (SGD: the papers' Nesterov step
  // from 128), the period is that one at least: on the torch MLP at 1 Gbit/s, H = 128 with it crossed 85% at step
  // 520 (2 runs), auto's H = 16 to 64 with plain averaging at 580 to 640 (3 runs), and its rarer syncs cost the
  // cores less. It is also what the best fixed setting ran (results/averaging.md).
  const int min_period = momentum_from(spec.inner);
  Search found = search(link, spec.target, busy, overhead, std::max(1, min_period), 512);
  // A longer period costs an adaptive inner optimizer (a family without a momentum period: Adam's, Muon, not named)
  // more loss than the cores' share costs time (the LM: H = 4 -> 8 3.5% of final loss): past the streamed period only
  // where it would keep under kLengthenBelow, as the check does.
  std::string kept;
  if (busy && min_period == 0 && found.chosen.s.period > kStreamedPeriod) {
    const Search streamed = search(link, spec.target, busy, overhead, 1, kStreamedPeriod);
    if (streamed.chosen.util >= kLengthenBelow) {
      kept = fmt::format(
          "; period {} would reach the target, but inner {} keeps period {} above {:.0f}%: a longer period costs an "
          "adaptive optimizer more loss than that",
          found.chosen.s.period, spec.inner.empty() ? "not named" : spec.inner, kStreamedPeriod, 100 * kLengthenBelow);
      found = streamed;
    }
  }
  const Candidate& chosen = found.chosen;
  AutoChoice out;
  out.settings = chosen.s;
  const std::string rule_why = set_outer_rule(out.settings, spec.inner);
  out.utilization = chosen.util;
  out.why = fmt::format(
      "diloco:auto chose {} on {} ranks: a step computes in {:.2f} ms and the model's float32 all-reduce ({:.2f} MB) "
      "takes {:.2f} ms, the cores were {:.0f}% busy ({}{}), so this keeps a predicted {:.0f}% compute utilization ({} "
      "the target {:.0f}%{}){}; {}",
      out.settings.to_string(), world, link.step_ms, link.bytes / 1e6, link.full_ms, 100 * link.cores_busy,
      busy ? "a codec's work counted against compute" : "a codec's work on an idle core",
      busy ? fmt::format(", and {:.2f} ms a model's worth of the syncs' other work, from the probe's blocking syncs",
                         overhead)
           : "",
      100 * chosen.util, found.reached ? "reaching" : "short of", 100 * spec.target,
      found.reached ? (min_period > 1 ? fmt::format(", with the shortest period from {}, where inner {}'s outer rule "
                                                    "takes its momentum step, that does",
                                                    min_period, spec.inner)
                                      : std::string(", with the shortest period that does"))
                    : std::string(": the highest any setting up to that period reaches"),
      kept, rule_why);
  return out;
}

}  // namespace hopwise::comm::detail
