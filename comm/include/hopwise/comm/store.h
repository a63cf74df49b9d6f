// The rendezvous interface: a key-value store every rank of a job can reach, through which ranks meet before any
// transport connects them (addresses, the NCCL unique id, layout fingerprints). Ways to meet: InProcessStore
// (ranks as threads), MpiStore (rank 0 of an MPI communicator serves; transports/mpi_store.h), TcpStore (rank 0
// serves an address; stores/tcp_store.h) and FileStore (a directory every rank sees; stores/file_store.h). The
// served ones share one meaning (comm/src/stores/store_protocol.h); tests/worlds.h runs the contract over each.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hopwise::comm {

class Store {
 public:
  using Seconds = std::chrono::duration<double>;
  virtual ~Store() = default;
  // Sets `key` to `value` (bytes), replacing any earlier value; wakes every rank waiting for it.
  virtual void set(const std::string& key, const std::string& value) = 0;
  // The value of `key`, waiting up to `timeout` for some rank to set it; TimeoutError naming the key otherwise.
  virtual std::string get(const std::string& key, Seconds timeout) = 0;
  // Waits until every key is set; TimeoutError naming the keys still missing.
  virtual void wait(const std::vector<std::string>& keys, Seconds timeout) = 0;
  // Adds `delta` to the integer at `key` (0 when unset) and returns the new value, atomically across ranks.
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;
  // Whether every key is set, without waiting.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // A transport meeting through this store gave up on a peer: a store whose teardown waits for every rank (MPI's:
  // MPI_Finalize) must not, or this process never exits.
  virtual void peer_lost() {}
};

// A store shared by the threads of one process (the in-process transport's ranks, tests).
class InProcessStore final : public Store {
 public:
  InProcessStore();
  ~InProcessStore() override;
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, Seconds timeout) override;
  void wait(const std::vector<std::string>& keys, Seconds timeout) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// Collective steps over any store, for bootstrapping. Every rank of the group makes the same calls in the same
// order with the same `name` (keys are "<name>/<rank>"); names must not repeat within one store.
// Every rank's `mine`, in rank order.
std::vector<std::string> store_allgather(Store& store, const std::string& name, int rank, int size,
                                         const std::string& mine, Store::Seconds timeout);
// `root`'s value on every rank (`value` is read on the root only).
std::string store_broadcast(Store& store, const std::string& name, int rank, int root, const std::string& value,
                            Store::Seconds timeout);

}  // namespace hopwise::comm
