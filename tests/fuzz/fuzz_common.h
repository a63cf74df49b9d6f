// Shared by the libFuzzer targets: the input as text, and what every successfully parsed topology must survive.
// A reader may refuse input only with hopwise::InvalidArgument (the documented error); anything else escapes the
// target and libFuzzer reports it as a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "hopwise/common/error.h"
#include "hopwise/topology/formats.h"
#include "hopwise/topology/graph.h"

namespace hopwise::fuzz {

inline std::string_view as_text(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

[[noreturn]] inline void broken(const char* what, const std::string& detail) {
  std::fprintf(stderr, "hopwise fuzz: %s\n%s\n", what, detail.c_str());
  std::abort();
}

// A model a reader accepted must be writable in every format, and its JSON must read back to the same JSON
// (formats.h promises that round trip); writers run on what readers produce, so their bugs count too.
inline void exercise(const topology::Topology& t) {
  using namespace hopwise::topology;
  const std::string j = to_json(t);
  try {
    const std::string again = to_json(parse_json(j, "roundtrip.json"));
    if (again != j) broken("JSON round trip differs", j.substr(0, 4096) + "\n---\n" + again.substr(0, 4096));
  } catch (const InvalidArgument& e) {
    broken("to_json wrote JSON that parse_json refuses", e.what());
  }
  (void)to_dot(t);
  try {
    (void)to_nccl_xml(t);
  } catch (const InvalidArgument&) {
    // Documented: a PCI tree deeper than kMaxXmlDepth can not be written as NCCL XML.
  }
  // A few path queries (the planner's main use of the model); bounded so big inputs stay fast.
  const auto gpus = t.nodes_of(NodeKind::Gpu);
  for (std::size_t i = 0; i + 1 < gpus.size() && i < 4; ++i) (void)t.path(gpus[i], gpus[i + 1]);
}

}  // namespace hopwise::fuzz
