// train_mnist's command line: the flags, their defaults (some from HOPWISE_* variables) and their checks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "hopwise/common/env.h"
#include "hopwise/training/monitor.h"

namespace hopwise::examples {

struct Flags {
  int epochs = 5, batch = 128, hidden = 1024;
  float lr = 0.05f, momentum = 0.9f;
  std::string compression = hopwise::env::get_or("HOPWISE_COMPRESSION", "none");
  double bucket_mb = 1;
  bool tune_bucket = false;  // --bucket-mb auto
  int chunks = 4;            // column blocks per weight gradient, each handed to the reducer when done
  bool overlap = true;
  std::string algo = "auto", trace = hopwise::env::get_or("HOPWISE_TRACE_FILE", ""), json;
  std::uint64_t seed = 1;
  std::size_t limit = 0;  // use only the first N training images (0 = all)
  std::string averaging = hopwise::env::get_or("HOPWISE_AVERAGING", "sync");
  double target = 0;               // --target-accuracy (a fraction)
  int eval_every = 20;             // steps between the probes while the target is not reached
  std::string checkpoint, resume;  // --resume: a checkpoint's path, or auto (--checkpoint's, where it has files)
  std::int64_t checkpoint_every = 0;
  bool elastic_scale_lr = false;  // --elastic-batch scale-lr: after a membership change, scale the learning rate  //
                                  // steps between checkpoints within an epoch (0: at epochs' ends only)
  comm::MonitorOptions monitor = comm::MonitorOptions::from_env();
  int straggler = -1;  // --straggle RANK:MS: this rank sleeps MS in every step's compute
  double straggle_ms = 0;
  bool keep_denormals = false;  // --keep-denormals: main() leaves FTZ/DAZ off
};

// Parses argv; prints the usage and exits 0 for --help; throws InvalidArgument naming the bad flag or spec.
Flags parse_flags(int argc, char** argv);

}  // namespace hopwise::examples
