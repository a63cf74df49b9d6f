// libFuzzer target: the `nvidia-smi topo -m` matrix reader.
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    hopwise::fuzz::exercise(hopwise::topology::parse_nvidia_smi(hopwise::fuzz::as_text(data, size), "fuzz"));
  } catch (const hopwise::InvalidArgument&) {
    // The documented refusal; any other exception escapes and is reported as a crash.
  }
  return 0;
}
