#include "options.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <cstdlib>
#include <string_view>

#include "hopwise/common/env.h"
#include "hopwise/common/error.h"
#include "hopwise/compression/codec.h"
#include "hopwise/compression/powersgd.h"

namespace hopwise::bench {

namespace {

constexpr const char* kUsage = R"(usage: mpirun -np N hopwise-bench [options]
       torchrun --nproc_per_node N --redirects 1 --tee 1 --no_python hopwise-bench [options]
  -b SIZE        smallest message in bytes (K/M/G suffixes), default 4K
  -e SIZE        largest message, default 64M
  -f FACTOR      multiply the size by FACTOR each row, default 4
  -o OP          sum | avg | min | max | prod, default sum
  -d DTYPE       float32 | float64 | float16 | bfloat16 | int32 | int64 | uint8, default float32
  -a ALGOS       comma list of auto and the algorithm table's rows ({algorithms}): one row each, default auto;
                 "all": auto and every algorithm of the table (a summary compares auto with the fastest)
  -n ITERS       timed iterations per row (median reported), default 20
  -w WARMUP      untimed iterations first, default 5
  -c 0|1         check every result against a reference, default 0
  --coll NAME    allreduce | reduce_scatter | allgather | broadcast | reduce, default allreduce
  --csv FILE     also write the rows as CSV
  --metrics-file FILE  the rows as Prometheus text format, written atomically (HOPWISE_METRICS_FILE)
  --metrics-json FILE  a JSON line per row (HOPWISE_METRICS_JSON)
  --overlap      add a table: allreduce_async beside compute, against compute-then-allreduce
  -C SPEC        also a row per codec (repeatable): allreduce_compressed on random normal data, with wire bytes,
                 compression ratio and relative L2 error against the exact sum; -c 1 checks it against a
                 serial run of the same codec
  --wire GBPS    each host's link runs at GBPS Gbit/s (e.g. shaped by local-cluster.sh): a wire row per size,
                 the least time the bytes each host must send over its link take, and vs_wire = wire / row time
  --burst N      each timed sample is N calls back to back after the ranks line up (the time per call): what a
                 job's buckets see, and what the tuner decides short calls by; default 1 (each call alone)
  -h             this help
Every row is timed interleaved with MPI's own collective on the same buffers; vs_mpi = MPI time / our time.
Without MPI (under torchrun) the reference is Gloo's allreduce (vs_gloo) where it runs.
)";

std::vector<comm::Algorithm> parse_algorithms(std::string_view list) {
  std::vector<comm::Algorithm> out;
  if (list == "all") {  // auto and every row of the algorithm table
    out.push_back(comm::Algorithm::kAuto);
    for (comm::Algorithm a : comm::all_algorithms()) out.push_back(a);
    return out;
  }
  while (!list.empty()) {
    const auto comma = list.find(',');
    out.push_back(comm::parse_algorithm(list.substr(0, comma)));
    list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
  }
  if (out.empty()) throw InvalidArgument("-a needs at least one algorithm, e.g. -a ring,hd,tree,native,auto");
  return out;
}

int parse_int(std::string_view flag, std::string_view v, int lo) {
  char* end = nullptr;
  const std::string s(v);
  const long x = std::strtol(s.c_str(), &end, 10);
  if (end == s.c_str() || *end != '\0' || x < lo)
    throw InvalidArgument(fmt::format("{} '{}' is not an integer >= {}", flag, v, lo));
  return static_cast<int>(x);
}

comm::Collective parse_collective(std::string_view v) {
  if (v == "allreduce") return comm::Collective::kAllreduce;
  if (v == "reduce_scatter") return comm::Collective::kReduceScatter;
  if (v == "allgather") return comm::Collective::kAllgather;
  if (v == "broadcast") return comm::Collective::kBroadcast;
  if (v == "reduce") return comm::Collective::kReduce;
  throw InvalidArgument(
      fmt::format("--coll '{}' is unknown; use allreduce, reduce_scatter, allgather, broadcast or "
                  "reduce",
                  v));
}

}  // namespace

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    auto value = [&]() -> std::string_view {
      if (i + 1 >= argc) throw InvalidArgument(fmt::format("{} needs a value; see hopwise-bench -h", flag));
      return argv[++i];
    };
    if (flag == "-h" || flag == "--help") {
      std::vector<std::string> names;
      for (comm::Algorithm a : comm::all_algorithms()) names.emplace_back(comm::to_string(a));
      fmt::print(fmt::runtime(kUsage), fmt::arg("algorithms", fmt::join(names, ", ")));
      std::exit(0);
    } else if (flag == "-b")
      o.min_bytes = env::parse_size(value(), "-b");
    else if (flag == "-e")
      o.max_bytes = env::parse_size(value(), "-e");
    else if (flag == "-f")
      o.factor = static_cast<std::size_t>(parse_int(flag, value(), 2));
    else if (flag == "-o")
      o.op = parse_reduce_op(value());
    else if (flag == "-d")
      o.dtype = parse_dtype(value());
    else if (flag == "-a")
      o.algorithms = parse_algorithms(value());
    else if (flag == "-n")
      o.iters = parse_int(flag, value(), 1);
    else if (flag == "-w")
      o.warmup = parse_int(flag, value(), 0);
    else if (flag == "--burst")
      o.burst = parse_int(flag, value(), 1);
    else if (flag == "-c")
      o.check = parse_int(flag, value(), 0) != 0;
    else if (flag == "--coll")
      o.collective = parse_collective(value());
    else if (flag == "--csv")
      o.csv_path = std::string(value());
    else if (flag == "--metrics-file")
      o.metrics_file = std::string(value());
    else if (flag == "--metrics-json")
      o.metrics_json = std::string(value());
    else if (flag == "--overlap")
      o.overlap = true;
    else if (flag == "-C")
      o.codecs.emplace_back(value());
    else if (flag == "--wire") {
      const std::string v(value());
      char* end = nullptr;
      o.wire_gbps = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0' || !(o.wire_gbps > 0))
        throw InvalidArgument(fmt::format("--wire '{}' is not a link speed in Gbit/s, e.g. --wire 1", v));
    } else
      throw InvalidArgument(fmt::format("unknown option '{}'; see hopwise-bench -h", flag));
  }
  if (o.min_bytes > o.max_bytes)
    throw InvalidArgument(fmt::format("-b {} is larger than -e {}", o.min_bytes, o.max_bytes));
  check_op_supported(o.dtype, o.op);
  if (!o.codecs.empty() &&
      (o.collective != comm::Collective::kAllreduce || o.dtype != DataType::kFloat32 || o.op != ReduceOp::kSum))
    throw InvalidArgument("-C rows need --coll allreduce -d float32 -o sum (codecs compress float32 sums)");
  // A bad spec fails here, with its reason. PowerSGD is not a one-payload codec: it has its own path.
  for (const auto& spec : o.codecs) {
    if (compression::parse_codec_spec(spec).name == "powersgd")
      compression::PowerSgd::from_spec(spec);
    else
      compression::make_codec(spec);
  }
  return o;
}

}  // namespace hopwise::bench
