#include "completion_thread.h"

#include <chrono>

#include "hopwise/common/log.h"

namespace hopwise::comm {

void run_callbacks(const std::vector<std::function<void(std::exception_ptr)>>& callbacks, const std::exception_ptr& e,
                   const char* what) {
  for (const auto& cb : callbacks) {
    try {
      cb(e);
    } catch (const std::exception& x) {
      log::warn("a {} callback threw (ignored): {}", what, x.what());
    } catch (...) {
      log::warn("a {} callback threw a non-standard exception (ignored)", what);
    }
  }
}

void CompletionThread::shutdown() {
  {
    std::lock_guard lock(mutex_);
    if (closed_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::deque<std::function<void()>> ready;
  std::vector<Watched> watched;
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
    ready.swap(ready_);
    watched.swap(watched_);
  }
  for (auto& fn : ready) fn();
  for (auto& w : watched) w.done() ? w.fn() : w.abandon();
}

void CompletionThread::start_locked() {
  if (!thread_.joinable() && !stopping_) thread_ = std::thread([this] { loop(); });
}

void CompletionThread::post(std::function<void()> fn) {
  {
    std::unique_lock lock(mutex_);
    if (closed_) {  // the communicator is gone: run here rather than lose the callback
      lock.unlock();
      fn();
      return;
    }
    ready_.push_back(std::move(fn));
    start_locked();
  }
  cv_.notify_all();
}

void CompletionThread::watch(std::function<bool()> done, std::function<void()> fn, std::function<void()> abandon) {
  {
    std::unique_lock lock(mutex_);
    if (closed_) {
      lock.unlock();
      done() ? fn() : abandon();
      return;
    }
    watched_.push_back({std::move(done), std::move(fn), std::move(abandon)});
    start_locked();
  }
  cv_.notify_all();
}

bool CompletionThread::on_this_thread() const { return thread_.get_id() == std::this_thread::get_id(); }

void CompletionThread::loop() {
  // Polling backs off from 20 us to 1 ms while only watched work is pending, so that an idle wait costs no core.
  auto poll_sleep = std::chrono::microseconds(20);
  std::unique_lock lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !ready_.empty() || !watched_.empty(); });
    while (!ready_.empty()) {
      auto fn = std::move(ready_.front());
      ready_.pop_front();
      lock.unlock();
      fn();
      lock.lock();
    }
    if (!watched_.empty()) {
      std::vector<Watched> items;
      items.swap(watched_);
      lock.unlock();
      std::vector<Watched> still;
      bool any = false;
      for (auto& w : items) {
        if (w.done()) {
          w.fn();
          any = true;
        } else {
          still.push_back(std::move(w));
        }
      }
      lock.lock();
      for (auto& w : still) watched_.push_back(std::move(w));
      if (any) {
        poll_sleep = std::chrono::microseconds(20);
      } else if (!watched_.empty() && ready_.empty() && !stopping_) {
        cv_.wait_for(lock, poll_sleep);
        poll_sleep = std::min<std::chrono::microseconds>(poll_sleep * 2, std::chrono::milliseconds(1));
      }
    }
    if (stopping_ && ready_.empty()) return;  // shutdown() settles what is still watched
  }
}

}  // namespace hopwise::comm
