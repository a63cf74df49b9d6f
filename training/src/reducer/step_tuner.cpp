#include "step_tuner.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "hopwise/common/log.h"
#include "hopwise/common/samples.h"

namespace hopwise::comm::reducer {

namespace {

double median(const std::vector<double>& v) { return samples::median_of(v, 0); }
std::string size_text(std::size_t bytes) { return size_class_text(size_class_of(bytes)); }

}  // namespace

StepTuner::StepTuner(StepChoices choices, int rank, StepTunerSettings s)
    : choices_(std::move(choices)), rank_(rank), s_(s) {}

void StepTuner::reset(const std::vector<std::size_t>& bucket_bytes) {
  std::map<int, Class> by_class;
  for (std::size_t b : bucket_bytes) {
    if (b == 0) continue;
    Class& c = by_class[size_class_of(b)];
    c.bytes = std::max(c.bytes, b);
    c.total += b;
    ++c.buckets;
  }
  classes_.clear();
  for (const auto& [k, c] : by_class) classes_.push_back(c);
  // Most bytes first (alike on every rank: the buckets are), the largest class first among equals.
  std::stable_sort(classes_.begin(), classes_.end(), [](const Class& a, const Class& b) {
    return a.total != b.total ? a.total > b.total : a.bytes > b.bytes;
  });
  if (classes_.size() > static_cast<std::size_t>(s_.max_classes))
    classes_.resize(static_cast<std::size_t>(s_.max_classes));
  state_ = State::kWaiting;
  current_ = 0;
  results_.clear();
  before_.clear();
  after_.clear();
}

bool StepTuner::all_decided() const {
  for (const Class& c : classes_)
    if (!choices_.decided(c.bytes)) return false;
  return true;
}

void StepTuner::step(double span_s) {
  switch (state_) {
    case State::kWaiting:
      if (!classes_.empty() && all_decided()) start_class();
      return;
    case State::kTrying: {
      if (block_step_ > 0) kept_[order_[pos_]].push_back(span_s);  // a block's first step settles: not kept
      if (++block_step_ <= s_.block_steps) return;
      block_step_ = 0;
      if (++pos_ < order_.size()) return pin_block();
      if (++round_ == 1) prune();
      if (round_ == s_.rounds || std::count(alive_.begin(), alive_.end(), true) == 1) return finish_class();
      start_round();
      return pin_block();
    }
    case State::kGuarding: return guard(span_s);
  }
}

// Round r runs the arms still in the race rotated by r, so that no arm always follows the same one.
void StepTuner::start_round() {
  order_.clear();
  for (std::size_t a = 0; a < arms_.size(); ++a)
    if (alive_[a]) order_.push_back(a);
  std::rotate(order_.begin(), order_.begin() + static_cast<long>(static_cast<std::size_t>(round_) % order_.size()),
              order_.end());
  pos_ = 0;
}

void StepTuner::pin_block() { choices_.pin(classes_[current_].bytes, arms_[order_[pos_]]); }

// After the first round, an arm whose steps took `prune` x the best arm's leaves the race (the tuned one stays: the
// others are measured against it): at 1 Gbit/s a ring arm 40% slower costs 30 ms a step.
void StepTuner::prune() {
  std::vector<double> med;
  for (const auto& k : kept_) med.push_back(median(k));
  choices_.max(med);
  const double best = *std::min_element(med.begin(), med.end());
  for (std::size_t a = 1; a < arms_.size(); ++a)
    if (med[a] > s_.prune * best) alive_[a] = false;
}

void StepTuner::start_class() {
  for (; current_ < classes_.size(); ++current_) {
    const Class& c = classes_[current_];
    const auto tuned = choices_.decided(c.bytes);
    if (!tuned) {  // re-tuned meanwhile: wait until it is decided again
      state_ = State::kWaiting;
      return;
    }
    arms_ = {*tuned};
    for (const TuningChoice& alt : choices_.alternatives(c.bytes))
      if (arms_.size() < static_cast<std::size_t>(s_.max_arms) &&
          std::find(arms_.begin(), arms_.end(), alt) == arms_.end())
        arms_.push_back(alt);
    if (arms_.size() < 2) {
      results_.push_back({size_text(c.bytes), c.buckets, {{*tuned, 0.0}}, *tuned});
      continue;
    }
    kept_.assign(arms_.size(), {});
    alive_.assign(arms_.size(), true);
    round_ = block_step_ = 0;
    state_ = State::kTrying;
    start_round();
    return pin_block();
  }
  state_ = State::kGuarding;
  guarded_.clear();
  for (const Class& c : classes_) guarded_.push_back(choices_.decided(c.bytes));
  before_.clear();
  after_.clear();
}

void StepTuner::finish_class() {
  const Class& c = classes_[current_];
  std::vector<double> med;
  for (const auto& k : kept_) med.push_back(median(k));
  choices_.max(med);  // the slowest rank's median of each arm
  std::size_t best = 0;
  for (std::size_t a = 1; a < med.size(); ++a)
    if (med[a] < med[best]) best = a;
  const std::size_t chosen = best != 0 && med[best] < (1 - s_.margin) * med[0] ? best : 0;
  choices_.pin(c.bytes, arms_[chosen]);
  StepTuning r{size_text(c.bytes), c.buckets, {}, arms_[chosen]};
  std::string row;
  for (std::size_t a = 0; a < arms_.size(); ++a) {
    r.arms.emplace_back(arms_[a], med[a]);
    row += fmt::format("{}{}{} {:.2f} ms", a ? ", " : "", to_string(arms_[a]), a ? "" : " (tuned)", med[a] * 1e3);
  }
  results_.push_back(std::move(r));
  if (rank_ == 0)
    log::info("step tuning, buckets up to {} ({} a step): step span, slowest rank's median of {} steps each: {}: {} {}",
              size_text(c.bytes), c.buckets, s_.rounds * s_.block_steps, row, to_string(arms_[chosen]),
              chosen == 0 ? "stays"
                          : fmt::format("replaces {} ({:.1f}% faster steps)", to_string(arms_[0]),
                                        100 * (1 - med[chosen] / med[0])));
  ++current_;
  start_class();
}

// A later change of a class's choice (the tuner re-tuned it after a drift) must not make the steps slower.
void StepTuner::guard(double span_s) {
  std::vector<std::optional<TuningChoice>> now;
  for (const Class& c : classes_) now.push_back(choices_.decided(c.bytes));
  if (now == guarded_) {
    before_.push_back(span_s);
    if (before_.size() > static_cast<std::size_t>(s_.guard_steps)) before_.erase(before_.begin());
    after_.clear();
    return;
  }
  for (const auto& n : now)
    if (!n) {  // being re-tuned: its trial steps are no evidence
      after_.clear();
      return;
    }
  after_.push_back(span_s);
  if (after_.size() < static_cast<std::size_t>(s_.guard_steps) + 1) return;
  after_.erase(after_.begin());  // the step of the change (it held the last trials)
  std::vector<double> v{median(before_), median(after_)};
  choices_.max(v);
  std::string changes;
  for (std::size_t i = 0; i < classes_.size(); ++i)
    if (!(now[i] == guarded_[i]))
      changes += fmt::format("{}buckets up to {}: {} -> {}", changes.empty() ? "" : ", ", size_text(classes_[i].bytes),
                             guarded_[i] ? to_string(*guarded_[i]) : "-", to_string(*now[i]));
  if (v[0] > 0 && v[1] > (1 + s_.guard) * v[0]) {
    for (std::size_t i = 0; i < classes_.size(); ++i)
      if (!(now[i] == guarded_[i]) && guarded_[i]) choices_.pin(classes_[i].bytes, *guarded_[i]);
    ++reverts_;
    if (rank_ == 0)
      log::warn("step guard: after the tuner's change ({}) steps took {:.2f} ms against {:.2f} ms before: reverted",
                changes, v[1] * 1e3, v[0] * 1e3);
  } else {
    if (rank_ == 0)
      log::info("step guard: the tuner's change ({}) kept: steps {:.2f} ms against {:.2f} ms before", changes,
                v[1] * 1e3, v[0] * 1e3);
    guarded_ = now;
    before_ = after_;
  }
  after_.clear();
}

}  // namespace hopwise::comm::reducer
