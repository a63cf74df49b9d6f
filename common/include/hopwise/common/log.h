// Minimal logging to stderr gated by HOPWISE_DEBUG (INFO, WARN; CHECK adds collective fingerprints).
#pragma once

#include <fmt/core.h>

#include <string_view>

namespace hopwise::log {

enum class Level { kWarn = 0, kInfo = 1 };
bool enabled(Level level);
// Writes "hopwise WARN: message" on a line of its own: to stderr, or, in a program that draws a progress bar on
// stdout (one that has called set_console_line_open), to stdout after ending the bar's line if it is open.
void write(Level level, std::string_view message);

// A program that redraws a progress bar in place says when the console's current line is open (printed without
// its newline): the next log line then ends it first, so that a warning never lands inside the bar. From the first
// call on, log lines go to stdout, the bar's stream: a launcher (mpirun) forwards stdout and stderr apart, with no
// order between them, so a line on stderr could still land inside the bar.
void set_console_line_open(bool open);
// Whether it is open; a program printing a line of its own may end it with end_console_line().
bool console_line_open();
// Ends an open console line on stdout (flushed); a no-op when none is open.
void end_console_line();

template <class... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  if (enabled(Level::kInfo)) write(Level::kInfo, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  if (enabled(Level::kWarn)) write(Level::kWarn, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace hopwise::log
