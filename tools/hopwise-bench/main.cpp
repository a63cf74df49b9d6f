// hopwise-bench: collectives timed like nccl-tests, every row beside MPI's own collective (under mpirun) and
// Gloo's from the same run.
#include <fmt/core.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include <cmath>
#include <random>
#include "control.h"
#include "hopwise/comm/communicator.h"
#include "hopwise/comm/launch.h"
#include "hopwise/comm/transports/mpi_store.h"
#include "hopwise/comm/transports/mpi_transport.h"
#include "hopwise/common/error.h"
#include "hopwise/common/half.h"
#include "hopwise/common/reduce.h"
#include "hopwise/compression/codec.h"
#include "hopwise/compression/powersgd.h"
#include "options.h"
#include "results.h"
#if HOPWISE_HAVE_GLOO
#include "gloo_peer.h"
#endif

namespace hopwise::bench {
namespace {

using Clock = std::chrono::steady_clock;
using comm::Algorithm;
using comm::Collective;

double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

// Page-aligned, pre-touched buffer: page faults inside a timed call would measure the kernel, not the collective.
struct Buffer {
  explicit Buffer(std::size_t bytes) : size(std::max<std::size_t>(bytes, 64)) {
    data = static_cast<char*>(std::aligned_alloc(4096, (size + 4095) & ~std::size_t{4095}));
    if (data == nullptr) throw std::bad_alloc();
    std::memset(data, 0, size);
  }
  ~Buffer() { std::free(data); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  char* data;
  std::size_t size;
};

// Small integers, so that every sum, product, min and max is exact in every dtype and any order of reduction.
int pattern(std::size_t i, int rank, ReduceOp op, DataType dt) {
  const std::size_t k = i * 7 + static_cast<std::size_t>(rank) * 13;
  if (op == ReduceOp::kProd) {
    const std::size_t m = (i + static_cast<std::size_t>(rank)) % 5;
    return m == 1 ? 2 : (m == 3 && dt != DataType::kUInt8 ? -1 : 1);
  }
  return dt == DataType::kUInt8 ? static_cast<int>(k % 9) : static_cast<int>(k % 9) - 4;
}

void fill(void* buf, std::size_t count, DataType dt, int rank, ReduceOp op, std::size_t first = 0) {
  for (std::size_t j = 0; j < count; ++j) {
    const int v = pattern(first + j, rank, op, dt);
    switch (dt) {
      case DataType::kFloat32: static_cast<float*>(buf)[j] = static_cast<float>(v); break;
      case DataType::kFloat64: static_cast<double*>(buf)[j] = v; break;
      case DataType::kFloat16: static_cast<std::uint16_t*>(buf)[j] = float_to_fp16(static_cast<float>(v)); break;
      case DataType::kBFloat16: static_cast<std::uint16_t*>(buf)[j] = float_to_bf16(static_cast<float>(v)); break;
      case DataType::kInt32: static_cast<std::int32_t*>(buf)[j] = v; break;
      case DataType::kInt64: static_cast<std::int64_t*>(buf)[j] = v; break;
      case DataType::kUInt8: static_cast<std::uint8_t*>(buf)[j] = static_cast<std::uint8_t>(v); break;
    }
  }
}

double memcpy_gbs() {
  constexpr std::size_t kBytes = 64 << 20;
  Buffer a(kBytes), b(kBytes);
  double best = 1e9;
  for (int i = 0; i < 5; ++i) {
    const double t0 = now_s();
    std::memcpy(b.data, a.data, kBytes);
    best = std::min(best, now_s() - t0);
  }
  return kBytes / best / 1e9;
}

class Bench {
 public:
  Bench(const Options& o, comm::Communicator& c, Control& control, bool with_mpi, int hosts)
      : o_(o), comm_(c), control_(control), p_(c.size()), rank_(c.rank()), with_mpi_(with_mpi), hosts_(hosts) {
    // A row per algorithm that implements the collective (tree has no reduce_scatter, for one).
    for (Algorithm a : o.algorithms) {
      if (a != Algorithm::kAuto && comm::algorithm_info(a).needs_native && c.transport().native() == nullptr) {
        if (rank_ == 0)
          fmt::print("# {}: {} has no native collectives: no row\n", comm::to_string(a), c.transport().name());
      } else if (comm::implements(a, o.collective))
        algorithms_.push_back(a);
      else if (rank_ == 0)
        fmt::print("# {} does not implement {}: no row\n", comm::to_string(a), comm::to_string(o.collective));
    }
    if (algorithms_.empty())
      throw InvalidArgument(fmt::format("none of the -a algorithms implements {}", comm::to_string(o.collective)));
    if (with_mpi_) MPI_Comm_dup(MPI_COMM_WORLD, &ref_);
    const std::size_t es = dtype_size(o.dtype);
    const std::size_t max_count = o.max_bytes / es + static_cast<std::size_t>(p_);
    in_ = std::make_unique<Buffer>(max_count * es);
    out_ = std::make_unique<Buffer>(max_count * es);
    expected_ = std::make_unique<Buffer>(max_count * es);
    scratch_ = std::make_unique<Buffer>(max_count * es);
#if HOPWISE_HAVE_GLOO
    // The Gloo peer meets through a store of the job's: an MpiStore under mpirun, the launch's under torchrun.
    if (o.collective == Collective::kAllreduce && GlooPeer::supports(o.dtype, o.op)) {
      const std::shared_ptr<comm::Store> store =
          with_mpi_
              ? std::make_shared<comm::MpiStore>()
              : comm::launch_store(comm::detect_launch(), comm::Store::Seconds(comm::Options::timeout_from_env()));
      gloo_ = std::make_unique<GlooPeer>(control_, store, hosts_ > 1);
    }
#endif
  }
  ~Bench() {
    if (with_mpi_) MPI_Comm_free(&ref_);
  }
  // The peer every row is compared with: MPI's own collective where MPI runs, else Gloo's, else none.
  std::string reference() const { return with_mpi_ ? "mpi" : has_gloo() ? "gloo" : "none"; }

  // Per size: what auto ran, the fastest of the other rows and their ratio (auto/best = best time / auto's).
  struct AutoVsBest {
    std::size_t bytes;
    std::string chose, best;
    double ratio;
  };
  const std::vector<AutoVsBest>& auto_vs_best() const { return auto_vs_best_; }

  std::vector<Row> run_sizes() {
    std::vector<Row> rows;
    for (std::size_t bytes = o_.min_bytes; bytes <= o_.max_bytes; bytes *= o_.factor) {
      auto r = run_size(bytes);
      rows.insert(rows.end(), r.begin(), r.end());
      if (bytes > o_.max_bytes / o_.factor) break;
    }
    return rows;
  }

  void run_overlap();

 private:
  // The bytes of the call as the communicator counts them (reduce_scatter: the block received; allgather: the block
  // sent): what its tuning is keyed by.
  std::size_t call_bytes(std::size_t count) const {
    const bool blocks = o_.collective == Collective::kReduceScatter || o_.collective == Collective::kAllgather;
    return (blocks ? count / static_cast<std::size_t>(p_) : count) * dtype_size(o_.dtype);
  }
  // Runs auto until the tuner has decided this size (its trials are the first calls of a job: the rows time the
  // steady state after them). Every rank decides at the same call, so every rank leaves the loop together.
  void settle_tuning(std::size_t count) {
    comm_.set_algorithm(Algorithm::kAuto);
    for (int i = 0; i < 400 && !comm_.tuned_choice(o_.collective, call_bytes(count), o_.dtype); ++i) run_ours(count);
    run_ours(count);  // the call after the decision
  }

  // Elements per call: allreduce/broadcast/reduce move `count`; reduce_scatter's input and allgather's output
  // hold `count` (rounded down to a multiple of p).
  std::size_t count_for(std::size_t bytes) const {
    std::size_t count = bytes / dtype_size(o_.dtype);
    if (o_.collective == Collective::kReduceScatter || o_.collective == Collective::kAllgather)
      count -= count % static_cast<std::size_t>(p_);
    return count;
  }
  // The least time `bytes` take on the wire: what each host must send over its link (the bus factor over hosts).
  double wire_seconds(std::size_t bytes) const { return bytes * bus_factor(hosts_) * 8 / (o_.wire_gbps * 1e9); }
  double bus_factor(int over = 0) const {
    const double n = over > 0 ? over : p_;
    switch (o_.collective) {
      case Collective::kAllreduce: return 2 * (n - 1) / n;
      case Collective::kReduceScatter:
      case Collective::kAllgather: return (n - 1) / n;
      default: return 1.0;
    }
  }

  void run_ours(std::size_t count) {
    const std::size_t block = count / static_cast<std::size_t>(p_);
    switch (o_.collective) {
      case Collective::kAllreduce: comm_.allreduce(in_->data, out_->data, count, o_.dtype, o_.op); break;
      case Collective::kReduceScatter: comm_.reduce_scatter(in_->data, out_->data, block, o_.dtype, o_.op); break;
      case Collective::kAllgather: comm_.allgather(in_->data, out_->data, block, o_.dtype); break;
      case Collective::kBroadcast: comm_.broadcast(out_->data, count, o_.dtype, 0); break;
      case Collective::kReduce: comm_.reduce(in_->data, out_->data, count, o_.dtype, o_.op, 0); break;
      default: break;
    }
  }

  void run_mpi(std::size_t count) {
    const MPI_Datatype t = comm::mpi_datatype(o_.dtype);
    const MPI_Op op = comm::mpi_op(o_.dtype, o_.op);
    const int n = static_cast<int>(count), block = static_cast<int>(count / static_cast<std::size_t>(p_));
    switch (o_.collective) {
      case Collective::kAllreduce: MPI_Allreduce(in_->data, out_->data, n, t, op, ref_); break;
      case Collective::kReduceScatter: MPI_Reduce_scatter_block(in_->data, out_->data, block, t, op, ref_); break;
      case Collective::kAllgather: MPI_Allgather(in_->data, block, t, out_->data, block, t, ref_); break;
      case Collective::kBroadcast: MPI_Bcast(out_->data, n, t, 0, ref_); break;
      case Collective::kReduce: MPI_Reduce(in_->data, out_->data, n, t, op, 0, ref_); break;
      default: break;
    }
  }

  // Runs the collective once more on fresh data and compares with a serial reference, bit for bit.
  bool check(std::size_t count) {
    const std::size_t es = dtype_size(o_.dtype), block = count / static_cast<std::size_t>(p_);
    const ReduceOp op = o_.op == ReduceOp::kAvg ? ReduceOp::kSum : o_.op;
    auto reference_reduce = [&](std::size_t n, std::size_t first) {
      fill(expected_->data, n, o_.dtype, 0, o_.op, first);
      for (int r = 1; r < p_; ++r) {
        fill(scratch_->data, n, o_.dtype, r, o_.op, first);
        reduce_into(o_.dtype, op, expected_->data, expected_->data, scratch_->data, n);
      }
      if (o_.op == ReduceOp::kAvg) scale_by(o_.dtype, expected_->data, n, 1.0 / p_);
    };
    std::memset(out_->data, 0xA5, count * es);
    std::size_t n = count;
    switch (o_.collective) {
      case Collective::kAllreduce:
      case Collective::kReduce:
        fill(in_->data, count, o_.dtype, rank_, o_.op);
        reference_reduce(count, 0);
        break;
      case Collective::kReduceScatter:
        fill(in_->data, count, o_.dtype, rank_, o_.op);
        reference_reduce(block, static_cast<std::size_t>(rank_) * block);
        n = block;
        break;
      case Collective::kAllgather:
        fill(in_->data, block, o_.dtype, rank_, o_.op);
        for (int r = 0; r < p_; ++r)
          fill(expected_->data + static_cast<std::size_t>(r) * block * es, block, o_.dtype, r, o_.op);
        n = block * static_cast<std::size_t>(p_);
        break;
      case Collective::kBroadcast:
        fill(expected_->data, count, o_.dtype, 0, o_.op);
        if (rank_ == 0) std::memcpy(out_->data, expected_->data, count * es);
        break;
      default: break;
    }
    run_ours(count);
    const bool has_result = o_.collective != Collective::kReduce || rank_ == 0;
    return !control_.any(has_result && std::memcmp(out_->data, expected_->data, n * es) != 0);
  }

  std::vector<Row> run_size(std::size_t bytes) {
    const std::size_t count = count_for(bytes);
    // Slots: our algorithms..., then Gloo's allreduce where it is built and applies, then MPI's where MPI runs.
    const std::size_t ours = algorithms_.size();
    const std::size_t slots = ours + (has_gloo() ? 1 : 0) + (with_mpi_ ? 1 : 0);
    std::vector<std::vector<double>> samples(slots);
    fill(in_->data, count, o_.dtype, rank_, o_.op);
    if (std::find(algorithms_.begin(), algorithms_.end(), Algorithm::kAuto) != algorithms_.end()) settle_tuning(count);
    auto time_slot = [&](std::size_t k, int it) {
      const bool mpi = with_mpi_ && k + 1 == slots;
      if (k < ours) comm_.set_algorithm(algorithms_[k]);
      control_.sync();
      const double t0 = now_s();
      for (int b = 0; b < o_.burst; ++b) {  // --burst: back to back, as a job's buckets run
        if (mpi)
          run_mpi(count);
        else if (k >= ours)
          run_gloo(count);
        else
          run_ours(count);
      }
      const double t = (now_s() - t0) / o_.burst;
      if (it >= o_.warmup) samples[k].push_back(t);
    };
    // Ours and MPI's interleaved, iteration by iteration, so that both see the same machine; the order is shuffled
    // every iteration (the same on every rank: one seed), because a call leaves caches, the allocator and MPI's
    // progress in a state that helps or hurts the next: in a merely rotated order the row after MPI's was always
    // the same one, and measured 15% slower than the same algorithm in another row.
    // Gloo runs in a pass of its own afterwards: its TCP progress threads would disturb whatever runs after it.
    const std::size_t interleaved = ours + (with_mpi_ ? 1 : 0);
    std::vector<std::size_t> order(interleaved);
    std::mt19937 shuffle_seed(12345);
    for (int it = 0; it < o_.warmup + o_.iters; ++it) {
      std::iota(order.begin(), order.end(), std::size_t{0});
      std::shuffle(order.begin(), order.end(), shuffle_seed);
      for (std::size_t k : order) time_slot(k == ours ? slots - 1 : k, it);
    }
    if (has_gloo())
      for (int it = 0; it < o_.warmup + o_.iters; ++it) time_slot(ours, it);
    // A call takes as long as its slowest rank: max over ranks per sample, then the median over samples.
    std::vector<double> median(slots);
    for (std::size_t k = 0; k < slots; ++k) {
      control_.max(samples[k]);
      std::sort(samples[k].begin(), samples[k].end());
      median[k] = samples[k][samples[k].size() / 2];
    }
    std::vector<Row> rows;
    // The reference row's time (MPI's, else Gloo's; 0: none, the ratio column then reads 0).
    const double mpi_t = slots > ours ? median.back() : 0.0;
    for (std::size_t k = 0; k < slots; ++k) {
      const bool mpi = with_mpi_ && k + 1 == slots;
      Row r;
      r.bytes = count * dtype_size(o_.dtype);
      r.count = count;
      r.time_us = median[k] * 1e6;
      r.algbw = static_cast<double>(r.bytes) / median[k] / 1e9;
      r.busbw = r.algbw * bus_factor();
      r.vs_mpi = mpi_t / median[k];
      if (mpi || k >= ours) {
        r.algo = std::string_view(mpi ? "mpi" : "gloo");
        r.check = std::string_view("-");
      } else {
        const Algorithm a = algorithms_[k];
        comm_.set_algorithm(a);
        r.algo = std::string(comm::to_string(a));
        if (a == Algorithm::kAuto) {
          const auto tuned = comm_.tuned_choice(o_.collective, call_bytes(count), o_.dtype);
          r.algo = fmt::format(
              "auto:{}",
              tuned ? comm::to_string(*tuned)
                    : std::string(comm::to_string(comm_.algorithm_for(o_.collective, call_bytes(count), o_.dtype))));
        }
        r.check = o_.check ? (check(count) ? "ok" : "FAIL") : "-";
      }
      rows.push_back(r);
    }
    comm_.set_algorithm(Algorithm::kAuto);
    note_auto_vs_best(rows);
    for (const auto& spec : o_.codecs) rows.push_back(codec_row(count, spec, mpi_t));
    if (o_.wire_gbps > 0 && hosts_ > 1) {
      const double wire = wire_seconds(count * dtype_size(o_.dtype));
      Row w = rows.front();
      w.algo = "wire";
      w.time_us = wire * 1e6;
      w.algbw = static_cast<double>(w.bytes) / wire / 1e9;
      w.busbw = w.algbw * bus_factor();
      w.vs_mpi = mpi_t > 0 ? mpi_t / wire : 0;
      w.check = "-";
      w.codec = "-";
      rows.push_back(w);
      for (Row& r : rows) r.vs_wire = wire / (r.time_us * 1e-6);
    }
    if (rank_ == 0) print_rows(rows);
    return rows;
  }

  // Where the rows hold auto and at least one other of ours: auto's time against the fastest of those.
  void note_auto_vs_best(const std::vector<Row>& rows) {
    const Row* autorow = nullptr;
    const Row* best = nullptr;
    for (std::size_t k = 0; k < algorithms_.size() && k < rows.size(); ++k) {
      if (algorithms_[k] == Algorithm::kAuto)
        autorow = &rows[k];
      else if (best == nullptr || rows[k].time_us < best->time_us)
        best = &rows[k];
    }
    if (autorow == nullptr || best == nullptr) return;
    auto_vs_best_.push_back({autorow->bytes, autorow->algo.substr(5), best->algo, best->time_us / autorow->time_us});
  }

  // The input of compressed rows: rank `rank`'s random normal floats (regenerated for the serial checks).
  static void normal_fill(float* v, std::size_t count, int rank) {
    std::mt19937 g(static_cast<std::uint32_t>(1234 + rank));
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (std::size_t i = 0; i < count; ++i) v[i] = d(g);
  }

  // ||out - exact|| / ||exact|| (0 when exact is 0).
  static double relative_l2(const float* out, const float* exact, std::size_t count) {
    double num = 0, den = 0;
    for (std::size_t i = 0; i < count; ++i) {
      num += (static_cast<double>(out[i]) - exact[i]) * (static_cast<double>(out[i]) - exact[i]);
      den += static_cast<double>(exact[i]) * exact[i];
    }
    return den > 0 ? std::sqrt(num / den) : 0.0;
  }

  // The buffers of a compressed row: this rank's random normal input, the output, and the exact sum.
  struct CodecBuffers {
    float* in;
    float* out;
    float* exact;
  };
  CodecBuffers codec_buffers(std::size_t count) {
    CodecBuffers b{reinterpret_cast<float*>(in_->data), reinterpret_cast<float*>(out_->data),
                   reinterpret_cast<float*>(expected_->data)};
    normal_fill(b.in, count, rank_);
    comm_.allreduce(b.in, b.exact, count, DataType::kFloat32, ReduceOp::kSum);
    return b;
  }

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
  Row codec_timing(std::size_t count, const std::vector<double>& sorted_times, double mpi_t) const {
    const double median = sorted_times[sorted_times.size() / 2];
    Row r;
    r.bytes = count * sizeof(float);
    r.count = count;
    r.time_us = median * 1e6;
    r.algbw = static_cast<double>(r.bytes) / median / 1e9;
    r.busbw = r.algbw * bus_factor();
    r.vs_mpi = mpi_t / median;
    return r;
  }

  // A compressed allreduce of `count` random normal floats per rank through `spec`.
  Row codec_row(std::size_t count, const std::string& spec, double mpi_t) {
    if (compression::parse_codec_spec(spec).name == "powersgd") return powersgd_row(count, spec, mpi_t);
    const auto codec = compression::make_codec(spec);
    const auto [in, out, exact] = codec_buffers(count);
    auto normal = [count](float* v, int rank) { normal_fill(v, count, rank); };
    compression::CodecState st(7, rank_, p_);
    const std::vector<double> t =
        timed_calls(o_.warmup, [&, in = in, out = out] { comm_.allreduce_compressed(in, out, count, *codec, st); });
    // One more call from a fresh state, for the error and the check.
    compression::CodecState fresh(11, rank_, p_);
    comm_.allreduce_compressed(in, out, count, *codec, fresh);
    Row r = codec_timing(count, t, mpi_t);
    r.rel_err = relative_l2(out, exact, count);
    r.algo = fmt::format("C:{}", codec->name());
    r.codec = codec->name();
    r.wire_bytes = codec->payload_bytes(count) + codec->scale_count(count) * sizeof(float);
    r.ratio = r.wire_bytes ? static_cast<double>(r.bytes) / static_cast<double>(r.wire_bytes) : 0.0;
    r.check = o_.check ? (check_codec(*codec, count, out, normal) ? "ok" : "FAIL") : "-";
    return r;
  }

  // The buffer as the most nearly square rows x cols matrix (rows the largest divisor <= sqrt(count)).
  static std::pair<std::size_t, std::size_t> matrix_shape(std::size_t count) {
    std::size_t rows = 1;
    for (std::size_t d = 1; d * d <= count; ++d)
      if (count % d == 0) rows = d;
    return {rows, count == 0 ? 0 : count / rows};
  }

  // A PowerSGD allreduce of `count` random normal floats per rank seen as a matrix, timed as training runs it: one
  // state kept across calls (warm-started Q, residual and buffers already in memory: a fresh state would time
  // the first touch of its pages, ~12 us per 4 KiB page here, not PowerSGD).
  Row powersgd_row(std::size_t count, const std::string& spec, double mpi_t) {
    const compression::PowerSgd ps = compression::PowerSgd::from_spec(spec);
    const auto [rows, cols] = matrix_shape(count);
    const auto [in, out, exact] = codec_buffers(count);
    auto normal = [count](float* v, int rank) { normal_fill(v, count, rank); };
    compression::PowerSgdState st(7);
    const comm::PowerSgdTensor timed{in, out, rows, cols, &st};
    // At least one untimed call: the state's buffers are touched there.
    const std::vector<double> t = timed_calls(std::max(1, o_.warmup), [&] {
      comm_.allreduce_powersgd(std::span<const comm::PowerSgdTensor>(&timed, 1), ps);
    });
    compression::PowerSgdState fresh(11);
    const comm::PowerSgdTensor m{in, out, rows, cols, &fresh};
    comm_.allreduce_powersgd(std::span<const comm::PowerSgdTensor>(&m, 1), ps);
    Row r = codec_timing(count, t, mpi_t);
    r.rel_err = relative_l2(out, exact, count);
    r.algo = fmt::format("C:{}", ps.name());
    r.codec = fmt::format("{}@{}x{}", ps.name(), rows, cols);
    r.wire_bytes = ps.step_bytes(rows, cols, compression::PowerSgdState());  // the checked call's fresh state
    r.ratio = r.wire_bytes ? static_cast<double>(r.bytes) / static_cast<double>(r.wire_bytes) : 0.0;
    r.check = o_.check ? (check_powersgd(ps, rows, cols, out, normal) ? "ok" : "FAIL") : "-";
    return r;
  }

  // PowerSGD's own stated result, run serially over every rank's regenerated input (P and Q summed in rank
  // order): the allreduce's output must match it to a relative L2 difference of 1e-4 (the sums' order differs),
  // and, being a projection of the exact sum, its error against that sum is at most 1.
  template <class Fill>
  bool check_powersgd(const compression::PowerSgd& ps, std::size_t rows, std::size_t cols, const float* out,
                      Fill fill) {
    const std::size_t n = rows * cols;
    float* ref = reinterpret_cast<float*>(expected_->data);
    float* x = reinterpret_cast<float*>(scratch_->data);
    std::vector<compression::PowerSgdState> st(static_cast<std::size_t>(p_), compression::PowerSgdState(11));
    std::vector<float> psum(ps.p_count(rows, cols)), qsum(ps.q_count(rows, cols)), tmp;
    std::vector<double> exact(n, 0.0);
    const bool compressed = ps.compressed_step(rows, cols, compression::PowerSgdState());
    int bad = 0;
    if (!compressed) {
      std::fill(ref, ref + n, 0.0f);
      for (int r = 0; r < p_; ++r) {
        fill(x, r);
        for (std::size_t i = 0; i < n; ++i) ref[i] += x[i];
      }
    } else {
      for (int r = 0; r < p_; ++r) {
        fill(x, r);
        for (std::size_t i = 0; i < n; ++i) exact[i] += x[i];
        tmp.assign(psum.size(), 0.0f);
        ps.compute_p(x, rows, cols, tmp.data(), st[static_cast<std::size_t>(r)]);
        for (std::size_t i = 0; i < tmp.size(); ++i) psum[i] += tmp[i];
      }
      for (int r = 0; r < p_; ++r) {
        fill(x, r);  // without error feedback compute_q reads rank r's gradient again, in place
        tmp.assign(qsum.size(), 0.0f);
        ps.compute_q(psum.data(), rows, cols, tmp.data(), st[static_cast<std::size_t>(r)]);
        for (std::size_t i = 0; i < tmp.size(); ++i) qsum[i] += tmp[i];
      }
      ps.decompress(qsum.data(), rows, cols, ref, st[0]);
    }
    double num = 0, den = 0, err = 0, mag = 0;
    for (std::size_t i = 0; i < n; ++i) {
      num += (static_cast<double>(out[i]) - ref[i]) * (static_cast<double>(out[i]) - ref[i]);
      den += static_cast<double>(ref[i]) * ref[i];
      if (compressed) {
        err += (out[i] - exact[i]) * (out[i] - exact[i]);
        mag += exact[i] * exact[i];
      }
    }
    bad = std::sqrt(num / std::max(den, 1e-30)) > 1e-4 || err > mag * (1 + 1e-6) ? 1 : 0;
    return !control_.any(bad != 0);
  }

  // The codec's own stated result: every rank's payload decoded and summed (run serially here, all ranks'
  // inputs regenerated), against what the compressed allreduce returned. fp16/bf16 payloads are summed in their
  // own type, so they may differ by p roundings of that type.
  template <class Fill>
  bool check_codec(const compression::Codec& codec, std::size_t count, const float* out, Fill fill) {
    float* ref = reinterpret_cast<float*>(expected_->data);
    float* x = reinterpret_cast<float*>(scratch_->data);
    std::vector<compression::CodecState> st;
    for (int r = 0; r < p_; ++r) st.emplace_back(11, r, p_);
    std::vector<float> scales(codec.scale_count(count), 0.0f), local(scales.size());
    for (int r = 0; r < p_; ++r) {
      fill(x, r);
      codec.local_scales(x, count, local.data(), st[static_cast<std::size_t>(r)]);
      for (std::size_t i = 0; i < scales.size(); ++i) scales[i] = std::max(scales[i], local[i]);
    }
    std::vector<std::byte> payload(codec.payload_bytes(count));
    std::fill(ref, ref + count, 0.0f);
    for (int r = 0; r < p_; ++r) {
      fill(x, r);
      codec.encode(x, count, payload.data(), st[static_cast<std::size_t>(r)], scales.empty() ? nullptr : scales.data());
      codec.decode_add(payload.data(), count, ref, st[static_cast<std::size_t>(r)],
                       scales.empty() ? nullptr : scales.data());
    }
    const std::string name = codec.name();
    const double ulp = name.rfind("fp16", 0) == 0   ? std::ldexp(1.0, -10)
                       : name.rfind("bf16", 0) == 0 ? std::ldexp(1.0, -7)
                                                    : 1e-6;
    int bad = 0;
    for (std::size_t i = 0; i < count && !bad; ++i)
      bad = std::abs(out[i] - ref[i]) > ulp * p_ * (std::abs(ref[i]) + 4.0) ? 1 : 0;
    return !control_.any(bad != 0);
  }

  void print_rows(const std::vector<Row>& rows) {
    for (const Row& r : rows) {
      fmt::print("{:>12} {:>11} {:>9} {:>12} {:>11.1f} {:>8.3f} {:>8.3f} {:>7.2f} {:>6}", r.bytes, r.count,
                 to_string(o_.dtype), r.algo, r.time_us, r.algbw, r.busbw, r.vs_mpi, r.check);
      if (r.vs_wire > 0) fmt::print(" {:>7.3f}", r.vs_wire);
      if (r.codec != "-") fmt::print("  wire {} B, ratio {:.1f}, rel_err {:.2e}", r.wire_bytes, r.ratio, r.rel_err);
      fmt::print("\n");
    }
    std::fflush(stdout);
  }

  bool has_gloo() const {
#if HOPWISE_HAVE_GLOO
    return gloo_ != nullptr;
#else
    return false;
#endif
  }
  void run_gloo(std::size_t count) {
#if HOPWISE_HAVE_GLOO
    gloo_->allreduce(in_->data, out_->data, count, o_.dtype, o_.op);
#endif
  }

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

int run(int argc, char** argv) {
  const comm::Launch launch = comm::detect_launch();
  // MPI's own collectives are the first peer wherever MPI runs (under mpirun, whichever transport hopwise uses).
  const bool with_mpi = launch.launcher == "mpirun";
  if (with_mpi) comm::ensure_mpi_initialized();
  comm::Communicator comm;  // as launched: MPI under mpirun, UCX under torchrun
  Control control;
  const int rank = comm.rank();
  Options o;
  try {
    o = parse_options(argc, argv);
  } catch (const InvalidArgument& e) {  // every rank parses the same argv, so every rank stops here
    if (rank == 0) std::fprintf(stderr, "hopwise-bench: %s\n", e.what());
    return 2;
  }
  const double limit = memcpy_gbs();
  std::int32_t hosts = comm.host_id() + 1;  // host ids count up from 0 in rank order: the largest + 1 hosts
  comm.allreduce(&hosts, &hosts, 1, DataType::kInt32, ReduceOp::kMax);
  Bench bench(o, comm, control, with_mpi, hosts);
  if (rank == 0) {
    const auto& cp = comm.cost_model().params();
    fmt::print(
        "# hopwise-bench: {}, {} ranks on {} host(s) over {} ({}), {} {}, {} iters (median, max over ranks), {} "
        "warm-up{}\n",
        comm::to_string(o.collective), comm.size(), hosts, comm.transport().name(), launch.launcher, to_string(o.dtype),
        to_string(o.op), o.iters, o.warmup,
        o.burst > 1 ? fmt::format(", each sample {} calls back to back", o.burst) : std::string());
    fmt::print("# single-core memcpy {:.2f} GB/s (the physical limit here); reduction kernels: {}\n", limit,
               active_isa());
    fmt::print(
        "# cost model ({}): alpha {:.2f} us (+{:.2f} us above 4 KiB), beta {:.2f} GB/s, gamma {:.2f} GB/s, "
        "shared slots {:.2f} us, {:.2f} GB/s; MPI line {:.2f} us + n / {:.2f} GB/s\n",
        cp.source, cp.alpha * 1e6, cp.alpha_rendezvous * 1e6, 1e-9 / cp.beta, 1e-9 / cp.gamma, cp.alpha_shared * 1e6,
        cp.beta_shared > 0 ? 1e-9 / cp.beta_shared : 0.0, cp.alpha_native * 1e6,
        cp.beta_native > 0 ? 1e-9 / cp.beta_native : 0.0);
    if (bench.reference() == "mpi")
      fmt::print(
          "# vs_mpi = MPI's own {} time / this row's time, same buffers, interleaved (rows mpi and gloo: the "
          "peers themselves)\n",
          comm::to_string(o.collective));
    else if (bench.reference() == "gloo")
      fmt::print("# no MPI in this job (launched by {}): vs_gloo = Gloo's allreduce time / this row's time\n",
                 launch.launcher);
    else
      fmt::print("# no MPI in this job and no Gloo row: vs_none reads 0\n");
    if (o.wire_gbps > 0)
      fmt::print("# wire: {} Gbit/s per host link; the least time is what each of the {} hosts sends over its link{}\n",
                 o.wire_gbps, hosts, hosts > 1 ? "" : " (one host: no wire row)");
    fmt::print("{:>12} {:>11} {:>9} {:>12} {:>11} {:>8} {:>8} {:>7} {:>6}{}\n", "size(B)", "count", "type", "algo",
               "time(us)", "algbw", "busbw", "vs_" + bench.reference(), "check",
               o.wire_gbps > 0 && hosts > 1 ? " vs_wire" : "");
  }
  const auto rows = bench.run_sizes();
  if (rank == 0 && !bench.auto_vs_best().empty()) {
    fmt::print("# auto against the fastest other row of this run (auto/best = best time / auto's time)\n");
    fmt::print("{:>12} {:>22} {:>22} {:>9}\n", "size(B)", "auto chose", "best", "auto/best");
    double worst = INFINITY;
    for (const auto& a : bench.auto_vs_best()) {
      fmt::print("{:>12} {:>22} {:>22} {:>9.3f}\n", a.bytes, a.chose, a.best, a.ratio);
      worst = std::min(worst, a.ratio);
    }
    const comm::CollectiveStats st = comm.stats();
    fmt::print(
        "# lowest auto/best {:.3f}; tuning: {} trial calls, {} agreements, {} re-tunes, {:.1f} ms beyond the "
        "chosen algorithms (rank 0)\n",
        worst, st.tuning_trials, st.tuning_agreements, st.retunes, st.tuning_excess_s * 1e3);
  }
  if (o.overlap && o.collective == Collective::kAllreduce) bench.run_overlap();
  bool ok = true;
  for (const Row& r : rows) ok = ok && r.check != "FAIL";
  if (rank == 0) {
    const RunInfo info{bench.reference(), comm.size(), o.wire_gbps > 0 && hosts > 1};
    if (!o.csv_path.empty()) write_csv(o.csv_path, o, info, rows);
    if (!o.metrics_file.empty()) write_metrics(o.metrics_file, o, info, rows);
    if (!o.metrics_json.empty()) write_json_lines(o.metrics_json, o, info, rows);
  }
  if (rank == 0 && !ok) std::fprintf(stderr, "hopwise-bench: some results did not match the reference (check FAIL)\n");
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace hopwise::bench

int main(int argc, char** argv) {
  try {
    return hopwise::bench::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hopwise-bench: %s\n", e.what());
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) MPI_Abort(MPI_COMM_WORLD, 1);  // under mpirun: end every rank, not only this one
    return 1;
  }
}
