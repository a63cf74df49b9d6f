// hopwise-sim --train (train.h): the trials, then one period of each method, the table and its CSV rows.
#include "train.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <ostream>
#include <tuple>

#include "hopwise/comm/tuning.h"
#include "hopwise/common/error.h"
#include "hopwise/sim/training.h"
#include "tune.h"

namespace hopwise::sim_tool {

namespace {

namespace hc = hopwise::comm;
namespace sim = hopwise::comm::sim;

std::string describe(const sim::StepCall& c) {
  return fmt::format("{} {} x{}", hc::to_string(c.kind), to_string(c.dtype), c.count);
}

std::size_t bytes_of(const sim::StepCall& c) { return c.count * dtype_size(c.dtype); }

// The algorithm of each class of calls (collective, dtype class, size class: tuning.h), decided at the class's first
// call and taken by its others: `decide` is the chooser.
template <typename Decide>
std::map<sim::StepCall, hc::TuningChoice> per_class(const std::vector<sim::StepCall>& calls, Decide decide) {
  std::map<sim::StepCall, hc::TuningChoice> picks;
  std::map<std::tuple<hc::Collective, std::string, int>, hc::TuningChoice> classes;
  for (const sim::StepCall& c : calls) {
    const auto key = std::make_tuple(c.kind, hc::dtype_class_of(c.dtype), hc::size_class_of(bytes_of(c)));
    const auto it = classes.find(key);
    picks[c] = it != classes.end() ? it->second : (classes[key] = decide(c));
  }
  return picks;
}

// Trials: each candidate a job's tuner would get (tune.h) timed once in simulated time (no noise there: once is
// the median), the fastest kept.
std::map<sim::StepCall, hc::TuningChoice> run_trials(const SimJob& job, const std::vector<sim::StepCall>& calls) {
  const auto w0 = std::chrono::steady_clock::now();
  int runs = 0, tuned = 0;
  auto picks = per_class(calls, [&](const sim::StepCall& c) {
    ++tuned;
    std::string line;
    double best = -1;
    hc::TuningChoice pick;
    for (const hc::TuningChoice& choice : sim_candidates(job, c.kind, bytes_of(c))) {
      const double s = time_choice(job, c.kind, c.dtype, c.count, choice);
      ++runs;
      line += fmt::format(" {} {:.3f} ms", hc::to_string(choice), s * 1e3);
      if (best < 0 || s < best) best = s, pick = choice;
    }
    if (best < 0) throw Error(fmt::format("hopwise-sim: no candidate for {} ran", describe(c)));
    fmt::print("#   {}:{} -> {}\n", describe(c), line, hc::to_string(pick));
    return pick;
  });
  fmt::print("# trials: {} calls in {} classes, {} simulated runs, {:.1f} s of wall time\n", calls.size(), tuned, runs,
             std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count());
  return picks;
}

// The job's Tuner, a class at a time (its first calls back to back on every rank, until it decides).
std::map<sim::StepCall, hc::TuningChoice> run_tuner(const SimJob& job, const std::vector<sim::StepCall>& calls) {
  const auto w0 = std::chrono::steady_clock::now();
  auto picks = per_class(calls, [&](const sim::StepCall& c) {
    const sim::TunerRun r = tune_class(job, c.kind, c.dtype, c.count, true);
    std::string line;
    for (const auto& [choice, median] : r.ranked)
      line += fmt::format(" {} {:.3f} ms", hc::to_string(choice), median * 1e3);
    fmt::print("#   {}: medians{} -> {} after {} calls ({:.1f} ms simulated)\n", describe(c), line,
               hc::to_string(r.choice), r.calls, r.tuning_s * 1e3);
    return r.choice;
  });
  fmt::print("# tuner: {} calls, {:.1f} s of wall time\n", calls.size(),
             std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count());
  return picks;
}

}  // namespace

int run_training(const TrainingOptions& o, const SimJob& job, std::ostream* csv) {
  if (!(o.step_ms > 0)) throw InvalidArgument("--train needs --step-ms: one step's compute on one rank, in ms");
  const sim::TrainingModel model = sim::parse_model(o.model);
  std::vector<std::string> specs = o.methods;
  if (specs.empty())
    specs = {"ddp",           "sync",           "sync/int8",     "sync/powersgd:rank=4", "local:period=8",
             "hier:period=8", "async:period=8", "gossip:peers=1"};
  std::vector<sim::TrainingMethod> methods;
  for (const std::string& s : specs) methods.push_back(sim::parse_method(s));
  const int n = static_cast<int>(job.hosts.size());

  sim::StepSettings base;
  base.compute_s = o.step_ms / 1e3;
  base.bucket_mb = o.bucket_mb;
  base.first_bucket_mb = o.first_bucket_mb;
  fmt::print(
      "# training: {}, {:.2f} M parameters ({:.0f} MB of float32 gradients), compute {:.1f} ms a step "
      "(backward {:.0f}%), buckets {} MB (the first {} MB); codecs' work {}\n",
      model.name, model.parameters() / 1e6, model.parameters() * 4 / 1e6, o.step_ms, base.backward_share * 100,
      o.bucket_mb, o.first_bucket_mb,
      o.codec_rate > 0 ? fmt::format("at {:.1f} GB/s (given)", o.codec_rate / 1e9)
                       : std::string("at this machine's measured rates"));

  // Every call the methods make (ddp's go on the ring), then the chooser.
  std::vector<sim::StepCall> calls;
  for (const sim::TrainingMethod& m : methods)
    if (!m.ddp)
      for (const sim::StepCall& c : sim::step_calls(n, model, m, base))
        if (std::find(calls.begin(), calls.end(), c) == calls.end()) calls.push_back(c);
  std::sort(calls.begin(), calls.end());
  std::map<sim::StepCall, hc::TuningChoice> picks;
  if (o.choose == "trial") {
    fmt::print("# algorithms by trial in simulated time (each candidate of a job's tuner once):\n");
    picks = run_trials(job, calls);
  } else if (o.choose == "tuner") {
    fmt::print("# algorithms by the job's tuner in simulated time (rounds, pruning, confirmation):\n");
    picks = run_tuner(job, calls);
  } else {
    for (const sim::StepCall& c : calls) picks[c] = {model_pick(job, c.kind, bytes_of(c))};
    fmt::print("# algorithms by the cost model:");
    for (const auto& [c, a] : picks) fmt::print(" {}={}", describe(c), hc::to_string(a));
    fmt::print("\n");
  }
  const sim::ChooseAlgorithm choose = [&](const sim::StepCall& c) {
    const auto it = picks.find(c);
    if (it == picks.end())
      throw Error(fmt::format("hopwise-sim: no algorithm chosen for {} (the calls listed before the run missed it)",
                              describe(c)));
    return it->second;
  };

  fmt::print("{:<26} {:>10} {:>12} {:>8} {:>11} {:>8} {:>8} {:>8}\n", "method", "step(ms)", "exposed(ms)", "util",
             "wire(MB)", "buckets", "vs ddp", "wall(s)");
  double ddp_step = 0;
  std::string costs;
  for (const sim::TrainingMethod& m : methods) {
    sim::StepSettings s = base;
    const std::string codec = m.codec;
    s.costs = o.codec_rate > 0 ? sim::codec_costs_at(codec, o.codec_rate) : sim::measure_codec_costs(codec);
    const sim::CodecCosts& k = s.costs;
    if (codec != "none")  // the inputs the row rests on, printed under the table
      costs += fmt::format("{}{}: ", costs.empty() ? "" : "; ", codec) +
               (k.p_s > 0 ? fmt::format("P {:.2f}, Q {:.2f}, decompress {:.2f}", k.p_s * 1e9, k.q_s * 1e9,
                                        k.decompress_s * 1e9)
                          : fmt::format("scales {:.2f}, encode {:.2f}, decode {:.2f}", k.scales_s * 1e9,
                                        k.encode_s * 1e9, k.decode_s * 1e9));
    const auto w0 = std::chrono::steady_clock::now();
    const sim::StepResult r =
        sim::simulate_step(job.hosts, job.ring, job.host_of, job.chunk, job.run, model, m, s, choose);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
    if (m.ddp) ddp_step = r.step_s();
    const double exposed = std::max(0.0, r.step_s() - base.compute_s);  // not -0.00 where nothing shows
    const double wire_mb = r.wire_bytes / r.steps / 1e6;
    fmt::print("{:<26} {:>10.2f} {:>12.2f} {:>7.1f}% {:>11.2f} {:>8} {:>8} {:>8.1f}\n", m.spec, r.step_s() * 1e3,
               exposed * 1e3, r.utilization() * 100, wire_mb,
               m.kind == sim::TrainingMethod::Kind::kSync || m.kind == sim::TrainingMethod::Kind::kHier ? r.buckets : 0,
               ddp_step > 0 ? fmt::format("{:.2f}x", ddp_step / r.step_s()) : std::string("-"), wall);
    if (csv)
      *csv << fmt::format("{},{},{},{},{:.4f},{:.4f},{:.4f},{:.4f},{},{},{:.3f}\n", model.name, n, job.host_count,
                          m.spec, r.step_s() * 1e3, o.step_ms, r.utilization(), wire_mb, r.buckets, o.choose, wall);
  }
  if (!costs.empty())
    fmt::print("# codecs' work, ns a float ({}): {}\n", o.codec_rate > 0 ? "given" : "measured", costs);
  fmt::print(
      "# step: one step's simulated time (local, async: their period's over its steps); exposed: beyond the "
      "compute; util: compute / step; wire: a rank's payload a step; vs ddp: ddp's step / this one\n");
  return 0;
}

}  // namespace hopwise::sim_tool
