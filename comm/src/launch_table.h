// What launch.cpp and launch_table.cpp share: the scheme an address belongs to.
#pragma once

#include <string>

#include "hopwise/comm/launch.h"

namespace hopwise::comm {

// The scheme of a store address; InvalidArgument "`what` is not a store address; use ..." (the known forms) where
// none matches.
StoreScheme store_scheme_of(const std::string& address, const std::string& what);

// srun's side (slurm_launch.cpp). Whether this process is a task of a Slurm job step (SLURM_STEP_ID, SLURM_PROCID).
bool slurm_step();
// Its rank, size, whether MPI joins the step (--mpi=pmix) and whether it spans nodes, into `l`; InvalidArgument
// naming the variable that is missing or inconsistent.
void read_slurm_step(Launch& l);
// Where the step's ranks meet without MPI: tcp://FIRST_NODE:PORT, the port from SLURM_JOB_ID and SLURM_STEP_ID
// (HOPWISE_SLURM_PORT overrides it). Rank 0 checks that it runs on that node (SLURMD_NODENAME).
std::string slurm_store_address(const Launch& l);

}  // namespace hopwise::comm
