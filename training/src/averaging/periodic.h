// The warm-up and period rules the periodic methods (local, hier, async) share.
#pragma once

#include <cstdint>

#include "hopwise/training/averaging.h"

namespace hopwise::comm::detail {

// After step t (1-based): the W warm-up steps are synchronous, then every H-th step averages.
inline bool averages_after(const AveragingSpec& s, std::int64_t t) {
  return t > s.warmup && (t - s.warmup) % s.period == 0;
}

// The gradients of the step after `steps`: the world's during warm-up, `after` from then on.
inline GradientScope scope_after_warmup(const AveragingSpec& s, std::int64_t steps, GradientScope after) {
  return steps < s.warmup ? GradientScope::kWorld : after;
}

}  // namespace hopwise::comm::detail
