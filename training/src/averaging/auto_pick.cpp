// diloco:auto's measurements and choice (auto_pick.h).
//
// The model of a period of H steps, t ms of compute each, F fragments each all-reduced behind D steps:
//   one fragment's all-reduce   c = (T * r + e) / F     T: the float32 model's all-reduce, r: the codec's wire
//                                                        ratio, e: its encoding and decoding of the model
//   exposed per fragment        c if D = 0, else max(0, c - D * t)
//   backlog                     max(0, F * c - H * t)   (the link busier than the period: syncs queue up)
//   utilization                 H * t / (H * t + F * exposed + backlog)
// The least staleness first: the shortest H, then the shortest D, then the fewest lost bits, then the fewest
// fragments, among the settings that reach the target.
#include "auto_pick.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <tuple>

#include "hopwise/compression/codec.h"

namespace hopwise::comm::detail {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// Candidates in order of the bits they lose: none, then 8 bits, then 4.
constexpr const char* kCandidates[] = {"none", "int8", "fp8", "int4"};

// The outer settings per inner optimizer family and period (the first row that fits). The papers' Nesterov step
// (0.7, 0.9) is tuned for AdamW inner steps; after SGD with momentum, on the MLP over 5 epochs
// (docs/results/averaging.md#diloco), it lost 5.8 points against synchronous training at H = 8 and 1.9-2.3 at
// H = 32, where plain averaging did not, and it was the best row at H = 128 (+0.44 against DDP).
struct OuterRule {
  const char* inner;
  int from_period;  // the rule holds from this period on
  double lr, momentum;
  bool nesterov;
  const char* why;
};
constexpr OuterRule kOuterRules[] = {
    {"sgd", 128, 0.7, 0.9, true,
     "inner sgd at a long period: the papers' outer Nesterov step (lr 0.7, momentum 0.9), the best measured at H = "
     "128"},
    {"sgd", 1, 1.0, 0.0, false,
     "inner sgd at a short period: plain averaging (the outer Nesterov step lost 2-6 points after SGD-momentum inner "
     "steps at H = 8 and 32)"},
    {"adam", 1, 1.0, 0.0, false,
     "inner adam: plain averaging (on the byte-level GPT the papers' outer Nesterov step, lr 0.7 and momentum 0.9, "
     "stalled at 3.6 bits per byte at H = 32 and 64 where plain averaging went on to 2.9)"},
};

}  // namespace

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

WindowReading read_window(const std::vector<CheckedStep>& steps, double probe_ms) {
  std::vector<double> quiet;
  for (const CheckedStep& s : steps)
    if (!s.paused && !s.syncing) quiet.push_back(s.ms);
  const double pause_above = quiet.empty() ? 1e300 : 3 * median(quiet);
  WindowReading w;
  double all = 0, still = 0;
  int counted = 0;
  for (const CheckedStep& s : steps) {
    if (s.paused || (!s.syncing && s.ms > pause_above)) continue;
    all += s.ms;
    ++counted;
    if (!s.syncing) {
      still += s.ms;
      ++w.quiet;
    }
  }
  w.step_ms = counted > 0 ? all / counted : 0;
  // A schedule with a fragment at work on almost every step leaves too few quiet steps to read compute from.
  const bool enough = w.quiet >= std::max<int>(4, static_cast<int>(steps.size() / 8));
  w.compute_ms = enough ? still / w.quiet : probe_ms;
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
                          double target) {
  const auto now = std::find_if(codecs.begin(), codecs.end(), [&](const CodecCost& c) { return c.codec == codec; });
  if (now == codecs.end()) return "";
  const SyncBudget b = sync_budget(w, target);
  for (const CodecCost& c : codecs)  // none first, then fewer bits: the first that fits loses the fewest
    if (c.wire_ratio < now->wire_ratio && b.over * c.wire_ratio / now->wire_ratio <= b.allowed) return c.codec;
  return "";
}

std::string set_outer_rule(OuterSettings& s, const std::string& inner) {
  const OuterRule* rule = &kOuterRules[1];
  for (const OuterRule& r : kOuterRules)
    if (inner == r.inner && s.period >= r.from_period) {
      rule = &r;
      break;
    }
  s.lr = rule->lr;
  s.momentum = rule->momentum;
  s.nesterov = rule->nesterov;
  return rule->why;
}

OuterSettings probe_settings(const AveragingSpec& spec) {
  OuterSettings o;
  o.warmup = spec.warmup;
  return o;
}

LinkProbe measure_link(AveragingContext& ctx, double step_ms) {
  LinkProbe link;
  const std::size_t n = ctx.count;
  link.bytes = n * sizeof(float);
  ctx.average_world();  // the probe's local steps end in a plain average: every rank now holds the same model
  std::vector<float> scratch(n);
  double best = 1e300;
  for (int i = 0; i < 2; ++i) {
    const auto t0 = Clock::now();
    ctx.comm.allreduce(ctx.params, scratch.data(), n, DataType::kFloat32, ReduceOp::kAvg);
    best = std::min(best, ms_since(t0));
  }
  std::vector<double> figures = {step_ms, best};
  const auto known = compression::known_codecs();
  for (const char* name : kCandidates) {
    if (std::find(known.begin(), known.end(), name) == known.end()) continue;
    CodecCost c{name, 1.0, 0.0};
    if (c.codec != "none") {
      const auto codec = compression::make_codec(c.codec);
      compression::CodecState st(1, ctx.comm.rank(), ctx.comm.size());
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
                         : payload_ratio * std::max(1.0, ctx.comm.size() / 2.0);
    }
    link.codecs.push_back(c);
    figures.push_back(c.cpu_ms);
  }
  ctx.comm.allreduce(figures.data(), figures.data(), figures.size(), DataType::kFloat64, ReduceOp::kMax);
  link.step_ms = figures[0];
  link.full_ms = figures[1];
  for (std::size_t i = 0; i < link.codecs.size(); ++i) link.codecs[i].cpu_ms = figures[2 + i];
  return link;
}

AutoChoice pick_outer(const LinkProbe& link, const AveragingSpec& spec, int world) {
  const double t = std::max(link.step_ms, 1e-3);
  struct Candidate {
    std::tuple<int, int, int, int> key;  // H, D, codec rank, F: the least stale first
    OuterSettings s;
    double util;
  };
  std::vector<Candidate> fit;
  Candidate best_any{{1 << 30, 0, 0, 0}, {}, -1};
  for (int h = 1; h <= 512; h *= 2)
    for (std::size_t ci = 0; ci < link.codecs.size(); ++ci)
      for (int f = 1; f <= 8 && f <= h; f *= 2)
        for (int d = 0; d <= std::min(h / f, 16); ++d) {
          const CodecCost& c = link.codecs[ci];
          const double per = (link.full_ms * c.wire_ratio + c.cpu_ms) / f;
          const double exposed = d == 0 ? per : std::max(0.0, per - d * t);
          const double backlog = std::max(0.0, f * per - h * t);
          const double util = h * t / (h * t + f * exposed + backlog);
          OuterSettings s;
          s.period = h;
          s.fragments = f;
          s.delay = d;
          s.codec = c.codec;
          Candidate cand{{h, d, static_cast<int>(ci), f}, s, util};
          if (util >= spec.target) fit.push_back(cand);
          if (util > best_any.util + 1e-9) best_any = cand;
        }
  const bool reached = !fit.empty();
  const Candidate chosen =
      reached ? *std::min_element(fit.begin(), fit.end(), [](const auto& a, const auto& b) { return a.key < b.key; })
              : best_any;
  AutoChoice out;
  out.settings = chosen.s;
  const std::string rule_why = set_outer_rule(out.settings, spec.inner);
  out.utilization = chosen.util;
  out.why = fmt::format(
      "diloco:auto chose {} on {} ranks: a step computes in {:.2f} ms and the model's float32 all-reduce ({:.2f} MB) "
      "takes {:.2f} ms, so this keeps a predicted {:.0f}% compute utilization ({} the target {:.0f}%{}); {}",
      out.settings.to_string(), world, link.step_ms, link.bytes / 1e6, link.full_ms, 100 * chosen.util,
      reached ? "reaching" : "short of", 100 * spec.target,
      reached ? ", with the shortest period that does" : ": the highest any setting up to period 512 reaches",
      rule_why);
  return out;
}

}  // namespace hopwise::comm::detail
