#include "hopwise/comm/transports/inproc_transport.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "hopwise/common/error.h"

namespace hopwise::comm {

namespace {

struct Op {
  const void* send_buf = nullptr;
  void* recv_buf = nullptr;
  std::size_t bytes = 0;
  int src = 0, dst = 0, tag = 0;
  bool done = false;  // guarded by the destination mailbox's mutex
  std::string error;  // set on a size mismatch
};

// Everything addressed to one rank: sends not yet received and receives not yet matched, both in post order.
struct Mailbox {
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<Op*> unmatched_sends;
  std::deque<Op*> posted_recvs;
};

// Copies send -> recv and completes both. Caller holds the destination mailbox mutex.
void complete(Op* send, Op* recv) {
  if (send->bytes > recv->bytes) {
    recv->error = send->error = fmt::format(
        "message of {} bytes from rank {} (tag {}) overflows the {}-byte receive "
        "on rank {}; post receives at least as large as the sends",
        send->bytes, send->src, send->tag, recv->bytes, recv->dst);
  } else if (send->bytes != 0) {
    std::memcpy(recv->recv_buf, send->send_buf, send->bytes);
  }
  recv->bytes = send->bytes;
  send->done = recv->done = true;
}

}  // namespace

class InProcessWorld {
 public:
  static constexpr std::size_t kSlotBytes = 64 << 10;
  explicit InProcessWorld(int size)
      : boxes(static_cast<std::size_t>(size)),
        slots(static_cast<std::size_t>(size) * SharedSlots::slot_size(kSlotBytes) + 64) {}
  std::vector<Mailbox> boxes;
  std::vector<char> slots;  // every rank's shared slot, zeroed (flags start at 0)
};

std::shared_ptr<InProcessWorld> make_inprocess_world(int size) {
  if (size < 1) throw InvalidArgument(fmt::format("in-process world of {} ranks; use at least 1", size));
  return std::make_shared<InProcessWorld>(size);
}

InProcessTransport::InProcessTransport(std::shared_ptr<InProcessWorld> world, int rank)
    : world_(std::move(world)), rank_(rank) {
  if (rank < 0 || rank >= static_cast<int>(world_->boxes.size()))
    throw InvalidArgument(fmt::format("rank {} is outside the in-process world of {}", rank, world_->boxes.size()));
  char* first = world_->slots.data() + (64 - reinterpret_cast<std::uintptr_t>(world_->slots.data()) % 64);
  slots_.slot_bytes = InProcessWorld::kSlotBytes;
  for (std::size_t r = 0; r < world_->boxes.size(); ++r)
    slots_.base.push_back(first + r * SharedSlots::slot_size(InProcessWorld::kSlotBytes));
}

InProcessTransport::~InProcessTransport() = default;

int InProcessTransport::size() const { return static_cast<int>(world_->boxes.size()); }

Request InProcessTransport::isend(const void* buf, std::size_t bytes, int peer, int tag) {
  if (peer < 0 || peer >= size()) throw InvalidArgument(fmt::format("isend to rank {} of {}", peer, size()));
  count_sent(peer, bytes);
  auto* op = new Op{buf, nullptr, bytes, rank_, peer, tag};
  Mailbox& box = world_->boxes[static_cast<std::size_t>(peer)];
  bool matched = false;
  {
    std::lock_guard lock(box.mutex);
    auto it = std::find_if(box.posted_recvs.begin(), box.posted_recvs.end(),
                           [&](Op* r) { return r->src == rank_ && r->tag == tag; });
    if (it != box.posted_recvs.end()) {
      complete(op, *it);
      box.posted_recvs.erase(it);
      matched = true;
    } else {
      box.unmatched_sends.push_back(op);
    }
  }
  if (matched) box.cv.notify_all();
  return Request{reinterpret_cast<std::uint64_t>(op), peer, false, true};
}

Request InProcessTransport::irecv(void* buf, std::size_t bytes, int peer, int tag) {
  if (peer < 0 || peer >= size()) throw InvalidArgument(fmt::format("irecv from rank {} of {}", peer, size()));
  auto* op = new Op{nullptr, buf, bytes, peer, rank_, tag};
  Mailbox& box = world_->boxes[static_cast<std::size_t>(rank_)];
  bool matched = false;
  {
    std::lock_guard lock(box.mutex);
    auto it = std::find_if(box.unmatched_sends.begin(), box.unmatched_sends.end(),
                           [&](Op* s) { return s->src == peer && s->tag == tag; });
    if (it != box.unmatched_sends.end()) {
      complete(*it, op);
      box.unmatched_sends.erase(it);
      matched = true;
    } else {
      box.posted_recvs.push_back(op);
    }
  }
  if (matched) box.cv.notify_all();
  return Request{reinterpret_cast<std::uint64_t>(op), peer, true, true};
}

// Withdraws the unmatched ops of `reqs` from the mailboxes (so that no late peer writes into them) and frees
// every op; returns the peers that never answered, sorted.
std::vector<int> InProcessTransport::cancel_pending(std::span<Request> reqs) {
  std::vector<int> pending;
  for (Request& q : reqs) {
    if (!q.active) continue;
    auto* op = reinterpret_cast<Op*>(q.handle);
    Mailbox& box = world_->boxes[static_cast<std::size_t>(op->dst)];
    {
      std::lock_guard lock(box.mutex);
      if (!op->done) {
        pending.push_back(q.peer);
        auto& queue = q.is_recv ? box.posted_recvs : box.unmatched_sends;
        queue.erase(std::remove(queue.begin(), queue.end(), op), queue.end());
      }
    }
    delete op;
    q.active = false;
  }
  std::sort(pending.begin(), pending.end());
  pending.erase(std::unique(pending.begin(), pending.end()), pending.end());
  return pending;
}

// Every op completes under its destination's mailbox mutex and notifies that mailbox's condition variable,
// so a waiter sleeps on the destination box of the op it waits for.
void InProcessTransport::wait_all(std::span<Request> reqs) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout_);
  std::string error;
  for (Request& r : reqs) {
    if (!r.active) continue;
    auto* op = reinterpret_cast<Op*>(r.handle);
    Mailbox& box = world_->boxes[static_cast<std::size_t>(op->dst)];
    std::unique_lock lock(box.mutex);
    if (!box.cv.wait_until(lock, deadline, [&] { return op->done; })) {
      lock.unlock();
      const std::vector<int> pending = cancel_pending(reqs);
      throw TimeoutError(fmt::format("rank {} timed out after {:.1f} s waiting for rank(s) {}; a peer died, stalled or "
                                     "skipped this call (raise HOPWISE_TIMEOUT_S if it is only slow)",
                                     rank_, timeout_.count(), fmt::join(pending, ",")),
                         pending);
    }
    lock.unlock();
    if (!op->error.empty() && error.empty()) error = op->error;
    delete op;
    r.active = false;
  }
  if (!error.empty()) throw TransportError(error);
}

bool InProcessTransport::test(Request& r) {
  if (!r.active) return true;
  auto* op = reinterpret_cast<Op*>(r.handle);
  Mailbox& box = world_->boxes[static_cast<std::size_t>(op->dst)];
  {
    std::lock_guard lock(box.mutex);
    if (!op->done) return false;
  }
  wait(r);
  return true;
}

void InProcessTransport::cancel(Request& r) { cancel_pending(std::span<Request>(&r, 1)); }

void run_inprocess(int size, const std::function<void(Transport&)>& fn) {
  auto world = make_inprocess_world(size);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(size));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        InProcessTransport t(world, r);
        fn(t);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace hopwise::comm
