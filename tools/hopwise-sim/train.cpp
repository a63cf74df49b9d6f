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
#include "sim_training.h"

namespace hopwise::sim_tool {

namespace {

namespace hc = hopwise::comm;
namespace sim = hopwise::comm::sim;

std::string describe(const sim::StepCall& c) {
  return fmt::format("{} {} x{}", hc::to_string(c.kind), to_string(c.dtype), c.count);
}

std::vector<hc::Algorithm> candidates_for(hc::Collective kind) {
  std::vector<hc::Algorithm> out;
  for (hc::Algorithm a : sim::sim_algorithms())
    if (hc::implements(a, kind)) out.push_back(a);
  return out;
}

hc::CostQuery query_of(const sim::StepCall& c, const SimJob& job) {
  hc::CostQuery q;
  q.collective = c.kind;
  q.bytes = c.count * dtype_size(c.dtype);
  q.ranks = static_cast<int>(job.hosts.size());
  q.hosts = job.host_count;
  q.tree_depth = job.tree_depth;
  return q;
}

// The cost model's cheapest candidate among those that run here (the ring where there is no model).
hc::Algorithm model_pick(const sim::StepCall& c, const SimJob& job) {
  const auto ok = candidates_for(c.kind);
  if (!job.model) return hc::Algorithm::kRing;
  hc::Algorithm pick = hc::Algorithm::kRing;
  double least = -1;
  for (const auto& [a, est] : job.model->candidates(query_of(c, job), false))
    if (std::find(ok.begin(), ok.end(), a) != ok.end() && (least < 0 || est < least)) pick = a, least = est;
  return pick;
}

// One call of `a` on every rank, phantom buffers: its simulated seconds.
double time_call(const SimJob& job, const sim::StepCall& c, hc::Algorithm a) {
  const std::size_t bytes = std::max<std::size_t>(c.count * dtype_size(c.dtype), 1) *
                            (c.kind == hc::Collective::kAllgather ? job.hosts.size() : 1);
  std::unique_ptr<std::byte[]> buf(new std::byte[bytes]);  // never written: phantom
  sim::RunOptions run = job.run;
  run.real_payloads = false;
  return sim::run_ranks(
      job.hosts,
      [&](int, hc::Transport& t) {
        sim::RankCollectives coll(t, job.ring, job.host_of, job.chunk, true);
        coll.run(a, c.kind, buf.get(), buf.get(), c.count, c.dtype);
      },
      run);
}

// Trials as the tuner makes them: per class of calls (collective, dtype class, size class: tuning.h), the class's
// first call timed once per candidate in simulated time (no noise there: once is the median), skipping those the
// cost model puts past 8x its cheapest estimate (the tuner's prior); the class's other calls take its pick.
std::map<sim::StepCall, hc::Algorithm> run_trials(const SimJob& job, const std::vector<sim::StepCall>& calls) {
  std::map<sim::StepCall, hc::Algorithm> picks;
  std::map<std::tuple<hc::Collective, std::string, int>, hc::Algorithm> classes;
  const auto w0 = std::chrono::steady_clock::now();
  int runs = 0, tuned = 0;
  for (const sim::StepCall& c : calls) {
    const auto key =
        std::make_tuple(c.kind, hc::dtype_class_of(c.dtype), hc::size_class_of(c.count * dtype_size(c.dtype)));
    if (const auto it = classes.find(key); it != classes.end()) {
      picks[c] = it->second;
      continue;
    }
    ++tuned;
    // The candidates that run here: one_shot connects every pair, and each connection is an actor: past 128
    // ranks (16 thousand actors) the process runs out of memory mappings before the call runs.
    std::vector<hc::Algorithm> runnable;
    for (hc::Algorithm a : candidates_for(c.kind))
      if (a != hc::Algorithm::kOneShot || job.hosts.size() <= 128) runnable.push_back(a);
    std::map<hc::Algorithm, double> estimate;
    double cheapest = -1;
    if (job.model)
      for (const auto& [a, est] : job.model->candidates(query_of(c, job), false))
        if (std::find(runnable.begin(), runnable.end(), a) != runnable.end()) {
          estimate[a] = est;
          if (cheapest < 0 || est < cheapest) cheapest = est;
        }
    std::string line;
    double best = -1;
    for (hc::Algorithm a : runnable) {
      if (cheapest > 0 && estimate.count(a) && estimate[a] > 8 * cheapest) continue;
      const double s = time_call(job, c, a);
      ++runs;
      line += fmt::format(" {} {:.3f} ms", hc::to_string(a), s * 1e3);
      if (best < 0 || s < best) best = s, picks[c] = a;
    }
    if (best < 0) throw Error(fmt::format("hopwise-sim: no candidate for {} ran", describe(c)));
    classes[key] = picks[c];
    fmt::print("#   {}:{} -> {}\n", describe(c), line, hc::to_string(picks[c]));
  }
  fmt::print("# trials: {} calls in {} classes, {} simulated runs, {:.1f} s of wall time\n", calls.size(), tuned, runs,
             std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count());
  return picks;
}

}  // namespace

int run_training(const TrainingOptions& o, const SimJob& job, std::ostream* csv) {
  if (!(o.step_ms > 0)) throw InvalidArgument("--train needs --step-ms: one step's compute on one rank, in ms");
  const sim::TrainingModel model = sim::parse_model(o.model);
  std::vector<std::string> specs = o.methods;
  if (specs.empty()) specs = {"ddp", "sync", "sync/int8", "sync/powersgd:rank=4", "local:period=8", "async:period=8"};
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
  std::map<sim::StepCall, hc::Algorithm> picks;
  if (o.choose == "trial") {
    fmt::print("# algorithms by trial in simulated time (as the tuner measures on a job):\n");
    picks = run_trials(job, calls);
  } else {
    for (const sim::StepCall& c : calls) picks[c] = model_pick(c, job);
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
               m.kind == sim::TrainingMethod::Kind::kSync ? r.buckets : 0,
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
