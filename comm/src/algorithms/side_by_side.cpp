// OS threads for the parts of a call (side_by_side.h).
#include "side_by_side.h"

#include <condition_variable>
#include <mutex>
#include <thread>

namespace hopwise::comm::algo {

namespace {

class ThreadProgress final : public PartProgress {
 public:
  explicit ThreadProgress(int counters) : done_(static_cast<std::size_t>(counters), 0) {}
  void advance(int counter) override {
    {
      std::lock_guard lock(mu_);
      ++done_[static_cast<std::size_t>(counter)];
    }
    cv_.notify_all();
  }
  bool wait_past(int counter, std::size_t value) override {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return failed_ || done_[static_cast<std::size_t>(counter)] > value; });
    return !failed_;
  }
  void fail() override {
    {
      std::lock_guard lock(mu_);
      failed_ = true;
    }
    cv_.notify_all();
  }
  bool failed() override {
    std::lock_guard lock(mu_);
    return failed_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::size_t> done_;
  bool failed_ = false;
};

class Threads final : public SideBySide {
 public:
  void run(const std::vector<std::function<void()>>& parts) override {
    std::vector<std::thread> threads;
    for (std::size_t i = 1; i < parts.size(); ++i) threads.emplace_back(parts[i]);
    if (!parts.empty()) parts[0]();
    for (auto& t : threads) t.join();
  }
  std::unique_ptr<PartProgress> progress(int counters) override { return std::make_unique<ThreadProgress>(counters); }
};

thread_local SideBySide* chosen = nullptr;

}  // namespace

SideBySide& side_by_side() {
  static Threads threads;
  return chosen != nullptr ? *chosen : threads;
}

void set_side_by_side(SideBySide* way) { chosen = way; }

}  // namespace hopwise::comm::algo
