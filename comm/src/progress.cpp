// The progress queue of the host Communicator: async calls run on one progress thread in call order; a sync call
// runs on the caller's thread when nothing is queued. Every failure is wrapped here with the call's description,
// marks the communicator broken and abandons the transport; HOPWISE_EMULATE_GBPS stretches each call to its
// wire time.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "communicator_impl.h"
#include "hopwise/common/error.h"

namespace hopwise::comm {

namespace {

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
}

}  // namespace

std::string detail::CommunicatorImpl::describe(const Task& t, Algorithm a) const {
  std::string s = fmt::format("{}(count={}, dtype={}", to_string(t.kind), t.count, to_string(t.dt));
  if (t.kind == Collective::kAllreduce || t.kind == Collective::kReduceScatter || t.kind == Collective::kReduce)
    s += fmt::format(", op={}", to_string(t.op));
  if (t.kind == Collective::kBroadcast || t.kind == Collective::kReduce) s += fmt::format(", root={}", t.root);
  if (!t.compression.empty()) s += fmt::format(", codec={}", t.compression);
  s += t.extra;
  s += fmt::format(", algo={}", to_string(a));
  return s + fmt::format(", ranks={})", p());
}

// Seconds the bytes each rank sends in `t` would take on the emulated link (bandwidth-optimal algorithms).
double detail::CommunicatorImpl::wire_seconds(const Task& t) const {
  const double n = static_cast<double>(t.count * dtype_size(t.dt)), P = p();
  double bytes = 0;
  switch (t.kind) {
    case Collective::kAllreduce: bytes = 2 * (P - 1) / P * n; break;
    case Collective::kReduceScatter:
    case Collective::kAllgather: bytes = (P - 1) * n; break;
    case Collective::kBroadcast:
    case Collective::kReduce: bytes = n; break;
    default: break;
  }
  return bytes * 8 / (options.emulate_gbps * 1e9);
}

// Each rank's timeout runs from its own last progress, and a pipelined ring staggers that by several of its steps:
// a second and more on a loaded machine (1.5 s seen beside stress-ng, where a 1 s window named live ranks as
// silent). Half the timeout, at most 5 s: the error comes at most that much later; it ends early once all are heard.
std::chrono::duration<double> detail::CommunicatorImpl::listen_for_others() const {
  return std::chrono::duration<double>(std::min(5.0, options.timeout_s / 2));
}

std::exception_ptr detail::CommunicatorImpl::execute(Task& t) {
  Algorithm a = Algorithm::kAuto;
  try {
    if (!broken.empty())
      throw Error(fmt::format("communicator is unusable after an earlier error ({}); create a new one", broken));
    // Numbered before the tuner's choice: its agreement among the ranks is a run of this call too.
    ++tasks;
    if (options.stamp_calls)  // off: no hashing of the codec's name on every call
      task_stamp = stamp_of({t.kind, t.count, t.dt, t.op, t.root, Algorithm::kAuto, t.compression}, tasks);
    // A composite call chooses for each of its plain collectives; its own entry names the cost model's pick.
    const Selected s =
        t.job ? Selected{{model_choice(t.kind, t.count * dtype_size(t.dt)), 0, 0}} : select(t.kind, t.count, t.dt);
    a = s.choice.algorithm;
    // The compression is part of the call: a PowerSGD allreduce against a plain one of the same count differs.
    if (options.check) check.verify(*transport, {t.kind, t.count, t.dt, t.op, t.root, a, t.compression});
    const auto start = std::chrono::steady_clock::now();
    if (t.job)
      t.job(*this);
    else
      run_selected(t, s);
    if (options.emulate_gbps > 0 && !t.within_host)
      std::this_thread::sleep_until(start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                std::chrono::duration<double>(wire_seconds(t))));
    return nullptr;
  } catch (const std::exception& e) {
    const std::string text =
        fmt::format("hopwise: rank {}: {} failed: {}", transport->rank(), describe(t, a), e.what());
    if (broken.empty()) broken = e.what();
    // Past a failure inside an exchange a peer may be stopped or gone: never wait for it again, teardown included.
    if (!dynamic_cast<const InvalidArgument*>(&e)) transport->abandon();
    if (auto* te = dynamic_cast<const TimeoutError*>(&e)) {
      // Name the rank at fault, not only the neighbour this rank waited for: ask who else gave up.
      return std::make_exception_ptr(
          TimeoutError(text + explain_timeout(*transport, listen_for_others()), te->pending_ranks()));
    }
    if (auto* fe = dynamic_cast<const TransportError*>(&e)) {
      if (fe->failed_ranks().empty()) return std::make_exception_ptr(TransportError(text));
      // A gone peer (UCX) may itself have left because of another: ask who else gave up, as for a timeout.
      return std::make_exception_ptr(
          TransportError(text + explain_timeout(*transport, listen_for_others()), fe->failed_ranks()));
    }
    if (dynamic_cast<const InvalidArgument*>(&e)) return std::make_exception_ptr(InvalidArgument(text));
    return std::make_exception_ptr(Error(text));
  }
}

void detail::CommunicatorImpl::progress_loop() {
  std::unique_lock lock(mutex);
  for (;;) {
    cv.wait(lock, [&] { return stopping || (!queue.empty() && !busy); });
    if (queue.empty()) return;  // stopping with nothing left
    Task t = std::move(queue.front());
    queue.pop_front();
    busy = true;
    lock.unlock();
    t.state->started = std::chrono::steady_clock::now();
    std::exception_ptr err = execute(t);
    lock.lock();
    busy = false;  // before finish(): whoever wait()s on this work may change the plan right away
    lock.unlock();
    t.state->finish(err, err ? what_of(err) : std::string());
    lock.lock();
    cv.notify_all();
  }
}

Work detail::CommunicatorImpl::submit(Task t) {
  t.state = std::make_shared<Work::State>();
  t.state->completions = completions;
  Work w(t.state);
  std::lock_guard lock(mutex);
  ++stats.calls;
  stats.bytes += t.count * dtype_size(t.dt);
  queue.push_back(std::move(t));
  cv.notify_all();
  return w;
}

void detail::CommunicatorImpl::run_sync(Task t) {
  std::unique_lock lock(mutex);
  if (!queue.empty() || busy) {
    lock.unlock();
    submit(std::move(t)).wait();
    return;
  }
  ++stats.calls;
  stats.bytes += t.count * dtype_size(t.dt);
  busy = true;
  lock.unlock();
  std::exception_ptr err = execute(t);
  lock.lock();
  busy = false;
  // Wake the progress thread only when it has something to do: a needless wake-up costs a context switch
  // (microseconds) on every small call.
  if (!queue.empty()) cv.notify_all();
  lock.unlock();
  if (err) std::rethrow_exception(err);
}

void detail::CommunicatorImpl::add_wire_bytes(std::size_t b) {
  std::lock_guard lock(mutex);
  stats.wire_bytes += b;
}

void detail::CommunicatorImpl::add_codec_seconds(double s) {
  std::lock_guard lock(mutex);
  stats.codec_s += s;
}

}  // namespace hopwise::comm
