// What a change of members does to the outer path (Outer::regroup, outer.h): DiLoCo goes on over the replicas that
// are here, from the outer state they share, instead of starting over.
//
// Every member holds the same synced model and outer momentum (each applies the same averaged pseudo-gradient), so a
// lost replica takes none of it with it: the survivors keep theirs. What a loss can leave uneven is the sync in
// flight when it happened. A member whose all-reduce completed (the lost replica's share arrived before it went)
// applies it; one whose all-reduce failed holds its pseudo-gradient as sent. The members then compare the syncs
// each applied: one behind takes the furthest's synced model and momentum and merges its local model as the missed
// sync would have (its own pseudo-gradient was in that sync: nothing is counted twice). The sync that failed
// everywhere is redone over the members here, each sending what it sent before (or, where it had not sent it yet,
// its pseudo-gradient now): the average is over the replicas that contributed. A newcomer (ModelAverager's
// `joining`) is behind everyone: it takes the synced model, momentum and step count, and starts from the synced
// model. Codec residuals stay with their member (a newcomer's start empty); the fragment schedule follows the step
// count, which all take from the furthest.
#include <fmt/core.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "outer.h"

namespace hopwise::comm::detail {

namespace {

// Where a member stands, as every member gathers it.
struct Standing {
  std::int64_t applied;         // syncs applied (-1: a newcomer, which holds none of the shared state)
  std::int64_t failed;          // the fragment whose sync failed here, or -1
  std::int64_t launched_at;     // and the step it was launched at
  std::int64_t everyone_equal;  // launched by full_average()
  std::int64_t steps;           // the averager's step count
  std::int64_t in_full;         // lost inside full_average()'s loop
  std::int64_t full_done;       // fragments that loop had synced
  std::int64_t completed;       // the last step whose after_step() ran to its end
  static constexpr std::size_t kFields = 8;
  // Further on: more syncs applied; at the same count, one whose sync in flight failed (it must be redone by all).
  bool further_than(const Standing& o) const {
    return applied != o.applied ? applied > o.applied : (failed >= 0) > (o.failed >= 0);
  }
};

}  // namespace

void Outer::merge_missed(int f, const std::vector<float>& y_old, bool everyone_equal) {
  const auto [b, e] = range(f);
  float* x = ctx_.params + b;
  const float* y = synced_.data() + b;
  const float keep = static_cast<float>(s_.alpha), take = static_cast<float>(1.0 - s_.alpha);
  const bool blocking = s_.delay == 0 || everyone_equal;
  ctx_.fetch(b, e);
  for (std::size_t i = 0; i < e - b; ++i) {
    if (everyone_equal || (blocking && s_.alpha == 0.0))
      x[i] = y[i];
    else if (blocking)
      x[i] = keep * x[i] + take * y[i];
    else
      x[i] += take * ((y[i] - y_old[i]) - send_[i]);
  }
  ctx_.publish(b, e);
}

std::string Outer::regroup(std::int64_t& steps) {
  Communicator& c = *ctx_.comm;
  const bool joining = ctx_.joining;
  ctx_.joining = false;
  // Codec states are per member: this one's place and the new size (int8's headroom), its residual kept.
  for (auto& cs : codec_states_) {
    compression::CodecState next(cs.seed, c.rank(), c.size());
    next.step = cs.step;
    next.residual = std::move(cs.residual);
    cs = std::move(next);
  }
  if (flight_.on && flight_.done && !flight_.failed) apply();  // completed here: every old member's share is in it

  const Standing mine{
      joining ? -1 : applied_,
      flight_.on ? flight_.fragment : -1,
      flight_.launched_at,
      flight_.everyone_equal ? 1 : 0,
      steps,
      in_full_ ? 1 : 0,
      full_done_,
      joining ? std::numeric_limits<std::int64_t>::max() : completed_};  // a newcomer left no step undone
  std::vector<Standing> all(static_cast<std::size_t>(c.size()));
  static_assert(sizeof(Standing) == Standing::kFields * sizeof(std::int64_t));
  c.allgather(&mine, all.data(), Standing::kFields, DataType::kInt64);
  int leader = 0;
  for (int r = 1; r < c.size(); ++r)
    if (all[static_cast<std::size_t>(r)].further_than(all[static_cast<std::size_t>(leader)])) leader = r;
  const Standing far = all[static_cast<std::size_t>(leader)];
  if (log::enabled(log::Level::kInfo)) {
    std::string seen;
    for (const Standing& s : all)
      seen += fmt::format(" [applied {} failed {} at {} steps {} completed {} full {}/{}]", s.applied, s.failed,
                          s.launched_at, s.steps, s.completed, s.in_full, s.full_done);
    log::info("regroup: rank {} of {}: leader {}:{}", c.rank(), c.size(), leader, seen);
  }
  std::int64_t most_steps = 0, least_completed = far.completed;
  bool anyone_behind = false;
  for (const Standing& s : all) {
    most_steps = std::max(most_steps, s.steps);
    least_completed = std::min(least_completed, s.completed);
    anyone_behind = anyone_behind || s.applied < far.applied;
  }

  std::string said = "the outer state kept (synced model, momentum, residuals)";
  if (anyone_behind) {
    const bool behind = mine.applied < far.applied;
    std::vector<float> y_old;
    if (behind && flight_.on) {
      const auto [b, e] = range(flight_.fragment);
      y_old.assign(synced_.begin() + static_cast<long>(b), synced_.begin() + static_cast<long>(e));
    }
    if (!synced_.empty()) c.broadcast(synced_.data(), synced_.size(), DataType::kFloat32, leader);
    if (!momentum_.empty()) c.broadcast(momentum_.data(), momentum_.size(), DataType::kFloat32, leader);
    std::vector<std::int64_t> codec_steps;
    for (const auto& cs : codec_states_) codec_steps.push_back(static_cast<std::int64_t>(cs.step));
    if (!codec_steps.empty()) c.broadcast(codec_steps.data(), codec_steps.size(), DataType::kInt64, leader);
    for (std::size_t f = 0; f < codec_states_.size(); ++f)
      codec_states_[f].step = static_cast<std::uint64_t>(codec_steps[f]);
    // Under plain averaging (no synced model: nothing shared) one behind keeps its model to the next sync.
    if (behind && flight_.on && !synced_.empty()) merge_missed(flight_.fragment, y_old, flight_.everyone_equal);
    if (synced_.empty()) {  // a newcomer starts from the furthest member's model
      const bool sends = c.rank() == leader;
      std::vector<float> model(sends ? 0 : ctx_.count);
      if (sends) ctx_.fetch_all();
      c.broadcast(sends ? ctx_.params : model.data(), ctx_.count, DataType::kFloat32, leader);
      if (joining) std::memcpy(ctx_.params, model.data(), ctx_.count * sizeof(float));
    } else if (joining) {  // from the synced model
      std::memcpy(ctx_.params, synced_.data(), ctx_.count * sizeof(float));
    }
    if (joining) ctx_.publish_all();
    if (behind) flight_ = Flight{};
    applied_ = far.applied;
    const bool only_newcomers = std::all_of(
        all.begin(), all.end(), [&](const Standing& s) { return s.applied == far.applied || s.applied < 0; });
    said = only_newcomers ? fmt::format(
                                "the outer state (synced model, momentum, step {}) sent to the newcomer(s) "
                                "from rank {}",
                                most_steps, leader)
                          : fmt::format("the outer state taken from rank {}, which had synced furthest", leader);
  }

  if (far.failed >= 0) {  // the sync lost everywhere, redone over the members here
    const int g = static_cast<int>(far.failed);
    const auto [b, e] = range(g);
    if (!(flight_.on && flight_.fragment == g)) {  // not sent by this member yet: its pseudo-gradient now
      ctx_.fetch(b, e);
      fill_send(g);
    }
    flight_ = {true, false, g, far.launched_at, Work(), Clock::now()};
    flight_.everyone_equal = far.everyone_equal != 0;
    ++ctx_.stats.syncs;
    start_allreduce(g);
    apply();
    said += fmt::format("; fragment {}'s sync (launched at step {}) redone over the {} replica(s) here", g,
                        far.launched_at, c.size());
  }
  full_done_ = static_cast<int>(far.full_done) + (far.failed >= 0 && far.everyone_equal ? 1 : 0);
  resume_full_ = far.in_full != 0;
  in_full_ = false;
  steps = last_step_ = completed_ = most_steps;
  // The step whose after_step() failed may have had a fragment to launch after its merge: launched now, as it would
  // have been (a loss inside full_average() leaves the trainer to call it again instead).
  const int f = due(most_steps);
  if (least_completed < most_steps && !resume_full_ && f >= 0 && !(far.failed >= 0 && far.launched_at == most_steps)) {
    launch(f, most_steps);
    if (s_.delay == 0) apply();
    said += fmt::format("; fragment {}'s sync, due at step {}, launched", f, most_steps);
  }
  return said;
}

}  // namespace hopwise::comm::detail
