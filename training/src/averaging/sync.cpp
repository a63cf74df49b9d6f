// averaging sync: the gradients averaged over the world every step (the reducer alone); the ranks' parameters never
// differ, so there is nothing to average.
#include "hopwise/training/averaging_method.h"

namespace hopwise::comm::detail {

namespace {

class Sync final : public AveragingMethodBase {
 public:
  GradientScope gradient_scope(std::int64_t) const override { return GradientScope::kWorld; }
  void after_step(std::int64_t) override {}
};

}  // namespace

AveragingMethodRow sync_row() {
  return {
      "sync", {}, {}, {}, true, "gradients averaged over the world every step (the default)", [](AveragingContext&) {
        return std::make_unique<Sync>();
      }};
}

}  // namespace hopwise::comm::detail
