// Where Work callbacks run: one thread per communicator, started on the first callback, that runs callbacks in the
// order their work completed and polls the work that only completes when driven (point-to-point, device events).
// Off the progress thread on purpose: a callback may issue a new collective on the same communicator and wait for
// it (PyTorch's PowerSGD hook does), which the progress thread must still be free to run.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace hopwise::comm {

// Runs each callback with the work's error; a callback that throws is logged (naming `what`, e.g. "Work") and
// skipped, so that the others still run and the thread that runs them goes on.
void run_callbacks(const std::vector<std::function<void(std::exception_ptr)>>& callbacks, const std::exception_ptr& e,
                   const char* what);

class CompletionThread {
 public:
  CompletionThread() = default;
  ~CompletionThread() { shutdown(); }
  // Runs the callbacks already posted and stops the thread; work still watched gets its `abandon` instead (its
  // callback must still run once). Later posts run on the posting thread. Not from a callback.
  void shutdown();
  CompletionThread(const CompletionThread&) = delete;
  CompletionThread& operator=(const CompletionThread&) = delete;

  // Runs `fn` on the completion thread, after every callback posted before it. No lock is held while it runs.
  void post(std::function<void()> fn);
  // Polls `done` (never blocking) until it returns true, then runs `fn`. At shutdown, `abandon` runs instead
  // of waiting further.
  void watch(std::function<bool()> done, std::function<void()> fn, std::function<void()> abandon);
  // Whether the calling thread is the completion thread (a communicator destroyed from a callback cannot join it).
  bool on_this_thread() const;

 private:
  struct Watched {
    std::function<bool()> done;
    std::function<void()> fn, abandon;
  };
  void loop();
  void start_locked();

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> ready_;
  std::vector<Watched> watched_;
  bool stopping_ = false, closed_ = false;
  std::thread thread_;
};

}  // namespace hopwise::comm
