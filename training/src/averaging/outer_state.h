// The outer path's settings (outer.cpp) and its state in a checkpoint: written and read here, every count checked
// against the model before anything is allocated (a checkpoint is a file someone else may have written).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hopwise/training/averaging.h"

namespace hopwise::comm::detail {

struct OuterSettings {
  int period = 1;
  int warmup = 0;
  double lr = 1.0;        // outer SGD's learning rate (1 with no momentum: plain averaging)
  double momentum = 0.0;  // outer SGD's momentum
  bool nesterov = false;
  int fragments = 1;
  int delay = 0;       // steps a fragment's all-reduce runs behind (0: blocking)
  double alpha = 0.0;  // share of the local model kept at a merge
  std::string codec = "none";
  std::string to_string() const;  // "period=8,fragments=1,delay=1,codec=int8,outer_lr=1,momentum=0,nesterov=0"
};

struct OuterState {
  struct CodecPart {
    std::uint64_t step = 0;
    std::vector<float> residual;
  };
  struct InFlight {
    int fragment = 0;
    std::int64_t launched_at = 0;
    std::vector<float> sent, averaged;
  };
  OuterSettings settings;
  bool picking = false;  // diloco:auto still measuring
  std::string why;       // what auto chose and why
  std::vector<float> synced, momentum;
  std::vector<CodecPart> codecs;
  std::optional<InFlight> flight;
};

std::string write_outer_state(const OuterState& s);
// InvalidArgument naming what is wrong: not this format, settings out of range, an array longer than the model
// (`count` parameters) or cut short.
OuterState read_outer_state(const std::string& blob, const AveragingSpec& spec, std::size_t count);

}  // namespace hopwise::comm::detail
