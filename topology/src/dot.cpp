// The Graphviz DOT writer (to_dot): one vertex per node, one undirected edge per link.
#include "hopwise/topology/formats.h"

#include <fmt/core.h>

#include <string>

namespace hopwise::topology {

std::string to_dot(const Topology& t) {
  auto esc = [](const std::string& s) {
    std::string o;
    for (char c : s) {
      if (c == '"' || c == '\\') o += '\\';
      o += c;
    }
    return o;
  };
  std::string out = "graph topology {\n  node [shape=box];\n";
  for (const auto& n : t.nodes()) {
    std::string label = n.name;
    if (!n.pci_bus_id.empty() && n.name.find(n.pci_bus_id) == std::string::npos) label += "\\n" + n.pci_bus_id;
    if (!n.model.empty()) label += "\\n" + esc(n.model);
    out += fmt::format("  n{} [label=\"{}\", kind=\"{}\"];\n", n.id, esc(n.name) + label.substr(n.name.size()),
                       to_string(n.kind));
  }
  for (const auto& l : t.links()) {
    std::string label(to_string(l.kind));
    if (l.kind == LinkKind::NVLink) label = fmt::format("NV{}", l.count);
    if (l.kind == LinkKind::PCIe && l.pcie_gen) label = fmt::format("PCIe{}x{}", l.pcie_gen, l.pcie_width);
    if (l.bandwidth_gbps > 0) label += fmt::format(" {:.1f}GB/s", l.bandwidth_gbps);
    out += fmt::format("  n{} -- n{} [label=\"{}\"{}];\n", l.a, l.b, label,
                       l.kind == LinkKind::NVLink ? ", color=green" : "");
  }
  out += "}\n";
  return out;
}

}  // namespace hopwise::topology
