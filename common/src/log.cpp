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
// Set once a program says it draws a progress bar on stdout: its log lines then go to stdout too (see write).
std::atomic<bool> console{false};
}  // namespace

void set_console_line_open(bool open) {
  console.store(true);
  line_open.store(open);
}
bool console_line_open() { return line_open.load(); }

void end_console_line() {
  if (!line_open.exchange(false)) return;
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

void write(Level level, std::string_view message) {
  static std::mutex m;
  std::lock_guard lock(m);
  // Where a progress bar is drawn, the line goes on the bar's stream, after ending the bar's line: a launcher
  // forwards a rank's stdout and stderr apart (mpirun: each on its own channel), and nothing orders the two, so a
  // warning on stderr reached the terminal before the newline that ended the bar, inside it.
  std::FILE* out = console.load() ? stdout : stderr;
  end_console_line();
  std::fprintf(out, "hopwise %s: %.*s\n", level == Level::kWarn ? "WARN" : "INFO", static_cast<int>(message.size()),
               message.data());
  std::fflush(out);
}

}  // namespace hopwise::log
