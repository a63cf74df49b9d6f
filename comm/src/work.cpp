#include "hopwise/comm/work.h"

#include "completion_thread.h"
#include "hopwise/common/error.h"
#include "hopwise/common/log.h"

namespace hopwise::comm {

namespace {

using Callbacks = std::vector<std::function<void(std::exception_ptr)>>;

}  // namespace

void Work::State::finish(std::exception_ptr e, std::string text) {
  Callbacks cbs;
  {
    std::lock_guard lock(mutex);
    if (done) return;  // finished once; a second finish (a late abandon) changes nothing
    done = true;
    finished = std::chrono::steady_clock::now();
    error = e;
    error_text = std::move(text);
    cbs.swap(callbacks);
  }
  cv.notify_all();
  if (cbs.empty()) return;
  if (auto c = completions.lock())
    c->post([cbs = std::move(cbs), e] { run_callbacks(cbs, e, "Work"); });
  else
    run_callbacks(cbs, e, "Work");
}

void Work::wait() {
  if (!state_) throw InvalidArgument("wait() on an empty Work handle; use the handle an *_async call returned");
  if (state_->drive) state_->drive(true);
  std::unique_lock lock(state_->mutex);
  state_->cv.wait(lock, [&] { return state_->done; });
  if (state_->error) std::rethrow_exception(state_->error);
}

bool Work::test() {
  if (!state_) return true;
  if (state_->drive) state_->drive(false);
  std::lock_guard lock(state_->mutex);
  return state_->done;
}

void Work::on_complete(std::function<void(std::exception_ptr)> fn) {
  if (!state_) throw InvalidArgument("on_complete() on an empty Work handle; use the handle an *_async call returned");
  if (!fn) throw InvalidArgument("on_complete() needs a callback");
  std::exception_ptr error;
  bool watch = false, complete = false;
  {
    std::lock_guard lock(state_->mutex);
    if (!state_->done) {
      state_->callbacks.push_back(std::move(fn));
      // Point-to-point work completes only when driven: the completion thread polls it.
      watch = state_->drive && !state_->watched;
      if (watch) state_->watched = true;
    } else {
      complete = true;
      error = state_->error;
    }
  }
  if (complete) {  // already complete: run here
    run_callbacks({fn}, error, "Work");
    return;
  }
  if (!watch) return;
  auto c = state_->completions.lock();
  // The poll keeps the work alive: the caller may drop its handle and rely on the callback alone.
  std::shared_ptr<State> s = state_;
  auto done = [s] { return s->drive(false); };
  auto abandon = [s] {
    s->finish(std::make_exception_ptr(Error("the communicator was destroyed before this work completed")),
              "the communicator was destroyed before this work completed");
  };
  if (c)
    c->watch(
        done, [] {}, abandon);
  else
    state_->drive(true);  // no communicator to poll for it: finish it here
}

std::string Work::error() const {
  if (!state_) return {};
  std::lock_guard lock(state_->mutex);
  return state_->error_text;
}

}  // namespace hopwise::comm
