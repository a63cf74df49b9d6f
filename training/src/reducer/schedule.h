// The reducer's schedule, the one core of the host GradientReducer (host_reducer.cpp) and the
// DeviceGradientReducer (device_reducer.cpp): the registered gradients, their buckets (planned in schedule.cpp), which
// are ready, which bucket launches next (bucket order, alike on every rank), the checks and their messages, the layout
// agreement, and after each step the rebuild from the observed order and the bucket-cap tuning (bucket_tuner.h).
// The reducers keep only what differs: memory (a bucket's view or buffer, host or device) and the launches, which
// they hand in as callbacks; the communication the schedule itself needs (one fingerprint gathered, rank 0's order
// broadcast, the tuner's medians agreed) goes through the `Collectives` each reducer provides over its own
// communicator.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "bucket_tuner.h"
#include "hopwise/training/reducer.h"  // ReducerOptions

namespace hopwise::comm::reducer {

struct Gradient {
  std::string name;
  std::size_t count = 0;
  std::size_t rows = 1;  // the matrix shape PowerSGD compresses (1: a vector)
  int bucket = -1;
  std::size_t offset = 0;  // elements from the start of its bucket
  bool ready = false;
};

struct Bucket {
  std::vector<int> gradients;  // in the order they sit in the bucket
  std::size_t count = 0;
  int pending = 0;  // gradients not yet ready this step
  bool launched = false;
};

// What the schedule needs from the reducer's communicator. Each is collective: every rank calls it at the same step.
struct Collectives {
  std::function<std::vector<std::uint64_t>(std::uint64_t)> allgather;  // one value from each rank, in rank order
  std::function<void(std::vector<std::int32_t>&)> broadcast_from_0;    // rank 0's vector (of the same length)
  std::function<void(std::vector<double>&)> max;                       // elementwise maximum over the ranks
};

class Schedule {
 public:
  using Clock = std::chrono::steady_clock;

  // `kind` names the reducer in messages ("gradient", "device gradient"). `tune` permits HOPWISE_BUCKET_MB=auto
  // (options.tune_bucket): false leaves the cap as it is, with the reason logged.
  // `lay_out` runs after every assignment of the buckets: the reducer places them in its memory.
  Schedule(ReducerOptions& options, int rank, std::string kind, Collectives collectives, std::function<void()> lay_out,
           bool tune, std::string_view no_tuning_reason = {});

  // Registers a gradient (forward order): the checks of add_parameter (after finalize, duplicate name).
  int add(std::string name, std::size_t rows, std::size_t cols);
  // Buckets in reverse registration order, the layout agreed across the ranks (names the ranks that differ).
  void finalize();
  bool finalized() const { return finalized_; }

  // The gradient `index` is ready (the checks of mark_ready); returns it. `launch(k)` then runs for each bucket,
  // in bucket order, whose gradients are all ready (unless the options defer launches to finish()).
  const Gradient& mark_ready(int index);
  int index_of(std::string_view name) const;  // throws naming an unregistered name
  void launch_ready(const std::function<void(int bucket)>& launch);
  bool overlaps() const { return options_.overlap; }

  // finish(): the checks (every gradient marked), then every bucket still unlaunched is launched.
  void begin_finish(const std::function<void(int bucket)>& launch);
  // After the step's buckets are done: rank 0's observed order rebuilds the buckets after the first step, and the
  // tuner moves to its next cap. Returns true when the buckets were assigned anew (`before_reassign` ran first:
  // the reducer lets its old buffers' work finish). `settled`: whether this step's span measures the cap.
  bool end_step(const std::function<void()>& before_reassign, const std::function<bool()>& settled = {});
  // A step whose gradients stayed local: only the marks are reset.
  void skip_step() { start_step(); }
  bool in_step() const { return !ready_order_.empty(); }

  const std::vector<Gradient>& gradients() const { return gradients_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  std::vector<std::vector<std::string>> bucket_names() const;
  int rank() const { return rank_; }
  bool tuning() const { return tuner_ && tuner_->active(); }
  int steps() const { return steps_; }
  double last_span_s() const { return last_span_s_; }  // the step end_step() ended: first ready to its call

 private:
  void assign(const std::vector<int>& order);
  void check_layout();
  void start_step();

  ReducerOptions& options_;
  int rank_;
  std::string kind_;
  Collectives collectives_;
  std::function<void()> lay_out_;
  std::optional<detail::BucketTuner> tuner_;
  std::vector<Gradient> gradients_;
  std::unordered_map<std::string, int> by_name_;
  std::vector<Bucket> buckets_;
  std::vector<int> order_;        // the order the buckets were assigned in
  std::vector<int> ready_order_;  // this step's mark_ready order (for the rebuild after step 1)
  Clock::time_point first_ready_;
  int next_launch_ = 0;
  int steps_ = 0;
  int steps_at_cap_ = 0;
  double last_span_s_ = 0;
  bool finalized_ = false;
};

}  // namespace hopwise::comm::reducer
