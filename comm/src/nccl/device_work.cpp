// DeviceWork: the handle of one enqueued call. Its outcome is settled once, by whoever sees the work's CUDA event
// fire (or fail) first: the caller's wait() or test(), or the communicator's completion thread, which polls the
// work that has callbacks (DeviceWork::on_complete) and runs them, never under a hopwise lock.
#include <fmt/core.h>

#include "device_impl.h"
#include "hopwise/common/error.h"
#include "hopwise/common/log.h"

namespace hopwise::comm {

namespace {

using Callbacks = std::vector<std::function<void(std::exception_ptr)>>;

}  // namespace

DeviceWork::State::~State() {
  if (start) cudaEventDestroy(start);
  if (done) cudaEventDestroy(done);
}

bool DeviceWork::State::complete() {
  std::lock_guard lock(mutex);
  return settled && !error;
}

void DeviceWork::State::settle(std::exception_ptr e) {
  Callbacks cbs;
  {
    std::lock_guard lock(mutex);
    if (settled) return;
    settled = true;
    error = e;
    cbs.swap(callbacks);
  }
  if (!cbs.empty()) impl->completions->post([cbs = std::move(cbs), e] { run_callbacks(cbs, e, "DeviceWork"); });
}

void DeviceWork::State::rethrow() {
  std::exception_ptr e;
  {
    std::lock_guard lock(mutex);
    e = error;
  }
  if (e) std::rethrow_exception(e);
}

bool DeviceWork::State::poll_once(bool give_way, DeviceClock::time_point deadline) {
  {
    std::lock_guard lock(mutex);
    if (settled) return true;
  }
  std::unique_lock lock(impl->mutex, std::defer_lock);
  if (!give_way)
    lock.lock();
  else if (!lock.try_lock())
    return false;
  std::exception_ptr failure;
  bool fired = false;
  try {
    fired = impl->query(done, what);
    if (!fired && DeviceClock::now() > deadline) impl->fail_timeout(what);
  } catch (...) {
    failure = std::current_exception();
  }
  lock.unlock();  // callbacks never run under the communicator's lock
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
  s.rethrow();  // the first outcome (the completion thread may have settled it before this wait did)
}

bool DeviceWork::test() {
  if (!state_) throw InvalidArgument("DeviceWork::test() on an empty handle (default-constructed)");
  State& s = *state_;
  const bool settled = s.poll_once(false, DeviceClock::time_point::max());
  s.rethrow();
  return settled;
}

void DeviceWork::wait_on_stream(void* stream) {
  if (!state_) throw InvalidArgument("DeviceWork::wait_on_stream() on an empty handle (default-constructed)");
  cuda::CurrentGuard guard(state_->impl->device);
  cuda::check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), state_->done, 0),
              fmt::format("cudaStreamWaitEvent (a stream waiting for NCCL {})", state_->what), state_->impl->rank);
}

void DeviceWork::on_complete(std::function<void(std::exception_ptr)> fn) {
  if (!state_) throw InvalidArgument("DeviceWork::on_complete() on an empty handle (default-constructed)");
  if (!fn) throw InvalidArgument("DeviceWork::on_complete() needs a callback");
  State& s = *state_;
  s.poll_once(false, DeviceClock::time_point::max());  // work already complete calls back right here
  bool now = false, watch = false;
  std::exception_ptr error;
  {
    std::lock_guard lock(s.mutex);
    if (s.settled) {
      now = true;
      error = s.error;
    } else {
      s.callbacks.push_back(std::move(fn));
      watch = !s.watched;
      s.watched = true;
    }
  }
  if (now) {
    run_callbacks({fn}, error, "DeviceWork");
    return;
  }
  if (!watch) return;
  // The completion thread keeps the state alive until it settles: the caller may drop its handle.
  const auto deadline = DeviceClock::now() + std::chrono::duration_cast<DeviceClock::duration>(
                                                 std::chrono::duration<double>(s.impl->options.timeout_s));
  auto state = state_;
  // It gives way to the caller's thread while on the completion thread, and waits its turn at shutdown.
  s.impl->completions->watch(
      [state, deadline] { return state->poll_once(state->impl->completions->on_this_thread(), deadline); }, [] {},
      [state] {
        state->settle(
            std::make_exception_ptr(Error(fmt::format("rank {}: NCCL {}: the communicator was destroyed before this "
                                                      "work completed",
                                                      state->impl->rank, state->what))));
      });
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
