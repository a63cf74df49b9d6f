// hopwise-tune: sweeps the collectives over sizes under mpirun or torchrun, lets the tuner time every candidate at
// each size (the same measurement the first calls of a job make online, with more repetitions), and writes what
// it chose as a tuning file for HOPWISE_TUNING_FILE.
#include <fmt/core.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "hopwise/comm/communicator.h"
#include "hopwise/comm/launch.h"
#include "hopwise/comm/transports/mpi_transport.h"
#include "hopwise/comm/tuning.h"
#include "hopwise/common/env.h"
#include "hopwise/common/error.h"

namespace {

namespace hc = hopwise::comm;
using hopwise::DataType;
using hopwise::InvalidArgument;

constexpr const char* kUsage = R"(usage: mpirun -np N hopwise-tune [options]
       torchrun --nproc_per_node N --redirects 1 --tee 1 --no_python hopwise-tune [options]
  -b SIZE        smallest message in bytes (K/M/G suffixes), default 4K
  -e SIZE        largest message, default 256M
  --coll LIST    comma list of allreduce, reduce_scatter, allgather, broadcast, reduce; default allreduce
  -d LIST        comma list of float32, float16, int32 (one per dtype class); default float32
  --rounds R     repetitions of each candidate (median of the slowest rank's times), default 5
  -o FILE        the tuning file to write, default hopwise-tuning.json
  -h             this help
Every size is a power of two from -b to -e (one size class each). Then run the job with HOPWISE_TUNING_FILE=FILE:
size classes the file holds need no tuning at run time; a file made for another job shape is ignored.
)";

struct Options {
  std::size_t min_bytes = 4 << 10, max_bytes = std::size_t{256} << 20;
  std::vector<hc::Collective> collectives{hc::Collective::kAllreduce};
  std::vector<DataType> dtypes{DataType::kFloat32};
  int rounds = 5;
  std::string out = "hopwise-tuning.json";
};

std::vector<std::string> split(std::string_view s) {
  std::vector<std::string> out;
  while (!s.empty()) {
    const auto comma = s.find(',');
    out.emplace_back(s.substr(0, comma));
    s = comma == std::string_view::npos ? std::string_view{} : s.substr(comma + 1);
  }
  return out;
}

hc::Collective parse_collective(const std::string& v) {
  for (hc::Collective c : {hc::Collective::kAllreduce, hc::Collective::kReduceScatter, hc::Collective::kAllgather,
                           hc::Collective::kBroadcast, hc::Collective::kReduce})
    if (hc::to_string(c) == v) return c;
  throw InvalidArgument(
      fmt::format("--coll '{}' is unknown; use allreduce, reduce_scatter, allgather, broadcast or reduce", v));
}

DataType parse_dtype(const std::string& v) {
  if (v == "float32") return DataType::kFloat32;
  if (v == "float16") return DataType::kFloat16;
  if (v == "int32") return DataType::kInt32;
  throw InvalidArgument(fmt::format("-d '{}' is unknown; use float32, float16 or int32 (one per dtype class)", v));
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) throw InvalidArgument(fmt::format("{} needs a value (or unknown flag); see -h", flag));
    const std::string v = argv[++i];
    if (flag == "-b")
      o.min_bytes = hopwise::env::parse_size(v, "-b");
    else if (flag == "-e")
      o.max_bytes = hopwise::env::parse_size(v, "-e");
    else if (flag == "--coll") {
      o.collectives.clear();
      for (const auto& c : split(v)) o.collectives.push_back(parse_collective(c));
    } else if (flag == "-d") {
      o.dtypes.clear();
      for (const auto& d : split(v)) o.dtypes.push_back(parse_dtype(d));
    } else if (flag == "--rounds") {
      o.rounds = std::atoi(v.c_str());
      if (o.rounds < 1 || o.rounds > 100) throw InvalidArgument("--rounds must be between 1 and 100");
    } else if (flag == "-o") {
      o.out = v;
    } else {
      throw InvalidArgument(fmt::format("unknown flag {}; see -h", flag));
    }
  }
  if (o.min_bytes < 4 || o.min_bytes > o.max_bytes) throw InvalidArgument("-b must be at least 4 bytes and at most -e");
  if (o.collectives.empty() || o.dtypes.empty()) throw InvalidArgument("--coll and -d need at least one entry");
  return o;
}

// One call of `c` whose size class is `bytes` as the communicator keys it (per rank; reduce_scatter: the block
// received; allgather: the block sent).
void call(hc::Communicator& comm, hc::Collective c, std::vector<char>& in, std::vector<char>& out, std::size_t bytes,
          DataType dt) {
  const std::size_t n = bytes / hopwise::dtype_size(dt);
  switch (c) {
    case hc::Collective::kAllreduce: comm.allreduce(in.data(), out.data(), n, dt); break;
    case hc::Collective::kReduceScatter: comm.reduce_scatter(in.data(), out.data(), n, dt); break;
    case hc::Collective::kAllgather: comm.allgather(in.data(), out.data(), n, dt); break;
    case hc::Collective::kBroadcast: comm.broadcast(out.data(), n, dt, 0); break;
    case hc::Collective::kReduce: comm.reduce(in.data(), out.data(), n, dt, hopwise::ReduceOp::kSum, 0); break;
    default: break;
  }
}

int run(int argc, char** argv) {
  const hc::Launch launch = hc::detect_launch();
  if (launch.mpi_world) hc::ensure_mpi_initialized();
  hc::Options co = hc::Options::from_env();
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const InvalidArgument& e) {
    std::fprintf(stderr, "hopwise-tune: %s\n", e.what());  // every rank parses the same argv: every rank stops
    return 2;
  }
  co.tune = true;
  co.tuning_file.clear();  // a sweep measures everything afresh
  co.tune_rounds = o.rounds;
  co.algorithm = hc::Algorithm::kAuto;
  hc::Communicator comm(co);
  const int p = comm.size();
  const std::size_t buffer = o.max_bytes * static_cast<std::size_t>(p);
  std::vector<char> in(buffer, 0), out(buffer, 0);
  for (std::size_t i = 0; i < buffer; i += 4096) in[i] = static_cast<char>(i / 4096 % 7);
  if (comm.rank() == 0)
    fmt::print("# hopwise-tune: {} over {} ({}), {} rounds per candidate\n{:>16} {:>7} {:>12} {:>22} {:>11}\n",
               hc::to_string(comm.job_shape()), comm.transport().name(), launch.launcher, o.rounds, "collective",
               "dtype", "size(B)", "chosen", "time(us)");
  for (hc::Collective c : o.collectives)
    for (DataType dt : o.dtypes)
      for (std::size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 2) {
        // Every rank decides at the same call: the loop ends on every rank together.
        for (int i = 0; i < 2000 && !comm.tuned_choice(c, bytes, dt); ++i) call(comm, c, in, out, bytes, dt);
        const auto choice = comm.tuned_choice(c, bytes, dt);
        if (comm.rank() != 0) continue;
        double t = 0;
        for (const auto& e : comm.tuning().entries)
          if (e.collective == c && e.dtype_class == hc::dtype_class_of(dt) && e.size_class == hc::size_class_of(bytes))
            t = e.seconds;
        fmt::print("{:>16} {:>7} {:>12} {:>22} {:>11.1f}\n", hc::to_string(c), hc::dtype_class_of(dt), bytes,
                   choice ? hc::to_string(*choice) : std::string("(untuned)"), t * 1e6);
        std::fflush(stdout);
      }
  const hc::CollectiveStats st = comm.stats();
  if (comm.rank() == 0) {
    const hc::TuningFile f = comm.tuning();
    hc::write_tuning_file(f, o.out);
    fmt::print("# wrote {} ({} size classes; {} trial calls); use it with HOPWISE_TUNING_FILE={}\n", o.out,
               f.entries.size(), st.tuning_trials, o.out);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hopwise-tune: %s\n", e.what());
    return 1;
  }
}
