// A loop of collectives through hopwise::comm::Communicator in which one rank misbehaves on purpose, so that the
// tests can see how the others find out (tests/faults.cmake). Run under mpirun, torchrun or tests/spawn_ranks.sh:
//
//   fault_driver [--iters N] [--count C] [--coll allreduce|broadcast] [--algo NAME]
//                [--fault none|stop|kill|skip|mismatch|absent] [--rank R] [--at I] [--what count|dtype|op|root]
//                [--linger S]
//
//   stop      rank R stops itself with SIGSTOP before iteration I (a hung or descheduled process)
//   stop-inside  rank R stops itself 20 ms after it starts iteration I's collective: inside it, for a large one
//   kill      rank R kills itself with SIGKILL before iteration I (a crashed process)
//   skip      rank R leaves out the collective of iteration I (a rank taking another branch)
//   mismatch  rank R calls iteration I's collective with another count, dtype, op or root
//   absent    rank R never joins: it exits before making its communicator (a rank that was never started)
//
// Every rank prints one line at the end: "rank R: ok after N iterations", or "rank R: FAILED after S s in
// iteration I: <error>" (exit 1), S counted from the start of that iteration. --linger S: a failed rank waits S
// seconds before it exits, since mpirun ends the job at the first failed exit, and the ranks of a ring give up
// seconds apart on a loaded machine: so that every one of them gets to say what it found.
// Every result is checked, so a fault that goes unnoticed but corrupts data also fails.
#include <fmt/core.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "hopwise/comm/communicator.h"
#include "hopwise/comm/launch.h"
#include "hopwise/common/error.h"

namespace {

namespace hc = hopwise::comm;
using hopwise::DataType;
using hopwise::ReduceOp;

struct Args {
  int iters = 50, rank = 1, at = 10;
  double linger_s = 0;
  std::size_t count = 256;
  std::string coll = "allreduce", fault = "none", what = "count", algo;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "fault_driver: %s\n", why.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) usage("missing value after " + k);
    const std::string v = argv[++i];
    if (k == "--iters")
      a.iters = std::stoi(v);
    else if (k == "--count")
      a.count = std::stoul(v);
    else if (k == "--coll")
      a.coll = v;
    else if (k == "--algo")
      a.algo = v;
    else if (k == "--fault")
      a.fault = v;
    else if (k == "--rank")
      a.rank = std::stoi(v);
    else if (k == "--at")
      a.at = std::stoi(v);
    else if (k == "--what")
      a.what = v;
    else if (k == "--linger")
      a.linger_s = std::stod(v);
    else
      usage("unknown flag " + k);
  }
  if (a.coll != "allreduce" && a.coll != "broadcast") usage("--coll must be allreduce or broadcast");
  if (a.fault != "none" && a.fault != "stop" && a.fault != "stop-inside" && a.fault != "kill" && a.fault != "skip" &&
      a.fault != "mismatch" && a.fault != "absent")
    usage("--fault must be none, stop, stop-inside, kill, skip, mismatch or absent");
  if (a.what != "count" && a.what != "dtype" && a.what != "op" && a.what != "root")
    usage("--what must be count, dtype, op or root");
  return a;
}

void say(const std::string& line) {
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
}

// One iteration: every rank contributes rank + 1 + i; the result is checked exactly (small integers in float64).
void iteration(hc::Communicator& comm, const Args& a, int i, std::vector<double>& buf, bool misbehave) {
  const int p = comm.size(), r = comm.rank();
  std::size_t count = a.count;
  DataType dt = DataType::kFloat64;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  if (misbehave) {
    if (a.what == "count")
      count = a.count / 2;
    else if (a.what == "dtype")
      dt = DataType::kFloat32;
    else if (a.what == "op")
      op = ReduceOp::kMax;
    else
      root = (root + 1) % p;
  }
  if (a.coll == "allreduce") {
    buf.assign(a.count, r + 1 + i);
    comm.allreduce(buf.data(), buf.data(), count, dt, op);
    const double want = p * (p + 1) / 2.0 + static_cast<double>(p) * i;
    for (std::size_t k = 0; k < a.count; ++k)
      if (buf[k] != want)
        throw hopwise::Error(
            fmt::format("iteration {}: element {} is {}, expected {} (wrong data)", i, k, buf[k], want));
  } else {
    buf.assign(a.count, r == 0 ? 1000.0 + i : -1.0);
    comm.broadcast(buf.data(), count, dt, root);
    for (std::size_t k = 0; k < a.count; ++k)
      if (buf[k] != 1000.0 + i)
        throw hopwise::Error(
            fmt::format("iteration {}: element {} is {}, expected {} (wrong data)", i, k, buf[k], 1000.0 + i));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  int rank = -1, at = -1;
  auto started = std::chrono::steady_clock::now();  // of the current iteration
  try {
    rank = hc::detect_launch().rank;
    if (rank == a.rank && a.fault == "absent") {
      say(fmt::format("rank {}: never joining", rank));
      return 0;
    }
    hc::Communicator comm;
    rank = comm.rank();
    if (!a.algo.empty()) comm.set_algorithm(hc::parse_algorithm(a.algo));
    std::vector<double> buf;
    // The failure is said while the communicator still stands: its teardown (closing endpoints to a stopped or
    // dead peer) must not delay the line a harness waits for.
    try {
      for (int i = 0; i < a.iters; ++i) {
        at = i;
        started = std::chrono::steady_clock::now();
        const bool mine = rank == a.rank && i == a.at;
        if (mine && a.fault == "stop") {
          say(fmt::format("rank {}: stopping itself (SIGSTOP) before iteration {}", rank, i));
          std::raise(SIGSTOP);
        } else if (mine && a.fault == "kill") {
          say(fmt::format("rank {}: killing itself (SIGKILL) before iteration {}", rank, i));
          std::raise(SIGKILL);
        } else if (mine && a.fault == "skip") {
          say(fmt::format("rank {}: skipping the {} of iteration {}", rank, a.coll, i));
          continue;
        } else if (mine && a.fault == "mismatch") {
          say(fmt::format("rank {}: calling iteration {}'s {} with another {}", rank, i, a.coll, a.what));
        }
        if (mine && a.fault == "stop-inside") {
          buf.assign(a.count, 0.0);  // the iteration's own fill then takes no time before the call
          say(fmt::format("rank {}: stopping itself (SIGSTOP) 20 ms into iteration {}'s {}", rank, i, a.coll));
          std::thread([] {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            std::raise(SIGSTOP);  // the whole process, the calling thread inside the collective
          }).detach();
        }
        iteration(comm, a, i, buf, mine && a.fault == "mismatch");
      }
    } catch (const std::exception& e) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      say(fmt::format("rank {}: FAILED after {:.1f} s in iteration {}: {}", rank, s, at, e.what()));
      if (a.linger_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(a.linger_s));
      return 1;
    }
    say(fmt::format("rank {}: ok after {} iterations", rank, a.iters));
    return 0;
  } catch (const std::exception& e) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    say(fmt::format("rank {}: FAILED after {:.1f} s in iteration {}: {}", rank, s, at, e.what()));
    if (a.linger_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(a.linger_s));
    return 1;
  }
}
