// The handle an async call returns: wait() blocks until done (rethrowing the error, which names the rank,
// the collective and its sizes), test() polls.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace hopwise::comm {

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
    void finish(std::exception_ptr e, std::string text);
  };

  Work() = default;
  explicit Work(std::shared_ptr<State> s) : state_(std::move(s)) {}

  // Blocks until the work is complete; throws its error if it failed.
  void wait();
  // True once the work is complete (successfully or not); never blocks.
  bool test();
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
