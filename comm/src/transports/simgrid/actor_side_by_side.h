// The parts of a call side by side on simulated ranks (algorithms/side_by_side.h): each part an actor of the
// rank's host, their waits on SimGrid's condition variables, never an OS thread or an OS wait (the actors share
// one OS thread). run_ranks sets it for its run.
#pragma once

#include "algorithms/side_by_side.h"

namespace hopwise::comm::sim {

algo::SideBySide& actors_side_by_side();

}  // namespace hopwise::comm::sim
