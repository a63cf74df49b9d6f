// libFuzzer target: the hwloc XML reader (lstopo output), including the XML layer in xml.cpp.
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    hopwise::fuzz::exercise(hopwise::topology::parse_hwloc_xml(hopwise::fuzz::as_text(data, size), "fuzz"));
  } catch (const hopwise::InvalidArgument&) {
    // The documented refusal; any other exception escapes and is reported as a crash.
  }
  return 0;
}
