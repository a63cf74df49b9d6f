// The Graphviz DOT writer (to_dot, plan_to_dot): one vertex per node, one undirected edge per link, laid out left to
// right so that a machine's devices stack vertically (a 16-GPU DGX-2 stays under ~2500 px wide), with several
// NVSwitches drawn as one fabric vertex. plan_to_dot adds the ring (red arrows numbered in hop order) and the
// trees' edges the ring does not already draw (blue, dashed).
#include <fmt/core.h>

#include <map>
#include <set>
#include <string>
#include <utility>

#include "hopwise/topology/formats.h"
#include "hopwise/topology/planner.h"

namespace hopwise::topology {

namespace {

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o;
}

// Several NVSwitches are one crossbar as far as a picture goes: drawing each (and each GPU's link to each) is what
// made a DGX-2 13,725 px wide.
constexpr int kFabricMinSwitches = 2;
constexpr const char* kFabricId = "nvswitch_fabric";

std::string vertex(const Topology& t, int id, bool fabric) {
  if (fabric && t.node(id).kind == NodeKind::NvSwitch) return kFabricId;
  return fmt::format("n{}", id);
}

std::string link_text(const Link& l) {
  std::string label(to_string(l.kind));
  if (l.kind == LinkKind::NVLink) label = fmt::format("NV{}", l.count);
  if (l.kind == LinkKind::PCIe && l.pcie_gen) label = fmt::format("PCIe{}x{}", l.pcie_gen, l.pcie_width);
  if (l.bandwidth_gbps > 0) label += fmt::format(" {:.1f}GB/s{}", l.bandwidth_gbps, l.assumed ? " (assumed)" : "");
  return label;
}

std::string write_dot(const Topology& t, const Plan* plan) {
  const bool fabric = t.count(NodeKind::NvSwitch) >= kFabricMinSwitches;
  std::map<int, std::vector<int>> ranks_on;  // device -> ranks placed on it
  if (plan)
    for (std::size_t r = 0; r < plan->placement.size(); ++r) ranks_on[plan->placement[r].device].push_back(int(r));
  std::string out =
      "graph topology {\n  rankdir=LR; ranksep=0.35; nodesep=0.12; size=\"25,60\";\n"
      "  node [shape=box, fontsize=10, height=0.3, margin=\"0.06,0.03\"];\n  edge [fontsize=9];\n";
  for (const auto& n : t.nodes()) {
    if (fabric && n.kind == NodeKind::NvSwitch) continue;
    std::string label = esc(n.name);
    if (!n.pci_bus_id.empty() && n.name.find(n.pci_bus_id) == std::string::npos) label += "\\n" + n.pci_bus_id;
    if (!n.model.empty() && n.kind != NodeKind::PciSwitch) label += "\\n" + esc(n.model);
    std::string style;
    if (n.kind == NodeKind::PciSwitch) style = ", fontsize=8, color=gray40";
    if (n.kind == NodeKind::Gpu) style = ", style=filled, fillcolor=\"#d9f2d9\"";
    if (auto it = ranks_on.find(n.id); it != ranks_on.end()) {
      std::string ranks;
      for (int r : it->second) ranks += fmt::format("{}{}", ranks.empty() ? "" : ",", r);
      label += "\\nrank " + ranks;
      style += ", penwidth=2";
    }
    out += fmt::format("  n{} [label=\"{}\", kind=\"{}\"{}];\n", n.id, label, to_string(n.kind), style);
  }
  // NVLink to the fabric: one edge per device with the links and bandwidth summed; switch-to-switch links inside.
  std::map<int, Link> to_fabric;
  int trunks = 0;
  bool trunks_assumed = false;
  for (const auto& l : t.links()) {
    const bool a_sw = t.node(l.a).kind == NodeKind::NvSwitch, b_sw = t.node(l.b).kind == NodeKind::NvSwitch;
    if (fabric && a_sw && b_sw) {
      trunks += std::max(1, l.count);
      trunks_assumed |= l.assumed;
      continue;
    }
    if (fabric && (a_sw || b_sw)) {
      Link& sum = to_fabric.try_emplace(a_sw ? l.b : l.a, Link{l.a, l.b, l.kind, 0, 0, 0, 0, 0}).first->second;
      sum.count += std::max(1, l.count);
      sum.bandwidth_gbps += l.bandwidth_gbps;
      sum.assumed |= l.assumed;
      continue;
    }
    out += fmt::format("  n{} -- n{} [label=\"{}\"{}];\n", l.a, l.b, link_text(l),
                       l.kind == LinkKind::NVLink ? ", color=green" : "");
  }
  if (fabric) {
    std::string label = fmt::format("NVSwitch fabric\\n{} switches", t.count(NodeKind::NvSwitch));
    if (trunks > 0) label += fmt::format("\\n{} trunk links{}", trunks, trunks_assumed ? " (assumed)" : "");
    out +=
        fmt::format("  {} [label=\"{}\", kind=\"nvswitch\", style=filled, fillcolor=\"#cce6ff\"];\n", kFabricId, label);
    for (const auto& [dev, l] : to_fabric)
      out += fmt::format("  n{} -- {} [label=\"{}\", color=green];\n", dev, kFabricId, link_text(l));
  }
  if (plan) {
    std::set<std::pair<int, int>> drawn;  // rank pairs the ring draws, both orders
    const auto& ring = plan->ring;
    auto device = [&](int r) { return plan->placement[static_cast<std::size_t>(r)].device; };
    for (std::size_t i = 0; i < ring.size() && ring.size() > 1; ++i) {
      const int a = ring[i], b = ring[(i + 1) % ring.size()];
      drawn.insert({a, b});
      drawn.insert({b, a});
      if (device(a) == device(b)) continue;  // on one device: the "rank" label says so
      out += fmt::format(
          "  {} -- {} [dir=forward, color=red, penwidth=2, constraint=false, fontcolor=red, "
          "label=\"{}\", fontsize=11];\n",
          vertex(t, device(a), fabric), vertex(t, device(b), fabric), i + 1);
    }
    int tree_no = 0;
    for (const TreeShape* tree : {&plan->trees.first, &plan->trees.second}) {
      ++tree_no;
      for (std::size_t r = 0; r < tree->parent.size(); ++r) {
        const int par = tree->parent[r];
        if (par < 0 || drawn.count({par, int(r)}) || device(par) == device(int(r))) continue;
        drawn.insert({par, int(r)});
        drawn.insert({int(r), par});
        out += fmt::format(
            "  n{} -- n{} [dir=forward, color=blue, style=dashed, constraint=false, fontcolor=blue, "
            "label=\"tree {}\"];\n",
            device(par), device(int(r)), tree_no);
      }
    }
    out += fmt::format(
        "  label=\"plan: {} ranks, ring (red) {:.1f} GB/s bottleneck{}, tree edges off the ring (blue)\"; "
        "labelloc=t;\n",
        plan->ranks, plan->ring_score.bottleneck_gbps, plan->bottleneck_assumed ? " (assumed)" : "");
  }
  out += "}\n";
  return out;
}

}  // namespace

std::string to_dot(const Topology& t) { return write_dot(t, nullptr); }
std::string plan_to_dot(const Topology& t, const Plan& plan) { return write_dot(t, &plan); }

}  // namespace hopwise::topology
