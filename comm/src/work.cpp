#include "hopwise/comm/work.h"

#include "hopwise/common/error.h"

namespace hopwise::comm {

void Work::State::finish(std::exception_ptr e, std::string text) {
  {
    std::lock_guard lock(mutex);
    done = true;
    finished = std::chrono::steady_clock::now();
    error = std::move(e);
    error_text = std::move(text);
  }
  cv.notify_all();
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

std::string Work::error() const {
  if (!state_) return {};
  std::lock_guard lock(state_->mutex);
  return state_->error_text;
}

}  // namespace hopwise::comm
