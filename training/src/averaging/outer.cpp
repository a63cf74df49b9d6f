// The rows of the methods the outer path runs (local, hier, async, diloco): each its settings for Outer (outer.h).
#include <fmt/core.h>

#include "outer.h"

namespace hopwise::comm::detail {

namespace {

OuterSettings settings_of(const AveragingSpec& s) {
  OuterSettings o;
  o.period = s.period;
  o.warmup = s.warmup;
  o.lr = s.outer_lr;
  o.momentum = s.momentum;
  o.nesterov = s.nesterov != 0;
  o.fragments = s.fragments;
  o.delay = s.delay;
  o.alpha = s.alpha;
  o.codec = s.codec;
  return o;
}

// Plain averaging: lr 1, no momentum, one fragment.
OuterSettings plain_of(const AveragingSpec& s, int delay) {
  OuterSettings o;
  o.period = s.period;
  o.warmup = s.warmup;
  o.delay = delay;
  o.codec = s.codec;
  return o;
}

}  // namespace

AveragingMethodRow local_row() {
  return {
      "local",
      {"period", "warmup"},
      {"period"},
      {"period", "warmup"},
      false,
      "post-local SGD: W synchronous steps, then no gradient communication and the parameters averaged every H",
      [](AveragingContext& ctx) { return std::make_unique<Outer>(ctx, plain_of(ctx.spec, 0), GradientScope::kNone); }};
}

AveragingMethodRow hier_row() {
  return {
      "hier",
      {"period", "warmup"},
      {"period"},
      {"period"},
      false,
      "gradients averaged within each host every step, parameters across the world every H steps",
      [](AveragingContext& ctx) { return std::make_unique<Outer>(ctx, plain_of(ctx.spec, 0), GradientScope::kHost); }};
}

AveragingMethodRow async_row() {
  AveragingMethodRow row{
      "async",
      {"period", "warmup", "delay", "codec"},
      {"period"},
      {"period"},
      false,
      "every H steps a snapshot averaged in the background while compute goes on, applied D steps later (delay; "
      "H by default)",
      [](AveragingContext& ctx) {
        const int delay = ctx.spec.delay > 0 ? ctx.spec.delay : ctx.spec.period;
        return std::make_unique<Outer>(ctx, plain_of(ctx.spec, delay), GradientScope::kNone);
      }};
  row.delay_up_to_period = true;
  return row;
}

AveragingMethodRow diloco_row() {
  AveragingMethodRow row{
      "diloco",
      {"period", "warmup", "outer_lr", "momentum", "nesterov", "fragments", "delay", "alpha", "codec", "auto", "target",
       "inner"},
      {"period"},
      {"period"},
      false,
      "DiLoCo: H local steps, then the pseudo-gradient averaged and applied by an outer Nesterov SGD; fragments "
      "streamed, delayed, compressed with error feedback; auto picks them",
      [](AveragingContext& ctx) { return std::make_unique<Outer>(ctx, settings_of(ctx.spec), GradientScope::kNone); }};
  row.any_codec = true;
  // Every fixed setting (outer_regroup.cpp); not auto, whose probe starts over.
  row.regroups = [](const AveragingSpec& spec) { return !spec.pick; };
  return row;
}

}  // namespace hopwise::comm::detail
