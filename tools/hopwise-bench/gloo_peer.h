// Gloo as a second peer in hopwise-bench: its allreduce over TCP (loopback within a host, the hosts' addresses
// across them), meeting through a hopwise store. Built where CMake finds Gloo (Debian libgloo-dev).
#pragma once

#include <cstddef>
#include <memory>

#include "hopwise/comm/store.h"
#include "hopwise/common/dtype.h"

namespace hopwise::bench {

class Control;

class GlooPeer {
 public:
  GlooPeer(Control& control, std::shared_ptr<comm::Store> store, bool several_hosts);  // collective
  ~GlooPeer();
  static bool supports(DataType dt, ReduceOp op);
  void allreduce(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace hopwise::bench
