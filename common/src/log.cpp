#include "hopwise/common/log.h"

#include <cstdio>
#include <mutex>

#include "hopwise/common/env.h"

namespace hopwise::log {

bool enabled(Level level) {
  static const int threshold = [] {
    const std::string v = env::get_or("HOPWISE_DEBUG", "WARN");
    return (v == "INFO" || v == "TRACE" || v == "CHECK") ? 1 : 0;
  }();
  return static_cast<int>(level) <= threshold;
}

void write(Level level, std::string_view message) {
  static std::mutex m;
  std::lock_guard lock(m);
  std::fprintf(stderr, "hopwise %s: %.*s\n", level == Level::kWarn ? "WARN" : "INFO",
               static_cast<int>(message.size()), message.data());
}

}  // namespace hopwise::log
