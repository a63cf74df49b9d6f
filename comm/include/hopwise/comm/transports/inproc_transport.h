// N ranks as threads of one process: fast, deterministic tests and simulations of up to 64 (or more) ranks.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "hopwise/comm/transport.h"

namespace hopwise::comm {

class InProcessWorld;

class InProcessTransport final : public Transport {
 public:
  InProcessTransport(std::shared_ptr<InProcessWorld> world, int rank);
  ~InProcessTransport() override;

  int rank() const override { return rank_; }
  int size() const override;
  std::string name() const override { return "inproc"; }
  Request isend(const void* buf, std::size_t bytes, int peer, int tag) override;
  Request irecv(void* buf, std::size_t bytes, int peer, int tag) override;
  void wait_all(std::span<Request> reqs) override;
  bool test(Request& r) override;
  void cancel(Request& r) override;
  SharedSlots* shared_slots() override { return &slots_; }

 private:
  std::vector<int> cancel_pending(std::span<Request> reqs);
  std::shared_ptr<InProcessWorld> world_;
  int rank_;
  SharedSlots slots_;
};

// The shared mailboxes of one in-process world.
std::shared_ptr<InProcessWorld> make_inprocess_world(int size);

// Runs fn(transport) on `size` threads, one per rank, and rethrows the first exception any rank threw.
void run_inprocess(int size, const std::function<void(Transport&)>& fn);

}  // namespace hopwise::comm
