// Reading and writing topology files.
//
// Readers detect the format from the content (not the file name):
//   - hwloc XML (lstopo output, versions 1.x, 2.x, 3.0): root <topology>
//   - NCCL topology XML (<system version="1">) and RCCL's (<system version="2">); NCCL graph files (<graphs>) load as
//     the GPUs and NICs their channels name, without links
//   - `nvidia-smi topo -m` text matrix
//   - this project's JSON (see to_json)
// Malformed input throws hopwise::InvalidArgument naming the file, the line and what was expected.
//
// Limits (enforced; exceeding them is InvalidArgument): kMaxFileBytes per file, kMaxXmlDepth element nesting,
// kMaxNodes vertices. The XML reader is this project's own: it accepts no DTD internal subset and never resolves
// entities other than the five predefined ones and numeric character references, so external entities can not be
// fetched.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "hopwise/topology/graph.h"

namespace hopwise::topology {

inline constexpr std::size_t kMaxFileBytes = 64u << 20;  // 64 MiB
inline constexpr int kMaxXmlDepth = 64;
inline constexpr int kMaxNodes = 100000;

enum class TopologyFormat { HwlocXml, NcclXml, NcclGraphXml, NvidiaSmi, Json, Unknown };
std::string_view to_string(TopologyFormat f);

// Looks at the first meaningful bytes of `text`.
TopologyFormat detect_format(std::string_view text);

// `source` names the input in error messages (a path, or "<string>").
Topology parse_topology(std::string_view text, const std::string& source = "<string>");
// Reads the file (at most kMaxFileBytes) and parses it. Throws InvalidArgument if it can not be read.
Topology load_topology(const std::string& path);

// Individual readers (parse_topology dispatches to these).
Topology parse_hwloc_xml(std::string_view text, const std::string& source);
Topology parse_nccl_xml(std::string_view text, const std::string& source);
Topology parse_nvidia_smi(std::string_view text, const std::string& source);
Topology parse_json(std::string_view text, const std::string& source);

// JSON, schema "hopwise-topology" version 1: {"schema","version","source_format","source_name","nodes":[...],
// "links":[...],"declared_paths":[[a,b,"NVL"],...]}. Deterministic: to_json(parse_json(to_json(t))) == to_json(t).
std::string to_json(const Topology& t);

// NCCL topology XML that NCCL's own parser (2.28) accepts: no XML declaration, every element on one line with all
// its attributes, at most 16 attributes, 2-space indentation, self-closing leaves. <cpu> per NUMA node, nested
// <pci> for switches, <gpu>/<nvlink>, <nic>/<net>. Host bridges are collapsed (their children hang off <cpu>),
// NVSwitches are written only as <nvlink tclass="0x068000"> targets, as NCCL's own dumps do. Where the model lacks
// what NCCL requires, placeholders are written: busid ffff:fX:YY.0, vendor/device 0xffff, cpu arch x86_64 /
// GenuineIntel / family 6 / model 85, gpu sm 80. Throws InvalidArgument if the PCI tree is deeper than kMaxXmlDepth.
std::string to_nccl_xml(const Topology& t);

// Graphviz DOT (undirected), one vertex per node ("n<id>") labelled with its name, edges labelled with the link;
// laid out left to right. Two or more NVSwitches are drawn as one "nvswitch_fabric" vertex, each device's links to
// them summed into one edge. plan_to_dot (planner.h) draws a plan over it.
std::string to_dot(const Topology& t);

void save_text(const std::string& path, const std::string& text);  // throws InvalidArgument on I/O errors

}  // namespace hopwise::topology
