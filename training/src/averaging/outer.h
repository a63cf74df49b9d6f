// The outer path every periodic method takes: local, hier, async and diloco are one engine with different settings.
//
// Every H steps (after W synchronous ones) a fragment of the model is synced: the ranks' difference from the last
// synced model, d = x - synced (the negative of DiLoCo's pseudo-gradient), is averaged over the world (with a codec
// and per-fragment error feedback, or plainly) and an outer SGD steps the synced model:
//   m = momentum * m + d;  u = lr * (nesterov ? d + momentum * m : m);  synced += u
// With delay D = 0 the sync blocks and x becomes alpha * x + (1 - alpha) * synced. With D > 0 the all-reduce runs on
// the communicator's progress thread behind D steps of compute and x keeps its progress since the launch:
// x += (1 - alpha) * (u - d_sent) (alpha 0: the outer result plus what the rank learned meanwhile). F fragments
// (contiguous ranges) are synced in turn, one every H / F steps, so one is in flight at a time.
//
// local (hier) is lr 1, no momentum, D 0 and no codec: the parameters themselves are averaged in place, the exact
// call and bits post-local SGD always made. async is lr 1, no momentum, D = H by default: its arithmetic is
// x += a - s with s the snapshot (or, with a codec, its difference from the synced model), as before. Plain
// averaging (lr 1, no momentum) keeps no synced copy unless a codec needs one.
//
// diloco:auto runs the probe's schedule (its syncs blocking), then whatever its tuner (auto_tuner.h) chose or changed
// to; Outer asks the tuner at every step and does what it says (reconfigure after a resync, sync blocking for a
// quiet window).
//
// What each setting keeps beside the model, per parameter (stats.state_bytes): the synced copy 4 B (diloco, or a
// codec), momentum 4 B (momentum > 0), the codec's residual 4 B (a codec), and the fragment in flight's send and
// receive buffers 8 B / F (D > 0 or not plain).
//
// The class is here, its rows in outer.cpp, what a change of members does to it in outer_regroup.cpp.
#pragma once

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <vector>

#include "auto_tuner.h"
#include "hopwise/common/error.h"
#include "hopwise/common/log.h"
#include "hopwise/compression/codec.h"
#include "hopwise/training/averaging_method.h"
#include "outer_rule.h"
#include "outer_state.h"
#include "periodic.h"

namespace hopwise::comm::detail {

using Clock = std::chrono::steady_clock;

inline double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

class Outer final : public AveragingMethodBase {
 public:
  Outer(AveragingContext& ctx, OuterSettings s, GradientScope between)
      : ctx_(ctx), between_(between), s_(std::move(s)) {
    if (ctx.spec.pick) {
      tuner_.emplace(ctx);  // measured in the first steps; plain local steps meanwhile
      s_ = probe_settings(ctx.spec);
    }
    // The outer step the rule sets is said: a warning where the inner optimizer is not named (the conservative rule).
    if (ctx.spec.method == "diloco" && (ctx.spec.pick || ctx.spec.outer_by_rule) && ctx.comm->rank() == 0) {
      const std::string why = outer_rule(ctx.spec.inner, ctx.spec.period).why;
      if (ctx.spec.inner.empty())
        log::warn("{}: {}", ctx.spec.to_string(), why);
      else if (!ctx.spec.pick)
        log::info("{}: {}", ctx.spec.to_string(), why);
    }
    configure();
  }
  ~Outer() override { drain(); }

  GradientScope gradient_scope(std::int64_t steps) const override {
    return scope_after_warmup(ctx_.spec, steps, between_);
  }

  void after_step(std::int64_t t) override {
    const auto t0 = Clock::now();
    last_step_ = t;
    if (t == ctx_.spec.warmup && t > 0) ranks_equal();  // the synchronous steps left every rank the same model
    if (picking())
      if (const auto chosen = tuner_->probe(t, t0)) {
        s_ = *chosen;  // every rank holds the same model: the probe ended in a plain average
        configure();
        ctx_.stats.wait_ms += ms_between(t0, Clock::now());
        completed_ = t;
        return;
      }
    const bool applied = flight_.on && t >= flight_.launched_at + s_.delay;
    double waited = applied ? apply() : 0;
    if (tuner_ && tuner_->checking())  // between an apply and a launch: where nothing may be in flight
      if (const auto next = tuner_->check(t, t0, s_, flight_.on)) {
        full_average(ctx_);  // new settings start from one synced model (configure() copies it)
        s_ = *next;
        configure();
      }
    // auto's quiet window: each due fragment synced at once, so the next step computes with no sync at work
    const bool quiet = tuner_ && tuner_->holding();
    const int f = due(t);
    if (f >= 0) {
      const auto l0 = Clock::now();
      launch(f, t);
      if (s_.delay == 0 || quiet) {
        apply();  // launched and applied with no step between: the delayed merge is the blocking one
        waited += ms_between(l0, Clock::now());  // a blocking sync is waited for whole
      }
    }
    // the next step pays for a sync at work in it; in a quiet window what was waited for here is left out of it
    if (tuner_) tuner_->step_done(flight_.on || (!quiet && (applied || f >= 0)), waited);
    ctx_.stats.wait_ms += ms_between(t0, Clock::now());
    completed_ = t;
  }

  void drain() override {
    if (!flight_.on) return;
    flight_.on = false;
    if (!flight_.done && !flight_.failed) flight_.work.wait();
  }
  bool in_flight() const override { return flight_.on; }
  void ranks_equal() override {
    if (synced_.empty()) return;
    ctx_.fetch_all();
    std::memcpy(synced_.data(), ctx_.params, ctx_.count * sizeof(float));
  }

  // Plain averaging keeps the mean whatever is dropped; an outer optimizer takes its step on everything instead,
  // the fragment in flight applied first, and every rank ends on the synced model.
  void full_average(AveragingContext& ctx) override {
    if (plain() || picking()) {
      AveragingMethodBase::full_average(ctx);
      return;
    }
    if (flight_.on) apply();
    // Redone after a regroup (a member was lost inside it): the fragments synced before the loss are not again.
    if (!resume_full_) full_done_ = 0;
    resume_full_ = false;
    in_full_ = true;
    for (int f = full_done_; f < s_.fragments; ++f) {
      launch(f, last_step_, /*everyone_equal=*/true);
      apply();
      full_done_ = f + 1;
    }
    in_full_ = false;
  }

  // Awaited and kept: its apply() finds it done.
  void settle() override {
    if (!flight_.on || flight_.done) return;
    if (flight_.failed) throw InvalidArgument("ModelAverager: the sync in flight failed (detach()); regroup() first");
    const auto w0 = Clock::now();
    flight_.work.wait();
    count_comm(flight_.work, ms_between(w0, Clock::now()));
    if (tuner_) tuner_->sync_ended(ms_between(flight_.work.started(), flight_.work.finished()));
    flight_.done = true;
  }

  bool saves_in_flight() const override { return true; }
  std::string save_state() override {
    settle();
    OuterState st;
    st.settings = s_;
    st.picking = picking();
    st.why = choice();
    st.synced = synced_;
    st.momentum = momentum_;
    for (const auto& fs : codec_states_) st.codecs.push_back({fs.step, fs.residual});
    if (flight_.on) {
      const auto [b, e] = range(flight_.fragment);
      st.flight = {flight_.fragment,
                   flight_.launched_at,
                   {send_.begin(), send_.begin() + static_cast<long>(e - b)},
                   {recv_.begin(), recv_.begin() + static_cast<long>(e - b)}};
    }
    return write_outer_state(st);
  }
  void load_state(const std::string& blob) override {
    drain();
    OuterState st = read_outer_state(blob, ctx_.spec, ctx_.count);
    // A spec fixes the settings; only diloco:auto takes them from the state (what it chose).
    if (!ctx_.spec.pick && (st.settings.to_string() != s_.to_string() || st.settings.warmup != s_.warmup))
      throw InvalidArgument(
          fmt::format("ModelAverager::load: the outer optimizer's state was saved with {}, this "
                      "averager runs {}",
                      st.settings.to_string(), s_.to_string()));
    const OuterSettings was = s_;
    s_ = st.settings;
    configure();  // the buffers the saved settings need, to size the saved arrays against
    // Every array exactly as these settings keep it, or none of it is taken and the averager stays as it was.
    const auto fits = [](const std::vector<float>& saved, const std::vector<float>& kept) {
      return saved.size() == kept.size();
    };
    bool ok = fits(st.synced, synced_) && fits(st.momentum, momentum_) && st.codecs.size() == codec_states_.size();
    for (std::size_t f = 0; ok && f < st.codecs.size(); ++f) {
      const auto [b, e] = range(static_cast<int>(f));
      ok = st.codecs[f].residual.empty() || st.codecs[f].residual.size() == e - b;
    }
    if (ok && st.flight) {
      const auto [b, e] = range(st.flight->fragment);
      ok = st.flight->sent.size() == e - b && st.flight->averaged.size() == e - b;
    }
    if (!ok) {
      const std::string wanted = s_.to_string();
      s_ = was;
      configure();
      throw InvalidArgument(fmt::format(
          "ModelAverager::load: the outer optimizer's saved state does not fit {} on {} parameters (its synced "
          "model, momentum, residuals or fragment in flight are of other sizes)",
          wanted, ctx_.count));
    }
    if (tuner_) tuner_->restore(st.picking, st.why);
    synced_ = std::move(st.synced);
    momentum_ = std::move(st.momentum);
    for (std::size_t f = 0; f < codec_states_.size(); ++f) {
      codec_states_[f].step = st.codecs[f].step;
      codec_states_[f].residual = std::move(st.codecs[f].residual);
    }
    if (st.flight) {
      std::copy(st.flight->sent.begin(), st.flight->sent.end(), send_.begin());
      std::copy(st.flight->averaged.begin(), st.flight->averaged.end(), recv_.begin());
      flight_ = {true, true, st.flight->fragment, st.flight->launched_at, Work(), {}};
    }
  }
  std::string choice() const override { return tuner_ ? tuner_->said() : std::string(); }
  std::string pick() const override { return tuner_ ? tuner_->picked() : std::string(); }

  void detach() override {
    if (!flight_.on || flight_.done || flight_.failed) return;
    try {
      flight_.work.wait();
      flight_.done = true;  // it completed here: every member's pseudo-gradient is in it
    } catch (const std::exception&) {
      flight_.failed = true;  // redone over the next members with what this rank sent (send_)
    }
    flight_.work = Work();
  }
  std::string regroup(std::int64_t& steps) override;

 private:
  struct Flight {
    bool on = false;
    bool done = false;  // restored from a checkpoint: the average is there, nothing to wait for
    int fragment = 0;
    std::int64_t launched_at = 0;
    Work work;
    Clock::time_point launched;
    bool failed = false;          // its all-reduce failed (a member was lost): redone at regroup()
    bool everyone_equal = false;  // launched by full_average(): x becomes the synced model at the merge
  };

  bool picking() const { return tuner_ && tuner_->probing(); }
  // lr 1 and no momentum: the synced model is the plain average, and the parameters can be averaged themselves.
  bool plain() const { return s_.lr == 1.0 && s_.momentum == 0.0; }
  bool direct() const { return plain() && s_.codec == "none"; }
  // The parameters averaged in place, post-local SGD's own call; not where a change of members may redo the sync
  // (a fixed diloco: an all-reduce that fails half way must leave the parameters whole), which averages a copy
  // into recv_ and takes it (the same bits: x = 0 * x + 1 * a).
  bool in_place() const {
    return direct() && s_.delay == 0 && s_.alpha == 0.0 && !(ctx_.spec.method == "diloco" && !ctx_.spec.pick);
  }

  // Buffers and codec states for the current settings (after the probe's choice, or a load).
  void configure() {
    const std::size_t n = ctx_.count;
    const bool need_synced = !direct();
    synced_.assign(need_synced ? n : 0, 0.0f);
    if (need_synced) {
      ctx_.fetch_all();
      std::memcpy(synced_.data(), ctx_.params, n * sizeof(float));
    }
    momentum_.assign(s_.momentum > 0 ? n : 0, 0.0f);
    codec_.reset();
    codec_states_.clear();
    if (s_.codec != "none") {
      codec_ = compression::make_codec(s_.codec + ":ef=1");  // what one sync's rounding leaves out goes into the next
      for (int f = 0; f < s_.fragments; ++f)
        codec_states_.emplace_back(0x6f75746572ull + static_cast<std::uint64_t>(f), ctx_.comm->rank(),
                                   ctx_.comm->size());
    }
    std::size_t largest = 0;
    for (int f = 0; f < s_.fragments; ++f) largest = std::max(largest, range(f).second - range(f).first);
    const bool buffers = !in_place();
    send_.assign(buffers ? largest : 0, 0.0f);
    recv_.assign(buffers ? largest : 0, 0.0f);
    ctx_.stats.state_bytes =
        (synced_.size() + momentum_.size() + (codec_ ? n : 0) + send_.size() + recv_.size()) * sizeof(float);
  }

  std::pair<std::size_t, std::size_t> range(int f) const {
    const auto n = ctx_.count, fs = static_cast<std::size_t>(s_.fragments);
    return {n * static_cast<std::size_t>(f) / fs, n * static_cast<std::size_t>(f + 1) / fs};
  }

  // The fragment synced after step t, or -1: fragment f at offsets (f + 1) * H / F of each period.
  int due(std::int64_t t) const {
    if (t <= s_.warmup) return -1;
    const std::int64_t gap = s_.period / s_.fragments, k = (t - s_.warmup) % s_.period;
    if (k % gap != 0) return -1;
    return static_cast<int>((k == 0 ? s_.fragments : k / gap) - 1);
  }

  void launch(int f, std::int64_t t, bool everyone_equal = false) {
    const auto [b, e] = range(f);
    const std::size_t m = e - b;
    float* x = ctx_.params + b;
    ++ctx_.stats.averages;
    ++ctx_.stats.syncs;
    flight_ = {true, false, f, t, Work(), Clock::now()};
    flight_.everyone_equal = everyone_equal;
    ctx_.fetch(b, e);
    if (in_place()) {
      const auto c0 = Clock::now();
      ctx_.comm->allreduce(x, x, m, DataType::kFloat32, ReduceOp::kAvg);
      ctx_.publish(b, e);
      const double took = ms_between(c0, Clock::now());
      ctx_.stats.comm_ms += took;  // blocking: none of it hidden
      ctx_.stats.bytes += m * sizeof(float);
      if (tuner_) tuner_->sync_ended(took);
      flight_.done = true;
      return;
    }
    fill_send(f);
    start_allreduce(f);
  }

  // send_: fragment f's parameters (direct) or its difference from the synced model, from params (fetched).
  void fill_send(int f) {
    const auto [b, e] = range(f);
    const float* x = ctx_.params + b;
    if (direct())
      std::memcpy(send_.data(), x, (e - b) * sizeof(float));
    else
      for (std::size_t i = 0; i < e - b; ++i) send_[i] = x[i] - synced_[b + i];
  }

  // send_ (fragment f's pseudo-gradient, or its parameters where direct) all-reduced into recv_ in the background.
  void start_allreduce(int f) {
    const std::size_t m = range(f).second - range(f).first;
    if (codec_) {
      flight_.work = ctx_.comm->allreduce_compressed_async(send_.data(), recv_.data(), m, *codec_,
                                                           codec_states_[static_cast<std::size_t>(f)], ReduceOp::kAvg);
      ctx_.stats.bytes += codec_->payload_bytes(m) + codec_->scale_count(m) * sizeof(float);
    } else {
      flight_.work = ctx_.comm->allreduce_async(send_.data(), recv_.data(), m, DataType::kFloat32, ReduceOp::kAvg);
      ctx_.stats.bytes += m * sizeof(float);
    }
  }

  // A background all-reduce's time, and the part of it the caller did not wait for.
  void count_comm(Work& work, double waited_ms) {
    const double took = ms_between(work.started(), work.finished());
    ctx_.stats.comm_ms += took;
    ctx_.stats.hidden_ms += std::max(0.0, took - waited_ms);
  }

  // The fragment in flight's average applied (see the head comment); returns what it waited for the all-reduce.
  // everyone_equal: x becomes the synced model whatever alpha and the delay say (a full average).
  double apply(bool everyone_equal = false) {
    if (flight_.failed) throw InvalidArgument("ModelAverager: the sync in flight failed (detach()); regroup() first");
    double waited = 0;
    if (!flight_.done) {  // waited for before it is taken: where it fails, detach() finds it still in flight
      const auto w0 = Clock::now();
      flight_.work.wait();
      waited = ms_between(w0, Clock::now());
      count_comm(flight_.work, waited);
      if (tuner_) tuner_->sync_ended(ms_between(flight_.work.started(), flight_.work.finished()));
    }
    Flight fl = std::move(flight_);
    flight_ = Flight{};
    everyone_equal = everyone_equal || fl.everyone_equal;
    ++applied_;
    const auto [b, e] = range(fl.fragment);
    const std::size_t m = e - b;
    float* x = ctx_.params + b;
    const float* a = recv_.data();
    const float* s = send_.data();
    const float keep = static_cast<float>(s_.alpha), take = static_cast<float>(1.0 - s_.alpha);
    if (direct()) {
      if (in_place()) return waited;  // averaged at the launch
      ctx_.fetch(b, e);               // the local model as it is now (D > 0: steps on since the launch)
      if (s_.delay == 0)
        for (std::size_t i = 0; i < m; ++i) x[i] = keep * x[i] + take * a[i];
      else
        for (std::size_t i = 0; i < m; ++i) x[i] += take * (a[i] - s[i]);
      ctx_.publish(b, e);
      return waited;
    }
    float* y = synced_.data() + b;
    const float lr = static_cast<float>(s_.lr), mu = static_cast<float>(s_.momentum);
    float* mom = momentum_.empty() ? nullptr : momentum_.data() + b;
    const bool blocking = s_.delay == 0 || everyone_equal;
    // x is read unless it becomes the synced model outright (then the launch just before fetched this range)
    if (!everyone_equal && !(blocking && s_.alpha == 0.0)) ctx_.fetch(b, e);
    for (std::size_t i = 0; i < m; ++i) {
      float step = a[i];
      if (mom) {
        mom[i] = mu * mom[i] + a[i];
        step = s_.nesterov ? a[i] + mu * mom[i] : mom[i];
      }
      const float u = lr * step;
      y[i] += u;
      if (everyone_equal || (blocking && s_.alpha == 0.0))
        x[i] = y[i];
      else if (blocking)
        x[i] = keep * x[i] + take * y[i];
      else
        x[i] += take * (u - s[i]);
    }
    ctx_.publish(b, e);
    return waited;
  }

  // A member behind the furthest one: its sync of fragment f failed where the furthest's completed. The furthest's
  // synced model (now in synced_) replaces y_old on f, and x merges as apply() would have (outer_regroup.cpp).
  void merge_missed(int f, const std::vector<float>& y_old, bool everyone_equal);

  AveragingContext& ctx_;
  GradientScope between_;
  OuterSettings s_;
  std::vector<float> synced_, momentum_, send_, recv_;
  std::unique_ptr<compression::Codec> codec_;
  std::vector<compression::CodecState> codec_states_;  // one per fragment: its own residual
  Flight flight_;
  std::optional<AutoTuner> tuner_;  // diloco:auto: what it measures and decides
  std::int64_t last_step_ = 0;
  std::int64_t applied_ = 0;    // fragment syncs applied: where this member stands against the others (regroup)
  std::int64_t completed_ = 0;  // the last step whose after_step() ran to its end (one that failed did not)
  int full_done_ = 0;           // fragments full_average() synced at last_step_
  bool in_full_ = false;        // inside full_average()'s loop (a loss there leaves it unfinished)
  bool resume_full_ = false;    // the next full_average() goes on from full_done_ (set by regroup)
};

}  // namespace hopwise::comm::detail
