// The outer path's definition (training/src/averaging/outer.cpp), replayed serially over all ranks' models: diloco's
// outer SGD with (Nesterov) momentum on the averaged difference from the synced model, fragments synced in turn,
// a delay behind compute, the alpha merge, and the full average's outer step on every fragment. Written from the
// definition, element by element, with the ranks' mean taken in rank order.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "hopwise/training/averaging.h"

namespace hwtest::averaging {

class OuterReference {
 public:
  using Models = std::vector<std::vector<float>>;
  OuterReference(const hopwise::comm::AveragingSpec& s, std::size_t dim)
      : s_(s), dim_(dim), synced_(dim), momentum_(dim, 0.0f) {}

  // After the optimizer step t (1-based) of every rank.
  void after_step(Models& x, std::int64_t t) {
    if (t == s_.warmup && t > 0) synced_ = x[0];
    if (on_ && t >= launched_at_ + s_.delay) apply(x, false);
    if (const int f = due(t); f >= 0) {
      launch(x, f, t);
      if (s_.delay == 0) apply(x, false);
    }
  }
  void start(const Models& x) { synced_ = x[0]; }
  void full_average(Models& x) {
    if (on_) apply(x, false);
    for (int f = 0; f < s_.fragments; ++f) {
      launch(x, f, 0);
      apply(x, true);
    }
  }

 private:
  std::pair<std::size_t, std::size_t> range(int f) const {
    const auto F = static_cast<std::size_t>(s_.fragments);
    return {dim_ * static_cast<std::size_t>(f) / F, dim_ * static_cast<std::size_t>(f + 1) / F};
  }
  int due(std::int64_t t) const {
    if (t <= s_.warmup) return -1;
    const std::int64_t gap = s_.period / s_.fragments, k = (t - s_.warmup) % s_.period;
    if (k % gap != 0) return -1;
    return static_cast<int>((k == 0 ? s_.fragments : k / gap) - 1);
  }
  void launch(const Models& x, int f, std::int64_t t) {
    const auto [b, e] = range(f);
    sent_.assign(x.size(), {});
    for (std::size_t r = 0; r < x.size(); ++r)
      for (std::size_t i = b; i < e; ++i) sent_[r].push_back(x[r][i] - synced_[i]);
    on_ = true;
    fragment_ = f;
    launched_at_ = t;
  }
  void apply(Models& x, bool everyone_equal) {
    on_ = false;
    const auto [b, e] = range(fragment_);
    const float lr = static_cast<float>(s_.outer_lr), mu = static_cast<float>(s_.momentum);
    const float keep = static_cast<float>(s_.alpha), take = static_cast<float>(1.0 - s_.alpha);
    for (std::size_t i = b; i < e; ++i) {
      float a = 0;
      for (const auto& s : sent_) a += s[i - b];
      a /= static_cast<float>(sent_.size());
      float step = a;
      if (s_.momentum > 0) {
        momentum_[i] = mu * momentum_[i] + a;
        step = s_.nesterov ? a + mu * momentum_[i] : momentum_[i];
      }
      const float u = lr * step;
      synced_[i] += u;
      for (std::size_t r = 0; r < x.size(); ++r) {
        if (everyone_equal || (s_.delay == 0 && s_.alpha == 0))
          x[r][i] = synced_[i];
        else if (s_.delay == 0)
          x[r][i] = keep * x[r][i] + take * synced_[i];
        else
          x[r][i] += take * (u - sent_[r][i - b]);
      }
    }
  }

  hopwise::comm::AveragingSpec s_;
  std::size_t dim_;
  std::vector<float> synced_, momentum_;
  std::vector<std::vector<float>> sent_;
  bool on_ = false;
  int fragment_ = 0;
  std::int64_t launched_at_ = 0;
};

}  // namespace hwtest::averaging
