// torch's Work and future for hopwise calls. DDP waits on the future; its hooks chain callbacks on it, and torch's
// PowerSGD hook starts another collective and waits for it inside such a callback. So futures are completed off
// hopwise's threads, each on a thread of its own: a pool that starts a thread whenever none is idle, so that no
// completion ever queues behind one that waits.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <vector>

#include "hopwise/comm/work.h"

namespace hopwise::torch_backend {

class Sequencer;

// Runs `fn` on an idle pool thread, or a new one; never on the caller's thread, never behind another task.
void run_detached(std::function<void()> fn);

class HopwiseWork final : public c10d::Work {
 public:
  // `devices`: where the outputs live when not on the CPU (the future then records CUDA events for them).
  HopwiseWork(int rank, c10d::OpType type, const char* title, std::vector<at::Tensor> outputs,
              std::vector<c10::Device> devices = {});
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }
  int sourceRank() const override;
  // Completes the work and its future (with the error when `e` is set). Call once, with no lock held.
  void complete(std::exception_ptr e);
  void set_source_rank(int r) { source_rank_ = r; }
  void set_sequencer(Sequencer* s) { sequencer_ = s; }
  // The call failed before it started (its error went to the caller): nothing is to wait for.
  void abandon() { abandoned_ = true; }
  bool abandoned() const { return abandoned_; }

 private:
  Sequencer* sequencer_ = nullptr;
  std::atomic<bool> abandoned_ = false;
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  int source_rank_ = -1;
};

// Orders a group's collectives alike on every rank although some are issued from completion callbacks (torch's
// PowerSGD hook all-reduces inside one, while DDP's thread goes on to the next bucket): a call made while an
// earlier call's completion (with its callbacks) has yet to finish waits for it, unless it comes from that
// completion, and then it goes first, as if callbacks ran the moment a call was made. Every rank thus issues its
// collectives in the order of one depth-first walk, whatever its threads' timing.
class Sequencer {
 public:
  // Runs `start` now (its synchronous errors reach the caller) or once earlier completions are done (its errors
  // then complete `work`), then completes `work` after the hopwise works it returns, with `then` first.
  void launch(const c10::intrusive_ptr<HopwiseWork>& work, std::function<std::vector<comm::Work>()> start,
              std::function<void(std::exception_ptr)> then = {});
  void done();  // a launched work's completion has run
  // Called with every work as it is launched (the backend keeps them for its barrier).
  void set_tracker(std::function<void(const c10::intrusive_ptr<HopwiseWork>&)> fn) { tracker_ = std::move(fn); }
  bool completing_here() const;  // this thread is running one of this sequencer's completions

  // What the monitor reads (monitor.cpp): while logging, every call's hopwise works and when the caller made it.
  struct Logged {
    std::chrono::steady_clock::time_point called;
    std::vector<comm::Work> works;
  };
  void set_logging(bool on);
  std::vector<Logged> take_log();

 private:
  void log(std::chrono::steady_clock::time_point called, const std::vector<comm::Work>& works);
  std::mutex log_mutex_;
  bool logging_ = false;
  std::vector<Logged> log_;
  std::function<void(const c10::intrusive_ptr<HopwiseWork>&)> tracker_;
  std::mutex mutex_;
  int open_ = 0;  // launched works whose completion has not yet run
  std::deque<std::function<void()>> held_;
};

// Once every hopwise work in `works` is complete: `then(first error or null)` on a pool thread (it copies staged
// results back), then `work` completes with the same error (or the one `then` throws).
void complete_after(std::vector<comm::Work> works, c10::intrusive_ptr<HopwiseWork> work,
                    std::function<void(std::exception_ptr)> then = {});
// The same once torch works (this backend's, via their futures) are complete: what coalesced calls return.
void complete_after(const std::vector<c10::intrusive_ptr<c10d::Work>>& parts, c10::intrusive_ptr<HopwiseWork> work,
                    std::function<void(std::exception_ptr)> then = {});

}  // namespace hopwise::torch_backend
