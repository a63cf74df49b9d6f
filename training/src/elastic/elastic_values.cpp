// elastic_values.h: the store's member lists and admissions, each number checked with from_chars and its range.
#include "elastic_values.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>

#include "hopwise/common/error.h"

namespace hopwise::comm::elastic_values {

std::string member_list_text(const std::vector<int>& ids) { return fmt::format("{}", fmt::join(ids, ",")); }

std::vector<int> parse_member_list(const std::string& text) {
  std::vector<int> ids;
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    int id = -1;
    const auto [end, ec] = std::from_chars(text.data() + at, text.data() + comma, id);
    if (ec != std::errc() || end != text.data() + comma || id < 0 || ids.size() >= kMostMembers)
      throw Error(
          fmt::format("elastic: the store's member list '{}' is not a list of ranks (another job's keys in "
                      "the same store? give each job its own HOPWISE_STORE)",
                      text.substr(0, 200)));
    ids.push_back(id);
    at = comma + 1;
  }
  std::vector<int> sorted = ids;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    throw Error(fmt::format("elastic: the store's member list '{}' names a rank twice (a damaged store?)",
                            text.substr(0, 200)));
  return ids;
}

std::string admission_text(const Admission& a) {
  return fmt::format("{} {} {} {}", a.generation, a.id, a.admitted, a.next_id);
}

Admission parse_admission(const std::string& text, std::int64_t ticket) {
  std::vector<std::int64_t> fields;
  std::size_t at = 0;
  bool counts = true;
  while (counts && at <= text.size() && fields.size() < 5) {
    const std::size_t space = std::min(text.find(' ', at), text.size());
    std::int64_t v = -1;
    const auto [end, ec] = std::from_chars(text.data() + at, text.data() + space, v);
    counts = ec == std::errc() && end == text.data() + space && v >= 0 && v <= kLargestCount;
    fields.push_back(v);
    at = space + 1;
  }
  // The id is one the members handed out before NEXT_ID, and the admitted count covers this ticket.
  if (!counts || fields.size() != 4 || fields[1] >= fields[3] || fields[2] < ticket)
    throw Error(
        fmt::format("elastic: the store's answer to ticket {} '{}' is not one hopwise writes (GENERATION ID "
                    "ADMITTED NEXT_ID, counts from 0 to 2^40); another job's keys in the same store?",
                    ticket, text.substr(0, 200)));
  return {fields[0], fields[1], fields[2], fields[3]};
}

}  // namespace hopwise::comm::elastic_values
