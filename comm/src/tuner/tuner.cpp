#include "tuner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "hopwise/common/log.h"
#include "hopwise/common/samples.h"

namespace hopwise::comm::detail {

namespace {

double median(const std::vector<double>& v) { return samples::median_of(v); }

std::string class_text(const TuneKey& k) {
  return fmt::format("{} {} up to {}", to_string(k.collective), k.dtype_class, size_class_text(k.size_class));
}

constexpr double kPriorFloorSeconds = 1e-3;

}  // namespace

std::vector<TuningChoice> tuning_candidates(const std::vector<std::pair<Algorithm, double>>& estimates, Collective c,
                                            std::size_t bytes, double prior, std::size_t chunk_bytes,
                                            bool several_channels) {
  double best = INFINITY;
  for (const auto& [a, t] : estimates) best = std::min(best, t);
  std::vector<TuningChoice> out;
  const std::size_t big_chunk = chunk_bytes * 4;
  for (const auto& [a, t] : estimates) {
    if (!std::isfinite(t) || (t > prior * best && t > kPriorFloorSeconds)) continue;
    const AlgorithmInfo& row = algorithm_info(a);
    out.push_back({a, 0, 0});
    if (row.pipelined && c != Collective::kBarrier && bytes >= 4 * big_chunk) out.push_back({a, big_chunk, 0});
    if (row.channels && c == Collective::kAllreduce && several_channels) out.push_back({a, 0, 1});
  }
  return out;
}

void Tuner::preset(const std::vector<TuningEntry>& entries, std::uint64_t fingerprint) {
  std::lock_guard lock(mu_);
  fingerprint_ = fingerprint;
  for (const TuningEntry& e : entries) {
    Class c;
    c.candidates = {e.choice};
    c.alive = {true};
    c.decided = true;
    c.choice = e.choice;
    c.tuned_s = e.seconds;
    c.from_file = true;
    c.measured = e.measured;
    classes_[{e.collective, e.dtype_class, e.size_class}] = std::move(c);
  }
}

// A fingerprint that differs between ranks shows as max(x) != -max(-x) for one of its two 24-bit halves.
void Tuner::verify_preset(const Agree& agree, int rank) {
  const double hi = static_cast<double>((fingerprint_ >> 24) & 0xFFFFFF),
               lo = static_cast<double>(fingerprint_ & 0xFFFFFF);
  std::vector<double> v{hi, lo, -hi, -lo};
  agree(v);
  std::lock_guard lock(mu_);
  ++stats_.agreements;
  verified_ = true;
  if (v[0] == -v[2] && v[1] == -v[3]) return;
  std::erase_if(classes_, [](const auto& kv) { return kv.second.from_file; });
  if (rank == 0)
    log::warn(
        "the ranks read different tuning files (HOPWISE_TUNING_FILE differs, or some ranks have "
        "none): every rank ignores them and tunes online; give every rank the same file");
}

void Tuner::start_round(Class& c) {
  c.order.clear();
  for (std::size_t i = 0; i < c.candidates.size(); ++i)
    if (c.alive[i]) c.order.push_back(i);
  // A new order each round, the same on every rank (one seed): a call leaves caches, the allocator and the
  // transport in a state that helps or hurts the next, and in a merely rotated order each candidate would always
  // follow the same one.
  std::mt19937 g(static_cast<std::uint32_t>(c.round * 7919 + c.candidates.size()));
  std::shuffle(c.order.begin(), c.order.end(), g);
  c.pos = 0;
  c.local.assign(c.candidates.size(), 0.0);
  c.pending = c.order.empty();
}

void Tuner::finish_round(const TuneKey& key, Class& c, const Agree& agree, int rank) {
  std::vector<double> v = c.local;  // dead candidates read 0
  agree(v);                         // the slowest rank's time of each
  std::lock_guard lock(mu_);
  ++stats_.agreements;
  for (std::size_t i = 0; i < v.size(); ++i)
    if (c.alive[i]) c.agreed[i].push_back(v[i]);
  // After two rounds, drop what is far slower than the best even at its own best: a single slow call (the first
  // at a new size grows the scratch buffers) must not cost a candidate its place. What is hopeless after one
  // round (past 4x) goes at once where its trial is costly: at 256 MiB across hosts a second try of such a one
  // costs seconds. A cheap one gets its second round: on 4 ranks at 4 KiB, one_shot's cold first call took 34 us
  // against two_shot's 8, and one_shot was the faster from its second call on (8 against 9.5).
  if (c.round == 0 || c.round == 1) {
    const double factor = c.round == 0 ? 2 * s_.prune : s_.prune;
    double best_min = INFINITY;
    for (std::size_t i = 0; i < v.size(); ++i)
      if (c.alive[i]) best_min = std::min(best_min, *std::min_element(c.agreed[i].begin(), c.agreed[i].end()));
    for (std::size_t i = 0; i < v.size(); ++i) {
      const double own_best = c.alive[i] ? *std::min_element(c.agreed[i].begin(), c.agreed[i].end()) : 0;
      if (own_best > factor * best_min && (c.round > 0 || own_best > s_.cheap_s)) c.alive[i] = false;
    }
  }
  ++c.round;
  c.pending = false;
  auto alive = std::count(c.alive.begin(), c.alive.end(), true);
  if (c.round < s_.rounds && alive > 1) {
    start_round(c);
    return;
  }
  // A close race gets more rounds, between the close ones only (each costs little beyond the best): on a busy
  // machine three repetitions do not tell 5% apart.
  if (alive > 1 && c.round < s_.rounds * s_.close_race_factor) {
    double best_median = INFINITY;
    for (std::size_t i = 0; i < v.size(); ++i)
      if (c.alive[i]) best_median = std::min(best_median, median(c.agreed[i]));
    for (std::size_t i = 0; i < v.size(); ++i)
      if (c.alive[i] && median(c.agreed[i]) > s_.close * best_median) c.alive[i] = false;
    alive = std::count(c.alive.begin(), c.alive.end(), true);
    if (alive > 1) {
      start_round(c);
      return;
    }
  }
  std::size_t pick = 0;
  double pick_s = INFINITY;
  c.measured.clear();
  for (std::size_t i = 0; i < c.candidates.size(); ++i) {
    const double m = median(c.agreed[i]);
    c.measured.emplace_back(to_string(c.candidates[i]), m);
    if (c.alive[i] && m < pick_s) {
      pick_s = m;
      pick = i;
    }
  }
  // The finalists, best first: every candidate (dropped or not) whose median is close to the best's. Where calls
  // are short, lined-up times rank them only loosely (4 ranks on 2 cores at 4 KiB: one_shot 20-70 us lined up by
  // the tuner's agreement, 7-12 us in the caller's rhythm) and blocks of them cost little: a wider net.
  const double within = pick_s < s_.short_s ? s_.confirm_within_short : s_.confirm_within;
  c.finalists.clear();
  for (std::size_t i = 0; i < c.candidates.size(); ++i)
    if (c.measured[i].second <= within * pick_s) c.finalists.push_back(i);
  std::stable_sort(c.finalists.begin(), c.finalists.end(),
                   [&](std::size_t a, std::size_t b) { return c.measured[a].second < c.measured[b].second; });
  if (c.finalists.size() > static_cast<std::size_t>(s_.confirm_max))
    c.finalists.resize(static_cast<std::size_t>(s_.confirm_max));
  if (rank == 0) {
    std::string row;
    for (const auto& [name, m] : c.measured)
      row += fmt::format("{}{} {:.1f} us", row.empty() ? "" : ", ", name, m * 1e6);
    log::info("tuning {}: lined up, medians: {}", class_text(key), row);
  }
  const int calls = pick_s > 0
                        ? static_cast<int>(std::min<double>(s_.confirm_calls, std::floor(s_.confirm_budget_s / pick_s)))
                        : s_.confirm_calls;
  if (c.finalists.size() < 2 || calls < 4) return decide(c, pick, 0);
  c.passes = std::clamp(s_.confirm_passes, 1, calls / 4);  // 4 kept calls in a pass at least
  c.block = calls / c.passes;
  c.confirming = true;
  c.block_pos = 0;
  c.block_s.assign(c.finalists.size(), {});
}

void Tuner::decide(Class& c, std::size_t pick, double steady_s) {
  c.confirming = false;
  c.decided = true;
  c.choice = c.candidates[pick];
  c.tuned_s = c.measured[pick].second;
  double spent = 0;
  for (double t : c.trial_s) spent += t;
  // Beyond what the choice would have cost: its lined-up time for the trials, its block time for the blocks.
  const double per_call = steady_s > 0 ? std::min(steady_s, c.tuned_s) : c.tuned_s;
  stats_.excess_s += std::max(0.0, spent - static_cast<double>(c.trial_s.size()) * per_call);
  c.trial_s.clear();
  c.recent.clear();
  c.since_check = 0;
  c.baseline_s = 0;  // the first drift check sets it: the job's first calls are no steady state (scratch buffers grow)
}

void Tuner::finish_confirm(const TuneKey& key, Class& c, const Agree& agree, int rank) {
  std::vector<double> v;
  for (const auto& times : c.block_s) v.push_back(samples::trimmed_mean_of(times));
  agree(v);  // the slowest rank's mean call of each finalist, its slowest eighth aside
  std::lock_guard lock(mu_);
  ++stats_.agreements;
  std::size_t best = 0;
  for (std::size_t i = 1; i < v.size(); ++i)
    if (v[i] < v[best]) best = i;
  const std::size_t pick = c.finalists[best];
  c.confirmed.clear();
  for (std::size_t i = 0; i < v.size(); ++i) c.confirmed.emplace_back(c.candidates[c.finalists[i]], v[i]);
  if (rank == 0) {
    std::string row;
    for (std::size_t i = 0; i < v.size(); ++i)
      row += fmt::format("{}{} {:.1f} us (lined up {:.1f})", i ? ", " : "", c.measured[c.finalists[i]].first,
                         v[i] * 1e6, c.measured[c.finalists[i]].second * 1e6);
    log::info("tuning {}: in a row: {}: {} chosen", class_text(key), row, to_string(c.candidates[pick]));
  }
  decide(c, pick, v[best]);
}

void Tuner::check_drift(const TuneKey& key, Class& c, const Agree& agree, int rank) {
  std::vector<double> v{median(std::vector<double>(c.recent.begin(), c.recent.end()))};
  agree(v);
  std::lock_guard lock(mu_);
  ++stats_.agreements;
  c.since_check = 0;
  // The first check sets the steady state to watch: a job's calls include the wait for the last rank to arrive,
  // which the trials (ranks lined up) do not, so the trial time is no baseline for a drift.
  if (c.baseline_s == 0) {
    c.baseline_s = v[0];
    return;
  }
  if (!(v[0] > s_.drift * c.baseline_s) || !s_.online) return;
  // Info, not a warning: the tuner handles it itself (on a busy machine it happens often); programs sum re-tunes up
  // at the end (CollectiveStats::retunes).
  if (rank == 0)
    log::info("{}: {} now takes {:.1f} us, {:.1f}x its steady {:.1f} us; tuning this size class again", class_text(key),
              to_string(c.choice), v[0] * 1e6, v[0] / c.baseline_s, c.baseline_s * 1e6);
  ++stats_.retunes;
  // Every candidate again, the cost model's filter included (a preset class has only its own choice).
  c.alive.assign(c.candidates.size(), true);
  c.agreed.assign(c.candidates.size(), {});
  c.round = 0;
  c.decided = false;
  c.confirming = false;
  c.from_file = false;
  c.needs_candidates = c.candidates.size() <= 1;
  c.recent.clear();
  start_round(c);
}

// Where calls are bandwidth-bound, an algorithm's place barely moves from one size class to the next: a candidate
// measured past `prune` x the winner at a decided smaller class of at least 1 MiB is not tried again (at 256 MiB on a
// 1 Gbit/s link each such trial costs seconds). Called with mu_ held.
void Tuner::inherit_prune(const TuneKey& key, std::vector<TuningChoice>& cands) const {
  for (int k = key.size_class - 1; k >= 20; --k) {
    auto it = classes_.find({key.collective, key.dtype_class, k});
    if (it == classes_.end() || !it->second.decided || it->second.from_file) continue;
    const Class& below = it->second;
    const std::vector<TuningChoice> all = cands;
    std::erase_if(cands, [&](const TuningChoice& ch) {
      if (ch == below.choice) return false;
      for (const auto& [name, t] : below.measured)
        if (name == to_string(ch)) return t > s_.prune * below.tuned_s;
      return false;
    });
    if (cands.empty()) cands = all;
    return;
  }
}

void Tuner::pin(const TuneKey& key, const TuningChoice& choice) {
  std::lock_guard lock(pins_mu_);
  pins_.emplace_back(key, choice);
  has_pins_ = true;
}

void Tuner::apply_pins() {
  std::vector<std::pair<TuneKey, TuningChoice>> pins;
  {
    std::lock_guard lock(pins_mu_);
    pins.swap(pins_);
    has_pins_ = false;
  }
  std::lock_guard lock(mu_);
  for (const auto& [key, choice] : pins) {
    Class& c = classes_[key];
    if (std::find(c.candidates.begin(), c.candidates.end(), choice) == c.candidates.end()) {
      c.candidates.push_back(choice);
      c.alive.push_back(true);
      c.agreed.emplace_back();
    }
    c.decided = true;
    c.choice = choice;
    c.confirming = c.pending = c.needs_candidates = false;
    c.tuned_s = 0;
    for (const auto& [name, t] : c.measured)
      if (name == to_string(choice)) c.tuned_s = t;
    c.recent.clear();
    c.since_check = 0;
    c.baseline_s = 0;  // the first drift check after the pin sets it
  }
}

std::optional<Tuner::Pick> Tuner::next(const TuneKey& key, const Candidates& candidates, const Agree& agree, int rank) {
  if (!verified_) verify_preset(agree, rank);
  if (has_pins_.load(std::memory_order_acquire)) apply_pins();
  std::unique_lock lock(mu_);
  auto it = classes_.find(key);
  if (it == classes_.end()) {
    if (!s_.online) return std::nullopt;
    lock.unlock();
    std::vector<TuningChoice> cands = candidates();  // outside the lock: the cost model runs here
    if (cands.empty()) return std::nullopt;
    lock.lock();
    inherit_prune(key, cands);
    Class c;
    c.candidates = std::move(cands);
    c.needs_candidates = false;
    it = classes_.emplace(key, std::move(c)).first;
    it->second.alive.assign(it->second.candidates.size(), true);
    it->second.agreed.assign(it->second.candidates.size(), {});
    start_round(it->second);
  }
  Class& c = it->second;
  if (c.decided && c.since_check >= s_.check_every && static_cast<int>(c.recent.size()) >= s_.window) {
    lock.unlock();
    check_drift(key, c, agree, rank);
    lock.lock();
  }
  if (c.needs_candidates) {  // a file's class that drifted: now every candidate
    lock.unlock();
    std::vector<TuningChoice> cands = candidates();
    lock.lock();
    if (!cands.empty()) c.candidates = std::move(cands);
    c.needs_candidates = false;
    c.alive.assign(c.candidates.size(), true);
    c.agreed.assign(c.candidates.size(), {});
    start_round(c);
  }
  if (c.pending) {
    lock.unlock();
    finish_round(key, c, agree, rank);
    lock.lock();
  }
  if (c.confirming && c.block_pos == c.confirm_calls_total()) {
    lock.unlock();
    finish_confirm(key, c, agree, rank);
    lock.lock();
  }
  if (c.decided) return Pick{c.choice, false};
  if (c.confirming) return Pick{c.candidates[c.finalists[c.confirm_slot(c.block_pos)]], false};
  log::info("rank {}: tuning {}: round {} call {}/{}: {}", rank, class_text(key), c.round, c.pos + 1, c.order.size(),
            to_string(c.candidates[c.order[c.pos]]));
  return Pick{c.candidates[c.order[c.pos]], true, static_cast<double>(stats_.trial_calls) * 64 + key.size_class};
}

std::optional<TuningChoice> Tuner::steady(const TuneKey& key) {
  if (!verified_) return std::nullopt;
  if (has_pins_.load(std::memory_order_acquire)) apply_pins();
  auto it = classes_.find(key);
  if (it == classes_.end()) return std::nullopt;
  Class& c = it->second;
  if (!c.decided || c.needs_candidates || c.since_check >= s_.check_every - s_.window) return std::nullopt;
  ++c.since_check;
  return c.choice;
}

void Tuner::record(const TuneKey& key, const TuningChoice& choice, double seconds) {
  std::lock_guard lock(mu_);
  auto it = classes_.find(key);
  if (it == classes_.end()) return;
  Class& c = it->second;
  if (c.decided) {
    if (!(choice == c.choice)) return;
    c.recent.push_back(seconds);
    if (static_cast<int>(c.recent.size()) > s_.window) c.recent.pop_front();
    ++c.since_check;
    return;
  }
  if (c.confirming) {
    if (c.block_pos >= c.confirm_calls_total()) return;
    const std::size_t f = c.confirm_slot(c.block_pos);
    if (!(c.candidates[c.finalists[f]] == choice)) return;
    if (c.confirm_kept(c.block_pos)) c.block_s[f].push_back(seconds);  // a block's first call settles
    c.trial_s.push_back(seconds);
    ++stats_.trial_calls;
    ++c.block_pos;
    return;
  }
  if (c.pending || c.pos >= c.order.size() || !(c.candidates[c.order[c.pos]] == choice)) return;
  c.local[c.order[c.pos]] = seconds;
  c.trial_s.push_back(seconds);
  ++stats_.trial_calls;
  if (++c.pos == c.order.size()) c.pending = true;
}

std::optional<TuningChoice> Tuner::decided(const TuneKey& key) const {
  {
    std::lock_guard lock(pins_mu_);
    for (auto it = pins_.rbegin(); it != pins_.rend(); ++it)
      if (!(it->first < key) && !(key < it->first)) return it->second;
  }
  std::lock_guard lock(mu_);
  auto it = classes_.find(key);
  if (it == classes_.end() || !it->second.decided) return std::nullopt;
  return it->second.choice;
}

std::vector<std::pair<TuningChoice, double>> Tuner::ranked(const TuneKey& key) const {
  std::lock_guard lock(mu_);
  std::vector<std::pair<TuningChoice, double>> out;
  auto it = classes_.find(key);
  if (it == classes_.end() || !it->second.decided) return out;
  for (const TuningChoice& ch : it->second.candidates)
    for (const auto& [name, t] : it->second.measured)
      if (name == to_string(ch) && std::isfinite(t)) out.emplace_back(ch, t);
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  return out;
}

std::vector<std::pair<TuningChoice, double>> Tuner::in_a_row(const TuneKey& key) const {
  std::lock_guard lock(mu_);
  auto it = classes_.find(key);
  if (it == classes_.end() || !it->second.decided) return {};
  return it->second.confirmed;
}

std::vector<TuningEntry> Tuner::entries() const {
  std::lock_guard lock(mu_);
  std::vector<TuningEntry> out;
  for (const auto& [k, c] : classes_)
    if (c.decided) out.push_back({k.collective, k.dtype_class, k.size_class, c.choice, c.tuned_s, c.measured});
  return out;
}

TunerStats Tuner::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace hopwise::comm::detail
