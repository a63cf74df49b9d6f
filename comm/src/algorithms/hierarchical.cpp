// Hierarchical allreduce: reduce within each host to its leader (a pipelined tree over the host's ranks), ring
// allreduce among the leaders (one per host: the slow links carry each byte once per host, not once per rank),
// broadcast within each host. The groups are GroupTransports over the communicator's transport.
#include <cstring>

#include "algorithm.h"
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

}  // namespace hopwise::comm::algo
