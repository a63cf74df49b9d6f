// Gloo as a second peer in hopwise-bench: its allreduce over TCP on this host, rendezvous through a FileStore
// in a directory rank 0 creates and shares through the bench's control communicator. Built where CMake finds Gloo
// (Debian libgloo-dev).
#pragma once

#include <cstddef>
#include <memory>

#include "hopwise/common/dtype.h"

namespace hopwise::bench {
class Control;
}

namespace hopwise::bench {

class GlooPeer {
 public:
  explicit GlooPeer(Control& control);  // collective
  ~GlooPeer();
  static bool supports(DataType dt, ReduceOp op);
  void allreduce(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace hopwise::bench
