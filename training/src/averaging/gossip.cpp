// averaging gossip: decentralized SGD. Each step every rank averages its model with K partners, paired one to one on
// the planned ring and shifting one place per round (Bagua's shift_one); the exchange of x_t overlaps the
// computation of the gradient at x_t (D-PSGD): started after the optimizer step, mixed in before the next one. The
// exchange itself is gossip_exchange.cpp.
#include <chrono>

#include "gossip_exchange.h"
#include "hopwise/training/averaging_method.h"

namespace hopwise::comm::detail {

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

class Gossip final : public AveragingMethodBase {
 public:
  // The exchange reads the parameters at construction (its reference): the averager fetched them for the broadcast.
  explicit Gossip(AveragingContext& ctx) : ctx_(ctx), exchange_(*ctx.comm, ctx.spec, ctx.params, ctx.count) {}
  GradientScope gradient_scope(std::int64_t) const override { return GradientScope::kNone; }
  void before_step() override {
    const auto t0 = std::chrono::steady_clock::now();
    if (exchange_.in_flight()) {
      exchange_.finish_and_mix();
      ctx_.publish_all();  // the partners' models mixed in
    }
    ctx_.stats.wait_ms += ms_since(t0);
  }
  void after_step(std::int64_t t) override {
    const auto t0 = std::chrono::steady_clock::now();
    ctx_.fetch_all();  // sent from where it is: the model after this step
    exchange_.start(t - 1);
    ctx_.stats.averages += exchange_.partners() > 0;
    ctx_.stats.bytes += exchange_.bytes_sent_per_round() * static_cast<std::uint64_t>(exchange_.partners());
    ctx_.stats.wait_ms += ms_since(t0);
  }
  void drain() override { exchange_.drop(); }
  bool in_flight() const override { return exchange_.in_flight(); }
  void ranks_equal() override {
    ctx_.fetch_all();
    exchange_.set_reference();
  }

 private:
  AveragingContext& ctx_;
  GossipExchange exchange_;
};

}  // namespace

AveragingMethodRow gossip_row() {
  return {"gossip",
          {"peers", "codec"},
          {},
          {"peers"},
          false,
          "each step every rank averages its model with K partners on the ring (codec: the model's difference)",
          [](AveragingContext& ctx) { return std::make_unique<Gossip>(ctx); }};
}

}  // namespace hopwise::comm::detail
