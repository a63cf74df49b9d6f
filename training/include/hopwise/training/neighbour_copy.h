// In-memory redundancy for elastic training (HOPWISE_ELASTIC=shrink): each member sends the state its step started
// from to its ring successor (the next member in rank order), which keeps the last complete copy. When a member is
// lost, its successor still holds what it had, so that nothing needs a disk checkpoint (Gemini's idea, with one
// copy). Under synchronous data parallelism every rank holds the same state and no copy is needed; under an
// averaging method (local SGD, gossip, async) the ranks' models differ between averagings and the copy is what
// lets the survivors average the lost rank's progress in (train_mnist does; README "When a rank dies").
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "hopwise/comm/communicator.h"
#include "hopwise/comm/work.h"

namespace hopwise::comm {

class NeighbourCopy {
 public:
  // `count` floats of state per member; `tag` the point-to-point tag the copies travel under.
  explicit NeighbourCopy(std::size_t count, int tag = 7001);
  ~NeighbourCopy();  // waits for what is in flight (errors ignored), so nothing lands in freed memory
  NeighbourCopy(const NeighbourCopy&) = delete;
  NeighbourCopy& operator=(const NeighbourCopy&) = delete;

  // Starts sending `mine` (as of `step`) to this rank's successor in `comm` and receiving its predecessor's.
  // `ids` names each rank of `comm` (an elastic group's members), so that the copy held says whose it is. `mine`
  // must stay unchanged until settle(). A single rank keeps nothing.
  void start(Communicator& comm, const float* mine, std::int64_t step, const std::vector<int>& ids);
  // Waits for both; the copy received becomes the one held. Throws the communicator's error where a peer failed;
  // the copy held is then the previous complete one.
  void settle();
  // After a failure, before the communicator goes: waits out (and ignores) what is in flight.
  void abandon();

  bool holds() const { return held_id_ >= 0; }
  int held_id() const { return held_id_; }               // whose copy is held (-1: none)
  std::int64_t held_step() const { return held_step_; }  // the step it was sent at
  const float* held() const { return held_.data(); }
  std::size_t count() const { return count_; }

 private:
  std::size_t count_;
  int tag_;
  std::vector<float> held_, incoming_;
  int held_id_ = -1, incoming_id_ = -1;
  std::int64_t held_step_ = -1, incoming_step_ = -1;
  Work send_, recv_;
};

}  // namespace hopwise::comm
