// Command line of hopwise-bench, in the habits of nccl-tests.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <string>
#include <vector>

#include "hopwise/comm/algorithm.h"
#include "hopwise/common/dtype.h"

namespace hopwise::bench {

inline std::string env_or(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

struct Options {
  std::size_t min_bytes = 4 << 10, max_bytes = 64 << 20;
  std::size_t factor = 4;
  comm::Collective collective = comm::Collective::kAllreduce;
  ReduceOp op = ReduceOp::kSum;
  DataType dtype = DataType::kFloat32;
  std::vector<comm::Algorithm> algorithms{comm::Algorithm::kAuto};
  int iters = 20, warmup = 5;
  int burst = 1;  // --burst N: each sample is N calls back to back (per-call time)
  bool check = false;
  std::string csv_path;
  std::string metrics_file = env_or("HOPWISE_METRICS_FILE");  // --metrics-file: Prometheus text format
  std::string metrics_json = env_or("HOPWISE_METRICS_JSON");  // --metrics-json: a JSON line per row
  bool overlap = false;                                       // add the async-overlap table
  std::vector<std::string> codecs;  // -C SPEC (repeatable): a compressed-allreduce row per codec
  double wire_gbps = 0;             // --wire G: each host's link runs at G Gbit/s; rows get vs_wire
};

// Parses argv; prints usage and exits 0 for -h, throws InvalidArgument naming the bad flag otherwise.
Options parse_options(int argc, char** argv);

}  // namespace hopwise::bench
