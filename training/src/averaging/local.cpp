// averaging local and hier: parameters averaged over the world every H steps (blocking), after W synchronous steps.
// local (post-local SGD, Lin et al., arXiv 1808.07217): no gradient communication between the averagings. hier:
// gradients averaged within each host every step (the fast path), so a host's ranks already agree and the world's
// average is across hosts.
#include <chrono>

#include "hopwise/training/averaging_method.h"
#include "periodic.h"

namespace hopwise::comm::detail {

namespace {

class Periodic final : public AveragingMethodBase {
 public:
  Periodic(AveragingContext& ctx, GradientScope between) : ctx_(ctx), between_(between) {}
  GradientScope gradient_scope(std::int64_t steps) const override {
    return scope_after_warmup(ctx_.spec, steps, between_);
  }
  void after_step(std::int64_t t) override {
    if (!averages_after(ctx_.spec, t)) return;
    const auto t0 = std::chrono::steady_clock::now();
    ctx_.average_world();
    ctx_.stats.wait_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }

 private:
  AveragingContext& ctx_;
  GradientScope between_;  // the gradients' scope between the averagings
};

}  // namespace

AveragingMethodRow local_row() {
  return {"local",
          {"period", "warmup"},
          {"period"},
          {"period", "warmup"},
          false,
          "post-local SGD: W synchronous steps, then no gradient communication and the parameters averaged every H",
          [](AveragingContext& ctx) { return std::make_unique<Periodic>(ctx, GradientScope::kNone); }};
}

AveragingMethodRow hier_row() {
  return {"hier",
          {"period", "warmup"},
          {"period"},
          {"period"},
          false,
          "gradients averaged within each host every step, parameters across the world every H steps",
          [](AveragingContext& ctx) { return std::make_unique<Periodic>(ctx, GradientScope::kHost); }};
}

}  // namespace hopwise::comm::detail
