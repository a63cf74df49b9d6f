// torch's Work and future for hopwise calls. DDP waits on the future; its hooks chain callbacks on it, and torch's
// PowerSGD hook starts another collective and waits for it inside such a callback. So futures are completed off
// hopwise's threads, each on a thread of its own: a pool that starts a thread whenever none is idle, so that no
// completion ever queues behind one that waits.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <exception>
#include <functional>
#include <vector>

#include "hopwise/comm/work.h"

namespace hopwise::torch_backend {

// Runs `fn` on an idle pool thread, or a new one; never on the caller's thread, never behind another task.
void run_detached(std::function<void()> fn);

class HopwiseWork final : public c10d::Work {
 public:
  HopwiseWork(int rank, c10d::OpType type, const char* title, std::vector<at::Tensor> outputs);
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }
  int sourceRank() const override;
  // Completes the work and its future (with the error when `e` is set). Call once, with no lock held.
  void complete(std::exception_ptr e);
  void set_source_rank(int r) { source_rank_ = r; }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  int source_rank_ = -1;
};

// Once every hopwise work in `works` is complete: `then(first error or null)` on a pool thread (it copies staged
// results back), then `work` completes with the same error (or the one `then` throws).
void complete_after(std::vector<comm::Work> works, c10::intrusive_ptr<HopwiseWork> work,
                    std::function<void(std::exception_ptr)> then = {});

}  // namespace hopwise::torch_backend
