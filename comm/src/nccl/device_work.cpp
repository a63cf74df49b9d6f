// DeviceWork: the handle of one enqueued call. Its outcome is settled once, by the first wait() or test() that sees
// the work's CUDA event fire (or fail), and kept: later calls return or rethrow it.
#include <fmt/core.h>

#include "device_impl.h"
#include "hopwise/common/error.h"

namespace hopwise::comm {

DeviceWork::State::~State() {
  if (start) cudaEventDestroy(start);
  if (done) cudaEventDestroy(done);
}

bool DeviceWork::State::complete() {
  std::lock_guard lock(mutex);
  return settled && !error;
}

void DeviceWork::State::settle(std::exception_ptr e) {
  std::lock_guard lock(mutex);
  if (settled) return;
  settled = true;
  error = e;
}

void DeviceWork::State::rethrow() {
  std::exception_ptr e;
  {
    std::lock_guard lock(mutex);
    e = error;
  }
  if (e) std::rethrow_exception(e);
}

bool DeviceWork::State::poll_once() {
  {
    std::lock_guard lock(mutex);
    if (settled) return true;
  }
  std::exception_ptr failure;
  bool fired = false;
  {
    std::lock_guard lock(impl->mutex);
    try {
      fired = impl->query(done, what);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  if (!fired && !failure) return false;
  settle(failure);
  return true;
}

void DeviceWork::wait() {
  if (!state_) throw InvalidArgument("DeviceWork::wait() on an empty handle (default-constructed)");
  State& s = *state_;
  {
    std::lock_guard lock(s.mutex);
    if (s.settled && !s.error) return;
  }
  s.rethrow();
  try {
    s.impl->poll(s.done, s.what);
    s.settle(nullptr);
  } catch (...) {
    s.settle(std::current_exception());
  }
  s.rethrow();
}

bool DeviceWork::test() {
  if (!state_) throw InvalidArgument("DeviceWork::test() on an empty handle (default-constructed)");
  State& s = *state_;
  const bool settled = s.poll_once();
  s.rethrow();
  return settled;
}

void DeviceWork::wait_on_stream(void* stream) {
  if (!state_) throw InvalidArgument("DeviceWork::wait_on_stream() on an empty handle (default-constructed)");
  cuda::CurrentGuard guard(state_->impl->device);
  cuda::check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), state_->done, 0),
              fmt::format("cudaStreamWaitEvent (a stream waiting for NCCL {})", state_->what), state_->impl->rank);
}

double DeviceWork::elapsed_ms() const {
  if (!state_ || !state_->complete())
    throw InvalidArgument("DeviceWork::elapsed_ms() before the work completed; call wait() first");
  float ms = 0;
  cuda::check(cudaEventElapsedTime(&ms, state_->start, state_->done), "cudaEventElapsedTime", state_->impl->rank);
  return ms;
}

const std::string& DeviceWork::description() const {
  static const std::string empty;
  return state_ ? state_->what : empty;
}

}  // namespace hopwise::comm
