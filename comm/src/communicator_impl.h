// Inside the host Communicator: the queued call (Task), the progress queue that runs them in call order, the
// dispatch through the algorithm table, and the plan. Split by concern: progress.cpp (queue, errors, link
// emulation), dispatch.cpp (choosing and running an algorithm), communicator.cpp (the public methods and the
// plan), compressed/ (composite calls built from plain collectives).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "call_stamps.h"
#include "collective_check.h"
#include "completion_thread.h"
#include "hopwise/comm/communicator.h"
#include "plan_state.h"
#include "tuner/tuner.h"
#include "workspace.h"

namespace hopwise::comm {

// One call, as queued: its arguments and the Work it completes.
struct Task {
  Collective kind = Collective::kBarrier;
  const void* in = nullptr;
  void* out = nullptr;
  std::size_t count = 0;
  DataType dt = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  std::shared_ptr<Work::State> state;
  // A composite call (a compressed allreduce, PowerSGD): runs on the progress thread in call order and issues
  // plain collectives through detail::CommunicatorImpl::run_nested. `compression` names what it compresses with (for
  // HOPWISE_DEBUG=CHECK and errors); `extra` is added to the error's description.
  std::function<void(detail::CommunicatorImpl&)> job;
  std::string compression, extra;
  bool within_host = false;  // allreduce_within_host: no emulated inter-host link
};

struct detail::CommunicatorImpl {
  std::unique_ptr<Transport> transport;
  Options options;
  Workspace workspace;
  CostModel cost;
  detail::PlanState plan;
  std::atomic<Algorithm> forced{Algorithm::kAuto};
  CollectiveCheck check;  // options.check: every rank's call compared before it runs
  // options.stamp_calls: each run goes through `stamped` under the current task's stamp (call_stamps.h).
  std::unique_ptr<StampedTransport> stamped;
  CallStamp task_stamp;     // the task being executed; `part` counts its runs
  std::uint64_t tasks = 0;  // tasks executed so far: the stamps' call numbers

  std::mutex mutex;
  std::condition_variable cv;
  std::deque<Task> queue;
  bool busy = false, stopping = false;
  std::string broken;  // the first error: later calls fail fast instead of joining a half-finished exchange
  CollectiveStats stats;
  std::thread progress;
  // Runs the Work callbacks (Work::on_complete) off the progress thread, so that a callback may issue and wait
  // for a new collective on this communicator.
  std::shared_ptr<CompletionThread> completions = std::make_shared<CompletionThread>();

  int p() const { return transport->size(); }
  // The ring's sends in flight at most (HOPWISE_RING_WINDOW; by default 1 where the plan spans hosts, else no limit).
  std::size_t ring_send_window() const {
    return options.ring_window >= 0 ? static_cast<std::size_t>(options.ring_window) : plan.hosts() > 1 ? 1 : 0;
  }

  // ---- progress.cpp ----
  std::string describe(const Task& t, Algorithm a) const;
  double wire_seconds(const Task& t) const;
  // How long a rank that gave up listens for the others' notes before naming the silent ones.
  std::chrono::duration<double> listen_for_others() const;
  // Runs one task; returns its error (naming rank, collective, sizes and algorithm), or null.
  std::exception_ptr execute(Task& t);
  void progress_loop();
  Work submit(Task t);
  // A sync call: runs right here when nothing is queued, else queues behind the earlier async calls and waits.
  void run_sync(Task t);
  void add_wire_bytes(std::size_t b);
  void add_codec_seconds(double s);

  // Measured choices (online tuning, HOPWISE_TUNING_FILE); null with HOPWISE_TUNE=0 and no file.
  std::unique_ptr<detail::Tuner> tuner;

  // ---- dispatch.cpp ----
  // What runs a call, and whether the tuner chose it (its time is then recorded under `key`).
  struct Selected {
    TuningChoice choice;
    bool tuned = false;
    bool trial = false;  // a candidate under trial: the ranks line up before it
    double step = 0;     // its place in the tuner's schedule, compared across the ranks as they line up
    detail::TuneKey key{};
  };
  CostQuery query(Collective c, std::size_t bytes) const;         // the cost model's question for a call
  Algorithm model_choice(Collective c, std::size_t bytes) const;  // the cost model's pick
  // What algorithm_for reports: forced, else the tuner's decided choice, else the cost model's.
  Algorithm choose(Collective c, std::size_t bytes, DataType dt) const;
  // What the next call runs: forced, else the tuner's (a candidate under trial, or the decided one), else the
  // cost model's. Every rank calls it at the same calls (the tuner may agree with the others first).
  Selected select(Collective c, std::size_t count, DataType dt);
  std::vector<TuningChoice> candidates(Collective c, std::size_t bytes) const;
  void agree_max(std::vector<double>& v);  // elementwise max over the ranks (small; the cost model's algorithm)
  JobShape job_shape() const;
  void run(Task& t, const TuningChoice& choice);
  // run(), timed for the tuner where it chose.
  void run_selected(Task& t, const Selected& s);
  // Runs a plain collective right here (on the thread already executing a task: no queue).
  void run_nested(Collective kind, const void* in, void* out, std::size_t count, DataType dt, ReduceOp op);
  std::vector<float> scratch_scales;  // the compressed allreduce's agreed scales
};

}  // namespace hopwise::comm
