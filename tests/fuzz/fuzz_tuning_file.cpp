// libFuzzer target: tuning files (parse_tuning_file), as hopwise-tune writes them and HOPWISE_TUNING_FILE reads
// them. Refusals must be InvalidArgument; an accepted file must survive its own round trip: written by
// write_tuning_file and read back, the same job shape and the same entries (class and choice).
#include <unistd.h>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "hopwise/comm/tuning.h"
#include "hopwise/common/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace hc = hopwise::comm;
  const std::string text(reinterpret_cast<const char*>(data), size);
  hc::TuningFile f;
  try {
    f = hc::parse_tuning_file(text, "fuzz.json");
  } catch (const hopwise::InvalidArgument&) {
    return 0;  // the documented refusal
  }
  static const std::string path = "/tmp/hopwise-fuzz-tuning-" + std::to_string(::getpid()) + ".json";
  hc::write_tuning_file(f, path);
  const hc::TuningFile back = hc::read_tuning_file(path);
  bool same = back.job == f.job && back.entries.size() == f.entries.size();
  for (std::size_t i = 0; same && i < f.entries.size(); ++i)
    same = back.entries[i].collective == f.entries[i].collective &&
           back.entries[i].dtype_class == f.entries[i].dtype_class &&
           back.entries[i].size_class == f.entries[i].size_class && back.entries[i].choice == f.entries[i].choice;
  if (!same) {
    std::fprintf(stderr, "a tuning file read back differently after write_tuning_file\n");
    std::abort();
  }
  return 0;
}
