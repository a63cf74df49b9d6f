#include "work.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include <c10/util/Exception.h>

namespace hopwise::torch_backend {

namespace {

// Never destroyed: torch may complete a future while the interpreter exits, and a pool thread must not outlive
// the mutex it waits on. Idle threads end after a while, so the pool is as large as the most completions ever
// waiting at once, and no larger for long.
class Pool {
 public:
  void run(std::function<void()> fn) {
    std::unique_lock lock(mutex_);
    tasks_.push_back(std::move(fn));
    if (idle_ >= tasks_.size()) {
      cv_.notify_one();
      return;
    }
    lock.unlock();
    std::thread([this] { work(); }).detach();
  }

 private:
  void work() {
    std::unique_lock lock(mutex_);
    for (;;) {
      if (tasks_.empty()) {
        ++idle_;
        const bool woken = cv_.wait_for(lock, std::chrono::seconds(30), [this] { return !tasks_.empty(); });
        --idle_;
        if (!woken) return;
      }
      auto fn = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      fn();
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::size_t idle_ = 0;
};

Pool& pool() {
  static Pool* p = new Pool;
  return *p;
}

}  // namespace

void run_detached(std::function<void()> fn) { pool().run(std::move(fn)); }

HopwiseWork::HopwiseWork(int rank, c10d::OpType type, const char* title, std::vector<at::Tensor> outputs,
                         std::vector<c10::Device> devices)
    : c10d::Work(rank, type, title),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                       std::move(devices))) {}

int HopwiseWork::sourceRank() const {
  TORCH_CHECK(source_rank_ >= 0, "hopwise: sourceRank() is known only for a completed recvAnysource");
  return source_rank_;
}

namespace {
thread_local const Sequencer* completing = nullptr;  // whose completion this thread runs
}

void HopwiseWork::complete(std::exception_ptr e) {
  // The future first (its callbacks run here), then the Work: once wait() returns, the future holds its value.
  const Sequencer* outer = completing;
  completing = sequencer_;
  if (e)
    future_->setError(e);
  else
    future_->markCompleted(c10::IValue(outputs_));
  finish(e);
  completing = outer;
  if (sequencer_) sequencer_->done();
}

bool Sequencer::completing_here() const { return completing == this; }

void Sequencer::launch(const c10::intrusive_ptr<HopwiseWork>& work, std::function<std::vector<comm::Work>()> start,
                       std::function<void(std::exception_ptr)> then) {
  work->set_sequencer(this);
  if (tracker_) tracker_(work);
  const auto called = std::chrono::steady_clock::now();
  std::unique_lock lock(mutex_);
  if (!completing_here() && (open_ > 0 || !held_.empty())) {
    held_.push_back([this, called, work, start = std::move(start), then = std::move(then)] {
      std::vector<comm::Work> works;
      try {
        works = start();
      } catch (...) {
        work->complete(std::current_exception());
        return;
      }
      log(called, works);
      complete_after(std::move(works), work, then);
    });
    return;
  }
  ++open_;
  lock.unlock();
  std::vector<comm::Work> works;
  try {
    works = start();
  } catch (...) {
    work->abandon();
    done();
    throw;
  }
  log(called, works);
  complete_after(std::move(works), work, std::move(then));
}

void Sequencer::set_logging(bool on) {
  std::lock_guard lock(log_mutex_);
  logging_ = on;
  log_.clear();
}

std::vector<Sequencer::Logged> Sequencer::take_log() {
  std::lock_guard lock(log_mutex_);
  return std::exchange(log_, {});
}

void Sequencer::log(std::chrono::steady_clock::time_point called, const std::vector<comm::Work>& works) {
  std::lock_guard lock(log_mutex_);
  if (logging_ && !works.empty()) log_.push_back({called, works});
}

void Sequencer::done() {
  std::unique_lock lock(mutex_);
  --open_;
  if (open_ > 0 || held_.empty()) return;
  auto next = std::move(held_.front());
  held_.pop_front();
  ++open_;
  lock.unlock();
  next();
}

namespace {

// Counts down the parts of a call; the last one to finish runs `then` and completes the torch work, on a pool thread.
struct Join {
  std::atomic<std::size_t> left;
  std::mutex mutex;
  std::exception_ptr error;
  c10::intrusive_ptr<HopwiseWork> work;
  std::function<void(std::exception_ptr)> then;

  void finish() {
    std::exception_ptr e = error;
    if (then) {
      try {
        then(e);
      } catch (...) {
        if (!e) e = std::current_exception();
      }
    }
    work->complete(e);
  }
  static void part_done(const std::shared_ptr<Join>& join, std::exception_ptr e) {
    if (e) {
      std::lock_guard lock(join->mutex);
      if (!join->error) join->error = e;
    }
    if (--join->left == 0) run_detached([join] { join->finish(); });
  }
};

std::shared_ptr<Join> make_join(std::size_t parts, c10::intrusive_ptr<HopwiseWork> work,
                                std::function<void(std::exception_ptr)> then) {
  auto join = std::make_shared<Join>();
  join->left = parts;
  join->work = std::move(work);
  join->then = std::move(then);
  if (parts == 0) run_detached([join] { join->finish(); });
  return join;
}

}  // namespace

void complete_after(std::vector<comm::Work> works, c10::intrusive_ptr<HopwiseWork> work,
                    std::function<void(std::exception_ptr)> then) {
  auto join = make_join(works.size(), std::move(work), std::move(then));
  for (auto& w : works) w.on_complete([join](std::exception_ptr e) { Join::part_done(join, e); });
}

void complete_after(const std::vector<c10::intrusive_ptr<c10d::Work>>& parts, c10::intrusive_ptr<HopwiseWork> work,
                    std::function<void(std::exception_ptr)> then) {
  auto join = make_join(parts.size(), std::move(work), std::move(then));
  for (const auto& part : parts)
    part->getFuture()->addCallback(
        [join](c10::ivalue::Future& f) { Join::part_done(join, f.hasError() ? f.exception_ptr() : nullptr); });
}

}  // namespace hopwise::torch_backend
