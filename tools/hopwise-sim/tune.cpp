// hopwise-sim's choosers (tune.h).
#include "tune.h"

#include <algorithm>
#include <memory>

namespace hopwise::sim_tool {

namespace hc = hopwise::comm;
namespace sim = hopwise::comm::sim;

namespace {

std::vector<hc::Algorithm> runnable(const SimJob& job, hc::Collective kind) {
  std::vector<hc::Algorithm> out;
  for (hc::Algorithm a : sim::sim_algorithms())
    if (hc::implements(a, kind) && (a != hc::Algorithm::kOneShot || job.hosts.size() <= 128)) out.push_back(a);
  return out;
}

// The model's estimates of the rows that run here (every such row at 0 where there is no model: all kept).
std::vector<std::pair<hc::Algorithm, double>> estimates(const SimJob& job, hc::Collective kind, std::size_t bytes) {
  const std::vector<hc::Algorithm> ok = runnable(job, kind);
  std::vector<std::pair<hc::Algorithm, double>> out;
  if (!job.model) {
    for (hc::Algorithm a : ok) out.emplace_back(a, 0.0);
    return out;
  }
  hc::CostQuery q;
  q.collective = kind;
  q.bytes = bytes;
  q.ranks = static_cast<int>(job.hosts.size());
  q.hosts = job.host_count;
  q.tree_depth = job.tree_depth;
  for (const auto& [a, est] : job.model->candidates(q, false))
    if (std::find(ok.begin(), ok.end(), a) != ok.end()) out.emplace_back(a, est);
  return out;
}

}  // namespace

std::vector<hc::TuningChoice> sim_candidates(const SimJob& job, hc::Collective kind, std::size_t bytes) {
  // One ring: RankCollectives runs the plan's one ring (no channels side by side).
  return hc::detail::tuning_candidates(estimates(job, kind, bytes), kind, bytes, hc::detail::TunerSettings{}.prior,
                                       job.chunk, false);
}

hc::Algorithm model_pick(const SimJob& job, hc::Collective kind, std::size_t bytes) {
  if (!job.model) return hc::Algorithm::kRing;
  hc::Algorithm pick = hc::Algorithm::kRing;
  double least = -1;
  for (const auto& [a, est] : estimates(job, kind, bytes))
    if (least < 0 || est < least) pick = a, least = est;
  return pick;
}

double time_choice(const SimJob& job, hc::Collective kind, DataType dt, std::size_t count,
                   const hc::TuningChoice& choice) {
  const std::size_t bytes =
      std::max<std::size_t>(count * dtype_size(dt), 1) * (kind == hc::Collective::kAllgather ? job.hosts.size() : 1);
  std::unique_ptr<std::byte[]> buf(new std::byte[bytes]);  // never written: phantom
  sim::RunOptions run = job.run;
  run.real_payloads = false;
  return sim::run_ranks(
      job.hosts,
      [&](int, hc::Transport& t) {
        sim::RankCollectives coll(t, job.ring, job.host_of, job.chunk, true);
        coll.run(choice.algorithm, kind, buf.get(), buf.get(), count, dt, ReduceOp::kSum, 0, choice.chunk_bytes);
      },
      run);
}

sim::TunerRun tune_class(const SimJob& job, hc::Collective kind, DataType dt, std::size_t count, bool phantom) {
  sim::TunerJob t;
  t.hosts = job.hosts;
  t.ring = job.ring;
  t.host_of = job.host_of;
  t.chunk_bytes = job.chunk;
  t.run = job.run;
  t.run.real_payloads = !phantom;
  // The agreements' allreduce of a few doubles, as the job's cost model picks it.
  t.agree_with = model_pick(job, hc::Collective::kAllreduce, 4 * sizeof(double));
  return sim::tune_in_simulation(t, kind, dt, count, sim_candidates(job, kind, count * dtype_size(dt)));
}

}  // namespace hopwise::sim_tool
