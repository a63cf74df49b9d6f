// libFuzzer target: what elastic membership reads back from the store (elastic_values.h): member lists ("0,1,3") and
// a newcomer's admission ("GENERATION ID ADMITTED NEXT_ID"). The first byte picks the reader (and the ticket). An
// accepted value must hold fields in their ranges and read back the same from the text the members would write.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>

#include "../../training/src/elastic/elastic_values.h"
#include "hopwise/common/error.h"

namespace ev = hopwise::comm::elastic_values;

namespace {

[[noreturn]] void fail(const char* what, const std::string& text) {
  std::fprintf(stderr, "%s: '%s'\n", what, text.c_str());
  std::abort();
}

void member_list(const std::string& text) {
  std::vector<int> ids;
  try {
    ids = ev::parse_member_list(text);
  } catch (const hopwise::Error&) {
    return;  // the documented refusal
  }
  if (ids.size() > ev::kMostMembers || std::set<int>(ids.begin(), ids.end()).size() != ids.size())
    fail("a member list was accepted with too many or repeated ids", text);
  for (int id : ids)
    if (id < 0) fail("a member list was accepted with a negative id", text);
  if (ev::parse_member_list(ev::member_list_text(ids)) != ids) fail("a member list does not read back", text);
}

void admission(const std::string& text, std::int64_t ticket) {
  ev::Admission a;
  try {
    a = ev::parse_admission(text, ticket);
  } catch (const hopwise::Error&) {
    return;
  }
  for (std::int64_t v : {a.generation, a.id, a.admitted, a.next_id})
    if (v < 0 || v > ev::kLargestCount) fail("an admission was accepted with a count out of range", text);
  if (a.id >= a.next_id || a.admitted < ticket) fail("an admission was accepted that contradicts itself", text);
  const ev::Admission b = ev::parse_admission(ev::admission_text(a), ticket);
  if (b.generation != a.generation || b.id != a.id || b.admitted != a.admitted || b.next_id != a.next_id)
    fail("an admission does not read back", text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1)
    admission(text, 1 + (data[0] >> 1));
  else
    member_list(text);
  return 0;
}
