// The built-in algorithms: one a file (ring.cpp, halving_doubling.cpp, tree.cpp, ...), each written once against
// Transport so that it runs over every transport, and each file ends with its row of the algorithm table
// (hopwise/comm/algorithm.h; the table itself is registry.cpp).
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <vector>

#include "../cost_terms.h"
#include "../workspace.h"
#include "hopwise/comm/algorithm.h"
#include "hopwise/comm/transport.h"
#include "hopwise/common/dtype.h"
#include "hopwise/topology/shapes.h"

namespace hopwise::comm::algo {

// Tags below kFirstInternalTag belong to the user's send/recv.
inline constexpr int kFirstInternalTag = 10000;
inline constexpr int kTagRingReduceScatter = 10000;  // + step
inline constexpr int kTagRingAllgather = 12000;      // + step
inline constexpr int kTagHalvingDoubling = 14000;    // + round
inline constexpr int kTagTreeReduce = 16000;         // + tree index
inline constexpr int kTagTreeBroadcast = 16100;      // + tree index
inline constexpr int kTagBarrier = 16200;            // + round
inline constexpr int kTagOneShot = 16250;
inline constexpr int kTagShardedExchange = 16260;  // compressed reduce-scatter's pairwise payloads
inline constexpr int kTagCheck = 16300;            // HOPWISE_DEBUG=CHECK fingerprints
inline constexpr int kTagAlive = 16301;            // after a timeout: "I gave up too"
inline constexpr int kTagGaveUp = 16302;           // UCX: a rank abandoned the transport (never received: probed)
inline constexpr int kTagStamp = 16303;            // the default call check's stamps (call_stamps.h)
inline constexpr int kTagReserved = 16400;  // .. 19999: reserved_tags (registry.cpp), for the layers above the engine

struct Context {
  Transport& transport;
  Workspace& workspace;
  std::size_t chunk_bytes;      // largest message; also the pipelining grain
  int tag_offset = 0;           // added to the ring's tags: channels running side by side keep their messages apart
  std::size_t send_window = 0;  // sends in flight at most (0: no limit); see AlgorithmContext
};

// The scratch space, chunk and transport of a row's run, as the algorithm functions below take them.
inline Context context_of(const AlgorithmContext& a) {
  return {a.transport, *a.workspace, a.chunk_bytes, 0, a.send_window};
}

// The rows of the built-in algorithms, one per file.
AlgorithmInfo ring_row();
AlgorithmInfo halving_doubling_row();
AlgorithmInfo tree_row();
AlgorithmInfo native_row();
AlgorithmInfo one_shot_row();
AlgorithmInfo two_shot_row();
AlgorithmInfo hierarchical_row();

// The ring allreduce along the plan: its channels side by side where there are several, else the one ring.
void planned_ring_allreduce(AlgorithmContext& a, const CollectiveCall& c);

// Tag offset of ring channel k (k = 1, 2, ...): above every other internal tag.
inline constexpr int kRingChannelTagStride = 20000;

// Element offsets of p blocks: block b is [offsets[b], offsets[b+1]).
struct Blocks {
  std::vector<std::size_t> offsets;
  std::size_t off(int b) const { return offsets[static_cast<std::size_t>(b)]; }
  std::size_t len(int b) const {
    return offsets[static_cast<std::size_t>(b) + 1] - offsets[static_cast<std::size_t>(b)];
  }
  static Blocks even(std::size_t count, int p);           // near-equal split, the first count % p one larger
  static Blocks uniform(std::size_t block_count, int p);  // p blocks of block_count
};

// Position of `rank` in `order`.
int position_of(const std::vector<int>& order, int rank);

// Ring reduce-scatter then allgather. `in` may equal `out`. `scale` != 1 multiplies the result (avg).
void ring_allreduce(const Context& c, const void* in, void* out, std::size_t count, DataType dt, ReduceOp op,
                    double scale, const std::vector<int>& order);
// Several rings side by side ("channels", e.g. the planned ring and its reverse): the buffer is split into one
// contiguous part per channel, channel 0 runs on the calling thread and each other channel on a thread of its own
// with its own workspace (`extra[k-1]`) and tags. Falls back to one ring when the buffer is too small to split.
void ring_allreduce_channels(const Context& c, std::vector<Workspace*> extra, const void* in, void* out,
                             std::size_t count, DataType dt, ReduceOp op, double scale,
                             const std::vector<std::vector<int>>& channels);
// out (recvcount) = this rank's block of the reduction of every rank's in (p * recvcount).
void ring_reduce_scatter(const Context& c, const void* in, void* out, std::size_t recvcount, DataType dt, ReduceOp op,
                         double scale, const std::vector<int>& order);
// out (p * sendcount) = every rank's in, in rank order. `in` may be out + rank * sendcount.
void ring_allgather(const Context& c, const void* in, void* out, std::size_t sendcount, DataType dt,
                    const std::vector<int>& order);

// Rabenseifner: recursive-halving reduce-scatter, recursive-doubling allgather; non-powers of two fold first.
void halving_doubling_allreduce(const Context& c, const void* in, void* out, std::size_t count, DataType dt,
                                ReduceOp op, double scale, const std::vector<int>& order);

// Pipelined reduce up and broadcast down one tree, or two trees (each half of the data) for a double tree.
void tree_allreduce(const Context& c, const void* in, void* out, std::size_t count, DataType dt, ReduceOp op,
                    double scale, const std::vector<const topology::TreeShape*>& trees);
// Pipelined reduce to tree.root: `out` is only written at the root.
void tree_reduce(const Context& c, const void* in, void* out, std::size_t count, DataType dt, ReduceOp op, double scale,
                 const topology::TreeShape& tree);
// Pipelined broadcast from tree.root.
void tree_broadcast(const Context& c, void* buf, std::size_t count, DataType dt, const topology::TreeShape& tree);

// One shot: everyone sends everything to everyone, then reduces locally in rank order (small messages).
// Uses the transport's shared slots when it has them and the data fits (no messages at all).
void one_shot_allreduce(const Context& c, const void* in, void* out, std::size_t count, DataType dt, ReduceOp op,
                        double scale);
// The shared-slot path alone; false (nothing done) where the transport has no slots or the data does not fit.
bool one_shot_allreduce_shared(const Context& c, const void* in, void* out, std::size_t count, DataType dt, ReduceOp op,
                               double scale);

// Reduce-scatter + allgather through the shared slots (one host, no messages), chunked by the slot size.
// False (nothing done) where the transport has no shared slots.
bool two_shot_allreduce(const Context& c, const void* in, void* out, std::size_t count, DataType dt, ReduceOp op,
                        double scale);

// Reduce within a host to its leader (local rank 0), ring allreduce among the leaders, broadcast within the host.
// `local`: this rank's host group; `leaders`: the leaders' group on leaders, nullptr elsewhere; `tree`: over the
// host group's ranks, rooted at its rank 0 (the leader). Calls of at least two segments are pipelined: the
// phases run side by side (side_by_side.h: threads in a job, actors in a simulation), segment by segment, the
// reduce and the broadcast on `workspaces`.
struct HierarchicalPipeline {
  std::size_t segment_bytes = 0;           // 0: one segment, the phases one after another
  std::array<Workspace*, 2> workspaces{};  // the reduce's and the broadcast's scratch space
};
std::size_t hierarchical_segment_bytes(std::size_t bytes, std::size_t chunk_bytes, int hosts);
void hierarchical_allreduce(const Context& local, const Context* leaders, const topology::TreeShape& tree,
                            const void* in, void* out, std::size_t count, DataType dt, ReduceOp op, double scale,
                            const HierarchicalPipeline& pipe);
// hier over a plan's host and leader groups (made at the first call): across the hosts, the leaders' ring on
// `base`'s send window, or within this rank's host only (across_hosts false). `base`: the communicator's transport,
// workspace and chunk; `phases`: the pipeline's two workspaces. The algorithm table's row,
// Communicator::allreduce_within_host and the simulated ranks all run it through here.
void hierarchical_over_plan(detail::PlanState& plan, const Context& base, const std::array<Workspace*, 2>& phases,
                            bool across_hosts, const void* in, void* out, std::size_t count, DataType dt, ReduceOp op,
                            double scale);

// Dissemination barrier: ceil(log2 p) rounds of 1-byte messages.
void dissemination_barrier(const Context& c);

}  // namespace hopwise::comm::algo
