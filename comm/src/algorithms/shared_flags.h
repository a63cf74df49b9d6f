// Sequence flags in shared slots: how ranks on one host signal each other without messages.
#pragma once

#include <sched.h>

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "hopwise/comm/transport.h"
#include "hopwise/common/error.h"

namespace hopwise::comm::algo {

// Names the ranks whose stamps in the slots differ and what differs (call_stamps.cpp); throws.
[[noreturn]] void throw_slot_stamps_differ(Transport& t, SharedSlots& sh, std::uint64_t seq);

// Flag `index` (0 or 1) of a slot: 8-byte counters in the slot's header, written only by its owner.
inline std::atomic_ref<std::uint64_t> flag_of(char* slot, int index = 0) {
  return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(slot + 8 * index));
}

// Spins (yielding now and then, for oversubscribed hosts) until every rank's flag `index` reaches `seq`;
// TimeoutError naming the ranks that did not get there, or TransportError naming one the transport knows is
// gone (asked ~10 times a second once the wait is long).
// Once a wait passes half a millisecond it lets the transport progress as it spins: a peer's last large send of
// the previous call may still wait for this rank's library to acknowledge it, and without that both ranks would
// wait forever.
inline void wait_for_flags(Transport& t, SharedSlots& sh, std::uint64_t seq, int index = 0) {
  const auto start = std::chrono::steady_clock::now();
  auto next_look = start + std::chrono::milliseconds(100);
  for (int r = 0; r < t.size(); ++r) {
    auto flag = flag_of(sh.base[static_cast<std::size_t>(r)], index);
    for (long spins = 1; flag.load(std::memory_order_acquire) < seq; ++spins) {
      if (spins % 16 != 0) continue;
      sched_yield();
      // The clock after every yield, not every 1024 spins: on a loaded machine a yield may take milliseconds.
      const auto now = std::chrono::steady_clock::now();
      // Only once the wait is long: driving MPI's progress on every short wait slowed shm 2.6x beside other calls.
      if (spins % 1024 == 0 && now - start > std::chrono::microseconds(500)) t.progress();
      if (now > next_look) {
        next_look = now + std::chrono::milliseconds(100);
        if (t.peer_gone(r))
          throw TransportError(fmt::format("rank {}: rank {} failed or gave up (its transport says so) while rank "
                                           "{} waited for it in shared memory",
                                           t.rank(), r, t.rank()),
                               {r});
      }
      if (now - start > t.timeout()) {
        std::vector<int> late;
        for (int q = 0; q < t.size(); ++q)
          if (flag_of(sh.base[static_cast<std::size_t>(q)], index).load() < seq) late.push_back(q);
        throw TimeoutError(fmt::format("rank {} timed out after {:.1f} s waiting for rank(s) {} in shared memory; a "
                                       "peer died, stalled or skipped this call (raise HOPWISE_TIMEOUT_S if it is "
                                       "only slow)",
                                       t.rank(), t.timeout().count(), fmt::join(late, ",")),
                           late);
      }
    }
  }
}

// The default call check where no message moves: each rank leaves its call's stamp in its slot's header before
// raising its flag for slot call `seq` (two places, alternating like the buffers: a rank ahead by one call must
// not overwrite the stamp a slower one is still reading), and after the flags every rank compares all of them.
inline CallStamp* stamp_place(char* slot, std::uint64_t seq) {
  static_assert(16 + 2 * sizeof(CallStamp) <= SharedSlots::kHeader);
  return reinterpret_cast<CallStamp*>(slot + 16 + (seq % 2) * sizeof(CallStamp));
}

inline void publish_stamp(Transport& t, char* mine, std::uint64_t seq) {
  if (const CallStamp* s = t.call_stamp()) *stamp_place(mine, seq) = *s;
}

// After wait_for_flags(seq): every rank's stamp is there (the flag's release orders it).
inline void compare_stamps(Transport& t, SharedSlots& sh, std::uint64_t seq) {
  const CallStamp* s = t.call_stamp();
  if (s == nullptr) return;
  for (int r = 0; r < t.size(); ++r)
    if (std::memcmp(stamp_place(sh.base[static_cast<std::size_t>(r)], seq), s, sizeof(CallStamp)) != 0)
      throw_slot_stamps_differ(t, sh, seq);
}

}  // namespace hopwise::comm::algo
