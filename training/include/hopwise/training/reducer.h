// The bucketed gradient reducer: gradients registered in forward order are grouped into buckets in reverse
// order (backward produces them that way); a bucket is all-reduced (averaged) on the communicator's progress
// thread as soon as its last gradient is marked ready, while backward computes the rest. Buckets view the
// caller's gradient memory where it is contiguous, else go through a bucket buffer.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "hopwise/comm/communicator.h"
#include "hopwise/training/averaging.h"

namespace hopwise::comm {

struct ReducerOptions {
  double bucket_mb = 25;  // HOPWISE_BUCKET_MB: cap of a bucket
  // HOPWISE_BUCKET_MB=auto: after the first step's rebuild, caps of 1, 2, 4, 8 and 25 MB run 5 steps each, and the
  // one whose steps (first ready gradient to the end of finish(), the slowest rank's median) were shortest stays.
  // Uncompressed or PowerSGD only (a codec's per-bucket error feedback would be lost with the buckets).
  bool tune_bucket = false;
  double first_bucket_mb = 1;  // the first bucket (last layers) small, so that communication starts early
  bool overlap = true;         // false: launch every bucket in finish() (the no-overlap baseline)
  bool rebuild = true;         // rebuild buckets after the first step from the observed ready order
  // HOPWISE_COMPRESSION: codec spec for every bucket (compression/codec.h), or "powersgd:rank=R[,warmup=N]": each
  // registered matrix as its rank-R factors (compression/powersgd.h).
  std::string compression = "none";
  // HOPWISE_STEP_TUNE (default 1, where the communicator tunes online; uncompressed only): once the buckets' size
  // classes are tuned call by call, whole steps confirm the choice: the tuned one against the tuner's other close
  // candidates and the cost model's pick, in interleaved blocks; then a guard reverts a later re-tuning that made the
  // steps slower. HOPWISE_DEBUG=INFO prints the evidence.
  bool tune_steps = true;
  static ReducerOptions from_env();
};

// What whole steps measured for one size class of the buckets (ReducerOptions::tune_steps).
struct StepTuning {
  std::string size_class;  // "1 MiB": the class's largest size
  int buckets = 0;         // buckets of the class a step
  // Each arm's step span (first ready gradient to the end of finish()), the slowest rank's median, seconds; the
  // first arm is the tuner's choice. One arm with 0 s: nothing else was worth a try.
  std::vector<std::pair<TuningChoice, double>> arms;
  TuningChoice chosen;
};

struct StepStats {
  std::size_t bytes = 0;  // bytes this rank put on the wire this step (codec payloads when compressing)
  int buckets = 0;
  double comm_ms = 0;          // the buckets' time on the progress thread, summed
  double exposed_comm_ms = 0;  // time finish() spent waiting: the communication backward did not hide
  double overlap_pct = 0;      // share of comm_ms that was hidden
  std::size_t host_bytes = 0;  // of `bytes`, what stayed within the host (GradientScope::kHost)
};

class GradientReducer {
 public:
  struct BucketTiming {
    int bucket;
    std::size_t bytes;
    std::chrono::steady_clock::time_point start, end;
  };

  explicit GradientReducer(Communicator& comm, ReducerOptions options = ReducerOptions::from_env());
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Registers a float32 gradient of `count` elements (forward order); returns its index. The memory stays the
  // caller's and must live as long as the reducer.
  int add_parameter(std::string name, float* grad, std::size_t count);
  // The same for a rows x cols matrix (row-major): its shape is what PowerSGD compresses; vectors and matrices
  // PowerSGD does not compress (see PowerSgd::compresses) are all-reduced plainly with the rest of the bucket.
  int add_parameter(std::string name, float* grad, std::size_t rows, std::size_t cols);
  // Assigns buckets and checks, once, that every rank has the same layout (names the ranks that differ).
  // Collective.
  void finalize();
  // Backward produced gradient `index`: its bucket is launched when complete (buckets launch in bucket order,
  // so that every rank issues the same collectives in the same order).
  void mark_ready(int index);
  // Waits for every bucket, leaves the averaged gradients in place, returns the step's statistics.
  StepStats finish();
  // What the coming steps' gradients are averaged over (ModelAverager::gradient_scope()): the world (default),
  // this rank's host (allreduce_within_host; uncompressed: a codec's state is the world's), or nothing (the
  // gradients stay local). Alike on every rank; between finish() and the next step's first mark_ready().
  void set_scope(GradientScope scope);
  GradientScope scope() const;

  std::size_t bucket_count() const;
  double bucket_mb() const;                                    // the cap in use (the tuned one once tuning is done)
  bool tuning_bucket() const;                                  // still trying caps
  std::vector<std::vector<std::string>> bucket_names() const;  // per bucket, in bucket order
  const std::vector<BucketTiming>& last_timings() const;
  std::vector<StepTuning> step_tuning() const;  // per size class, as decided so far
  int step_tuning_reverts() const;              // later re-tunings the guard reverted

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hopwise::comm
