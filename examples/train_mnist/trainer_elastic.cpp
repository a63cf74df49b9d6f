// train_mnist's elastic side (trainer.h): a lost rank survived (shrink), newcomers let in (grow), the state each
// step starts from and the ring neighbour's copy of it, and the survivors' agreement on where they stand.
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>

#include "hopwise/common/error.h"
#include "hopwise/common/log.h"
#include "trainer.h"

namespace hopwise::examples {

namespace {

namespace hc = hopwise::comm;

double seconds_since(Trainer::Clock::time_point t0) {
  return std::chrono::duration<double>(Trainer::Clock::now() - t0).count();
}

}  // namespace

// Whether every rank holds the same parameters, bit for bit (a hash of each rank's, compared). Collective.
bool Trainer::parameters_identical() {
  std::uint64_t h = 1469598103934665603ull;
  const auto* bytes = reinterpret_cast<const unsigned char*>(model_.params());
  for (std::size_t i = 0; i < model_.parameter_count() * sizeof(float); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  std::vector<std::int64_t> all(static_cast<std::size_t>(p_));
  const auto mine = static_cast<std::int64_t>(h);
  comm_->allgather(&mine, all.data(), 1, hopwise::DataType::kInt64);
  return std::all_of(all.begin(), all.end(), [&](std::int64_t v) { return v == all[0]; });
}

// Over the group's new communicator: this rank's place, its slice of the batch, a reducer, averager and monitor.
// An averager that regroups (diloco) is kept and aligned over the new members (its outer state goes on; a newcomer
// takes it); any other starts anew from rank 0's parameters, which are every member's by then (catch_up(),
// average_in_lost(), share_state()). Returns what the kept averager did, for the event's line.
std::string Trainer::rejoin_group() {
  comm_ = &elastic_->comm();
  rank_ = comm_->rank();
  p_ = comm_->size();
  trace_.rank = rank_;
  comm_->set_algorithm(hc::parse_algorithm(f_.algo));
  split_batch();
  make_reducer();
  std::string kept;
  if (averager_ && averager_->regroups())
    kept = "; " + averager_->regroup(*comm_);
  else
    averager_.emplace(*comm_, hc::AveragingSpec::parse(f_.averaging), model_.params(), model_.parameter_count());
  neighbour_.reset();  // its copies are of the old ring
  return kept;
}

// HOPWISE_ELASTIC=grow, at a step boundary (every HOPWISE_ELASTIC_GROW_EVERY steps): newcomers waiting are let in and
// sent the state (share_state()). Under an averaging method the members average fully first, so that the newcomer
// starts from the job's mean model.
void Trainer::grow() {
  if (!elastic_->newcomers_waiting(steps_done_)) return;
  const auto t0 = Clock::now();
  averager_->full_average();
  if (monitor_) monitor_->finish();  // collective on the old communicator, which still works
  monitor_.reset();
  reducer_.reset();
  if (!averager_->regroups()) averager_.reset();  // else kept, and its outer state sent to the newcomers
  const hc::ElasticEvent ev = elastic_->admit();
  const std::string kept = rejoin_group();
  share_state();
  note_change(ev, t0, fmt::format("{} image(s) per rank ({}){}", local_, batch_policy(), kept));
}

// After a change of membership: a monitor over the new communicator (its files continued), the event's line on the
// console, in the monitor's JSON lines and its Prometheus counters.
void Trainer::note_change(const hc::ElasticEvent& ev, Clock::time_point t0, const std::string& what) {
  f_.monitor.continue_files = true;
  monitor_.emplace(*comm_, f_.monitor);
  ++sum_.elastic_events;
  sum_.stood_still_s += seconds_since(t0);
  const std::string line = fmt::format("elastic: {} at step {}; {}", ev.describe(), steps_done_, what);
  hopwise::log::end_console_line();
  if (rank_ == 0) fmt::print("{}\n", line);
  std::fflush(stdout);
  monitor_->membership_event(line, sum_.elastic_events, sum_.stood_still_s);
}

// Rank 0's place (steps, epochs ended, last checkpoint), run id, launched size, parameters and momentum to every
// rank: a newcomer starts where the others stand.
void Trainer::share_state() {
  std::int64_t head[5] = {steps_done_, static_cast<std::int64_t>(run_), launched_ranks_, epochs_ended_,
                          checkpointed_step_};
  comm_->broadcast(head, 5, hopwise::DataType::kInt64, 0);
  comm_->broadcast(model_.params(), model_.parameter_count(), hopwise::DataType::kFloat32, 0);
  comm_->broadcast(model_.velocity(), model_.parameter_count(), hopwise::DataType::kFloat32, 0);
  steps_done_ = head[0];
  run_ = static_cast<std::uint64_t>(head[1]);
  launched_ranks_ = static_cast<int>(head[2]);
  epochs_ended_ = static_cast<int>(head[3]);
  checkpointed_step_ = head[4];
  split_batch();  // a newcomer's share follows the job's launched size
}

// Under synchronous data parallelism a step fails in the reducer's finish(), before the optimizer step, and every
// rank holds the same state: nothing to keep, the step is done again. Under an averaging method the ranks' models
// differ: every HOPWISE_ELASTIC_COPY_EVERY steps this rank sends its parameters to its ring successor while the step
// computes (from the model itself: nothing changes it before settle(), which comes before the gradients are reduced
// and the optimizer step). A step that fails after its optimizer step (in the averaging) counts as done: the
// survivors' average after the shrink stands in for the averaging that failed.
void Trainer::keep_step_start() {
  start_step_ = steps_done_;
  step_applied_ = false;
  // A method that regroups (diloco) keeps what the lost rank shared (the synced model and outer momentum); its
  // progress since the last sync goes with it, as a replica's does in DiLoCo: no copy.
  if (!elastic_ || !elastic_->options().shrink || !models_differ_ || averager_->regroups()) return;
  if (!neighbour_) neighbour_.emplace(model_.parameter_count());
  if (steps_done_ % elastic_->options().copy_every == 0)
    neighbour_->start(*comm_, model_.params(), steps_done_, elastic_->members());
}

// Under an averaging method, after a shrink: the lost ranks' progress since the last averaging lives on only in
// their ring successors' copies. The survivors average their models together with those copies (each lost rank
// counted once), so that the job goes on from the mean of every rank's model rather than from rank 0's. Returns
// what was averaged in, for the event's line. Collective over the new communicator.
std::string Trainer::average_in_lost(const hc::ElasticEvent& ev) {
  if (!models_differ_) return "";
  hc::Communicator& c = elastic_->comm();
  const std::size_t n = model_.parameter_count();
  const bool adds = neighbour_ && neighbour_->holds() &&
                    std::find(ev.left.begin(), ev.left.end(), neighbour_->held_id()) != ev.left.end();
  std::vector<float> sum(model_.params(), model_.params() + n);
  if (adds)
    for (std::size_t i = 0; i < n; ++i) sum[i] += neighbour_->held()[i];
  c.allreduce(sum.data(), sum.data(), n, hopwise::DataType::kFloat32, hopwise::ReduceOp::kSum);
  const std::int64_t mine[2] = {adds ? neighbour_->held_id() : -1, adds ? neighbour_->held_step() : -1};
  std::vector<std::int64_t> all(2 * static_cast<std::size_t>(c.size()));
  c.allgather(mine, all.data(), 2, hopwise::DataType::kInt64);
  std::vector<std::string> kept;
  for (int r = 0; r < c.size(); ++r)
    if (all[2 * static_cast<std::size_t>(r)] >= 0)
      kept.push_back(fmt::format("rank {}'s (step {}, kept by rank {})", all[2 * static_cast<std::size_t>(r)],
                                 all[2 * static_cast<std::size_t>(r) + 1], ev.members[static_cast<std::size_t>(r)]));
  const float models = static_cast<float>(c.size()) + static_cast<float>(kept.size());
  for (std::size_t i = 0; i < n; ++i) model_.params()[i] = sum[i] / models;
  const std::size_t lost = ev.left.size() - kept.size();
  return fmt::format("; the survivors' models averaged with {}{}",
                     kept.empty() ? "no lost rank's" : fmt::format("{}", fmt::join(kept, ", ")),
                     lost ? fmt::format(" ({} lost rank(s) had no copy: their keeper left too)", lost) : "");
}

// After a shrink the survivors may stand at different places: a collective can complete on some ranks and fail
// on others, and those went on to the next part. The one furthest on sends its place (and its accuracies) to all;
// under synchronous data parallelism also its parameters and momentum, the step's result every rank would have
// computed (under an averaging method average_in_lost() made the models equal already). Collective.
std::string Trainer::catch_up() {
  hc::Communicator& c = elastic_->comm();
  const std::int64_t mine = position();
  std::vector<std::int64_t> at(static_cast<std::size_t>(c.size()));
  c.allgather(&mine, at.data(), 1, hopwise::DataType::kInt64);
  const auto [lo, hi] = std::minmax_element(at.begin(), at.end());
  if (*lo == *hi) return "";
  const int leader = static_cast<int>(hi - at.begin());
  const std::int64_t from_step = *lo / 2, to_step = *hi / 2;
  std::int64_t head[5] = {steps_done_, epochs_ended_, checkpointed_step_,
                          static_cast<std::int64_t>(sum_.epoch_accuracy.size()), accuracy_epoch_};
  c.broadcast(head, 5, hopwise::DataType::kInt64, leader);
  std::vector<double> accuracy = sum_.epoch_accuracy;
  accuracy.resize(static_cast<std::size_t>(head[3]));
  if (head[3] > 0) c.broadcast(accuracy.data(), accuracy.size(), hopwise::DataType::kFloat64, leader);
  if (!models_differ_) {
    c.broadcast(model_.params(), model_.parameter_count(), hopwise::DataType::kFloat32, leader);
    c.broadcast(model_.velocity(), model_.parameter_count(), hopwise::DataType::kFloat32, leader);
  }
  steps_done_ = head[0];
  epochs_ended_ = static_cast<int>(head[1]);
  checkpointed_step_ = head[2];
  sum_.epoch_accuracy = std::move(accuracy);
  accuracy_epoch_ = static_cast<int>(head[4]);
  return fmt::format("; the survivors stood between steps {} and {}: all go on from rank {}'s place", from_step,
                     to_step, elastic_->members()[static_cast<std::size_t>(leader)]);
}

// Runs `part`; under HOPWISE_ELASTIC=shrink a failure of a collective is survived: the survivors agree on who is
// left, the lost ranks' models are averaged in (averaging methods),
// the survivors agree on where they stand, the reducer, averager and monitor are rebuilt over them and false says
// to go on from there (the failed part again, for most).
bool Trainer::survive(const std::function<void()>& part) {
  if (!elastic_ || !elastic_->options().shrink) {
    part();
    return true;
  }
  try {
    part();
    return true;
  } catch (const hopwise::Error& e) {
    const std::string why = e.what();
    const auto t0 = Clock::now();
    hopwise::log::warn("elastic: rank {} gave up on step {} ({:.1f} s into training): {}", elastic_->id(), steps_done_,
                       training_s(), why.substr(0, 300));
    if (neighbour_) neighbour_->abandon();  // nothing may stay in flight on the old communicator
    if (start_step_ == steps_done_ && step_applied_) ++steps_done_;  // failed in the averaging (keep_step_start())
    const bool in_step = start_step_ == steps_done_;
    reducer_.reset();  // each holds the old communicator, which failed (no collective on it now)
    if (averager_->regroups())
      averager_->detach();  // kept: its sync in flight resolved, to be redone over the survivors
    else
      averager_.reset();
    monitor_.reset();
    const std::int64_t was = steps_done_;
    const hc::ElasticEvent ev = elastic_->shrink(why);
    const std::string averaged = averager_ ? "" : average_in_lost(ev);  // a kept averager aligns in regroup()
    const std::string place = catch_up();
    const std::string kept = rejoin_group();
    const bool redone = in_step && steps_done_ == was;
    sum_.steps_redone += redone ? 1 : 0;
    note_change(ev, t0,
                fmt::format("{} with {} image(s) per rank ({}){}{}{}", redone ? "the step is done again" : "going on",
                            local_, batch_policy(), averaged, place, kept));
    return false;
  }
}

}  // namespace hopwise::examples
