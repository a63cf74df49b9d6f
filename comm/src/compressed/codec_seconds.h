// Runs one codec call and adds its seconds to the communicator's codec time (what the monitor reports: on a few
// cores the codec competes with the compute thread). Shared by the host's composite calls.
#pragma once

#include <chrono>

#include "../communicator_impl.h"

namespace hopwise::comm::compressed {

template <class F>
void timed(detail::CommunicatorImpl& impl, F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  impl.add_codec_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

}  // namespace hopwise::comm::compressed
