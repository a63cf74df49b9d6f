// The simulation tests' platform: tests/sim/cluster8.xml (HOPWISE_SIM_PLATFORM), loaded once per process with
// SimGrid's latency and bandwidth factors at 1, as the validation against the emulated cluster set them.
#pragma once

#include "hopwise/comm/transports/simgrid_transport.h"

namespace hopwise::comm::sim::testing {

inline void load() {
  static const bool configured = [] {
    configure("network/latency-factor:1");
    configure("network/bandwidth-factor:1");
    return true;
  }();
  (void)configured;
  load_platform(HOPWISE_SIM_PLATFORM);
}

}  // namespace hopwise::comm::sim::testing
