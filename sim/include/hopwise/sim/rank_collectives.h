// One rank's collectives on simulated ranks (the simulator's, sim/): the algorithm rows of comm/src/algorithms run
// straight through on the actor of each rank of the SimGrid transport (hopwise/comm/transports/simgrid_transport.h).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "hopwise/comm/algorithm.h"
#include "hopwise/comm/transport.h"
#include "hopwise/comm/transports/simgrid_transport.h"

namespace hopwise::comm::sim {

// One rank's collectives run straight through the algorithm rows, on the actor's own thread: a Communicator runs its
// calls on a progress thread of its own, an OS thread that an actor must not wait on. The ring order and the ranks'
// hosts (as run_ranks places them) must be alike on every rank; the trees are the planner's over them (a chain
// within each host, a double binary tree over the hosts), as a planned Communicator's.
class RankCollectives {
 public:
  // share_scratch: every rank of the process uses one scratch space (a run without real payloads, whose buffers
  // hold nothing: thousands of ranks would not fit their own).
  RankCollectives(Transport& t, std::vector<int> ring, std::vector<int> host_of_rank,
                  std::size_t chunk_bytes = std::size_t{1} << 20, bool share_scratch = false);
  ~RankCollectives();
  RankCollectives(const RankCollectives&) = delete;
  RankCollectives& operator=(const RankCollectives&) = delete;
  // One call as the Communicator takes it (avg included; 1 rank and empty buffers handled as there). `count` per
  // rank as the public calls count it; `a` one of sim_algorithms() that implements `kind`; `chunk_bytes` 0: the
  // chunk given at construction (a tuner's choice may name another).
  void run(Algorithm a, Collective kind, const void* in, void* out, std::size_t count, DataType dt,
           ReduceOp op = ReduceOp::kSum, int root = 0, std::size_t chunk_bytes = 0);
  // Each host's ranks all-reduce among themselves, as Communicator::allreduce_within_host does it (hier's host
  // phases, no leaders' ring between).
  void allreduce_within_host(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op = ReduceOp::kSum);

 private:
  void hierarchical(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op, double scale,
                    std::size_t chunk, bool across_hosts);
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace hopwise::comm::sim
