// allreduce_within_host: each host all-reduces among its own ranks, on the progress thread in call order, over
// the plan's host group (the hierarchical allreduce's first and last phases, with no leaders' ring between).
#include <fmt/core.h>

#include <algorithm>

#include "algorithms/algorithms.h"
#include "call_checks.h"
#include "communicator_impl.h"

namespace hopwise::comm {

namespace {

Task within_host_task(int rank, const void* in, void* out, std::size_t count, DataType dt, ReduceOp op) {
  check_op_supported(dt, op);
  checks::buffers("allreduce_within_host", in, count, out, count, dt, rank);
  Task t{Collective::kAllreduce, in, out, count, dt, op};
  t.within_host = true;
  t.extra = ", within the host";
  t.job = [in, out, count, dt, op](detail::CommunicatorImpl& impl) {
    detail::PlanState& plan = impl.plan;
    plan.make_groups(*impl.transport);
    const int n = plan.host_group->size();
    const ReduceOp base = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
    const double scale = op == ReduceOp::kAvg ? 1.0 / n : 1.0;
    algo::hierarchical_over_plan(plan, {*impl.transport, impl.workspace, impl.options.chunk_bytes},
                                 {plan.hier_workspaces[0].get(), plan.hier_workspaces[1].get()}, false, in, out, count,
                                 dt, base, scale);
  };
  return t;
}

}  // namespace

void Communicator::allreduce_within_host(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op) {
  impl_->run_sync(within_host_task(rank(), in, out, count, dt, op));
}

Work Communicator::allreduce_within_host_async(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op) {
  return impl_->submit(within_host_task(rank(), in, out, count, dt, op));
}

Communicator::LinkBytes Communicator::link_bytes() const {
  LinkBytes b;
  const auto& host_of = impl_->plan.host_of;
  const Transport& t = *impl_->transport;
  // HOPWISE_EMULATE_GBPS makes the ranks' links a network's: their bytes are the network's.
  const bool emulated = impl_->options.emulate_gbps > 0;
  const bool one_host = host_of.empty() && local_size() == size();
  for (int r = 0; r < size(); ++r) {
    if (r == rank()) continue;
    const bool same = !emulated && (one_host || (!host_of.empty() && host_of[static_cast<std::size_t>(r)] ==
                                                                         host_of[static_cast<std::size_t>(rank())]));
    (same ? b.host : b.network) += t.sent_to(r);
  }
  if (SharedSlots* sh = impl_->transport->shared_slots())
    (emulated ? b.network : b.host) += sh->bytes_in.load(std::memory_order_relaxed);
  return b;
}

int Communicator::host_ranks() const {
  const auto& host_of = impl_->plan.host_of;
  if (host_of.empty()) return size();
  const int mine = host_of[static_cast<std::size_t>(rank())];
  return static_cast<int>(std::count(host_of.begin(), host_of.end(), mine));
}

}  // namespace hopwise::comm
