// Choosing and running an algorithm: a forced one (HOPWISE_ALGO, set_algorithm) where it implements the call and
// can run here, else the cost model's pick among the algorithm table's candidates; then the row's run function.
// One rank and empty buffers are handled here once, for every row.
#include <cstring>

#include "communicator_impl.h"
#include "hopwise/common/error.h"
#include "hopwise/common/reduce.h"

namespace hopwise::comm {

Algorithm detail::CommunicatorImpl::choose(Collective c, std::size_t bytes) const {
  const Algorithm f = forced.load();
  const bool has_native = transport->native() != nullptr;
  if (f != Algorithm::kAuto && implements(f, c) && (!algorithm_info(f).needs_native || has_native)) return f;
  CostQuery q;
  q.collective = c;
  q.bytes = bytes;
  q.ranks = p();
  q.hosts = plan.hosts();
  q.tree_depth = plan.tree_depth;
  return cost.choose(q, has_native);
}

void detail::CommunicatorImpl::run(Task& t, Algorithm a) {
  if (t.kind == Collective::kSend || t.kind == Collective::kRecv)
    throw Error("internal: point-to-point task on the collective path");
  const std::size_t es = dtype_size(t.dt);
  CollectiveCall call{t.kind,
                      t.in,
                      t.out,
                      t.count,
                      t.dt,
                      t.op == ReduceOp::kAvg ? ReduceOp::kSum : t.op,
                      t.op == ReduceOp::kAvg ? 1.0 / p() : 1.0,
                      t.root};
  if (p() == 1 || (t.count == 0 && t.kind != Collective::kBarrier)) {
    if (t.kind == Collective::kBroadcast || t.kind == Collective::kBarrier) return;
    if (t.kind == Collective::kReduce && transport->rank() != t.root) return;
    if (t.out != t.in && t.count != 0) std::memmove(t.out, t.in, t.count * es);
    if (call.scale != 1.0 && t.kind != Collective::kAllgather) scale_by(t.dt, t.out, t.count, call.scale);
    return;
  }
  AlgorithmContext ctx{*transport, options.chunk_bytes, plan.ring, &workspace, &plan};
  algorithm_info(a).run(ctx, call);
}

void detail::CommunicatorImpl::run_nested(Collective kind, const void* in, void* out, std::size_t count, DataType dt,
                                          ReduceOp op) {
  Task n{kind, in, out, count, dt, op};
  run(n, choose(kind, count * dtype_size(dt)));
}

}  // namespace hopwise::comm
