// The shared slots of one host's ranks in POSIX shared memory, for transports without a shared window of their
// own (UCX): each rank creates its slot as a shm_open segment, the ranks exchange the names through the store,
// map every slot, and unlink their own once all have mapped it (so nothing is left in /dev/shm after the job).
#pragma once

#include <string>
#include <vector>

#include "hopwise/comm/store.h"
#include "hopwise/comm/transport.h"

namespace hopwise::comm {

class PosixSlots {
 public:
  // Collective over the ranks of `store` (all on this host); keys "<name>/...".
  PosixSlots(Store& store, const std::string& name, int rank, int size, std::size_t slot_bytes, Store::Seconds timeout);
  ~PosixSlots();
  PosixSlots(const PosixSlots&) = delete;
  PosixSlots& operator=(const PosixSlots&) = delete;
  SharedSlots& slots() { return slots_; }

 private:
  SharedSlots slots_;
  std::vector<std::size_t> lengths_;
};

}  // namespace hopwise::comm
