// libFuzzer target: the hopwise JSON reader (schema hopwise-topology).
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    hopwise::fuzz::exercise(hopwise::topology::parse_json(hopwise::fuzz::as_text(data, size), "fuzz"));
  } catch (const hopwise::InvalidArgument&) {
    // The documented refusal; any other exception escapes and is reported as a crash.
  }
  return 0;
}
