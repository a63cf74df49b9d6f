// Processes without MPI (torchrun, a test harness): point-to-point over UCX (the engine under Open MPI's pml ucx
// and UCC). The ranks meet through a Store: each publishes its host identity and its worker addresses there, then
// connects to every peer. Peers on this host are reached by a worker that may use shared memory and CMA; peers on
// other hosts by a worker limited to TCP, so that hosts emulated on one machine (network namespaces sharing
// /dev/shm and the kernel) never take a shortcut a real network does not have. When every rank is on this host,
// the shared slots of `direct` and `shm` live in POSIX shared memory.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "hopwise/comm/store.h"
#include "hopwise/comm/transport.h"

namespace hopwise::comm {

// What tells hosts apart: the host name, and the network namespace and boot (so that emulated hosts, each in a
// namespace of its own, are different hosts even if named alike).
std::string host_identity();

class UcxTransport final : public Transport {
 public:
  // Collective over the `size` ranks meeting through `store` under `name` (keys "<name>/..."; each transport of
  // a job needs a name of its own, and every rank must give the same one). Waits up to `timeout` for every rank
  // to arrive (TimeoutError naming the missing ranks). Keeps `store` until destroyed, so that a rank serving it
  // outlives every other rank's use of it.
  UcxTransport(std::shared_ptr<Store> store, int rank, int size, std::string name = "hopwise/ucx",
               std::chrono::duration<double> timeout = std::chrono::seconds(300));
  ~UcxTransport() override;
  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "ucx"; }
  Request isend(const void* buf, std::size_t bytes, int peer, int tag) override;
  Request irecv(void* buf, std::size_t bytes, int peer, int tag) override;
  void wait_all(std::span<Request> reqs) override;
  bool test(Request& r) override;
  void cancel(Request& r) override;
  std::optional<int> probe_any(int tag) override;
  bool has_probe() const override { return true; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  int host_id() const override { return host_ids_[static_cast<std::size_t>(rank_)]; }
  SharedSlots* shared_slots() override;
  void progress() override;
  bool peer_gone(int peer) const override;
  std::optional<std::vector<int>> ranks_that_gave_up(std::chrono::duration<double> listen) override;
  void abandon() override;
  void declare_lost(int peer) override;

  // The host of rank `peer` (host ids count from 0 in rank order).
  int host_of(int peer) const { return host_ids_.at(static_cast<std::size_t>(peer)); }
  // The UCX transports each peer is reached by (e.g. "posix/memory cma/memory" or "tcp/eth0"), for logs and tests.
  std::string lanes(int peer) const;

  struct State;

 private:
  void meet(Store& store, const std::string& name, std::chrono::duration<double> timeout);
  int settle(Request& r, std::string& error);  // a ucs_status_t
  int first_to_give_up();                      // a peer that abandoned this transport, or -1
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  std::vector<int> host_ids_;
  std::unique_ptr<State> s_;
};

}  // namespace hopwise::comm
