// How hopwise-sim chooses algorithms as a job would: the candidates a job's tuner gets (the cost model's, within its
// prior), the job's Tuner run on the simulated ranks (hopwise/sim/tuner.h), and the cost model's pick.
#pragma once

#include <cstddef>
#include <vector>

#include "hopwise/comm/tuning.h"
#include "hopwise/sim/tuner.h"
#include "train.h"

namespace hopwise::sim_tool {

// The candidates a job's tuner would get for `bytes` of `kind` (detail::tuning_candidates over the cost model's
// estimates), among the rows that run on simulated ranks: one_shot connects every pair and each connection is an
// actor, so past 128 ranks (16 thousand actors) the process would run out of memory mappings; it is left out there.
std::vector<comm::TuningChoice> sim_candidates(const SimJob& job, comm::Collective kind, std::size_t bytes);

// The cost model's cheapest row among those that run here (the ring where there is no model).
comm::Algorithm model_pick(const SimJob& job, comm::Collective kind, std::size_t bytes);

// One call of `choice` on every rank, the ranks started together, phantom buffers: its simulated seconds.
double time_choice(const SimJob& job, comm::Collective kind, DataType dt, std::size_t count,
                   const comm::TuningChoice& choice);

// The job's Tuner deciding `count` elements of `dt` for `kind` on every simulated rank (buffers phantom or real).
comm::sim::TunerRun tune_class(const SimJob& job, comm::Collective kind, DataType dt, std::size_t count, bool phantom);

}  // namespace hopwise::sim_tool
