// Helpers the topology file readers share (internal to topology/): XML attributes read as numbers that fail with
// the element's line, the node-count limit, and the all-pairs mesh of sockets / NUMA nodes.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "hopwise/topology/graph.h"
#include "xml.h"

namespace hopwise::topology::detail {

inline bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// Integer attribute; throws with the element's line when present but not a number.
long long int_attr(const XmlElement& e, std::string_view key, long long fallback, const std::string& src);

// Number attribute; throws with the element's line when present but not a finite number.
double double_attr(const XmlElement& e, std::string_view key, double fallback, const std::string& src);

// Throws with `line` when `t` holds more than kMaxNodes nodes.
void check_nodes(const Topology& t, const std::string& src, int line);

// Links every pair of `ids` (sockets / NUMA nodes) with `kind` at NCCL's inter-socket bandwidth for their CPUs; throws
// with `line` when there are too many of them for one machine.
void mesh(Topology& t, const std::vector<int>& ids, LinkKind kind, const std::string& src, int line);

}  // namespace hopwise::topology::detail
