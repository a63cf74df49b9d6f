// The reducer's schedule (schedule.h), once for the host and the device reducer; and ReducerOptions::from_env,
// which both read.
#include "schedule.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "hopwise/common/env.h"
#include "hopwise/common/error.h"
#include "hopwise/common/log.h"

namespace hopwise::comm {

ReducerOptions ReducerOptions::from_env() {
  ReducerOptions o;
  if (env::get_or("HOPWISE_BUCKET_MB", "") == "auto")
    o.tune_bucket = true;
  else
    o.bucket_mb = env::get_double("HOPWISE_BUCKET_MB", o.bucket_mb);
  if (!(o.bucket_mb > 0))
    throw InvalidArgument("HOPWISE_BUCKET_MB must be a positive number of megabytes, or auto (measured)");
  o.compression = env::get_or("HOPWISE_COMPRESSION", "none");
  const long long steps = env::get_int("HOPWISE_STEP_TUNE", 1);
  if (steps != 0 && steps != 1)
    throw InvalidArgument("HOPWISE_STEP_TUNE must be 1 (confirm the tuned choices by whole steps) or 0 (off)");
  o.tune_steps = steps == 1;
  return o;
}

}  // namespace hopwise::comm

namespace hopwise::comm::reducer {

namespace {

// Reverse registration order of n gradients: the order backward normally produces them in.
std::vector<int> reverse_order(std::size_t n) {
  std::vector<int> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = static_cast<int>(n - 1 - i);
  return order;
}

// Buckets in `order` (its first gradient goes first): the first capped at first_bucket_mb, so that communication
// starts early, the rest at bucket_mb; a gradient over the cap gets a bucket of its own.
std::vector<Bucket> plan_buckets(const std::vector<Gradient>& gradients, const std::vector<int>& order,
                                 const ReducerOptions& options) {
  const auto first_cap = static_cast<std::size_t>(options.first_bucket_mb * (1 << 20) / sizeof(float));
  const auto cap = static_cast<std::size_t>(options.bucket_mb * (1 << 20) / sizeof(float));
  std::vector<Bucket> buckets;
  for (int i : order) {
    const std::size_t count = gradients[static_cast<std::size_t>(i)].count;
    const std::size_t limit = buckets.size() <= 1 ? first_cap : cap;
    if (buckets.empty() || (buckets.back().count > 0 && buckets.back().count + count > limit)) buckets.emplace_back();
    buckets.back().gradients.push_back(i);
    buckets.back().count += count;
  }
  return buckets;
}

// One 64-bit fingerprint (FNV-1a) of the layout: every gradient's name, count and rows, the compression spec and
// the bucket sizes.
std::uint64_t fingerprint(const std::vector<Gradient>& gradients, std::string_view compression,
                          const std::vector<Bucket>& buckets) {
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&](std::uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  mix(gradients.size());
  for (const Gradient& g : gradients) {
    mix(g.count);
    mix(g.rows);
    for (char ch : g.name) mix(static_cast<unsigned char>(ch));
  }
  for (char ch : compression) mix(static_cast<unsigned char>(ch));
  mix(buckets.size());
  for (const Bucket& b : buckets) mix(b.count);
  return h;
}

}  // namespace

Schedule::Schedule(ReducerOptions& options, int rank, std::string kind, Collectives collectives,
                   std::function<void()> lay_out, bool tune, std::string_view no_tuning_reason)
    : options_(options),
      rank_(rank),
      kind_(std::move(kind)),
      collectives_(std::move(collectives)),
      lay_out_(std::move(lay_out)) {
  if (!(options_.bucket_mb > 0) || !(options_.first_bucket_mb > 0))
    throw InvalidArgument(
        fmt::format("{} reducer: bucket_mb and first_bucket_mb must be positive (HOPWISE_BUCKET_MB)", kind_));
  if (options_.tune_bucket) {
    if (tune)
      tuner_.emplace();
    else
      log::warn("HOPWISE_BUCKET_MB=auto: {}, so the cap stays {} MB", no_tuning_reason, options_.bucket_mb);
  }
}

int Schedule::add(std::string name, std::size_t rows, std::size_t cols) {
  if (finalized_)
    throw InvalidArgument(
        fmt::format("rank {}: add_parameter('{}') after finalize(); register every parameter first", rank_, name));
  if (by_name_.count(name) != 0)
    throw InvalidArgument(fmt::format(
        "rank {}: add_parameter('{}'): a parameter of that name is already registered; names must be unique", rank_,
        name));
  const int index = static_cast<int>(gradients_.size());
  by_name_.emplace(name, index);
  gradients_.push_back({std::move(name), rows * cols, rows});
  return index;
}

void Schedule::finalize() {
  if (finalized_) return;
  assign(reverse_order(gradients_.size()));
  check_layout();
  finalized_ = true;
  start_step();
}

void Schedule::assign(const std::vector<int>& order) {
  order_ = order;
  buckets_ = plan_buckets(gradients_, order_, options_);
  for (std::size_t k = 0; k < buckets_.size(); ++k) {
    std::size_t at = 0;
    for (int i : buckets_[k].gradients) {
      Gradient& g = gradients_[static_cast<std::size_t>(i)];
      g.bucket = static_cast<int>(k);
      g.offset = at;
      at += g.count;
    }
  }
  lay_out_();
}

// Every rank's fingerprint gathered; the ranks whose differ from rank 0's are named.
void Schedule::check_layout() {
  const std::vector<std::uint64_t> all =
      collectives_.allgather(fingerprint(gradients_, options_.compression, buckets_));
  std::vector<int> differ;
  for (std::size_t r = 0; r < all.size(); ++r)
    if (all[r] != all[0]) differ.push_back(static_cast<int>(r));
  if (!differ.empty())
    throw InvalidArgument(
        fmt::format("rank {}: {} bucket layout differs from rank 0's on rank(s) {}; every rank must register the "
                    "same parameters (names, sizes, order) with the same bucket and compression options",
                    rank_, kind_, fmt::join(differ, ",")));
}

const Gradient& Schedule::mark_ready(int index) {
  if (!finalized_) throw InvalidArgument("mark_ready() before finalize(); call finalize() once after add_parameter()");
  if (index < 0 || index >= static_cast<int>(gradients_.size()))
    throw InvalidArgument(fmt::format("rank {}: mark_ready({}): no such parameter; indices run 0..{}", rank_, index,
                                      static_cast<long long>(gradients_.size()) - 1));
  Gradient& g = gradients_[static_cast<std::size_t>(index)];
  if (g.ready)
    throw InvalidArgument(
        fmt::format("rank {}: gradient '{}' was marked ready twice in one step; mark each parameter once per step, "
                    "then call finish()",
                    rank_, g.name));
  g.ready = true;
  if (ready_order_.empty()) first_ready_ = Clock::now();
  ready_order_.push_back(index);
  --buckets_[static_cast<std::size_t>(g.bucket)].pending;
  return g;
}

int Schedule::index_of(std::string_view name) const {
  const auto it = by_name_.find(std::string(name));
  if (it == by_name_.end())
    throw InvalidArgument(
        fmt::format("rank {}: mark_ready('{}'): no parameter of that name was registered", rank_, name));
  return it->second;
}

void Schedule::launch_ready(const std::function<void(int)>& launch) {
  while (next_launch_ < static_cast<int>(buckets_.size()) &&
         buckets_[static_cast<std::size_t>(next_launch_)].pending == 0) {
    launch(next_launch_);
    buckets_[static_cast<std::size_t>(next_launch_)].launched = true;
    ++next_launch_;
  }
}

void Schedule::begin_finish(const std::function<void(int)>& launch) {
  if (!finalized_) throw InvalidArgument("finish() before finalize()");
  std::vector<std::string> missing;
  for (const Gradient& g : gradients_)
    if (!g.ready) missing.push_back(g.name);
  if (!missing.empty())
    throw InvalidArgument(
        fmt::format("rank {}: finish(): gradient(s) {} were never marked ready this step; call mark_ready() for "
                    "every registered parameter in backward (or register only the parameters that get gradients)",
                    rank_, fmt::join(missing, ", ")));
  launch_ready(launch);
}

bool Schedule::end_step(const std::function<void()>& before_reassign, const std::function<bool()>& settled) {
  bool reassigned = false;
  ++steps_;
  last_span_s_ = std::chrono::duration<double>(Clock::now() - first_ready_).count();
  // After the first step, rebuild the buckets from the order gradients really arrived in (rank 0's, so that every
  // rank builds the same buckets); a tuned cap starts there with the first candidate.
  if (steps_ == 1 && (options_.rebuild || tuner_)) {
    std::vector<std::int32_t> order(ready_order_.begin(), ready_order_.end());
    collectives_.broadcast_from_0(order);
    const std::vector<int> observed(order.begin(), order.end());
    const bool rebuild = options_.rebuild && observed != reverse_order(gradients_.size());
    if (tuner_) options_.bucket_mb = tuner_->cap();
    if (rebuild || tuner_) {
      before_reassign();
      assign(rebuild ? observed : order_);
      reassigned = true;
    }
  } else if (steps_ > 1 && tuner_ && tuner_->active() && (++steps_at_cap_ > 40 || !settled || settled())) {
    if (tuner_->record(last_span_s_, collectives_.max)) {
      steps_at_cap_ = 0;
      options_.bucket_mb = tuner_->cap();
      before_reassign();
      assign(order_);
      reassigned = true;
      if (!tuner_->active() && rank_ == 0)
        log::info("bucket cap tuned: {} MB (median step span in s for caps 1 2 4 8 25 MB: {:.4f})", options_.bucket_mb,
                  fmt::join(tuner_->medians(), " "));
    }
  }
  start_step();
  return reassigned;
}

void Schedule::start_step() {
  for (Bucket& b : buckets_) {
    b.pending = static_cast<int>(b.gradients.size());
    b.launched = false;
  }
  for (Gradient& g : gradients_) g.ready = false;
  ready_order_.clear();
  next_launch_ = 0;
}

std::vector<std::vector<std::string>> Schedule::bucket_names() const {
  std::vector<std::vector<std::string>> out;
  for (const Bucket& b : buckets_) {
    out.emplace_back();
    for (int i : b.gradients) out.back().push_back(gradients_[static_cast<std::size_t>(i)].name);
  }
  return out;
}

}  // namespace hopwise::comm::reducer
