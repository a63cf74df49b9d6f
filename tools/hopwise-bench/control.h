// The bench's own synchronization: the barrier before each timed call and the max over ranks of the timings and
// checks, over a communicator of its own (MPI under mpirun, UCX under torchrun), so that they neither need MPI
// nor run through the algorithm being timed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hopwise/comm/communicator.h"

namespace hopwise::bench {

class Control {
 public:
  Control() : c_(options()) {}
  comm::Communicator& comm() { return c_; }
  void sync() { c_.barrier(); }
  // Element-wise max over ranks, in place.
  void max(std::vector<double>& v) { c_.allreduce(v.data(), v.data(), v.size(), DataType::kFloat64, ReduceOp::kMax); }
  // Whether `flag` is true on any rank.
  bool any(bool flag) {
    std::int32_t x = flag ? 1 : 0;
    c_.allreduce(&x, &x, 1, DataType::kInt32, ReduceOp::kMax);
    return x != 0;
  }
  // Rank 0's `text` on every rank (at most 255 bytes).
  std::string broadcast(const std::string& text) {
    std::vector<std::uint8_t> b(256, 0);
    std::copy_n(text.begin(), std::min<std::size_t>(text.size(), 255), b.begin());
    c_.broadcast(b.data(), b.size(), DataType::kUInt8, 0);
    return std::string(reinterpret_cast<const char*>(b.data()));
  }

 private:
  static comm::Options options() {
    comm::Options o = comm::Options::from_env();
    o.algorithm = comm::Algorithm::kAuto;
    o.calibrate = false;
    o.discover_topology = false;
    o.emulate_gbps = 0;
    o.tune = false;  // a barrier and small maxima: nothing to tune, and no trial may disturb a timed call
    o.tuning_file.clear();
    return o;
  }
  comm::Communicator c_;
};

}  // namespace hopwise::bench
