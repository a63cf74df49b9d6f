// The handle an async call returns: wait() blocks until done (rethrowing the error, which names the rank,
// the collective and its sizes), test() polls, on_complete() calls back.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace hopwise::comm {

class CompletionThread;

class Work {
 public:
  struct State {
    std::mutex mutex;
    std::condition_variable cv;
    bool done = false;
    std::exception_ptr error;
    std::string error_text;
    // For point-to-point work, which runs on the transport rather than the progress thread: polls (block=false)
    // or finishes (block=true) the request; returns true when complete.
    std::function<bool(bool block)> drive;
    // When the progress thread started and finished the work (for statistics and traces).
    std::chrono::steady_clock::time_point started, finished;
    // Callbacks not yet run, and where they run (the communicator's completion thread; gone: the finishing one).
    std::vector<std::function<void(std::exception_ptr)>> callbacks;
    std::weak_ptr<CompletionThread> completions;
    bool watched = false;    // `drive` work already polled by the completion thread
    std::mutex drive_mutex;  // one thread at a time in `drive`
    void finish(std::exception_ptr e, std::string text);
  };

  Work() = default;
  explicit Work(std::shared_ptr<State> s) : state_(std::move(s)) {}

  // Blocks until the work is complete; throws its error if it failed.
  void wait();
  // True once the work is complete (successfully or not); never blocks.
  bool test();
  // Runs `fn` exactly once when the work is complete, after its result is in place, with its error (null on
  // success); at once on this thread if it is already complete, else on the communicator's completion thread,
  // in completion order, never while a hopwise lock is held. `fn` may issue collectives on the same communicator
  // and wait for them. An exception thrown by `fn` is logged and dropped.
  void on_complete(std::function<void(std::exception_ptr)> fn);
  // Empty unless the work failed.
  std::string error() const;
  bool valid() const { return state_ != nullptr; }
  // Start and end of the work on the progress thread; meaningful once test() is true.
  std::chrono::steady_clock::time_point started() const { return state_->started; }
  std::chrono::steady_clock::time_point finished() const { return state_->finished; }

 private:
  std::shared_ptr<State> state_;
};

}  // namespace hopwise::comm
