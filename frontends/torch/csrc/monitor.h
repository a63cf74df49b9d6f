// hopwise.torch.Monitor's C++ side: the comm/ Monitor (monitor.h) fed from a hopwise group's calls. Each step
// (the trainer calls step() after optimizer.step()) takes the group's calls since the last one: their times on
// the progress thread are the buckets', and the wait after the last call was made until every call finished is
// the exposed communication (DDP makes its last bucket's call as backward ends, then waits for all).
#pragma once

#include <chrono>
#include <memory>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "backend.h"
#include "hopwise/training/monitor.h"

namespace hopwise::torch_backend {

class TorchMonitor {
 public:
  TorchMonitor(c10::intrusive_ptr<c10d::ProcessGroup> keep, HopwiseBackend& pg, comm::MonitorOptions options);
  ~TorchMonitor();
  // Every rank, after each optimizer step. Collective every `every` steps (a small background allgather).
  void step();
  void finish();  // collective: the last interval's line and files
  const comm::Monitor& monitor() const { return *monitor_; }
  const comm::StepSample& last_sample() const { return last_; }

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> keep_;
  HopwiseBackend* pg_;
  std::unique_ptr<comm::Monitor> monitor_;
  std::chrono::steady_clock::time_point last_step_;
  comm::StepSample last_;
};

}  // namespace hopwise::torch_backend
