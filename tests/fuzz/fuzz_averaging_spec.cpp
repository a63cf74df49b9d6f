// libFuzzer target: averaging specs (AveragingSpec::parse), e.g. "local:period=8,warmup=100". An accepted spec must
// survive its canonical form (parse(to_string(spec)) is the same spec) and hold fields in their ranges.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "hopwise/common/error.h"
#include "hopwise/training/averaging.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using hopwise::comm::AveragingSpec;
  const std::string text(reinterpret_cast<const char*>(data), size);
  AveragingSpec spec;
  try {
    spec = AveragingSpec::parse(text);
  } catch (const hopwise::InvalidArgument&) {
    return 0;  // the documented refusal
  }
  if (spec.period < 1 || spec.warmup < 0 || spec.peers < 1) {
    std::fprintf(stderr, "'%s' was accepted with a field out of range\n", text.c_str());
    std::abort();
  }
  const std::string canonical = spec.to_string();
  try {
    const AveragingSpec again = AveragingSpec::parse(canonical);
    if (again.to_string() == canonical && again.method == spec.method && again.period == spec.period &&
        again.warmup == spec.warmup && again.peers == spec.peers && again.codec == spec.codec)
      return 0;
  } catch (const hopwise::InvalidArgument& e) {
    std::fprintf(stderr, "canonical form '%s' is refused: %s\n", canonical.c_str(), e.what());
    std::abort();
  }
  std::fprintf(stderr, "canonical form '%s' parses to a different spec\n", canonical.c_str());
  std::abort();
}
