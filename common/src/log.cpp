#include "hopwise/common/log.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <mutex>

#include "hopwise/common/env.h"

namespace hopwise::log {

bool enabled(Level level) {
  // A list is allowed ("INFO,CHECK"): any of these words turns on INFO.
  static const int threshold = env::list_contains("HOPWISE_DEBUG", "INFO") ||
                                       env::list_contains("HOPWISE_DEBUG", "TRACE") ||
                                       env::list_contains("HOPWISE_DEBUG", "CHECK")
                                   ? 1
                                   : 0;
  return static_cast<int>(level) <= threshold;
}

void write(Level level, std::string_view message) {
  static std::mutex m;
  std::lock_guard lock(m);
  std::fprintf(stderr, "hopwise %s: %.*s\n", level == Level::kWarn ? "WARN" : "INFO", static_cast<int>(message.size()),
               message.data());
}

}  // namespace hopwise::log
