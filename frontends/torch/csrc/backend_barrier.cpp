// The backend's barrier, torch's monitored barrier, and coalescing groups. A barrier is rank 0 hearing from every
// rank within the timeout and answering each with who came, so that a rank that never arrives is named on every
// rank that did (gloo's monitored barrier names it on rank 0 only, and its plain barrier names no one).
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <memory>
#include <thread>

#include <c10/util/Exception.h>

#include "backend.h"
#include "translate.h"

namespace hopwise::torch_backend {

namespace {

constexpr int kBarrierReportTag = kFirstBackendTag + 3, kBarrierAnswerTag = kFirstBackendTag + 4;
using Clock = std::chrono::steady_clock;

// Polls `w` until it completes or `deadline` passes: true when complete, false when not; throws its error.
bool complete_by(comm::Work& w, Clock::time_point deadline) {
  for (;;) {
    if (w.test()) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

std::string seconds(std::chrono::milliseconds t) { return fmt::format("{:.1f} s", t.count() / 1000.0); }

[[noreturn]] void fail(const std::string& message) { C10_THROW_ERROR(DistBackendError, message); }

}  // namespace

std::chrono::milliseconds HopwiseBackend::timeout_of(std::chrono::milliseconds asked) const {
  return asked.count() > 0 ? asked : timeout_;  // torch's "unset" is negative
}

void HopwiseBackend::run_barrier(std::chrono::milliseconds timeout, bool wait_all_ranks, const char* what) {
  const int p = getSize(), me = getRank();
  int64_t number;
  {
    std::lock_guard lock(works_mutex_);
    number = static_cast<int64_t>(++barriers_);
  }
  if (p == 1) return;
  const auto deadline = Clock::now() + timeout;
  // Buffers live as long as their transfers, which may outlast a failed barrier (a late rank's report).
  auto keep = [](comm::Work& w, std::shared_ptr<std::vector<int64_t>> buf) {
    w.on_complete([buf](std::exception_ptr) {});
  };
  if (me != 0) {
    auto report = std::make_shared<std::vector<int64_t>>(1, number);
    auto answer = std::make_shared<std::vector<int64_t>>(static_cast<std::size_t>(p) + 1, 0);
    comm::Work sent =
        translated([&] { return comm_->send_async(report->data(), 1, DataType::kInt64, 0, kBarrierReportTag); });
    comm::Work heard = translated(
        [&] { return comm_->recv_async(answer->data(), answer->size(), DataType::kInt64, 0, kBarrierAnswerTag); });
    keep(sent, report);
    keep(heard, answer);
    // Rank 0 answers once it has heard from all or its own timeout passed: give its verdict time to arrive.
    const auto grace = std::chrono::milliseconds(std::chrono::seconds(5));
    bool answered = false;
    try {
      answered = complete_by(heard, deadline + grace);
    } catch (const std::exception& e) {
      fail(fmt::format("hopwise: {}: rank {} lost rank 0 while waiting for its answer: {}", what, me, e.what()));
    }
    if (!answered)
      fail(
          fmt::format("hopwise: {}: rank {} had no answer from rank 0 within {} (rank 0 not at the barrier, or "
                      "gone)",
                      what, me, seconds(timeout + grace)));
    std::vector<int> missing;
    for (int q = 0; q < p; ++q)
      if ((*answer)[static_cast<std::size_t>(q) + 1] == 0) missing.push_back(q);
    if (!missing.empty())
      fail(fmt::format("hopwise: {}: rank(s) {} of {} did not arrive within {} (rank 0 says; this is rank {})", what,
                       fmt::join(missing, ", "), p, seconds(timeout), me));
    if ((*answer)[0] != number)
      fail(
          fmt::format("hopwise: {}: rank 0 is at barrier #{}, rank {} at #{}: the ranks called different "
                      "collectives",
                      what, (*answer)[0], me, number));
    return;
  }
  // Rank 0: hear from every rank by the deadline (with wait_all_ranks false, gloo's fail-fast: from the first
  // missing rank in rank order on, the rest are not waited for).
  std::vector<std::shared_ptr<std::vector<int64_t>>> reports(static_cast<std::size_t>(p));
  std::vector<comm::Work> heard(static_cast<std::size_t>(p));
  for (int q = 1; q < p; ++q) {
    auto& r = reports[static_cast<std::size_t>(q)];
    r = std::make_shared<std::vector<int64_t>>(1, 0);
    heard[static_cast<std::size_t>(q)] =
        translated([&] { return comm_->recv_async(r->data(), 1, DataType::kInt64, q, kBarrierReportTag); });
    keep(heard[static_cast<std::size_t>(q)], r);
  }
  std::vector<int64_t> came(static_cast<std::size_t>(p) + 1, 0);
  came[0] = number;
  came[1] = 1;
  std::vector<int> missing;
  std::vector<std::string> why;
  for (int q = 1; q < p; ++q) {
    bool arrived = false;
    if (wait_all_ranks || missing.empty()) {
      try {
        arrived = complete_by(heard[static_cast<std::size_t>(q)], deadline);
      } catch (const std::exception& e) {
        why.push_back(fmt::format("rank {}: {}", q, e.what()));
      }
    }
    if (arrived && (*reports[static_cast<std::size_t>(q)])[0] != number) {
      why.push_back(fmt::format("rank {} is at barrier #{}, rank 0 at #{}", q,
                                (*reports[static_cast<std::size_t>(q)])[0], number));
      arrived = false;
    }
    came[static_cast<std::size_t>(q) + 1] = arrived ? 1 : 0;
    if (!arrived) missing.push_back(q);
  }
  // Every rank that came hears who did, so that each of them can name the missing ones too.
  std::vector<comm::Work> answers;
  auto answer = std::make_shared<std::vector<int64_t>>(came);
  for (int q = 1; q < p; ++q)
    if (came[static_cast<std::size_t>(q) + 1]) {
      answers.push_back(translated(
          [&] { return comm_->send_async(answer->data(), answer->size(), DataType::kInt64, q, kBarrierAnswerTag); }));
      keep(answers.back(), answer);
    }
  if (!missing.empty()) {
    // Fail-fast names the first rank that did not come; the ranks after it were not waited for.
    const bool first_only = !wait_all_ranks && missing.size() > 1;
    const std::vector<int> named = first_only ? std::vector<int>{missing[0]} : missing;
    fail(fmt::format("hopwise: {}: rank(s) {} of {} did not arrive within {}{}{}", what, fmt::join(named, ", "), p,
                     seconds(timeout), first_only ? " (the first; wait_all_ranks=True waits for and names all)" : "",
                     why.empty() ? "" : fmt::format(" ({})", fmt::join(why, "; "))));
  }
  for (auto& a : answers) {
    try {
      complete_by(a, deadline + std::chrono::seconds(5));
    } catch (const std::exception& e) {
      fail(fmt::format("hopwise: {}: rank 0 could not answer a rank: {}", what, e.what()));
    }
  }
}

c10::intrusive_ptr<c10d::Work> HopwiseBackend::barrier(const c10d::BarrierOptions& opts) {
  std::vector<c10::intrusive_ptr<HopwiseWork>> before;
  {
    std::lock_guard lock(works_mutex_);
    for (const auto& w : recent_)
      if (!w->isCompleted() && !w->abandoned()) before.push_back(w);
  }
  auto work = make_work(c10d::OpType::BARRIER, "hopwise:barrier", {});
  const auto timeout = timeout_of(opts.timeout);
  run_detached([this, work, before = std::move(before), timeout] {
    std::exception_ptr error;
    try {
      for (const auto& w : before) w->wait(timeout);  // its error is the barrier's too (as in gloo)
      run_barrier(timeout, /*wait_all_ranks=*/true, "barrier");
    } catch (...) {
      error = std::current_exception();
    }
    work->complete(error);
  });
  return work;
}

void HopwiseBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  run_barrier(timeout_of(opts.timeout), wait_all_ranks, "monitored_barrier");
}

void HopwiseBackend::startCoalescing() {
  std::lock_guard lock(works_mutex_);
  TORCH_CHECK(!coalescing_, "hopwise: startCoalescing while coalescing already (nested coalescing managers?)");
  coalescing_ = true;
  coalesced_.clear();
}

c10::intrusive_ptr<c10d::Work> HopwiseBackend::endCoalescing() {
  std::vector<c10::intrusive_ptr<HopwiseWork>> parts;
  {
    std::lock_guard lock(works_mutex_);
    TORCH_CHECK(coalescing_, "hopwise: endCoalescing without startCoalescing");
    coalescing_ = false;
    parts = std::exchange(coalesced_, {});
  }
  std::erase_if(parts, [](const auto& w) { return w->abandoned(); });
  auto work = make_work(c10d::OpType::COALESCED, "hopwise:coalesced", {});
  complete_after(std::vector<c10::intrusive_ptr<c10d::Work>>(parts.begin(), parts.end()), work);
  return work;
}

}  // namespace hopwise::torch_backend
