// libFuzzer target: the outer path's saved state (training/src/averaging/outer_state.h), which a checkpoint file
// carries. Read against a model of 64 parameters: refused with InvalidArgument, or accepted with every array within
// the model and settings in range, and what is accepted reads back the same after writing it again.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "../../training/src/averaging/outer_state.h"
#include "hopwise/common/error.h"

namespace hd = hopwise::comm::detail;

namespace {

constexpr std::size_t kCount = 64;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "%s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string blob(reinterpret_cast<const char*>(data), size);
  hopwise::comm::AveragingSpec spec = hopwise::comm::AveragingSpec::parse("diloco:auto");
  hd::OuterState s;
  try {
    s = hd::read_outer_state(blob, spec, kCount);
  } catch (const hopwise::InvalidArgument&) {
    return 0;  // the documented refusal
  }
  const auto& o = s.settings;
  if (o.period < 1 || o.fragments < 1 || o.period % o.fragments != 0 || o.delay < 0 || o.delay > o.period)
    fail("settings out of range were accepted");
  if (s.synced.size() > kCount || s.momentum.size() > kCount || s.codecs.size() > static_cast<std::size_t>(o.fragments))
    fail("an array past the model was accepted");
  for (const auto& c : s.codecs)
    if (c.residual.size() > kCount) fail("a residual past the model was accepted");
  if (s.flight && (s.flight->sent.size() > kCount || s.flight->averaged.size() > kCount))
    fail("a fragment in flight past the model was accepted");
  const std::string again = hd::write_outer_state(s);
  hd::OuterState t = hd::read_outer_state(again, spec, kCount);
  if (hd::write_outer_state(t) != again) fail("an accepted state does not read back the same");
  return 0;
}
