#include "hopwise/common/log.h"

#include <algorithm>
#include <atomic>
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

namespace {
std::atomic<bool> line_open{false};
}  // namespace

void set_console_line_open(bool open) { line_open.store(open); }
bool console_line_open() { return line_open.load(); }

void end_console_line() {
  if (!line_open.exchange(false)) return;
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

void write(Level level, std::string_view message) {
  static std::mutex m;
  std::lock_guard lock(m);
  // The bar is on stdout and this goes to stderr: the newline goes where the bar is, before the message.
  end_console_line();
  std::fprintf(stderr, "hopwise %s: %.*s\n", level == Level::kWarn ? "WARN" : "INFO", static_cast<int>(message.size()),
               message.data());
}

}  // namespace hopwise::log
