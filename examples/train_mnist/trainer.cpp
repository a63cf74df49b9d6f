// train_mnist's training loop (trainer.h).
#include "trainer.h"

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <thread>

#include "checkpoint.h"
#include "hopwise/common/error.h"
#include "hopwise/common/log.h"
#include "hopwise/training/averaging_method.h"

namespace hopwise::examples {

namespace {

namespace hc = hopwise::comm;

double ms(Trainer::Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

hc::ReducerOptions reducer_options(const Flags& f) {
  hc::ReducerOptions ro;
  ro.bucket_mb = f.bucket_mb;
  ro.tune_bucket = f.tune_bucket;
  ro.first_bucket_mb = std::min(1.0, f.bucket_mb);
  ro.overlap = f.overlap;
  ro.compression = f.compression;
  ro.tune_steps = hc::ReducerOptions::from_env().tune_steps;  // HOPWISE_STEP_TUNE
  return ro;
}

}  // namespace

Trainer::Trainer(hc::Communicator& comm, Flags flags, hc::ElasticGroup* elastic)
    : comm_(&comm),
      elastic_(elastic),
      f_(std::move(flags)),
      rank_(comm.rank()),
      p_(comm.size()),
      data_dir_(default_mnist_dir()),
      train_(load_fashion_mnist(data_dir_, "train")),
      test_(load_fashion_mnist(data_dir_, "t10k")),
      px_(train_.rows * train_.cols),
      n_train_(f_.limit ? std::min(f_.limit, train_.size()) : train_.size()),
      model_({px_, f_.hidden, f_.hidden, 10}, f_.seed, f_.chunks),
      trace_{Clock::now(), {}, rank_, !f_.trace.empty()},
      tty_(isatty(STDOUT_FILENO) != 0),
      steps_per_epoch_(n_train_ / static_cast<std::size_t>(f_.batch)),
      order_(n_train_) {
  comm.set_algorithm(hc::parse_algorithm(f_.algo));
  models_differ_ = hc::AveragingSpec::parse(f_.averaging).method != "sync";
  split_batch();
  make_reducer();
  if (elastic_ && elastic_->joined_late()) {  // a newcomer: the members send where they stand
    const auto spec = hc::AveragingSpec::parse(f_.averaging);
    if (hc::averaging_regroups(spec)) {  // the members keep theirs and send this one its outer state
      averager_.emplace(comm, spec, model_.params(), model_.parameter_count(), nullptr, /*joining=*/true);
      averager_->regroup(comm);
    } else {
      averager_.emplace(comm, spec, model_.params(), model_.parameter_count());
    }
    share_state();
    resumed_steps_ = steps_done_;  // share_state() set the place: steps, epochs ended, last checkpoint
    resumed_from_ = "the running job (joined)";
    just_joined_ = true;
  } else {
    resume();
  }
  sum_.target_accuracy = f_.target;
}

// This rank's slice of the global batch: an equal share, or after a shrink to ranks that do not divide it, one more
// image on the first batch % p ranks (forward scales the gradient so that the average is the global batch's mean).
// --elastic-batch scale-lr instead keeps each rank's share of the job as launched and scales the learning rate with
// the ranks (the global batch follows them).
void Trainer::split_batch() {
  if (launched_ranks_ == 0) launched_ranks_ = p_;
  lr_ = f_.lr;
  if (f_.elastic_scale_lr && p_ != launched_ranks_) {
    local_ = f_.batch / launched_ranks_;
    first_ = rank_ * local_;
    grad_scale_ = 1;
    lr_ = f_.lr * static_cast<float>(p_) / static_cast<float>(launched_ranks_);
    xb_.resize(static_cast<std::size_t>(px_) * static_cast<std::size_t>(local_));
    yb_.resize(static_cast<std::size_t>(local_));
    return;
  }
  const int share = f_.batch / p_, extra = f_.batch % p_;
  local_ = share + (rank_ < extra ? 1 : 0);
  first_ = rank_ * share + std::min(rank_, extra);
  grad_scale_ = static_cast<float>(local_) * static_cast<float>(p_) / static_cast<float>(f_.batch);
  xb_.resize(static_cast<std::size_t>(px_) * static_cast<std::size_t>(local_));
  yb_.resize(static_cast<std::size_t>(local_));
}

std::string Trainer::batch_policy() const {
  if (f_.elastic_scale_lr && p_ != launched_ranks_)
    return fmt::format("global batch {}, learning rate scaled to {:.4g}", local_ * p_, lr_);
  return fmt::format("global batch {} kept", f_.batch);
}

void Trainer::make_reducer() {
  reducer_.emplace(*comm_, reducer_options(f_));
  for (const auto& t : model_.tensors()) reducer_->add_parameter(t.name, model_.grads() + t.offset, t.rows, t.cols);
  reducer_->finalize();
}

void Trainer::resume() {
  const std::string from = f_.resume == "auto" ? f_.checkpoint : f_.resume;
  std::optional<Checkpoint> c;
  if (!from.empty())
    c = load_newest_checkpoint(*comm_, from, model_.params(), model_.velocity(), model_.parameter_count());
  if (!from.empty() && !c && f_.resume != "auto")
    throw InvalidArgument(
        fmt::format("--resume {}: no checkpoint files {}.step*.rank* (--resume auto starts afresh "
                    "where there are none)",
                    from, from));
  if (c && c->ranks != p_)
    throw InvalidArgument(fmt::format("checkpoint {}: saved by {} ranks, this job has {}", from, c->ranks, p_));
  if (c && c->batch != f_.batch)
    throw InvalidArgument(
        fmt::format("checkpoint {}: saved with --batch {}, this run has {}; resume with the same --batch", from,
                    c->batch, f_.batch));
  // Rank 0's parameters to every rank (identical at a checkpoint, which follows a full average, or the same seed).
  averager_.emplace(*comm_, hc::AveragingSpec::parse(f_.averaging), model_.params(), model_.parameter_count());
  if (!c) {
    run_ = new_run_id(*comm_);
    return;
  }
  averager_->load(c->averaging);
  steps_done_ = resumed_steps_ = checkpointed_step_ = c->steps_done;
  epochs_ended_ = epoch_of(steps_done_);
  resumed_from_ = from;
  run_ = c->run;
}

void Trainer::print_plan() const {
  if (rank_ != 0) return;
  const std::size_t hosts = comm_->cluster() ? comm_->cluster()->hosts.size() : (comm_->local_size() == p_ ? 1 : 0);
  fmt::print("train_mnist: {} ranks over {} on {} host(s), Fashion-MNIST {} train / {} test images from {}\n", p_,
             comm_->transport().name(), hosts ? std::to_string(hosts) : std::string("several"), n_train_, test_.size(),
             data_dir_);
  if (!comm_->plan_description().empty()) fmt::print("topology plan, {}", comm_->plan_description());
  std::string ring;
  for (int r : comm_->ring_order()) ring += (ring.empty() ? "" : "→") + std::to_string(r);
  fmt::print("communicator: ring {} ({}); {}; cost model {}\n", ring,
             comm_->plan_description().empty() ? "rank order: topology discovery is off" : "planned",
             comm_->local_size() == p_ ? "one host (shared-memory slots)" : "several hosts",
             comm_->cost_model().params().source);
  std::size_t k = 0;
  for (const auto& b : reducer_->bucket_names()) {
    std::size_t count = 0;
    for (const auto& t : model_.tensors())
      if (std::find(b.begin(), b.end(), t.name) != b.end()) count += t.count;
    fmt::print("  bucket {}: {} ({:.2f} MB) -> {}\n", k++, fmt::join(b, ", "), count * 4 / 1e6,
               f_.compression == "none"
                   ? std::string(hc::to_string(comm_->algorithm_for(hc::Collective::kAllreduce, count * 4))) +
                         (comm_->tuned_choice(hc::Collective::kAllreduce, count * 4)
                              ? ""
                              : " (cost model; tuned in the first steps)")
                   : f_.compression + " (its payloads all-reduced or all-gathered)");
  }
  fmt::print(
      "model {}-{}-{}-10: {} parameters ({:.1f} MB of gradients per step); batch {} ({} per rank); "
      "overlap {}; compression {}; averaging {}{}\n",
      px_, f_.hidden, f_.hidden, model_.parameter_count(), model_.parameter_count() * 4 / 1e6, f_.batch,
      f_.batch % p_ ? fmt::format("{} or {}", f_.batch / p_ + 1, f_.batch / p_) : std::to_string(local_),
      f_.overlap ? "on" : "off (--no-overlap)", f_.compression, averager_->spec().to_string(),
      resumed_from_.empty() ? std::string()
                            : fmt::format("; resumed at step {} (epoch {}, step {} of it) from {}", resumed_steps_,
                                          epoch_of(resumed_steps_) + 1, step_in_epoch(resumed_steps_), resumed_from_));
  std::fflush(stdout);  // a log file holds it even if this process is killed next (a restart's resume line)
}

void Trainer::order_epoch(int epoch) {
  if (ordered_epoch_ == epoch) return;
  std::mt19937_64 rng(f_.seed + 1);
  for (int e = 0; e <= epoch; ++e) {  // each epoch's permutation follows the one before, as in one pass
    std::iota(order_.begin(), order_.end(), 0);
    std::shuffle(order_.begin(), order_.end(), rng);
  }
  ordered_epoch_ = epoch;
}

double Trainer::training_s() const { return std::chrono::duration<double>(Clock::now() - start_).count() - paused_s_; }

bool Trainer::epoch_end_pending() const {
  return steps_done_ >= static_cast<std::int64_t>(epochs_ended_ + 1) * static_cast<std::int64_t>(steps_per_epoch_);
}

// Every --checkpoint-every steps, except where the epoch's end saves one anyway.
bool Trainer::checkpoint_due() const {
  return f_.checkpoint_every && steps_done_ > checkpointed_step_ && steps_done_ % f_.checkpoint_every == 0 &&
         !epoch_end_pending();
}

std::int64_t Trainer::position() const { return steps_done_ * 2 + (epoch_end_pending() || checkpoint_due() ? 0 : 1); }

// Driven by the place alone (steps done, epochs ended, last checkpoint), so that after a shrink every survivor
// goes on from where catch_up() put it: the step, the epoch's end or the checkpoint that comes next.
void Trainer::train() {
  f_.monitor.job = "train_mnist";
  // The progress line printed last may have no newline yet: the monitor's lines and hopwise's warnings end it first.
  f_.monitor.print_line = [](const std::string& line) {
    hopwise::log::end_console_line();
    fmt::print("{}\n", line);
  };
  monitor_.emplace(*comm_, f_.monitor);
  start_ = Clock::now();
  double loss_sum = 0;
  int loss_epoch = -1;
  std::size_t losses = 0;
  while (epochs_ended_ < f_.epochs) {
    const int epoch = epochs_ended_;
    if (epoch_end_pending()) {
      while (!survive([&] { end_epoch(epoch); })) {
      }
      continue;
    }
    if (checkpoint_due()) {
      while (!survive([&] { checkpoint(); })) {
      }
      continue;
    }
    const auto s = static_cast<std::size_t>(steps_done_ - static_cast<std::int64_t>(epoch) *
                                                              static_cast<std::int64_t>(steps_per_epoch_));
    order_epoch(epoch);
    if (loss_epoch != epoch) loss_sum = 0, losses = 0, loss_epoch = epoch;
    if (elastic_ && elastic_->options().grow) {
      if (just_joined_)
        just_joined_ = false;  // the members asked at this boundary already, before letting this process in
      else if (!survive([&] { grow(); }))
        continue;
    }
    const double loss_before = loss_sum;
    if (!survive([&] { step(s, loss_sum); })) {
      loss_sum = loss_before;
      continue;  // the step again (or where catch_up() put this rank), over the survivors
    }
    ++steps_done_;
    ++losses;
    probe_target(epoch, s);
    progress(epoch, s, loss_sum, losses);
    say_choice();
  }
}

// The library logs the choice at INFO only (HOPWISE_DEBUG); the trainer shows it always, on a line of its own: an
// open progress bar's line is ended first, as for the monitor's lines, and the bar goes on below.
void Trainer::say_choice() {
  if (rank_ != 0 || !averager_->spec().pick) return;
  std::string why = averager_->choice();
  if (why.empty() || why == said_) return;  // each new decision once (the choice, then its checks)
  said_ = std::move(why);
  const std::string& line = said_;
  hopwise::log::end_console_line();
  fmt::print("{}\n", line);
  std::fflush(stdout);
}

int Trainer::epoch_of(std::int64_t steps) const {
  return static_cast<int>(steps / static_cast<std::int64_t>(std::max<std::size_t>(1, steps_per_epoch_)));
}

std::size_t Trainer::step_in_epoch(std::int64_t steps) const {
  return static_cast<std::size_t>(steps % static_cast<std::int64_t>(std::max<std::size_t>(1, steps_per_epoch_)));
}

// Under an averaging method the ranks' models differ between averagings: a checkpoint averages fully first (an
// uninterrupted run with the same flags does the same), so that a resumed run starts where it would have gone on.
void Trainer::checkpoint() {
  const auto a0 = Clock::now();
  averager_->full_average();
  totals_.averaging_ms += ms(Clock::now() - a0);
  save_checkpoint(*comm_, f_.checkpoint, {steps_done_, p_, f_.batch, run_, averager_->save()}, model_.params(),
                  model_.velocity(), model_.parameter_count());
  checkpointed_step_ = steps_done_;
}

void Trainer::step(std::size_t s, double& loss_sum) {
  const auto t0 = Clock::now();
  for (int j = 0; j < local_; ++j) {  // this rank's slice of the global batch
    const std::size_t idx = order_[s * static_cast<std::size_t>(f_.batch) + static_cast<std::size_t>(first_ + j)];
    std::memcpy(xb_.data() + static_cast<std::size_t>(j) * px_, train_.images.data() + idx * px_, px_ * sizeof(float));
    yb_[static_cast<std::size_t>(j)] = train_.labels[idx];
  }
  keep_step_start();
  hc::ModelAverager& averager = *averager_;
  reducer_->set_scope(averager.gradient_scope());
  loss_sum += model_.forward(xb_.data(), yb_.data(), local_, grad_scale_);
  if (rank_ == f_.straggler) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(f_.straggle_ms));
  const auto t_fwd = Clock::now();
  Clock::time_point layer_start;
  const std::size_t steps = totals_.steps;
  model_.backward([&](int i) { reducer_->mark_ready(i); },
                  [&](int l, bool begin) {
                    if (begin)
                      layer_start = Clock::now();
                    else if (steps < 200)
                      trace_.span(fmt::format("backward layer{}", l + 1), "compute", layer_start, Clock::now(), 0);
                  });
  const auto t_bwd = Clock::now();
  if (neighbour_) neighbour_->settle();  // sent while the step computed
  const hc::StepStats st = reducer_->finish();
  const double waited_before = averager.stats().wait_ms;
  averager.before_step();
  const auto t_opt = Clock::now();
  model_.sgd_step(lr_, f_.momentum);
  step_applied_ = true;
  const auto t_opt_end = Clock::now();
  averager.after_step();
  const auto t1 = Clock::now();
  const double averaged_ms = averager.stats().wait_ms - waited_before;
  if (steps < 200) {
    trace_.span("forward", "compute", t0, t_fwd, 0);
    trace_.span("finish (exposed comm)", "comm", t_bwd, t1, 0);
    for (const auto& b : reducer_->last_timings())
      trace_.span(fmt::format("allreduce bucket {} ({:.2f} MB)", b.bucket, b.bytes / 1e6), "comm", b.start, b.end, 1);
  }
  const double step_compute_ms = ms(t_bwd - t0) + ms(t_opt_end - t_opt);  // forward, backward, optimizer step
  if (monitor_->on()) {
    hc::StepSample sample{ms(t1 - t0), step_compute_ms, st.exposed_comm_ms + averaged_ms, {}};
    for (const auto& b : reducer_->last_timings()) sample.bucket_ms.push_back(ms(b.end - b.start));
    monitor_->record(sample);
  }
  Totals& t = totals_;
  t.compute_ms += step_compute_ms;
  t.forward_ms += ms(t_fwd - t0);
  t.backward_ms += ms(t_bwd - t_fwd);
  t.optimizer_ms += ms(t_opt_end - t_opt);
  if (!reducer_->last_timings().empty()) {
    auto first = reducer_->last_timings().front().start;
    for (const auto& b : reducer_->last_timings()) first = std::min(first, b.start);
    t.first_bucket_ms += ms(first - t0);
  }
  t.comm_ms += st.comm_ms;
  t.exposed_ms += st.exposed_comm_ms + averaged_ms;
  t.gradient_exposed_ms += st.exposed_comm_ms;
  t.averaging_ms += averaged_ms;
  t.step_ms += ms(t1 - t0);
  t.gradient_bytes += st.bytes;
  ++t.steps;
}

// The target's probes: the mean model evaluated off the clock, every rank's own left as it is.
void Trainer::probe_target(int epoch, std::size_t s) {
  if (f_.target <= 0 || sum_.seconds_to_target >= 0 || totals_.steps % static_cast<std::size_t>(f_.eval_every) != 0)
    return;
  const auto e0 = Clock::now();
  probe_.resize(model_.parameter_count());
  averager_->average_into(probe_.data());
  std::swap_ranges(probe_.begin(), probe_.end(), model_.params());
  const double acc = evaluate();
  std::swap_ranges(probe_.begin(), probe_.end(), model_.params());
  paused_s_ += std::chrono::duration<double>(Clock::now() - e0).count();
  if (acc >= f_.target) {
    sum_.seconds_to_target = training_s();
    sum_.steps_to_target = totals_.steps;
    sum_.epochs_to_target = epoch + static_cast<double>(s + 1) / static_cast<double>(steps_per_epoch_);
  }
}

// A bar redrawn in place on a terminal; a line per quarter epoch in a log.
void Trainer::progress(int epoch, std::size_t s, double loss_sum, std::size_t losses) const {
  const std::size_t every = std::max<std::size_t>(1, steps_per_epoch_ / (tty_ ? 40 : 4));
  if (rank_ != 0 || (s % every != every - 1 && s + 1 != steps_per_epoch_)) return;
  const int w = 30, done = static_cast<int>(w * (s + 1) / steps_per_epoch_);
  fmt::print("{}epoch {}/{} [{}{}] {:3d}% loss {:.3f}", tty_ ? "\r" : "", epoch + 1, f_.epochs,
             std::string(static_cast<std::size_t>(done), '#'), std::string(static_cast<std::size_t>(w - done), '.'),
             static_cast<int>(100 * (s + 1) / steps_per_epoch_), loss_sum / static_cast<double>(losses));
  if (!tty_ && s + 1 != steps_per_epoch_) fmt::print("\n");
  std::fflush(stdout);
  hopwise::log::set_console_line_open(tty_ || s + 1 == steps_per_epoch_);
}

// Every epoch ends with one full average (every rank then holds the same model), an evaluation and the checkpoint.
void Trainer::end_epoch(int epoch) {
  const auto a0 = Clock::now();
  averager_->full_average();
  totals_.averaging_ms += ms(Clock::now() - a0);
  const auto e0 = Clock::now();
  const double acc = evaluate();
  paused_s_ += std::chrono::duration<double>(Clock::now() - e0).count();
  if (accuracy_epoch_ == epoch) sum_.epoch_accuracy.pop_back();  // the epoch's end done again after a shrink
  sum_.epoch_accuracy.push_back(acc);
  accuracy_epoch_ = epoch;
  if (f_.target > 0 && sum_.seconds_to_target < 0 && acc >= f_.target) {
    sum_.seconds_to_target = training_s();
    sum_.steps_to_target = totals_.steps;
    sum_.epochs_to_target = epoch + 1;
  }
  if (rank_ == 0) {
    // The epoch's bar ends with its accuracy, unless a warning ended its line already.
    const bool open = hopwise::log::console_line_open();
    hopwise::log::set_console_line_open(false);
    fmt::print("{}test accuracy {:.2f}%\n", open ? " " : "epoch " + std::to_string(epoch + 1) + ": ", 100 * acc);
  }
  if (!f_.checkpoint.empty())
    save_checkpoint(*comm_, f_.checkpoint, {steps_done_, p_, f_.batch, run_, averager_->save()}, model_.params(),
                    model_.velocity(), model_.parameter_count());
  epochs_ended_ = epoch + 1;
}

// Each rank scores a slice of the test set, the counts are summed.
double Trainer::evaluate() {
  std::vector<int> pred;
  std::int64_t correct = 0;
  const std::size_t per = (test_.size() + static_cast<std::size_t>(p_) - 1) / static_cast<std::size_t>(p_);
  const std::size_t lo = std::min(test_.size(), per * static_cast<std::size_t>(rank_)),
                    hi = std::min(test_.size(), lo + per);
  for (std::size_t a = lo; a < hi; a += 1000) {
    const int n = static_cast<int>(std::min<std::size_t>(1000, hi - a));
    model_.predict(test_.images.data() + a * px_, n, pred);
    for (int j = 0; j < n; ++j)
      correct += pred[static_cast<std::size_t>(j)] == test_.labels[a + static_cast<std::size_t>(j)];
  }
  comm_->allreduce(&correct, &correct, 1, hopwise::DataType::kInt64, hopwise::ReduceOp::kSum);
  return static_cast<double>(correct) / static_cast<double>(test_.size());
}

void Trainer::report() {
  const Totals& t = totals_;
  const double wall_s = std::max(1e-9, training_s());
  const double acc = sum_.epoch_accuracy.empty() ? evaluate() : sum_.epoch_accuracy.back();
  const double n_steps = std::max<double>(1, static_cast<double>(t.steps));
  const double overlap_pct =
      t.comm_ms > 0 ? std::clamp(100.0 * (1 - t.gradient_exposed_ms / t.comm_ms), 0.0, 100.0) : 100.0;
  if (monitor_) monitor_->finish();
  if (!f_.trace.empty()) write_trace(*comm_, trace_, f_.trace);
  const bool same = elastic_ && parameters_identical();
  if (rank_ != 0) return;
  if (elastic_)
    fmt::print("elastic: the parameters are {} on the {} rank(s)\n", same ? "bit-identical" : "NOT identical", p_);
  const hc::ModelAverager& averager = *averager_;
  const double avg_bytes = static_cast<double>(averager.stats().bytes) / n_steps;
  fmt::print(
      "test accuracy {:.2f}% after {} epoch(s); {:.0f} images/s; step {:.2f} ms (compute {:.2f} ms: {:.0f}% "
      "utilization; gradient communication {:.2f} ms of which exposed {:.2f} ms: {:.0f}% hidden; waiting on "
      "averaging {:.2f} ms); {:.2f} MB on the wire per step per rank\n",
      100 * acc, f_.epochs, static_cast<double>(t.steps) * f_.batch / wall_s, t.step_ms / n_steps,
      t.compute_ms / n_steps, t.step_ms > 0 ? 100 * t.compute_ms / t.step_ms : 0.0, t.comm_ms / n_steps,
      t.gradient_exposed_ms / n_steps, overlap_pct, t.averaging_ms / n_steps,
      (static_cast<double>(t.gradient_bytes) / n_steps + avg_bytes) / 1e6);
  if (averager.spec().method != "sync")
    fmt::print("{}\n",
               describe_averaging(averager.spec().to_string(), averager.stats(), n_steps, t.averaging_ms / n_steps));
  if (sum_.elastic_events)
    fmt::print(
        "elastic: {} membership change(s) survived, {} step(s) done again, {:.1f} s stood still; {} rank(s) "
        "at the end\n",
        sum_.elastic_events, sum_.steps_redone, sum_.stood_still_s, p_);
  if (f_.target > 0)
    std::fputs(
        sum_.seconds_to_target >= 0
            ? fmt::format("target accuracy {:.2f}% reached after {} steps ({:.2f} epochs), {:.1f} s of training\n",
                          100 * f_.target, sum_.steps_to_target, sum_.epochs_to_target, sum_.seconds_to_target)
                  .c_str()
            : fmt::format("target accuracy {:.2f}% not reached\n", 100 * f_.target).c_str(),
        stdout);
  if (!f_.trace.empty()) fmt::print("trace written to {} (open in ui.perfetto.dev or chrome://tracing)\n", f_.trace);
  const hc::CollectiveStats cs = comm_->stats();
  const std::string tuned = describe_tuned(comm_->tuning().entries);
  if (f_.tune_bucket)
    fmt::print("bucket cap: {} MB ({}; {} buckets)\n", reducer_->bucket_mb(),
               reducer_->tuning_bucket() ? "still tuning: too few steps" : "measured", reducer_->bucket_count());
  if (!tuned.empty())
    fmt::print("tuned (size class up to: choice): {}; {} trial calls, {} re-tunes{}, {:.1f} ms beyond the choices\n",
               tuned, cs.tuning_trials, cs.retunes,
               cs.retunes
                   ? " (a choice slowed past its steady time, as on a busy machine; HOPWISE_DEBUG=INFO names them)"
                   : "",
               cs.tuning_excess_s * 1e3);
  const std::vector<hc::StepTuning> step_tuning = reducer_ ? reducer_->step_tuning() : std::vector<hc::StepTuning>{};
  const int step_reverts = reducer_ ? reducer_->step_tuning_reverts() : 0;
  if (!step_tuning.empty())
    fmt::print("step-tuned (buckets up to: choice, the slowest rank's median step): {}; {} reverted by the guard\n",
               describe(step_tuning), step_reverts);
  if (f_.json.empty()) return;
  Summary sum = sum_;
  sum.step_tuning_json = to_json(step_tuning);
  sum.step_tuning_reverts = step_reverts;
  sum.ranks = p_;
  sum.epochs = f_.epochs;
  sum.batch = f_.batch;
  sum.steps = t.steps;
  sum.test_accuracy = acc;
  sum.train_s = wall_s;
  sum.images_per_s = static_cast<double>(t.steps) * f_.batch / wall_s;
  sum.step_ms = t.step_ms / n_steps;
  sum.compute_ms = t.compute_ms / n_steps;
  sum.compute_utilization = t.step_ms > 0 ? t.compute_ms / t.step_ms : 0;
  sum.forward_ms = t.forward_ms / n_steps;
  sum.backward_ms = t.backward_ms / n_steps;
  sum.optimizer_ms = t.optimizer_ms / n_steps;
  sum.first_bucket_ms = t.first_bucket_ms / n_steps;
  sum.comm_ms = t.comm_ms / n_steps;
  sum.exposed_comm_ms = t.exposed_ms / n_steps;
  sum.averaging_ms = t.averaging_ms / n_steps;
  sum.overlap_pct = overlap_pct;
  sum.gradient_bytes_per_step = static_cast<double>(t.gradient_bytes) / n_steps;
  sum.averaging_bytes_per_step = avg_bytes;
  sum.averaging_syncs = averager.stats().syncs;
  sum.averaging_comm_ms = averager.stats().comm_ms / n_steps;
  sum.averaging_hidden_ms = averager.stats().hidden_ms / n_steps;
  sum.averaging_state_bytes = averager.stats().state_bytes;
  sum.bytes_per_step = sum.gradient_bytes_per_step + avg_bytes;
  sum.compression = f_.compression;
  sum.averaging = averager.spec().to_string();
  sum.overlap = f_.overlap;
  write_json(f_.json, sum);
}

}  // namespace hopwise::examples
