// averaging async: every H steps (after W synchronous ones) a snapshot of the model is averaged in the background on
// the communicator's progress thread while compute goes on; D steps later (delay, 1..H; H by default) each rank
// adds (average - snapshot), which keeps its progress since: the ranks' models part for at most H + D steps. A
// short delay is local SGD whose average travels behind D steps of compute. With a codec (error feedback) the
// snapshot's difference from the last average (`reference`, the same bits on every rank) is all-reduced instead.
#include <chrono>
#include <cstring>
#include <vector>

#include "hopwise/compression/codec.h"
#include "hopwise/training/averaging_method.h"
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
    const bool apply = in_flight_ && t >= launched_at_ + delay_steps();
    const bool restart = averages_after(ctx_.spec, t);
    if (apply || restart) average_step(apply, restart, t);
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
  int delay_steps() const { return ctx_.spec.delay > 0 ? ctx_.spec.delay : ctx_.spec.period; }

  // `apply`: the average launched D steps ago is waited for and applied, x += average - snapshot; `restart`: the
  // next snapshot is taken and its average launched. Where both fall on one step (the default delay) one pass
  // over the model does both. With a codec the snapshot is x - reference, and the reference moves by the average
  // difference.
  void average_step(bool apply, bool restart, std::int64_t t) {
    const auto t0 = std::chrono::steady_clock::now();
    if (apply) background_.wait();
    if (apply) in_flight_ = false;
    const std::size_t n = ctx_.count;
    float* x = ctx_.params;
    float* s = snapshot_.data();
    const float* a = averaged_.data();
    if (codec_) {
      float* ref = reference_.data();
      if (apply && restart)
        for (std::size_t i = 0; i < n; ++i) {
          x[i] += a[i] - s[i];
          ref[i] += a[i];
          s[i] = x[i] - ref[i];
        }
      else if (apply)
        for (std::size_t i = 0; i < n; ++i) {
          x[i] += a[i] - s[i];
          ref[i] += a[i];
        }
      else
        for (std::size_t i = 0; i < n; ++i) s[i] = x[i] - ref[i];
    } else {
      if (apply && restart)
        for (std::size_t i = 0; i < n; ++i) {
          x[i] += a[i] - s[i];
          s[i] = x[i];
        }
      else if (apply)
        for (std::size_t i = 0; i < n; ++i) x[i] += a[i] - s[i];
      else
        std::memcpy(s, x, n * sizeof(float));
    }
    if (restart) {
      if (codec_) {
        background_ =
            ctx_.comm.allreduce_compressed_async(s, averaged_.data(), n, *codec_, codec_state_, ReduceOp::kAvg);
        ctx_.stats.bytes += codec_->payload_bytes(n) + codec_->scale_count(n) * sizeof(float);
      } else {
        background_ = ctx_.comm.allreduce_async(s, averaged_.data(), n, DataType::kFloat32, ReduceOp::kAvg);
        ctx_.stats.bytes += n * sizeof(float);
      }
      in_flight_ = true;
      launched_at_ = t;
      ++ctx_.stats.averages;
    }
    ctx_.stats.wait_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }

  AveragingContext& ctx_;
  std::vector<float> snapshot_, averaged_, reference_;
  std::unique_ptr<compression::Codec> codec_;
  compression::CodecState codec_state_;
  Work background_;
  bool in_flight_ = false;
  std::int64_t launched_at_ = 0;  // the step whose snapshot is in flight
};

}  // namespace

AveragingMethodRow async_row() {
  return {"async",
          {"period", "warmup", "delay", "codec"},
          {"period"},
          {"period"},
          false,
          "every H steps a snapshot averaged in the background while compute goes on, applied D steps later (delay; "
          "H by default)",
          [](AveragingContext& ctx) { return std::make_unique<Async>(ctx); }};
}

}  // namespace hopwise::comm::detail
