// libFuzzer target: the NCCL/RCCL topology XML and NCCL graph XML reader.
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    hopwise::fuzz::exercise(hopwise::topology::parse_nccl_xml(hopwise::fuzz::as_text(data, size), "fuzz"));
  } catch (const hopwise::InvalidArgument&) {
    // The documented refusal; any other exception escapes and is reported as a crash.
  }
  return 0;
}
