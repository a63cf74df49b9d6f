// The reducer's bucket cap, measured where it is left to the reducer (HOPWISE_BUCKET_MB=auto): after the rebuild
// each candidate cap runs a few steps; the span from a step's first ready gradient to the end of finish()
// (backward plus the communication it did not hide: what the cap changes) is taken per step, its median per cap
// agreed across the ranks (max, so every rank keeps the same cap), and the fastest cap stays. Small caps start
// communication early and overlap more; large ones pay fewer per-call latencies: which wins depends on the link.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <functional>
#include <vector>

namespace hopwise::comm::detail {

class BucketTuner {
 public:
  static constexpr std::array<double, 5> kCaps{1, 2, 4, 8, 25};  // MB

  explicit BucketTuner(int steps_per_cap = 5) : steps_(steps_per_cap) {}
  bool active() const { return !done_; }
  double cap() const { return kCaps[current_]; }                   // the cap to run now (the chosen one once done)
  const std::vector<double>& medians() const { return medians_; }  // seconds per cap, agreed, once done

  // One step's span in seconds. Returns true when the cap to run changed (the caller assigns its buckets again).
  // `agree_max` (collective: every rank calls it at the same step) maxes a vector over the ranks.
  bool record(double seconds, const std::function<void(std::vector<double>&)>& agree_max) {
    if (done_) return false;
    samples_.push_back(seconds);
    if (static_cast<int>(samples_.size()) < steps_) return false;
    std::sort(samples_.begin(), samples_.end());
    medians_.push_back(samples_[samples_.size() / 2]);
    samples_.clear();
    if (++current_ < kCaps.size()) return true;
    agree_max(medians_);
    current_ = static_cast<std::size_t>(std::min_element(medians_.begin(), medians_.end()) - medians_.begin());
    done_ = true;
    return true;
  }

 private:
  int steps_;
  std::size_t current_ = 0;
  bool done_ = false;
  std::vector<double> samples_, medians_;
};

}  // namespace hopwise::comm::detail
