// hopwise-bench: collectives timed like nccl-tests, every row beside MPI's own collective (under mpirun) and
// Gloo's from the same run.
// This file: the launch, the header lines, the sweep's driver, the auto summary and the result files; what is
// measured is Bench's (bench.h), the buffers and the memcpy probe are in buffers.h.
#include <fmt/core.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>

#include "bench.h"
#include "buffers.h"
#include "control.h"
#include "hopwise/comm/communicator.h"
#include "hopwise/comm/launch.h"
#include "hopwise/comm/transports/mpi_transport.h"
#include "hopwise/common/error.h"
#include "hopwise/common/reduce.h"
#include "options.h"
#include "results.h"

namespace hopwise::bench {
namespace {

int run(int argc, char** argv) {
  const comm::Launch launch = comm::detect_launch();
  // MPI's own collectives are the first peer wherever MPI runs (under mpirun, whichever transport hopwise uses).
  const bool with_mpi = launch.mpi_world;
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
