// The store over MPI: rank 0 of the communicator keeps the keys and a thread of its serves the other ranks'
// requests (point-to-point on a duplicate of the communicator, so they never meet the caller's messages). It
// lives as long as rank 0's MpiStore: every rank's last store call must come before rank 0 destroys it, which the
// collective steps built on it (store_allgather, store_broadcast) guarantee.
#pragma once

#include <mpi.h>

#include <atomic>
#include <memory>
#include <thread>

#include "hopwise/comm/store.h"
#include "hopwise/comm/transports/mpi_transport.h"

namespace hopwise::comm {

class MpiStore final : public Store {
 public:
  // Collective over `comm` (duplicated); initializes MPI if the caller has not. `reply_timeout` bounds set, check
  // and add: MPI cannot tell that rank 0 died, so a rank probing the store for a lost peer's mark must not wait
  // longer than the job's timeout for an answer that will never come.
  explicit MpiStore(MPI_Comm comm = MPI_COMM_WORLD, Seconds reply_timeout = Seconds(300));
  ~MpiStore() override;
  MpiStore(const MpiStore&) = delete;
  MpiStore& operator=(const MpiStore&) = delete;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, Seconds timeout) override;
  void wait(const std::vector<std::string>& keys, Seconds timeout) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  // A peer is lost: rank 0 may be the rank that is gone, so from now on set, check and add wait kReplyAfterLoss at
  // most (a live server answers within milliseconds), and once one of them goes unanswered the rest fail at once.
  void peer_lost() override {
    lost_ = true;
    mpi_peer_lost();
  }
  static constexpr Seconds kReplyAfterLoss{2.0};

  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  struct Server;
  std::string call(int op, const std::vector<std::string>& keys, const std::string& value, std::int64_t delta,
                   Seconds timeout);
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::unique_ptr<Server> server_;     // rank 0 only
  std::atomic<std::uint64_t> seq_{0};  // numbers the requests (their reply tags)
  Seconds reply_timeout_;
  std::atomic<bool> lost_{false};    // peer_lost() was called
  std::atomic<bool> silent_{false};  // a set, check or add went unanswered: rank 0 is gone
};

}  // namespace hopwise::comm
