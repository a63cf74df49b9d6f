// Environment knobs, read in NCCL's style (HOPWISE_*).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace hopwise::env {

std::optional<std::string> get(std::string_view name);
std::string get_or(std::string_view name, std::string_view fallback);
// Parses a number; a malformed value is an InvalidArgument naming the variable.
double get_double(std::string_view name, double fallback);
long long get_int(std::string_view name, long long fallback);
// Whether the list in variable `name` ("INFO,CHECK", words split by ',', ';' or spaces) holds `word`, ignoring case.
bool list_contains(std::string_view name, std::string_view word);
// "4K", "64M", "1G", "123" -> bytes. Throws InvalidArgument naming `what`.
std::size_t parse_size(std::string_view text, std::string_view what);

}  // namespace hopwise::env
