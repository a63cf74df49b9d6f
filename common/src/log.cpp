#include "hopwise/common/log.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <mutex>

#include "hopwise/common/env.h"

namespace hopwise::log {

bool enabled(Level level) {
  static const int threshold = [] {
    // A list is allowed ("INFO,CHECK"): any of these words turns on INFO.
    std::string v = env::get_or("HOPWISE_DEBUG", "WARN");
    for (char& c : v) c = (c == ' ' || c == ';') ? ',' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    for (std::size_t start = 0; start <= v.size();) {
      const std::size_t end = std::min(v.find(',', start), v.size());
      const std::string_view word(v.data() + start, end - start);
      if (word == "INFO" || word == "TRACE" || word == "CHECK") return 1;
      start = end + 1;
    }
    return 0;
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
