// What elastic membership reads back from the job's store, parsed with caps: anyone who reaches the store may have
// written it (a damaged store, another job's keys, a hostile client), so each value is checked before a member or
// newcomer acts on it, and refused with an Error that names it. Fuzzed by tests/fuzz/fuzz_elastic_values.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hopwise::comm::elastic_values {

// Most processes let in at one boundary: a ticket count past it is no crowd of newcomers but a damaged or hostile
// store, which would otherwise make the members list (and wait for) that many phantoms.
constexpr std::int64_t kMostNewcomers = 1024;
// Ids, generations and ticket counts past this are no job's.
constexpr std::int64_t kLargestCount = std::int64_t{1} << 40;
// Members one generation may have.
constexpr std::size_t kMostMembers = std::size_t{1} << 20;

// A generation's members as the store holds them: "0,1,3" (member ids, each once).
std::string member_list_text(const std::vector<int>& ids);
std::vector<int> parse_member_list(const std::string& text);

// A newcomer's way in, as rank 0 writes it under the newcomer's ticket: "GENERATION ID ADMITTED NEXT_ID".
struct Admission {
  std::int64_t generation = 0, id = 0, admitted = 0, next_id = 0;
};
std::string admission_text(const Admission& a);
Admission parse_admission(const std::string& text, std::int64_t ticket);

}  // namespace hopwise::comm::elastic_values
