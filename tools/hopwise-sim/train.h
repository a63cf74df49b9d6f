// hopwise-sim --train: a model's training step at scale in simulated time (hopwise/sim/training.h), per averaging
// method, with the projected compute utilization; each call's algorithm chosen by trials in simulated time (as the
// tuner decides on a real job) or by the cost model.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "hopwise/comm/cost_model.h"
#include "hopwise/sim/rank_collectives.h"

namespace hopwise::sim_tool {

struct TrainingOptions {
  std::string model;                 // --train: mnist, gpt2-small or layers (sim::parse_model)
  double step_ms = 0;                // --step-ms: one step's compute on one rank
  std::vector<std::string> methods;  // --method, repeated (sim::parse_method); empty: the default set
  std::string choose = "trial";      // --choose trial|model
  double codec_rate = 0;             // --codec-rate: the codecs' bytes/s; 0: measured on this machine
  double bucket_mb = 25, first_bucket_mb = 1;
};

// The simulated job as hopwise-sim laid it out.
struct SimJob {
  std::vector<std::string> hosts;  // rank -> the platform's host
  std::vector<int> ring, host_of;
  std::size_t chunk = 0;
  comm::sim::RunOptions run;
  std::optional<comm::CostModel> model;  // the platform's alpha/beta and the measured gamma (fat trees)
  int host_count = 1, tree_depth = 1;
};

// Prints the table (and the CSV rows to `csv` where open); the process's exit status.
int run_training(const TrainingOptions& o, const SimJob& job, std::ostream* csv);

}  // namespace hopwise::sim_tool
