// The backend's barrier, torch's monitored barrier, and coalescing groups. A barrier is rank 0 hearing from every
// rank within the timeout and answering each with who came, so that a rank that never arrives is named on every
// rank that did (gloo's monitored barrier names it on rank 0 only, and its plain barrier names no one). The
// failures read as gloo's where torch's tests match them: a plain barrier's say " Timed out " (torch's regex
// " (Timed out|closed|timeout) "), a monitored barrier's "Rank R failed to pass monitoredBarrier in T ms" (rank 0),
// "Ranks R, S failed ..." (wait_all_ranks), "Rank 0 timed out in monitoredBarrier after T ms" (rank 0's time ran out
// before a rank's turn) and "Rank R successfully reached monitoredBarrier, but received errors while waiting for
// send/recv from rank 0" (the others); each goes on to name every missing rank it knows of.
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <memory>
#include <string_view>
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

// torch's "no timeout given" (c10d's kUnsetTimeout): the group's applies. Any other value is the caller's, 0 and
// below included (already past: gloo fails such a monitored barrier at once).
constexpr std::chrono::milliseconds kUnsetTimeout{-1};

[[noreturn]] void fail(const std::string& message) { C10_THROW_ERROR(DistBackendError, message); }

}  // namespace

std::chrono::milliseconds HopwiseBackend::timeout_of(std::chrono::milliseconds asked) const {
  return asked == kUnsetTimeout ? timeout_ : std::max(asked, std::chrono::milliseconds(0));
}

void HopwiseBackend::run_barrier(std::chrono::milliseconds timeout, bool wait_all_ranks, const char* what) {
  const int p = getSize(), me = getRank();
  const bool monitored = std::string_view(what) == "monitored_barrier";
  // What a rank other than 0 says before the reason (torch's tests match gloo's words for a monitored barrier).
  const std::string not_passed =
      monitored ? fmt::format(
                      "Rank {} successfully reached monitoredBarrier, but received errors while waiting for "
                      "send/recv from rank 0: ",
                      me)
                : std::string();
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
      fail(fmt::format("hopwise: {}: {}rank {} lost rank 0 while waiting for its answer: {}", what, not_passed, me,
                       e.what()));
    }
    if (!answered)
      fail(fmt::format(
          "hopwise: {}: {}Timed out after {}: rank {} had no answer from rank 0 (rank 0 not at the barrier, gone, "
          "or it failed the barrier over a rank before this one)",
          what, not_passed, seconds(timeout + grace), me));
    std::vector<int> missing;
    for (int q = 0; q < p; ++q)
      if ((*answer)[static_cast<std::size_t>(q) + 1] == 0) missing.push_back(q);
    if (!missing.empty())
      fail(monitored ? fmt::format("hopwise: {}: {}rank 0 says rank(s) {} of {} did not arrive within {}", what,
                                   not_passed, fmt::join(missing, ", "), p, seconds(timeout))
                     : fmt::format("hopwise: {}: Timed out after {}: rank(s) {} of {} did not arrive (rank 0 says; "
                                   "this is rank {})",
                                   what, seconds(timeout), fmt::join(missing, ", "), p, me));
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
  int out_of_time = -1;  // fail-fast: the rank whose turn came after rank 0's time had run out
  for (int q = 1; q < p; ++q) {
    bool arrived = false;
    try {
      if (wait_all_ranks || (missing.empty() && out_of_time < 0)) {
        // gloo's fail-fast checks the time left before each rank's turn; a timeout of 0 fails at once.
        if (!wait_all_ranks && Clock::now() >= deadline && !heard[static_cast<std::size_t>(q)].test())
          out_of_time = q;
        else
          arrived = complete_by(heard[static_cast<std::size_t>(q)], deadline);
      } else {
        // Not waited for (fail-fast): its report counts where it is in already.
        arrived = heard[static_cast<std::size_t>(q)].test();
      }
    } catch (const std::exception& e) {
      why.push_back(fmt::format("rank {}: {}", q, e.what()));
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
    const std::string causes = why.empty() ? "" : fmt::format(" ({})", fmt::join(why, "; "));
    if (!monitored)
      fail(fmt::format("hopwise: {}: Timed out after {}: rank(s) {} of {} did not arrive{}", what, seconds(timeout),
                       fmt::join(missing, ", "), p, causes));
    const std::vector<int> rest(missing.begin() + 1, missing.end());
    if (out_of_time > 0)
      fail(
          fmt::format("hopwise: {}: Rank 0 timed out in monitoredBarrier after {} ms: its time ran out before rank "
                      "{}'s turn; rank(s) {} of {} had not arrived{}",
                      what, timeout.count(), out_of_time, fmt::join(missing, ", "), p, causes));
    if (wait_all_ranks)
      fail(fmt::format("hopwise: {}: Ranks {} failed to pass monitoredBarrier in {} ms{}", what,
                       fmt::join(missing, ", "), timeout.count(), causes));
    // Fail-fast waits for the first rank that did not come; the ranks after it were not waited for.
    fail(fmt::format("hopwise: {}: Rank {} failed to pass monitoredBarrier in {} ms{}{}", what, missing[0],
                     timeout.count(),
                     rest.empty() ? ""
                                  : fmt::format("; rank(s) {} had not arrived either (not waited for: "
                                                "wait_all_ranks=True waits for and names every rank)",
                                                fmt::join(rest, ", ")),
                     causes));
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
      // Its error is the barrier's too (as in gloo). Work::wait takes 0 ms for "no timeout": 1 ms at least.
      for (const auto& w : before) w->wait(std::max(timeout, std::chrono::milliseconds(1)));
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
