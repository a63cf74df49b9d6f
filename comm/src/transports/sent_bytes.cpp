// The bytes each rank sends to each peer, counted in the transports' isend, read by the monitor.
#include "hopwise/comm/transport.h"

namespace hopwise::comm {

std::atomic<std::uint64_t>* Transport::sent_counters() const {
  // Sized on first use: size() is virtual, so the base class cannot size it while it is being constructed.
  std::call_once(sent_once_, [this] {
    const int n = size();
    sent_ = std::make_unique<std::atomic<std::uint64_t>[]>(static_cast<std::size_t>(n > 0 ? n : 1));
  });
  return sent_.get();
}

void Transport::count_sent(int peer, std::size_t bytes) {
  if (peer < 0 || peer >= size()) return;  // the transport's own check reports the bad peer
  sent_counters()[peer].fetch_add(bytes, std::memory_order_relaxed);
}

std::uint64_t Transport::sent_to(int peer) const {
  if (peer < 0 || peer >= size()) return 0;
  return sent_counters()[peer].load(std::memory_order_relaxed);
}

}  // namespace hopwise::comm
