// "native": the transport library's own collectives (MPI_Allreduce, ...), for the transports that have them. The
// library's algorithm is its own business, so the cost model fits its allreduce as a line (calibrate()).
#include <fmt/core.h>

#include "algorithms.h"
#include "hopwise/comm/cost_model.h"
#include "hopwise/common/error.h"
#include "hopwise/common/reduce.h"

namespace hopwise::comm::algo {

AlgorithmInfo native_row() {
  AlgorithmInfo r;
  r.name = "native";
  r.aliases = {"mpi"};
  r.collectives = {Collective::kAllreduce, Collective::kReduceScatter, Collective::kAllgather,
                   Collective::kBroadcast, Collective::kReduce,        Collective::kBarrier};
  r.needs_native = true;
  r.summary = "the transport library's own collective (MPI_Allreduce, ...)";
  r.estimate = [](const CostQuery& q) {
    const CostParams& m = *q.params;
    if (m.alpha_native <= 0) return static_cast<double>(INFINITY);
    const double n = static_cast<double>(q.bytes), P = q.ranks;
    switch (q.collective) {
      case Collective::kAllreduce: return m.alpha_native + m.beta_native * n;
      case Collective::kReduceScatter:
      case Collective::kAllgather: return m.alpha_native + m.beta_native * (P - 1) / P * n * P / 2;
      case Collective::kBroadcast:
      case Collective::kReduce: return m.alpha_native + m.beta_native * n / 2;
      case Collective::kBarrier: return m.alpha_native;
      default: return static_cast<double>(INFINITY);
    }
  };
  r.run = [](AlgorithmContext& a, const CollectiveCall& c) {
    NativeCollectives* nat = a.transport.native();
    if (nat == nullptr)
      throw Error(
          fmt::format("internal: 'native' chosen over {}, which has no collectives of its own", a.transport.name()));
    switch (c.kind) {
      case Collective::kAllreduce:
        nat->allreduce(c.in, c.out, c.count, c.dt, c.op);
        if (c.scale != 1.0) scale_by(c.dt, c.out, c.count, c.scale);
        return;
      case Collective::kReduceScatter:
        nat->reduce_scatter(c.in, c.out, c.count, c.dt, c.op);
        if (c.scale != 1.0) scale_by(c.dt, c.out, c.count, c.scale);
        return;
      case Collective::kAllgather: return nat->allgather(c.in, c.out, c.count, c.dt);
      case Collective::kBroadcast: return nat->broadcast(c.out, c.count, c.dt, c.root);
      case Collective::kReduce:
        nat->reduce(c.in, c.out, c.count, c.dt, c.op, c.root);  // out only at the root
        if (c.scale != 1.0 && a.transport.rank() == c.root) scale_by(c.dt, c.out, c.count, c.scale);
        return;
      default: return nat->barrier();
    }
  };
  return r;
}

}  // namespace hopwise::comm::algo
