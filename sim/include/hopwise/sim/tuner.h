// The job's online tuner (comm/src/tuner/tuner.h, the class a Communicator runs) on simulated ranks: every rank holds
// a Tuner of its own and makes one class's calls back to back, as a job's first calls of a size are made, until the
// tuner decides: its rounds, pruning, close races, confirmation blocks and agreements, all in simulated time. A
// trial is lined up first and its time recorded as the Communicator does (dispatch.cpp: run_selected).
//
// The agreements (an elementwise max of a few doubles over the ranks) travel as the job's do, an allreduce of their
// true size. Where the run carries no bytes (phantom buffers, RunOptions::real_payloads off) their values go through
// the process's memory beside it: each rank posts its vector before the allreduce and reads the maximum after it,
// when every rank has posted (no rank's allreduce ends before every rank has entered it). One OS thread runs every
// actor, so the board needs no lock, and the tuner's own mutexes are never held across a SimGrid call.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "hopwise/comm/tuning.h"
#include "hopwise/sim/rank_collectives.h"

namespace hopwise::comm::sim {

struct TunerRun {
  TuningChoice choice;                                    // what every rank decided
  int calls = 0;                                          // the class's calls until then (trials, blocks)
  double tuning_s = 0;                                    // their simulated seconds, agreements included
  double decided_s = 0;                                   // a call of the choice after the decision
  std::vector<std::pair<TuningChoice, double>> ranked;    // each measured candidate's median, fastest first
  std::vector<std::pair<TuningChoice, double>> in_a_row;  // the finalists' mean call in the job's rhythm
  detail::TunerStats stats;                               // rank 0's
};

struct TunerJob {
  std::vector<std::string> hosts;  // rank -> host, as run_ranks takes them
  std::vector<int> ring, host_of;  // the planned ring, rank -> host index (RankCollectives)
  std::size_t chunk_bytes = std::size_t{1} << 20;
  RunOptions run;
  Algorithm agree_with = Algorithm::kHalvingDoubling;  // the agreements' allreduce (the job's cost model
                                                       // picks it for a few doubles)
};

// Tunes `count` elements of `dt` for `kind` (allreduce sums; the ring's chunk variants through `chunk_bytes`) among
// `candidates` (detail::tuning_candidates); Error where the ranks' tuners disagree or none decides in `max_calls`.
TunerRun tune_in_simulation(const TunerJob& job, Collective kind, DataType dt, std::size_t count,
                            const std::vector<TuningChoice>& candidates, const detail::TunerSettings& settings = {},
                            int max_calls = 2000);

}  // namespace hopwise::comm::sim
