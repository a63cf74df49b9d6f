// Bench: what hopwise-bench measures. One collective over the size sweep, a row per algorithm beside MPI's and
// Gloo's own collective, the compressed rows (-C) and the async-overlap table (--overlap). The class is declared
// here and defined by concern: bench.cpp (construction, the sweep, the algorithm rows and their checks),
// bench_codecs.cpp (the compressed rows) and bench_overlap.cpp (the overlap table).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "buffers.h"
#include "clock.h"
#include "control.h"
#include "hopwise/comm/communicator.h"
#include "hopwise/compression/codec.h"
#include "hopwise/compression/powersgd.h"
#include "options.h"
#include "results.h"
#if HOPWISE_HAVE_GLOO
#include "gloo_peer.h"
#endif

namespace hopwise::bench {

using comm::Algorithm;
using comm::Collective;

class Bench {
 public:
  Bench(const Options& o, comm::Communicator& c, Control& control, bool with_mpi, int hosts);
  ~Bench();
  // The peer every row is compared with: MPI's own collective where MPI runs, else Gloo's, else none.
  std::string reference() const { return with_mpi_ ? "mpi" : has_gloo() ? "gloo" : "none"; }

  // Per size: what auto ran, the fastest of the other rows and their ratio (auto/best = best time / auto's).
  struct AutoVsBest {
    std::size_t bytes;
    std::string chose, best;
    double ratio;
  };
  const std::vector<AutoVsBest>& auto_vs_best() const { return auto_vs_best_; }

  std::vector<Row> run_sizes();

  void run_overlap();

 private:
  // bench.cpp: the size sweep, the algorithm rows and their checks.

  // The bytes of the call as the communicator counts them (reduce_scatter: the block received; allgather: the block
  // sent): what its tuning is keyed by.
  std::size_t call_bytes(std::size_t count) const;
  // Runs auto until the tuner has decided this size (its trials are the first calls of a job: the rows time the
  // steady state after them). Every rank decides at the same call, so every rank leaves the loop together.
  void settle_tuning(std::size_t count);

  // Elements per call: allreduce/broadcast/reduce move `count`; reduce_scatter's input and allgather's output
  // hold `count` (rounded down to a multiple of p).
  std::size_t count_for(std::size_t bytes) const;
  // The least time `bytes` take on the wire: what each host must send over its link (the bus factor over hosts).
  double wire_seconds(std::size_t bytes) const;
  double bus_factor(int over = 0) const;

  void run_ours(std::size_t count);

  void run_mpi(std::size_t count);

  // Runs the collective once more on fresh data and compares with a serial reference, bit for bit.
  bool check(std::size_t count);

  std::vector<Row> run_size(std::size_t bytes);

  // Where the rows hold auto and at least one other of ours: auto's time against the fastest of those.
  void note_auto_vs_best(const std::vector<Row>& rows);

  void print_rows(const std::vector<Row>& rows);

  bool has_gloo() const;
  void run_gloo(std::size_t count);

  // bench_codecs.cpp: the compressed rows (-C) and their checks (check_powersgd and check_codec are member
  // templates defined there, beside their only callers).

  // The input of compressed rows: rank `rank`'s random normal floats (regenerated for the serial checks).
  static void normal_fill(float* v, std::size_t count, int rank);

  // ||out - exact|| / ||exact|| (0 when exact is 0).
  static double relative_l2(const float* out, const float* exact, std::size_t count);

  // The buffers of a compressed row: this rank's random normal input, the output, and the exact sum.
  struct CodecBuffers {
    float* in;
    float* out;
    float* exact;
  };
  CodecBuffers codec_buffers(std::size_t count);

  // Times `call` skip + iters times after a barrier each, keeps the last iters, the slowest rank's, sorted.
  template <class F>
  std::vector<double> timed_calls(int skip, F call) {
    std::vector<double> t;
    for (int it = 0; it < skip + o_.iters; ++it) {
      control_.sync();
      const double t0 = now_s();
      call();
      if (it >= skip) t.push_back(now_s() - t0);
    }
    control_.max(t);
    std::sort(t.begin(), t.end());
    return t;
  }

  // A compressed row's sizes and timing figures from its sorted per-iteration times.
  Row codec_timing(std::size_t count, const std::vector<double>& sorted_times, double mpi_t) const;

  // A compressed allreduce of `count` random normal floats per rank through `spec`.
  Row codec_row(std::size_t count, const std::string& spec, double mpi_t);

  // The buffer as the most nearly square rows x cols matrix (rows the largest divisor <= sqrt(count)).
  static std::pair<std::size_t, std::size_t> matrix_shape(std::size_t count);

  // A PowerSGD allreduce of `count` random normal floats per rank seen as a matrix, timed as training runs it: one
  // state kept across calls (warm-started Q, residual and buffers already in memory: a fresh state would time
  // the first touch of its pages, ~12 us per 4 KiB page here, not PowerSGD).
  Row powersgd_row(std::size_t count, const std::string& spec, double mpi_t);

  // PowerSGD's own stated result, run serially over every rank's regenerated input (P and Q summed in rank
  // order): the allreduce's output must match it to a relative L2 difference of 1e-4 (the sums' order differs),
  // and, being a projection of the exact sum, its error against that sum is at most 1.
  template <class Fill>
  bool check_powersgd(const compression::PowerSgd& ps, std::size_t rows, std::size_t cols, const float* out, Fill fill);

  // The codec's own stated result: every rank's payload decoded and summed (run serially here, all ranks'
  // inputs regenerated), against what the compressed allreduce returned. fp16/bf16 payloads are summed in their
  // own type, so they may differ by p roundings of that type.
  template <class Fill>
  bool check_codec(const compression::Codec& codec, std::size_t count, const float* out, Fill fill);

  const Options& o_;
  std::vector<Algorithm> algorithms_;
  comm::Communicator& comm_;
  Control& control_;
  int p_, rank_;
  bool with_mpi_;
  int hosts_;
  MPI_Comm ref_ = MPI_COMM_NULL;
  std::unique_ptr<Buffer> in_, out_, expected_, scratch_;
  std::vector<AutoVsBest> auto_vs_best_;
#if HOPWISE_HAVE_GLOO
  std::unique_ptr<GlooPeer> gloo_;
#endif
};

}  // namespace hopwise::bench
