// libFuzzer target: codec spec strings (parse_codec_spec), e.g. "topk:ratio=0.01,ef=1".
// An accepted spec must also survive its canonical form: parse(to_string(spec)) gives the same spec.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "hopwise/common/error.h"
#include "hopwise/compression/spec.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using hopwise::compression::CodecSpec;
  using hopwise::compression::parse_codec_spec;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  CodecSpec spec;
  try {
    spec = parse_codec_spec(text);
  } catch (const hopwise::InvalidArgument&) {
    return 0;  // the documented refusal
  }
  const std::string canonical = spec.to_string();
  try {
    const CodecSpec again = parse_codec_spec(canonical);
    if (again.name == spec.name && again.params == spec.params) return 0;
  } catch (const hopwise::InvalidArgument& e) {
    std::fprintf(stderr, "canonical form '%s' is refused: %s\n", canonical.c_str(), e.what());
    std::abort();
  }
  std::fprintf(stderr, "canonical form '%s' parses to a different spec\n", canonical.c_str());
  std::abort();
}
