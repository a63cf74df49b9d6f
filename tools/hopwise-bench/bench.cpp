// Bench's construction, the size sweep and the algorithm rows: each size timed for every -a algorithm, MPI's own
// collective and Gloo's, checked against a serial reference, with the auto-against-best note and the console rows.
// The compressed rows are in bench_codecs.cpp, the overlap table in bench_overlap.cpp.
#include "bench.h"

#include <fmt/core.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include "hopwise/comm/launch.h"
#include "hopwise/comm/transports/mpi_store.h"
#include "hopwise/comm/transports/mpi_transport.h"
#include "hopwise/common/error.h"
#include "hopwise/common/reduce.h"
#include "order.h"

namespace hopwise::bench {

Bench::Bench(const Options& o, comm::Communicator& c, Control& control, bool with_mpi, int hosts)
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
        with_mpi_ ? std::make_shared<comm::MpiStore>()
                  : comm::launch_store(comm::detect_launch(), comm::Store::Seconds(comm::Options::timeout_from_env()));
    gloo_ = std::make_unique<GlooPeer>(control_, store, hosts_ > 1);
  }
#endif
}

Bench::~Bench() {
  if (with_mpi_) MPI_Comm_free(&ref_);
}

std::vector<Row> Bench::run_sizes() {
  std::vector<Row> rows;
  for (std::size_t bytes = o_.min_bytes; bytes <= o_.max_bytes; bytes *= o_.factor) {
    auto r = run_size(bytes);
    rows.insert(rows.end(), r.begin(), r.end());
    if (bytes > o_.max_bytes / o_.factor) break;
  }
  return rows;
}

std::size_t Bench::call_bytes(std::size_t count) const {
  const bool blocks = o_.collective == Collective::kReduceScatter || o_.collective == Collective::kAllgather;
  return (blocks ? count / static_cast<std::size_t>(p_) : count) * dtype_size(o_.dtype);
}

void Bench::settle_tuning(std::size_t count) {
  comm_.set_algorithm(Algorithm::kAuto);
  for (int i = 0; i < 400 && !comm_.tuned_choice(o_.collective, call_bytes(count), o_.dtype); ++i) run_ours(count);
  run_ours(count);  // the call after the decision
}

std::size_t Bench::count_for(std::size_t bytes) const {
  std::size_t count = bytes / dtype_size(o_.dtype);
  if (o_.collective == Collective::kReduceScatter || o_.collective == Collective::kAllgather)
    count -= count % static_cast<std::size_t>(p_);
  return count;
}

double Bench::wire_seconds(std::size_t bytes) const { return bytes * bus_factor(hosts_) * 8 / (o_.wire_gbps * 1e9); }

double Bench::bus_factor(int over) const {
  const double n = over > 0 ? over : p_;
  switch (o_.collective) {
    case Collective::kAllreduce: return 2 * (n - 1) / n;
    case Collective::kReduceScatter:
    case Collective::kAllgather: return (n - 1) / n;
    default: return 1.0;
  }
}

void Bench::run_ours(std::size_t count) {
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

void Bench::run_mpi(std::size_t count) {
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

bool Bench::check(std::size_t count) {
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

std::vector<Row> Bench::run_size(std::size_t bytes) {
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
  // Ours and MPI's interleaved, iteration by iteration, so that both see the same machine. A call leaves caches,
  // the allocator and MPI's progress in a state that helps or hurts the next (at 64 KiB on 2 ranks one_shot took
  // 9.8 us after some rows and 11.0 after others), so which row runs before which is balanced (order.h). Orders
  // shuffled from one seed had left auto 8-15% behind its own algorithm's row, run after run, at such sizes.
  // Gloo runs in a pass of its own afterwards: its TCP progress threads would disturb whatever runs after it.
  const std::size_t interleaved = ours + (with_mpi_ ? 1 : 0);
  for (int it = 0; it < o_.warmup + o_.iters; ++it)
    for (std::size_t k : balanced_order(interleaved, it >= o_.warmup ? it - o_.warmup : it))
      time_slot(k == ours ? slots - 1 : k, it);
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
      // "-" as a std::string: assigned from a string_view it trips GCC 12's false -Wrestrict (its bug 105329)
      // here once inlined.
      r.check = std::string("-");
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

void Bench::note_auto_vs_best(const std::vector<Row>& rows) {
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

void Bench::print_rows(const std::vector<Row>& rows) {
  for (const Row& r : rows) {
    fmt::print("{:>12} {:>11} {:>9} {:>12} {:>11.1f} {:>8.3f} {:>8.3f} {:>7.2f} {:>6}", r.bytes, r.count,
               to_string(o_.dtype), r.algo, r.time_us, r.algbw, r.busbw, r.vs_mpi, r.check);
    if (r.vs_wire > 0) fmt::print(" {:>7.3f}", r.vs_wire);
    if (r.codec != "-") fmt::print("  wire {} B, ratio {:.1f}, rel_err {:.2e}", r.wire_bytes, r.ratio, r.rel_err);
    fmt::print("\n");
  }
  std::fflush(stdout);
}

bool Bench::has_gloo() const {
#if HOPWISE_HAVE_GLOO
  return gloo_ != nullptr;
#else
  return false;
#endif
}

void Bench::run_gloo(std::size_t count) {
#if HOPWISE_HAVE_GLOO
  gloo_->allreduce(in_->data, out_->data, count, o_.dtype, o_.op);
#endif
}

}  // namespace hopwise::bench
