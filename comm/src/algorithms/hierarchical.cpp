// Hierarchical allreduce: reduce within each host to its leader (a pipelined tree over the host's ranks), ring
// allreduce among the leaders (one per host: the slow links carry each byte once per host, not once per rank),
// broadcast within each host. The groups are GroupTransports over the communicator's transport.
#include <cstring>

#include <algorithm>
#include "../plan_state.h"
#include "algorithms.h"
#include "hopwise/comm/cost_model.h"
#include "hopwise/common/reduce.h"

namespace hopwise::comm::algo {

void hierarchical_allreduce(const Context& local, const Context* leaders, const topology::TreeShape& tree,
                            const void* in, void* out, std::size_t count, DataType dt, ReduceOp op, double scale) {
  if (local.transport.size() > 1) {
    tree_reduce(local, in, out, count, dt, op, 1.0, tree);  // out written on the leader (local rank 0) only
  } else if (in != out && count > 0) {
    std::memcpy(out, in, count * dtype_size(dt));
  }
  if (leaders != nullptr && leaders->transport.size() > 1)
    ring_allreduce(*leaders, out, out, count, dt, op, 1.0, topology::identity_ring(leaders->transport.size()));
  if (local.transport.size() > 1) tree_broadcast(local, out, count, dt, tree);
  if (scale != 1.0) scale_by(dt, out, count, scale);
}

AlgorithmInfo hierarchical_row() {
  AlgorithmInfo r;
  r.name = "hier";
  r.aliases = {"hierarchical"};
  r.collectives = {Collective::kAllreduce};
  r.summary = "tree reduce within each host, ring among the hosts' leaders, tree broadcast within each host";
  r.estimate = [](const CostQuery& q) {
    // Three phases one after another. Within a host: a binary tree of depth d over ranks_per_host, whose
    // interior ranks receive two children (2n per byte up, 2n down); among the H leaders: a ring allreduce.
    const CostParams& m = *q.params;
    const double n = static_cast<double>(q.bytes), H = std::max(1, q.hosts);
    const int per_host = (q.ranks + static_cast<int>(H) - 1) / static_cast<int>(H);
    const double d = std::max(1.0, log2_ceil(per_host + 1) - 1);
    const double be = beta_for(m, std::min(kModelChunk, n));
    const double local =
        per_host > 1 ? 2 * (d + 1) * alpha_for(m, std::min(kModelChunk, n)) + 4 * n * be + n * m.gamma : 0;
    const double leaders = H > 1 ? 2 * (H - 1) * alpha_for(m, std::min(kModelChunk, n / H)) + 2 * (H - 1) / H * n * be +
                                       (H - 1) / H * n * m.gamma
                                 : 0;
    return local + leaders;
  };
  r.run = [](AlgorithmContext& a, const CollectiveCall& c) {
    detail::PlanState& plan = *a.plan;
    plan.make_groups(a.transport);
    const Context local{*plan.host_group, *a.workspace, a.chunk_bytes};
    if (plan.leader_group) {
      const Context leaders{*plan.leader_group, *a.workspace, a.chunk_bytes};
      hierarchical_allreduce(local, &leaders, plan.host_tree, c.in, c.out, c.count, c.dt, c.op, c.scale);
    } else {
      hierarchical_allreduce(local, nullptr, plan.host_tree, c.in, c.out, c.count, c.dt, c.op, c.scale);
    }
  };
  return r;
}

}  // namespace hopwise::comm::algo
