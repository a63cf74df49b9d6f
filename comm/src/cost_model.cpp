#include "hopwise/comm/cost_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "algorithms/algorithms.h"
#include "hopwise/comm/transport.h"
#include "hopwise/common/reduce.h"
#include "workspace.h"

namespace hopwise::comm {

CostParams CostParams::defaults() {
  // calibrate() on the 2-core Debian development machines, 2 ranks, shared memory.
  CostParams p;
  p.alpha = 0.32e-6;
  p.beta = 1.0 / 12.0e9;
  p.gamma = 1.0 / 47.0e9;
  p.alpha_native = 0.7e-6;
  p.alpha_rendezvous = 2.0e-6;
  p.beta_native = 1.0 / 7.5e9;
  p.source = "defaults";
  return p;
}

double CostModel::estimate(Algorithm a, CostQuery q) const {
  if (q.ranks <= 1) return 0.0;
  q.params = &p_;
  return algorithm_info(a).estimate(q);
}

// Every row of the table that implements the collective and may run here is a candidate, built-in or registered.
std::vector<std::pair<Algorithm, double>> CostModel::candidates(CostQuery q, bool has_native) const {
  std::vector<std::pair<Algorithm, double>> out;
  for (Algorithm a : all_algorithms()) {
    const AlgorithmInfo& row = algorithm_info(a);
    if (!row.candidate || !implements(a, q.collective) || (row.needs_native && !has_native)) continue;
    out.emplace_back(a, estimate(a, q));
  }
  return out;
}

Algorithm CostModel::choose(CostQuery q, bool has_native) const {
  Algorithm best = Algorithm::kRing;
  double best_t = INFINITY;
  for (const auto& [a, t] : candidates(q, has_native))
    if (t < best_t) {
      best_t = t;
      best = a;
    }
  return best;
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Median time of a ring-neighbour exchange (send to next, receive from prev) of `bytes`.
double time_exchange(Transport& t, char* sendbuf, char* recvbuf, std::size_t bytes, int reps) {
  const int p = t.size(), r = t.rank();
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    Request reqs[2] = {t.irecv(recvbuf, bytes, (r + p - 1) % p, algo::kTagCheck),
                       t.isend(sendbuf, bytes, (r + 1) % p, algo::kTagCheck)};
    t.wait_all(reqs);
    times.push_back(seconds_since(t0));
  }
  std::nth_element(times.begin(), times.begin() + reps / 2, times.end());
  return times[static_cast<std::size_t>(reps / 2)];
}

}  // namespace

CostParams calibrate(Transport& t, Workspace& ws) {
  CostParams p = CostParams::defaults();
  p.source = "calibrated";
  if (t.size() <= 1) return p;
  constexpr std::size_t kLarge = 1 << 20;
  char* a = static_cast<char*>(ws.get(Scratch::kRecvA, kLarge));
  char* b = static_cast<char*>(ws.get(Scratch::kRecvB, kLarge));
  time_exchange(t, a, b, kLarge, 2);  // warm up the path
  const double small = time_exchange(t, a, b, 8, 21);
  const double large = time_exchange(t, a, b, kLarge, 9);
  p.beta = std::max(1e-12, (large - small) / static_cast<double>(kLarge));
  constexpr std::size_t kRendezvous = 16 << 10;
  p.alpha_rendezvous = std::max(0.0, time_exchange(t, a, b, kRendezvous, 21) - small - kRendezvous * p.beta);
  if (t.shared_slots() != nullptr) {
    const algo::Context ctx{t, ws, 256 << 10};
    float x = 1.0f, y = 0.0f;
    std::vector<double> times;
    for (int i = 0; i < 21; ++i) {
      const auto t0 = Clock::now();
      algo::one_shot_allreduce_shared(ctx, &x, &y, 1, DataType::kFloat32, ReduceOp::kSum, 1.0);
      times.push_back(seconds_since(t0));
    }
    std::sort(times.begin(), times.end());
    p.alpha_shared = times[10];
    p.shared_slot_bytes = static_cast<double>(t.shared_slots()->slot_bytes);
    // The shm allreduce's cost per byte (copy in, reduce, copy out), from one slot-sized chunk.
    const std::size_t n = std::min<std::size_t>(kLarge, t.shared_slots()->slot_bytes);
    times.clear();
    for (int i = 0; i < 7; ++i) {
      const auto t0 = Clock::now();
      algo::two_shot_allreduce(ctx, a, a, n / 4, DataType::kFloat32, ReduceOp::kSum, 1.0);
      times.push_back(seconds_since(t0));
    }
    std::sort(times.begin(), times.end());
    p.beta_shared = std::max(1e-12, (times[3] - 2 * p.alpha_shared) / static_cast<double>(n));
  } else {
    p.alpha_shared = p.shared_slot_bytes = p.beta_shared = 0;
  }
  {
    // alpha is what one ring step costs in software, not just on the wire: time a ring allreduce of one
    // element per rank and divide by its 2(p-1) steps.
    const algo::Context ctx{t, ws, 256 << 10};
    std::vector<float> x(static_cast<std::size_t>(t.size()), 1.0f), y(x.size());
    std::vector<double> times;
    for (int i = 0; i < 21; ++i) {
      const auto t0 = Clock::now();
      algo::ring_allreduce(ctx, x.data(), y.data(), x.size(), DataType::kFloat32, ReduceOp::kSum, 1.0,
                           topology::identity_ring(t.size()));
      times.push_back(seconds_since(t0));
    }
    std::sort(times.begin(), times.end());
    p.alpha = std::max(small, times[10] / (2.0 * (t.size() - 1)));
  }
  {
    std::vector<double> times;
    for (int i = 0; i < 7; ++i) {
      const auto t0 = Clock::now();
      reduce_into(DataType::kFloat32, ReduceOp::kSum, a, a, b, kLarge / 4);
      times.push_back(seconds_since(t0));
    }
    std::sort(times.begin(), times.end());
    p.gamma = times[3] / static_cast<double>(kLarge);
  }
  if (NativeCollectives* nat = t.native()) {
    auto time_native = [&](std::size_t count, int reps) {
      std::vector<double> times;
      for (int i = 0; i < reps; ++i) {
        const auto t0 = Clock::now();
        nat->allreduce(a, b, count, DataType::kFloat32, ReduceOp::kSum);
        times.push_back(seconds_since(t0));
      }
      std::nth_element(times.begin(), times.begin() + reps / 2, times.end());
      return times[static_cast<std::size_t>(reps / 2)];
    };
    time_native(kLarge / 4, 2);
    // MPI's algorithm is its own business: fit its allreduce as a line through 4 KiB and 1 MiB, the range
    // where the choice matters (below 4 KiB MPI is faster per byte than the line says: it stays eager).
    constexpr std::size_t kSmall = 4096;
    const double ns = time_native(kSmall / 4, 21), nl = time_native(kLarge / 4, 9);
    p.beta_native = std::max(1e-12, (nl - ns) / static_cast<double>(kLarge - kSmall));
    p.alpha_native = std::max(1e-9, ns - p.beta_native * kSmall);
  } else {
    p.alpha_native = p.beta_native = 0;
  }
  // Every rank must choose alike: take the largest of each figure. A max-allreduce over the transport itself,
  // by recursive doubling on the ring of ranks (every rank ends with the maximum).
  double v[9] = {p.alpha,        p.beta,
                 p.gamma,        p.alpha_native,
                 p.beta_native,  p.alpha_rendezvous,
                 p.alpha_shared, p.shared_slot_bytes,
                 p.beta_shared},
         in[9];
  const int n = t.size(), r = t.rank();
  for (int dist = 1; dist < n; dist *= 2) {
    Request reqs[2] = {t.irecv(in, sizeof in, (r - dist + n) % n, algo::kTagAlive),
                       t.isend(v, sizeof v, (r + dist) % n, algo::kTagAlive)};
    t.wait_all(reqs);
    for (int i = 0; i < 9; ++i) v[i] = std::max(v[i], in[i]);
  }
  p.alpha = v[0];
  p.beta = v[1];
  p.gamma = v[2];
  p.alpha_native = v[3];
  p.beta_native = v[4];
  p.alpha_rendezvous = v[5];
  p.alpha_shared = v[6];
  p.shared_slot_bytes = v[7];
  p.beta_shared = v[8];
  return p;
}

}  // namespace hopwise::comm
