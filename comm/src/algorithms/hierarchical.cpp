// Hierarchical allreduce: reduce within each host to its leader (a pipelined tree over the host's ranks), ring
// allreduce among the leaders (one per host: the slow links carry each byte once per host, not once per rank),
// broadcast within each host. The groups are GroupTransports over the communicator's transport. Large calls run
// the three phases side by side, segment by segment, so the host's work hides behind the network's.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>

#include "../plan_state.h"
#include "algorithms.h"
#include "hopwise/comm/cost_model.h"
#include "hopwise/common/reduce.h"
#include "side_by_side.h"

namespace hopwise::comm::algo {

// Segments of at least 4 chunks, and at most 8 per call: each segment's ring pays its own 2(H-1) latencies. And at
// least 32 KiB a leader: on 128 hosts 1 MiB segments gave each leader 8 KiB a step, latency-bound (simulated, 1024
// ranks, 8 MiB: 13.4 ms in 8 segments, 11.0 in 2, 12.3 in one; 64 and 128 KiB a leader did worse).
std::size_t hierarchical_segment_bytes(std::size_t bytes, std::size_t chunk_bytes, int hosts) {
  constexpr std::size_t kLeastPerLeader = 32 << 10;
  return std::max({4 * chunk_bytes, (bytes + 7) / 8, static_cast<std::size_t>(std::max(hosts, 1)) * kLeastPerLeader});
}

namespace {

// One segment's three phases, run one after another (small calls, or one segment).
void hierarchical_segment(const Context& local, const Context* leaders, const topology::TreeShape& tree, const char* in,
                          char* out, std::size_t count, DataType dt, ReduceOp op) {
  if (local.transport.size() > 1) {
    tree_reduce(local, in, out, count, dt, op, 1.0, tree);  // out written on the leader (local rank 0) only
  } else if (in != out && count > 0) {
    std::memcpy(out, in, count * dtype_size(dt));
  }
  if (leaders != nullptr && leaders->transport.size() > 1)
    ring_allreduce(*leaders, out, out, count, dt, op, 1.0, topology::identity_ring(leaders->transport.size()));
  if (local.transport.size() > 1) tree_broadcast(local, out, count, dt, tree);
}

}  // namespace

void hierarchical_allreduce(const Context& local, const Context* leaders, const topology::TreeShape& tree,
                            const void* in, void* out, std::size_t count, DataType dt, ReduceOp op, double scale,
                            const HierarchicalPipeline& pipe) {
  const std::size_t es = dtype_size(dt), bytes = count * es;
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  // Decided alike on every rank of the job (same size, same call), whatever its host's rank count: the leaders'
  // rings must cut the same segments on every host (a host of one rank once ran one whole-buffer ring against
  // the others' segments).
  const bool ring = leaders != nullptr && leaders->transport.size() > 1;
  const bool alone = local.transport.size() == 1;
  const std::size_t seg_count = std::max<std::size_t>(1, pipe.segment_bytes / es);
  if (pipe.segment_bytes == 0 || bytes < 2 * pipe.segment_bytes) {
    hierarchical_segment(local, leaders, tree, src, dst, count, dt, op);
  } else {
    // Pipelined: the host's reduce of segment k+1 runs while the leaders' ring carries segment k and the host's
    // broadcast spreads segment k-1; each phase a part of its own (side_by_side.h) with its own scratch space, in
    // segment order, so that each phase's messages keep their order. A non-leader's broadcast of segment k waits on
    // no local event: its receives wait for the leader.
    const std::size_t segments = (count + seg_count - 1) / seg_count;
    auto seg = [&](std::size_t k) { return std::pair{k * seg_count, std::min(seg_count, count - k * seg_count)}; };
    enum Counter { kReduced, kRinged };
    SideBySide& parts = side_by_side();
    const std::unique_ptr<PartProgress> prog = parts.progress(2);
    std::exception_ptr errors[3];
    const Context reduce_ctx{local.transport, *pipe.workspaces[0], local.chunk_bytes};
    const Context bcast_ctx{local.transport, *pipe.workspaces[1], local.chunk_bytes};
    const bool leader = local.transport.rank() == tree.root;
    auto guarded = [&](int i, auto body) {
      return [&, i, body] {
        try {
          body();
        } catch (...) {
          errors[i] = std::current_exception();
          prog->fail();
        }
      };
    };
    std::vector<std::function<void()>> phases;
    if (leader && ring)  // the leaders' ring on the caller's thread
      phases.push_back(guarded(2, [&] {
        for (std::size_t k = 0; k < segments; ++k) {
          if (!prog->wait_past(kReduced, k)) return;
          const auto [off, n] = seg(k);
          ring_allreduce(*leaders, dst + off * es, dst + off * es, n, dt, op, 1.0,
                         topology::identity_ring(leaders->transport.size()));
          prog->advance(kRinged);
        }
      }));
    phases.push_back(guarded(0, [&] {
      for (std::size_t k = 0; k < segments && !prog->failed(); ++k) {
        const auto [off, n] = seg(k);
        if (!alone)
          tree_reduce(reduce_ctx, src + off * es, dst + off * es, n, dt, op, 1.0, tree);
        else if (src != dst)
          std::memcpy(dst + off * es, src + off * es, n * es);
        prog->advance(kReduced);
      }
    }));
    phases.push_back(guarded(1, [&] {
      for (std::size_t k = 0; k < segments; ++k) {
        if (leader && !prog->wait_past(ring ? kRinged : kReduced, k)) return;
        const auto [off, n] = seg(k);
        if (!alone) tree_broadcast(bcast_ctx, dst + off * es, n, dt, tree);
      }
    }));
    parts.run(phases);
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
  }
  if (scale != 1.0) scale_by(dt, out, count, scale);
}

void hierarchical_over_plan(detail::PlanState& plan, const Context& base, const std::array<Workspace*, 2>& phases,
                            bool across_hosts, const void* in, void* out, std::size_t count, DataType dt, ReduceOp op,
                            double scale) {
  plan.make_groups(base.transport);
  const Context local{*plan.host_group, base.workspace, base.chunk_bytes};
  // Every rank cuts the same segments, leader or not (only leaders hold a leader group).
  const HierarchicalPipeline pipe{
      hierarchical_segment_bytes(count * dtype_size(dt), base.chunk_bytes, across_hosts ? plan.hosts() : 1), phases};
  if (across_hosts && plan.leader_group) {
    const Context leaders{*plan.leader_group, base.workspace, base.chunk_bytes, 0, base.send_window};
    hierarchical_allreduce(local, &leaders, plan.host_tree, in, out, count, dt, op, scale, pipe);
  } else {
    hierarchical_allreduce(local, nullptr, plan.host_tree, in, out, count, dt, op, scale, pipe);
  }
}

AlgorithmInfo hierarchical_row() {
  AlgorithmInfo r;
  r.name = "hier";
  r.aliases = {"hierarchical"};
  r.collectives = {Collective::kAllreduce};
  r.summary =
      "tree reduce within each host, ring among the hosts' leaders, tree broadcast within each host; "
      "pipelined segment by segment";
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
    // Pipelined (at least two segments, as hierarchical_segment_bytes cuts them): the phases overlap, one
    // segment's worth of the shorter phase exposed.
    const double segment = static_cast<double>(
        hierarchical_segment_bytes(q.bytes, static_cast<std::size_t>(kModelChunk), static_cast<int>(H)));
    if (per_host > 1 && n >= 2 * segment)
      return std::max(local, leaders) + std::min(local, leaders) / std::ceil(n / segment);
    return local + leaders;
  };
  r.run = [](AlgorithmContext& a, const CollectiveCall& c) {
    detail::PlanState& plan = *a.plan;
    hierarchical_over_plan(plan, context_of(a), {plan.hier_workspaces[0].get(), plan.hier_workspaces[1].get()}, true,
                           c.in, c.out, c.count, c.dt, c.op, c.scale);
  };
  return r;
}

}  // namespace hopwise::comm::algo
