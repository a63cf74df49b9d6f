#include "results.h"

#include <fmt/core.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "hopwise/common/error.h"
#include "hopwise/training/monitor.h"

namespace hopwise::bench {

namespace {

std::FILE* open_or_throw(const std::string& path, const char* what) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) throw InvalidArgument(fmt::format("cannot write {} {}: {}", what, path, std::strerror(errno)));
  return f;
}

// The row's algorithm as the tables name it: a codec row runs through auto; a tuned row's ":chunk" detail dropped.
std::string algo_of(const Row& r) { return r.codec != "-" ? "auto" : r.algo.substr(0, r.algo.find(':')); }

}  // namespace

void write_csv(const std::string& path, const Options& o, const RunInfo& info, const std::vector<Row>& rows) {
  std::FILE* f = open_or_throw(path, "--csv");
  const bool codecs = !o.codecs.empty();
  fmt::print(f, "size_bytes,count,dtype,op,algo,ranks,time_us,algbw_gbs,busbw_gbs,vs_{},check{}{}\n", info.reference,
             codecs ? ",codec,wire_bytes,ratio,rel_err" : "", info.wire ? ",vs_wire" : "");
  for (const Row& r : rows) {
    fmt::print(f, "{},{},{},{},{},{},{:.2f},{:.4f},{:.4f},{:.3f},{}", r.bytes, r.count, to_string(o.dtype),
               to_string(o.op), algo_of(r), info.ranks, r.time_us, r.algbw, r.busbw, r.vs_mpi, r.check);
    if (codecs) {
      if (r.codec != "-")  // the spec has commas of its own: quoted
        fmt::print(f, ",\"{}\",{},{:.2f},{:.3e}", r.codec, r.wire_bytes, r.ratio, r.rel_err);
      else
        fmt::print(f, ",none,{},1.00,0", r.bytes);
    }
    if (info.wire) fmt::print(f, ",{:.3f}", r.vs_wire);
    fmt::print(f, "\n");
  }
  std::fclose(f);
}

void write_metrics(const std::string& path, const Options& o, const RunInfo& info, const std::vector<Row>& rows) {
  std::string out;
  auto family = [&](const char* name, const char* help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} gauge\n", name, help, name);
  };
  auto labels = [&](const Row& r) {
    return fmt::format(
        "job=\"hopwise-bench\",collective=\"{}\",dtype=\"{}\",algo=\"{}\",codec=\"{}\",size_bytes=\"{}\"",
        comm::to_string(o.collective), to_string(o.dtype), algo_of(r), r.codec == "-" ? "none" : r.codec, r.bytes);
  };
  family("hopwise_bench_time_seconds", "Median time of one call (the slowest rank's), from the last run.");
  for (const Row& r : rows)
    out += fmt::format("hopwise_bench_time_seconds{{{}}} {:.9g}\n", labels(r), r.time_us * 1e-6);
  family("hopwise_bench_bus_bandwidth_bytes_per_second", "Bus bandwidth as nccl-tests defines it, from the last run.");
  for (const Row& r : rows)
    out += fmt::format("hopwise_bench_bus_bandwidth_bytes_per_second{{{}}} {:.9g}\n", labels(r), r.busbw * 1e9);
  family("hopwise_bench_speedup_ratio", "The reference's time over this row's (reference label: mpi, gloo or none).");
  for (const Row& r : rows)
    out +=
        fmt::format("hopwise_bench_speedup_ratio{{{},reference=\"{}\"}} {:.6g}\n", labels(r), info.reference, r.vs_mpi);
  family("hopwise_bench_check_failed", "1 where the row's result differed from the reference computation.");
  for (const Row& r : rows)
    out += fmt::format("hopwise_bench_check_failed{{{}}} {}\n", labels(r), r.check == "FAIL" ? 1 : 0);
  out += fmt::format(
      "# HELP hopwise_bench_ranks Ranks of the run.\n# TYPE hopwise_bench_ranks gauge\n"
      "hopwise_bench_ranks{{job=\"hopwise-bench\"}} {}\n",
      info.ranks);
  comm::write_file_atomically(path, out);
}

void write_json_lines(const std::string& path, const Options& o, const RunInfo& info, const std::vector<Row>& rows) {
  std::FILE* f = open_or_throw(path, "--metrics-json");
  for (const Row& r : rows) {
    nlohmann::json j;
    j["type"] = "bench";
    j["collective"] = comm::to_string(o.collective);
    j["dtype"] = to_string(o.dtype);
    j["op"] = to_string(o.op);
    j["algo"] = algo_of(r);
    j["codec"] = r.codec == "-" ? "none" : r.codec;
    j["ranks"] = info.ranks;
    j["size_bytes"] = r.bytes;
    j["count"] = r.count;
    j["time_us"] = r.time_us;
    j["algbw_gbs"] = r.algbw;
    j["busbw_gbs"] = r.busbw;
    j["vs_" + info.reference] = r.vs_mpi;
    if (info.wire) j["vs_wire"] = r.vs_wire;
    j["check"] = r.check;
    fmt::print(f, "{}\n", j.dump());
  }
  std::fclose(f);
}

}  // namespace hopwise::bench
