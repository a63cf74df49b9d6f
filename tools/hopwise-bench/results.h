// hopwise-bench's rows and where they go besides the console: CSV (--csv), a Prometheus textfile
// (--metrics-file / HOPWISE_METRICS_FILE) and JSON lines (--metrics-json / HOPWISE_METRICS_JSON).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "options.h"

namespace hopwise::bench {

struct Row {
  std::size_t bytes, count;
  std::string algo;
  double time_us, algbw, busbw, vs_mpi;
  double vs_wire = 0;  // --wire: the wire time / this row's time
  std::string check;
  std::string codec = "-";  // -C rows: the codec spec, bytes per rank on the wire, ratio, relative L2 error
  std::size_t wire_bytes = 0;
  double ratio = 0, rel_err = 0;
};

// What every row was measured against, and the job's shape.
struct RunInfo {
  std::string reference;  // mpi, gloo or none: the vs_ column
  int ranks = 0;
  bool wire = false;  // rows carry vs_wire
};

// Each throws InvalidArgument naming the file when it cannot be written.
void write_csv(const std::string& path, const Options& o, const RunInfo& info, const std::vector<Row>& rows);
void write_metrics(const std::string& path, const Options& o, const RunInfo& info, const std::vector<Row>& rows);
void write_json_lines(const std::string& path, const Options& o, const RunInfo& info, const std::vector<Row>& rows);

}  // namespace hopwise::bench
