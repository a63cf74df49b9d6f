// The alpha-beta-gamma model that picks an algorithm per (collective, bytes, ranks) among the algorithm table's
// candidates, each row estimating its own cost from these parameters:
//   alpha = seconds per message, beta = seconds per byte moved, gamma = seconds per byte reduced.
// MPI's own collectives are a black box; they get a line alpha_native + beta_native * bytes measured from
// MPI_Allreduce itself. All parameters come from calibrate() (a few milliseconds, collective) or, with
// HOPWISE_CALIBRATE=0, from defaults() measured on the 2-core development machines.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "hopwise/comm/algorithm.h"

namespace hopwise::comm {

class Transport;
class Workspace;

struct CostParams {
  double alpha = 0, beta = 0, gamma = 0;     // hopwise over the transport
  double alpha_rendezvous = 0;               // extra latency of a message above the eager limit (4 KiB)
  double alpha_shared = 0;                   // a 1-element direct allreduce through shared slots (0 = no slots)
  double shared_slot_bytes = 0;              // the largest buffer the shared slots take
  double beta_shared = 0;                    // seconds per byte of the shared-memory allreduce (shm)
  double alpha_native = 0, beta_native = 0;  // the transport library's own allreduce (0 = none)
  std::string source;                        // "calibrated" or "defaults"
  static CostParams defaults();
};

class CostModel {
 public:
  CostModel() = default;
  explicit CostModel(CostParams p) : p_(p) {}
  const CostParams& params() const { return p_; }
  // Seconds for `a` to run the query (its row's estimate, with these parameters; 0 for one rank).
  double estimate(Algorithm a, CostQuery q) const;
  // Every candidate of the algorithm table that implements q.collective (native ones only when has_native),
  // with its estimate, in table order.
  std::vector<std::pair<Algorithm, double>> candidates(CostQuery q, bool has_native) const;
  // The cheapest of the candidates.
  Algorithm choose(CostQuery q, bool has_native) const;

 private:
  CostParams p_ = CostParams::defaults();
};

// Measures alpha and beta with ring-neighbour exchanges, gamma with the reduction kernel, and the native
// allreduce line; then agrees on the slowest figure across ranks so that every rank picks the same algorithm.
// Collective: every rank of the transport must call it.
CostParams calibrate(Transport& t, Workspace& ws);

}  // namespace hopwise::comm
