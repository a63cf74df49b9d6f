// Minimal logging to stderr gated by HOPWISE_DEBUG (INFO, WARN; CHECK adds collective fingerprints).
#pragma once

#include <fmt/core.h>

#include <string_view>

namespace hopwise::log {

enum class Level { kWarn = 0, kInfo = 1 };
bool enabled(Level level);
void write(Level level, std::string_view message);

template <class... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  if (enabled(Level::kInfo)) write(Level::kInfo, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  if (enabled(Level::kWarn)) write(Level::kWarn, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace hopwise::log
