// RankCollectives: the dispatch of the Communicator (comm/src/dispatch.cpp) without its progress thread, tuner or
// calibration, for ranks that are SimGrid actors: one plan (ring, trees, hosts) and one scratch space per rank.
#include <fmt/core.h>

#include <algorithm>
#include <cstring>

#include "algorithms/algorithms.h"
#include "hopwise/common/error.h"
#include "hopwise/common/reduce.h"
#include "hopwise/sim/rank_collectives.h"
#include "hopwise/topology/planner.h"
#include "plan_state.h"
#include "workspace.h"

namespace hopwise::comm::sim {

namespace {

// The scratch of ranks whose buffers hold nothing: one for the process (SimGrid runs every actor on one thread).
Workspace& shared_scratch() {
  static Workspace* w = [] {
    auto* s = new Workspace;  // lives as long as the process: actors of later runs use it too
    s->share_between_simulated_ranks();
    return s;
  }();
  return *w;
}

}  // namespace

struct RankCollectives::State {
  Transport& transport;
  detail::PlanState plan;
  Workspace own, own_reduce, own_broadcast;  // hier's pipeline: its reduce and broadcast have scratch of their own
  Workspace *workspace, *reduce_workspace, *broadcast_workspace;
  std::size_t chunk_bytes;
  State(Transport& t, std::size_t chunk, bool shared)
      : transport(t),
        workspace(shared ? &shared_scratch() : &own),
        reduce_workspace(shared ? &shared_scratch() : &own_reduce),
        broadcast_workspace(shared ? &shared_scratch() : &own_broadcast),
        chunk_bytes(chunk) {}
};

RankCollectives::RankCollectives(Transport& t, std::vector<int> ring, std::vector<int> host_of_rank,
                                 std::size_t chunk_bytes, bool share_scratch)
    : s_(std::make_unique<State>(t, chunk_bytes, share_scratch)) {
  const auto n = static_cast<std::size_t>(t.size());
  if (ring.size() != n || host_of_rank.size() != n)
    throw InvalidArgument(fmt::format("RankCollectives: a ring of {} and hosts of {} ranks for a transport of {}",
                                      ring.size(), host_of_rank.size(), n));
  std::vector<int> sorted(ring);
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < n; ++i)
    if (sorted[i] != static_cast<int>(i)) throw InvalidArgument("RankCollectives: the ring must hold every rank once");
  if (chunk_bytes == 0) throw InvalidArgument("RankCollectives: the chunk must be at least 1 byte");
  // As Communicator::plan_topology sets them: the ring, then the plan's trees (a chain within each host, a double
  // binary tree over the hosts), then the hosts.
  const topology::DoubleTree trees = topology::hierarchical_trees(ring, host_of_rank);
  s_->plan.set_ring(std::move(ring));
  if (n > 1) {
    s_->plan.tree_a = trees.first;
    s_->plan.tree_b = trees.second;
    s_->plan.tree_depth = s_->plan.tree_a.depth();
    s_->plan.two_trees = true;
  }
  s_->plan.set_hosts(std::move(host_of_rank));
}

RankCollectives::~RankCollectives() = default;

void RankCollectives::run(Algorithm a, Collective kind, const void* in, void* out, std::size_t count, DataType dt,
                          ReduceOp op, int root, std::size_t chunk_bytes) {
  if (!implements(a, kind))
    throw InvalidArgument(fmt::format("{} does not implement {}", to_string(a), to_string(kind)));
  Transport& t = s_->transport;
  const std::size_t chunk = chunk_bytes ? chunk_bytes : s_->chunk_bytes;
  const std::size_t es = dtype_size(dt);
  const CollectiveCall call{
      kind, in, out, count, dt, op == ReduceOp::kAvg ? ReduceOp::kSum : op, op == ReduceOp::kAvg ? 1.0 / t.size() : 1.0,
      root};
  if (t.size() == 1 || (count == 0 && kind != Collective::kBarrier)) {  // as the Communicator's run()
    if (kind == Collective::kBroadcast || kind == Collective::kBarrier) return;
    if (kind == Collective::kReduce && t.rank() != root) return;
    if (out != in && count != 0) copy_bytes(out, in, count * es);
    if (call.scale != 1.0 && kind != Collective::kAllgather) scale_by(dt, out, count, call.scale);
    return;
  }
  if (a == Algorithm::kHierarchical) {  // hier's row, its pipeline's phases on actors of the rank's host
    hierarchical(in, out, count, dt, call.op, call.scale, chunk, true);
    return;
  }
  const AlgorithmInfo& row = algorithm_info(a);
  AlgorithmContext ctx{t, chunk, s_->plan.ring, s_->workspace, &s_->plan};
  ctx.one_channel = true;
  ctx.first_tag = row.first_tag;
  row.run(ctx, call);
}

void RankCollectives::hierarchical(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op, double scale,
                                   std::size_t chunk, bool across_hosts) {
  algo::hierarchical_over_plan(s_->plan, {s_->transport, *s_->workspace, chunk},
                               {s_->reduce_workspace, s_->broadcast_workspace}, across_hosts, in, out, count, dt, op,
                               scale);
}

void RankCollectives::allreduce_within_host(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op) {
  if (count == 0) return;
  s_->plan.make_groups(s_->transport);
  const int n = s_->plan.host_group->size();
  hierarchical(in, out, count, dt, op == ReduceOp::kAvg ? ReduceOp::kSum : op, op == ReduceOp::kAvg ? 1.0 / n : 1.0,
               s_->chunk_bytes, false);
}

}  // namespace hopwise::comm::sim
