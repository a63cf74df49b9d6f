// Bench's async-overlap table (--overlap, allreduce only): how much of allreduce_async's time hides behind
// compute run before wait(), against compute then a blocking allreduce, with sleep and a busy core as the compute.
#include "bench.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "clock.h"

namespace hopwise::bench {
namespace {

// Compute stand-ins: "sleep" leaves the CPU free (compute on an accelerator); "cpu" keeps this rank's core busy.
void compute_for(double seconds, bool cpu) {
  if (!cpu) {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    return;
  }
  static std::vector<float> v(1 << 14, 1.0f);
  volatile float sink = 0;
  const double end = now_s() + seconds;
  while (now_s() < end) {
    float s = 0;
    for (float x : v) s += x * 1.0001f;
    sink = sink + s;
  }
}

}  // namespace

void Bench::run_overlap() {
  const std::size_t count = o_.max_bytes / dtype_size(o_.dtype);
  comm_.set_algorithm(Algorithm::kAuto);
  auto median_of = [&](auto&& body) {
    std::vector<double> t;
    for (int it = 0; it < o_.warmup + o_.iters; ++it) {
      control_.sync();
      const double t0 = now_s();
      body();
      if (it >= o_.warmup) t.push_back(now_s() - t0);
    }
    control_.max(t);
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  const double c = median_of([&] { comm_.allreduce(in_->data, out_->data, count, o_.dtype, o_.op); });
  if (rank_ == 0)
    fmt::print(
        "\n# async overlap: allreduce_async of {} bytes, then compute for T, then wait(); against compute "
        "then allreduce\n# {:>7} {:>10} {:>10} {:>13} {:>13} {:>12} {:>8}\n",
        count * dtype_size(o_.dtype), "compute", "comm_us", "compute_us", "sequential_us", "overlapped_us",
        "max(T,C)_us", "hidden%");
  for (bool cpu : {false, true}) {
    for (double ratio : {0.5, 1.0, 2.0}) {
      const double T = c * ratio;
      const double seq = median_of([&] {
        compute_for(T, cpu);
        comm_.allreduce(in_->data, out_->data, count, o_.dtype, o_.op);
      });
      const double ovl = median_of([&] {
        comm::Work w = comm_.allreduce_async(in_->data, out_->data, count, o_.dtype, o_.op);
        compute_for(T, cpu);
        w.wait();
      });
      const double hidden = std::clamp((seq - ovl) / std::min(T, c), 0.0, 1.0) * 100;
      if (rank_ == 0)
        fmt::print("  {:>7} {:>10.1f} {:>10.1f} {:>13.1f} {:>13.1f} {:>12.1f} {:>8.0f}\n", cpu ? "cpu" : "sleep",
                   c * 1e6, T * 1e6, seq * 1e6, ovl * 1e6, std::max(T, c) * 1e6, hidden);
    }
  }
}

}  // namespace hopwise::bench
