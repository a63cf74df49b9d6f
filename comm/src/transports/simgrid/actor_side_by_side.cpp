// Actors for the parts of a call on a simulated rank (actor_side_by_side.h).
#include "actor_side_by_side.h"

#include <fmt/core.h>

#include <exception>
#include <simgrid/s4u.hpp>

namespace hopwise::comm::sim {

namespace s4u = simgrid::s4u;

namespace {

// SimGrid's mutex and condition variable block an actor in simulated time and hand the thread to the others.
class ActorProgress final : public algo::PartProgress {
 public:
  explicit ActorProgress(int counters) : done_(static_cast<std::size_t>(counters), 0) {}
  void advance(int counter) override {
    const std::unique_lock lock(*mu_);
    ++done_[static_cast<std::size_t>(counter)];
    cv_->notify_all();
  }
  bool wait_past(int counter, std::size_t value) override {
    std::unique_lock lock(*mu_);
    while (!failed_ && done_[static_cast<std::size_t>(counter)] <= value) cv_->wait(lock);
    return !failed_;
  }
  void fail() override {
    const std::unique_lock lock(*mu_);
    failed_ = true;
    cv_->notify_all();
  }
  bool failed() override { return failed_; }  // one OS thread, switched only inside SimGrid's calls

 private:
  s4u::MutexPtr mu_ = s4u::Mutex::create();
  s4u::ConditionVariablePtr cv_ = s4u::ConditionVariable::create();
  std::vector<std::size_t> done_;
  bool failed_ = false;
};

class Actors final : public algo::SideBySide {
 public:
  void run(const std::vector<std::function<void()>>& parts) override {
    s4u::Actor* self = s4u::Actor::self();
    std::vector<s4u::ActorPtr> others;
    std::vector<std::exception_ptr> errors(parts.size());
    for (std::size_t i = 1; i < parts.size(); ++i)
      others.push_back(s4u::Actor::create(fmt::format("{}/part{}", self->get_name(), i), self->get_host(), [&, i] {
        try {  // never out of an actor: SimGrid would end the process
          parts[i]();
        } catch (...) {
          errors[i] = std::current_exception();
        }
      }));
    if (!parts.empty()) parts[0]();
    for (const s4u::ActorPtr& a : others) a->join();
    for (const auto& e : errors)
      if (e) std::rethrow_exception(e);
  }
  std::unique_ptr<algo::PartProgress> progress(int counters) override {
    return std::make_unique<ActorProgress>(counters);
  }
};

}  // namespace

algo::SideBySide& actors_side_by_side() {
  static Actors actors;
  return actors;
}

}  // namespace hopwise::comm::sim
