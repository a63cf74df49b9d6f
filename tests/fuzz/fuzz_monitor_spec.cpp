// libFuzzer target: the monitor's spec (MonitorOptions::parse, e.g. "interval=10s,every=10,alert_after=3") and the
// alert threshold (parse_threshold, "0.5" or "50%"). What is accepted must hold fields in their ranges; everything
// else must be refused with InvalidArgument.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "hopwise/common/error.h"
#include "hopwise/training/monitor.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using hopwise::comm::MonitorOptions;
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const MonitorOptions o = MonitorOptions::parse(text);
    if (!o.on || !(o.interval_s > 0) || !std::isfinite(o.interval_s) || o.interval_steps < 0 ||
        o.interval_steps > 1000000 || o.every < 1 || o.alert_after < 1) {
      std::fprintf(stderr, "'%s' was accepted with a field out of range\n", text.c_str());
      std::abort();
    }
  } catch (const hopwise::InvalidArgument&) {
  }
  try {
    const double t = MonitorOptions::parse_threshold(text);
    if (!(t >= 0 && t <= 1)) {
      std::fprintf(stderr, "threshold '%s' was accepted as %g\n", text.c_str(), t);
      std::abort();
    }
  } catch (const hopwise::InvalidArgument&) {
  }
  return 0;
}
