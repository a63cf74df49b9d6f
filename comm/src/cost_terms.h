// The terms the rows' cost estimates are written in (the algorithms' files), apart from the cost model that calls
// them (cost_model.cpp), so that neither includes the other's pieces.
#pragma once

#include <cmath>

#include "hopwise/comm/cost_model.h"  // CostParams

namespace hopwise::comm::algo {

inline double log2_ceil(int p) { return p <= 1 ? 0.0 : std::ceil(std::log2(static_cast<double>(p))); }
// Per-byte cost of a message of m bytes: shared-memory MPI copies one up to its eager limit (4 KiB) twice.
inline double beta_for(const CostParams& c, double m) { return m <= 4096 ? 2 * c.beta : c.beta; }
// Latency of one message of m bytes: above the eager limit a handshake (rendezvous) comes first.
inline double alpha_for(const CostParams& c, double m) { return m <= 4096 ? c.alpha : c.alpha + c.alpha_rendezvous; }
inline constexpr double kModelChunk = 256 << 10;  // the pipelining grain the estimates assume

}  // namespace hopwise::comm::algo
