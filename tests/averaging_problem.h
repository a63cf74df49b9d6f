// The averaging tests' problem: a deterministic quadratic (each rank its own curvature, centre and noise) trained
// through the GradientReducer and the ModelAverager, and a serial simulation that replays each method's
// definition over all ranks' models at once. Shared by test_averaging (in-process ranks) and averaging_mpi
// (mpirun).
#pragma once

#include <fmt/core.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "hopwise/compression/codec.h"
#include "hopwise/training/averaging.h"
#include "hopwise/training/reducer.h"
#include "outer_reference.h"

namespace hc = hopwise::comm;

namespace hwtest::averaging {

constexpr std::size_t kDim = 1009;   // a prime: no bucket or chunk divides it
constexpr std::size_t kSplit = 600;  // two registered tensors
constexpr float kLr = 0.1f, kMomentum = 0.9f;

inline float curvature(int r, std::size_t i) {
  return 0.5f + static_cast<float>((i * 7 + static_cast<std::size_t>(r) * 3) % 10) / 10;
}
inline float centre(int r, std::size_t i) { return std::sin(static_cast<float>(i) + static_cast<float>(r)); }
inline float noise(int r, std::int64_t t, std::size_t i) {
  return 0.01f * std::sin(1.3f * static_cast<float>(i) + 0.7f * static_cast<float>(t) + 2.1f * static_cast<float>(r));
}
inline void gradient(int r, std::int64_t t, const float* x, float* g) {
  for (std::size_t i = 0; i < kDim; ++i) g[i] = curvature(r, i) * (x[i] - centre(r, i)) + noise(r, t, i);
}
inline void sgd(float* x, float* v, const float* g) {
  for (std::size_t i = 0; i < kDim; ++i) {
    v[i] = kMomentum * v[i] + g[i];
    x[i] -= kLr * v[i];
  }
}

struct Run {
  std::string spec;
  int steps = 24;
  int eval_every = 10;  // full_average() every this many steps, and at the end
  bool staged = false;  // the averager works on a host copy of the model (ParameterStaging), as for a GPU model
};

// The staging a GPU model has, on the CPU: the model is the trainer's buffer, the averager works on a copy, and
// every step of the trainer leaves that copy stale (NaN), so a read without fetch or a write without publish shows.
class CopyStaging final : public hc::ParameterStaging {
 public:
  CopyStaging(float* model, float* host) : model_(model), host_(host) {}
  void fetch(std::size_t b, std::size_t e) override {
    std::memcpy(host_ + b, model_ + b, (e - b) * sizeof(float));
    fetched += e - b;
  }
  void publish(std::size_t b, std::size_t e) override { std::memcpy(model_ + b, host_ + b, (e - b) * sizeof(float)); }
  void stale() { std::fill(host_, host_ + kDim, std::nanf("")); }
  std::size_t fetched = 0;  // elements copied out so far (what crosses PCIe on a GPU)

 private:
  float* model_;
  float* host_;
};

using Models = std::vector<std::vector<float>>;

inline Models mean_of(const Models& xs, const std::vector<int>& members) {
  std::vector<float> m(kDim, 0.0f);
  for (int r : members)
    for (std::size_t i = 0; i < kDim; ++i) m[i] += xs[static_cast<std::size_t>(r)][i];
  for (float& v : m) v /= static_cast<float>(members.size());
  Models out(xs);
  for (int r : members) out[static_cast<std::size_t>(r)] = m;
  return out;
}

// The method's definition, replayed over all ranks. host_of[r]: rank r's host; ring: the planned ring.
inline Models simulate(const Run& run, int n, const std::vector<int>& host_of, const std::vector<int>& ring) {
  const hc::AveragingSpec s = hc::AveragingSpec::parse(run.spec);
  std::vector<int> all(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) all[static_cast<std::size_t>(r)] = r;
  Models x(static_cast<std::size_t>(n), std::vector<float>(kDim)), v(x), snap(x);
  for (auto& xr : x)
    for (std::size_t i = 0; i < kDim; ++i) xr[i] = std::cos(static_cast<float>(i));  // rank 0's, broadcast
  bool async_pending = false, gossip_pending = false;
  std::int64_t snapped_at = 0;
  const int k = std::min(s.peers, std::max(1, n - 1));
  std::unique_ptr<hopwise::compression::Codec> codec;
  if (s.codec != "none") codec = hopwise::compression::make_codec(s.codec);
  std::vector<float> reference = x[0];
  OuterReference outer(s, kDim);
  outer.start(x);
  auto full_average = [&] {
    if (s.method == "sync") return;
    if (s.method == "diloco") return outer.full_average(x);
    async_pending = gossip_pending = false;
    x = mean_of(x, all);
    reference = x[0];
  };
  for (std::int64_t t = 1; t <= run.steps; ++t) {
    Models g(static_cast<std::size_t>(n), std::vector<float>(kDim));
    for (int r = 0; r < n; ++r)
      gradient(r, t, x[static_cast<std::size_t>(r)].data(), g[static_cast<std::size_t>(r)].data());
    const bool world = s.method == "sync" || t <= s.warmup;
    if (world) g = mean_of(g, all);
    if (s.method == "hier" && !world)
      for (int h : std::set<int>(host_of.begin(), host_of.end())) {
        std::vector<int> members;
        for (int r = 0; r < n; ++r)
          if (host_of[static_cast<std::size_t>(r)] == h) members.push_back(r);
        g = mean_of(g, members);
      }
    if (s.method == "gossip" && gossip_pending) {
      // Mix the models sent after step t-1: rounds (t-2)K .. (t-2)K+K-1 of the pairing over ring positions.
      Models mixed(x);
      const float w = 1.0f / static_cast<float>(k + 1);
      Models decoded(static_cast<std::size_t>(n), std::vector<float>(kDim));
      if (codec)
        for (int r = 0; r < n; ++r) {
          std::vector<float> d(kDim);
          for (std::size_t i = 0; i < kDim; ++i) d[i] = x[static_cast<std::size_t>(r)][i] - reference[i];
          std::vector<std::byte> payload(codec->payload_bytes(kDim));
          hopwise::compression::CodecState st(0x676f73ull + static_cast<std::uint64_t>(r), 0, 1);
          codec->encode(d.data(), kDim, payload.data(), st);
          codec->decode(payload.data(), kDim, decoded[static_cast<std::size_t>(r)].data(), st);
        }
      for (int pos = 0; pos < n; ++pos) {
        const int r = ring[static_cast<std::size_t>(pos)];
        std::vector<int> partners;
        for (int j = 0; j < k; ++j)
          if (int q = hc::gossip_partner(pos, n, (t - 2) * k + j); q >= 0)
            partners.push_back(ring[static_cast<std::size_t>(q)]);
        auto& out = mixed[static_cast<std::size_t>(r)];
        const auto& me = x[static_cast<std::size_t>(r)];
        for (std::size_t i = 0; i < kDim; ++i) {
          if (codec) {
            for (int q : partners)
              out[i] += w * (decoded[static_cast<std::size_t>(q)][i] - decoded[static_cast<std::size_t>(r)][i]);
          } else if (k == 1 && partners.size() == 1) {
            out[i] = 0.5f * (me[i] + x[static_cast<std::size_t>(partners[0])][i]);
          } else {
            float acc = static_cast<float>(k + 1 - static_cast<int>(partners.size())) * me[i];
            for (int q : partners) acc += x[static_cast<std::size_t>(q)][i];
            out[i] = w * acc;
          }
        }
      }
      x = mixed;
      gossip_pending = false;
    }
    for (int r = 0; r < n; ++r)
      sgd(x[static_cast<std::size_t>(r)].data(), v[static_cast<std::size_t>(r)].data(),
          g[static_cast<std::size_t>(r)].data());
    if ((s.method == "local" || s.method == "hier") && t > s.warmup && (t - s.warmup) % s.period == 0)
      x = mean_of(x, all);
    if (s.method == "gossip") gossip_pending = n > 1;
    if (s.method == "diloco") outer.after_step(x, t);
    if (s.method == "async" && async_pending && t == snapped_at + (s.delay > 0 ? s.delay : s.period)) {
      const Models m = mean_of(snap, all);
      for (int r = 0; r < n; ++r)
        for (std::size_t i = 0; i < kDim; ++i)
          x[static_cast<std::size_t>(r)][i] += m[static_cast<std::size_t>(r)][i] - snap[static_cast<std::size_t>(r)][i];
      async_pending = false;
    }
    if (s.method == "async" && t > s.warmup && (t - s.warmup) % s.period == 0) {
      snap = x;
      snapped_at = t;
      async_pending = true;
    }
    if (t % run.eval_every == 0) full_average();
  }
  full_average();
  return x;
}

// One rank of the run, as a trainer would write it: the reducer averages what the averager's scope says, the
// averager runs around each optimizer step. Returns this rank's final parameters.
inline std::vector<float> train_rank(int r, hc::Communicator& comm, const Run& run) {
  std::vector<float> x(kDim, 100.0f + static_cast<float>(r)), v(kDim, 0.0f), grad(kDim);
  if (r == 0)
    for (std::size_t i = 0; i < kDim; ++i) x[i] = std::cos(static_cast<float>(i));
  hc::ReducerOptions ro;
  ro.bucket_mb = 0.001;  // several buckets
  ro.first_bucket_mb = 0.001;
  hc::GradientReducer reducer(comm, ro);
  reducer.add_parameter("a", grad.data(), kSplit);
  reducer.add_parameter("b", grad.data() + kSplit, kDim - kSplit);
  reducer.finalize();
  std::vector<float> host(run.staged ? kDim : 0, std::nanf(""));
  CopyStaging staging(x.data(), host.data());
  hc::ModelAverager avg(comm, hc::AveragingSpec::parse(run.spec), run.staged ? host.data() : x.data(), kDim,
                        run.staged ? &staging : nullptr);
  for (std::int64_t t = 1; t <= run.steps; ++t) {
    reducer.set_scope(avg.gradient_scope());
    gradient(r, t, x.data(), grad.data());
    reducer.mark_ready(1);
    reducer.mark_ready(0);
    reducer.finish();
    avg.before_step();
    sgd(x.data(), v.data(), grad.data());
    if (run.staged) staging.stale();
    avg.after_step();
    if (t % run.eval_every == 0) avg.full_average();
  }
  avg.full_average();
  return x;
}

// "" when every element is within `tolerance` of the simulation, else where the largest difference is.
inline std::string compare(const std::vector<float>& got, const std::vector<float>& want, double tolerance) {
  double worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < kDim; ++i)
    if (double d = std::abs(got[i] - want[i]); d > worst) worst = d, at = i;
  if (worst < tolerance) return "";
  return fmt::format("[{}] = {}, simulation {}", at, got[at], want[at]);
}

inline const std::vector<std::string> kSpecs = {"sync",
                                                "local:period=4,warmup=3",
                                                "local:period=1",
                                                "hier:period=3",
                                                "hier:period=2,warmup=5",
                                                "gossip:peers=1",
                                                "gossip:peers=2",
                                                "async:period=4",
                                                "async:period=1",
                                                "async:period=3,warmup=4",
                                                "async:period=4,delay=1",
                                                "async:period=3,delay=2,warmup=2",
                                                "gossip:peers=1,codec=fp16",
                                                "diloco:period=4",
                                                "diloco:period=4,fragments=2,delay=1",
                                                "diloco:period=6,fragments=3,delay=2,alpha=0.5,warmup=3",
                                                "diloco:period=5,momentum=0.5,nesterov=0,outer_lr=0.9,alpha=0.25",
                                                "diloco:period=3,fragments=3,outer_lr=1.2"};

}  // namespace hwtest::averaging
