// averaging async: every H steps (after W synchronous ones) a snapshot of the model is averaged in the background on
// the communicator's progress thread while compute goes on; H steps later each rank adds (average - snapshot), which
// keeps its progress since: staleness at most H steps. With a codec (error feedback) the snapshot's difference from
// the last average (`reference`, the same bits on every rank) is all-reduced instead.
#include <chrono>
#include <cstring>
#include <vector>

#include "hopwise/comm/averaging_method.h"
#include "hopwise/compression/codec.h"
#include "periodic.h"

namespace hopwise::comm::detail {

namespace {

class Async final : public AveragingMethodBase {
 public:
  explicit Async(AveragingContext& ctx) : ctx_(ctx), snapshot_(ctx.count), averaged_(ctx.count) {
    if (ctx.spec.codec != "none") {
      // Error feedback: what one average's rounding leaves out goes into the next.
      codec_ = compression::make_codec(ctx.spec.codec + ":ef=1");
      codec_state_ = compression::CodecState(0x6173796eull, ctx.comm.rank(), ctx.comm.size());
      reference_.assign(ctx.params, ctx.params + ctx.count);
    }
  }
  GradientScope gradient_scope(std::int64_t steps) const override {
    return scope_after_warmup(ctx_.spec, steps, GradientScope::kNone);
  }
  void after_step(std::int64_t t) override {
    if (averages_after(ctx_.spec, t)) apply_and_restart();
  }
  // Waits for the average in flight and drops it: every averaging keeps the ranks' mean, so a full average that
  // follows gives the same model with or without it.
  void drain() override {
    if (!in_flight_) return;
    in_flight_ = false;
    background_.wait();
  }
  bool in_flight() const override { return in_flight_; }
  void ranks_equal() override {
    if (codec_) reference_.assign(ctx_.params, ctx_.params + ctx_.count);
  }

 private:
  // The average launched H steps ago (if any) is applied, x += average - snapshot; then the next snapshot is taken
  // and its average launched. One pass over the model does both (with a codec: the snapshot is x - reference, and
  // the reference moves by the average difference).
  void apply_and_restart() {
    const auto t0 = std::chrono::steady_clock::now();
    const bool apply = in_flight_;
    if (apply) background_.wait();
    in_flight_ = false;
    const std::size_t n = ctx_.count;
    float* x = ctx_.params;
    float* s = snapshot_.data();
    const float* a = averaged_.data();
    if (codec_) {
      float* ref = reference_.data();
      if (apply)
        for (std::size_t i = 0; i < n; ++i) {
          x[i] += a[i] - s[i];
          ref[i] += a[i];
          s[i] = x[i] - ref[i];
        }
      else
        for (std::size_t i = 0; i < n; ++i) s[i] = x[i] - ref[i];
      background_ = ctx_.comm.allreduce_compressed_async(s, averaged_.data(), n, *codec_, codec_state_, ReduceOp::kAvg);
      ctx_.stats.bytes += codec_->payload_bytes(n) + codec_->scale_count(n) * sizeof(float);
    } else {
      if (apply)
        for (std::size_t i = 0; i < n; ++i) {
          x[i] += a[i] - s[i];
          s[i] = x[i];
        }
      else
        std::memcpy(s, x, n * sizeof(float));
      background_ = ctx_.comm.allreduce_async(s, averaged_.data(), n, DataType::kFloat32, ReduceOp::kAvg);
      ctx_.stats.bytes += n * sizeof(float);
    }
    in_flight_ = true;
    ++ctx_.stats.averages;
    ctx_.stats.wait_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }

  AveragingContext& ctx_;
  std::vector<float> snapshot_, averaged_, reference_;
  std::unique_ptr<compression::Codec> codec_;
  compression::CodecState codec_state_;
  Work background_;
  bool in_flight_ = false;
};

}  // namespace

AveragingMethodRow async_row() {
  return {"async",
          {"period", "warmup", "codec"},
          {"period"},
          {"period"},
          false,
          "every H steps a snapshot averaged in the background while compute goes on (staleness at most H steps)",
          [](AveragingContext& ctx) { return std::make_unique<Async>(ctx); }};
}

}  // namespace hopwise::comm::detail
