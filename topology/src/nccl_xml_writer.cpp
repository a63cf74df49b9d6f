// The NCCL topology XML writer (to_nccl_xml): the model in the shape NCCL's own parser reads, one <cpu> per NUMA
// node with its PCI tree, with placeholders where the model lacks what NCCL requires.
#include "hopwise/topology/formats.h"

#include <fmt/core.h>

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "hopwise/common/error.h"

namespace hopwise::topology {

namespace {

std::string xml_value(std::string v) {
  // NCCL's parser decodes no entities: drop characters it can not carry instead.
  v.erase(std::remove_if(v.begin(), v.end(),
                         [](char c) {
                           return c == '"' || c == '<' || c == '>' || c == '\n' || c == '\r' || c == '\t' || c == '&';
                         }),
          v.end());
  if (v.size() > 255) v.resize(255);
  return v;
}

struct Tag {
  std::string name;
  std::vector<std::pair<std::string, std::string>> attrs;
  void add(const std::string& k, const std::string& v) {
    if (attrs.size() < 16) attrs.emplace_back(k, xml_value(v));
  }
  std::string open(int indent, bool self_close) const {
    std::string s(static_cast<std::size_t>(indent) * 2, ' ');
    s += "<" + name;
    for (const auto& [k, v] : attrs) s += " " + k + "=\"" + v + "\"";
    s += self_close ? "/>\n" : ">\n";
    return s;
  }
};

// A figure as a whole number; clamped, because a model read from JSON may carry 1e300 and the cast would be undefined.
std::string whole_number(double x) {
  constexpr double kMax = 9.2e18;  // just inside long long
  if (!(x > -kMax && x < kMax)) x = x < 0 ? -kMax : kMax;
  return std::to_string(static_cast<long long>(x));
}

std::string link_speed_string(int gen) {
  static const char* s[] = {
      "", "2.5 GT/s PCIe", "5.0 GT/s PCIe", "8.0 GT/s PCIe", "16.0 GT/s PCIe", "32.0 GT/s PCIe", "64.0 GT/s PCIe"};
  return gen >= 1 && gen <= 6 ? s[gen] : "";
}

}  // namespace

std::string to_nccl_xml(const Topology& t) {
  // Bus ids for nodes that lack one (NCCL requires busid on <pci>): ffff:fX:YY.0 placeholders as the cloud files use.
  std::vector<std::string> bus(t.nodes().size());
  int fake = 0;
  for (const auto& n : t.nodes()) {
    bus[static_cast<std::size_t>(n.id)] =
        !n.pci_bus_id.empty() ? n.pci_bus_id : fmt::format("ffff:{:02x}:{:02x}.0", 0xf0 + (fake / 32) % 16, fake % 32);
    if (n.pci_bus_id.empty() && n.kind != NodeKind::Host && n.kind != NodeKind::Numa) ++fake;
  }
  auto cls_of = [&](const Node& n) -> std::string {
    if (auto it = n.attrs.find("class"); it != n.attrs.end() && it->second.size() >= 4) return it->second;
    switch (n.kind) {
      case NodeKind::Gpu: return "0x030200";
      case NodeKind::Nic: return "0x020700";
      case NodeKind::NvSwitch: return "0x068000";
      default: return "0x060400";
    }
  };
  std::vector<char> done(t.nodes().size(), 0);
  std::string out = "<system version=\"1\">\n";
  std::function<void(int, int, const Link*)> emit = [&](int id, int indent, const Link* up) {
    if (indent > kMaxXmlDepth)
      throw InvalidArgument(
          fmt::format("the PCI tree below node '{}' is deeper than {} levels; NCCL XML can not "
                      "carry it",
                      t.node(id).name, kMaxXmlDepth));
    done[static_cast<std::size_t>(id)] = 1;
    const Node& n = t.node(id);
    // Host bridges are not NCCL nodes: their children go straight under the parent.
    std::vector<std::pair<int, const Link*>> kids;
    for (int li : t.links_of(id)) {
      const Link& l = t.links()[static_cast<std::size_t>(li)];
      const int o = l.a == id ? l.b : l.a;
      if (l.kind != LinkKind::PCIe || done[static_cast<std::size_t>(o)]) continue;
      const NodeKind k = t.node(o).kind;
      // NVSwitches are not written as PCI devices: NCCL builds its NVS node from the GPUs' <nvlink tclass="0x068000">.
      if (k == NodeKind::Host || k == NodeKind::Numa || k == NodeKind::CpuPackage || k == NodeKind::Network ||
          k == NodeKind::NvSwitch)
        continue;
      kids.emplace_back(o, &l);
    }
    if (n.kind == NodeKind::PciSwitch && n.host_bridge) {
      for (auto& [o, l] : kids)
        if (!done[static_cast<std::size_t>(o)]) emit(o, indent, l);
      return;
    }
    const bool bare_nic = n.kind == NodeKind::Nic && n.pci_bus_id.empty() && kids.empty();
    if (bare_nic) {
      out += std::string(static_cast<std::size_t>(indent) * 2, ' ') + "<nic>\n";
    } else {
      Tag p{"pci", {}};
      p.add("busid", bus[static_cast<std::size_t>(id)]);
      p.add("class", cls_of(n));
      for (const char* k : {"vendor", "device", "subsystem_vendor", "subsystem_device"})
        p.add(k, n.attrs.count(k) ? n.attrs.at(k) : "0xffff");
      const int gen = up ? up->pcie_gen : 0;
      p.add("link_speed", gen ? link_speed_string(gen) : (n.attrs.count("link_speed") ? n.attrs.at("link_speed") : ""));
      p.add("link_width", std::to_string(up && up->pcie_width ? up->pcie_width : 16));
      const bool has_body = n.kind == NodeKind::Gpu || n.kind == NodeKind::Nic || !kids.empty();
      out += p.open(indent, !has_body);
      if (!has_body) return;
      for (auto& [o, l] : kids)
        if (!done[static_cast<std::size_t>(o)]) emit(o, indent + 1, l);
      if (n.kind == NodeKind::Gpu) {
        Tag g{"gpu", {}};
        g.add("dev", std::to_string(n.index >= 0 ? n.index : 0));
        g.add("sm", n.attrs.count("sm") ? n.attrs.at("sm") : "80");
        g.add("rank", n.attrs.count("rank") ? n.attrs.at("rank") : std::to_string(std::max(n.index, 0)));
        g.add("gdr", n.attrs.count("gdr") ? n.attrs.at("gdr") : "1");
        std::vector<Tag> nv;
        for (int li : t.links_of(id)) {
          const Link& l = t.links()[static_cast<std::size_t>(li)];
          if (l.kind != LinkKind::NVLink && l.kind != LinkKind::C2C) continue;
          const Node& o = t.node(l.a == id ? l.b : l.a);
          if (l.kind == LinkKind::C2C) {
            Tag c{"c2c", {}};
            c.add("bw", whole_number(l.bandwidth_gbps * 1000 / std::max(l.count, 1)));
            c.add("count", std::to_string(l.count));
            nv.push_back(c);
            continue;
          }
          Tag v{"nvlink", {}};
          v.add("target", o.kind == NodeKind::NvSwitch && o.pci_bus_id.empty() ? "fffffff:ff:ff.0"
                                                                               : bus[static_cast<std::size_t>(o.id)]);
          v.add("count", std::to_string(std::max(l.count, 1)));
          v.add("tclass", o.kind == NodeKind::Gpu        ? "0x030200"
                          : o.kind == NodeKind::NvSwitch ? "0x068000"
                                                         : "0x068001");
          nv.push_back(v);
        }
        out += g.open(indent + 1, nv.empty());
        if (!nv.empty()) {
          for (const auto& v : nv) out += v.open(indent + 2, true);
          out += std::string(static_cast<std::size_t>(indent + 1) * 2, ' ') + "</gpu>\n";
        }
      }
      if (n.kind != NodeKind::Nic) {
        out += std::string(static_cast<std::size_t>(indent) * 2, ' ') + "</pci>\n";
        return;
      }
      out += std::string(static_cast<std::size_t>(indent + 1) * 2, ' ') + "<nic>\n";
      ++indent;
    }
    // NIC body.
    std::string ports = n.attrs.count("ports") ? n.attrs.at("ports") : n.name;
    std::vector<std::string> names;
    for (std::size_t b = 0;;) {
      const auto e = ports.find(',', b);
      names.push_back(ports.substr(b, e == std::string::npos ? std::string::npos : e - b));
      if (e == std::string::npos) break;
      b = e + 1;
    }
    for (std::size_t k = 0; k < names.size(); ++k) {
      Tag net{"net", {}};
      net.add("name", names[k]);
      net.add("dev", std::to_string(std::max(n.index, 0) + static_cast<long long>(k)));  // index may be INT_MAX
      const double per_port = names.empty() ? n.speed_gbps : n.speed_gbps / static_cast<double>(names.size());
      net.add("speed", whole_number(per_port > 0 ? per_port * 1000 : 100000));
      net.add("port", n.attrs.count("port") ? n.attrs.at("port") : "1");
      if (n.attrs.count("guid")) net.add("guid", n.attrs.at("guid"));
      net.add("gdr", n.attrs.count("gdr") ? n.attrs.at("gdr") : "0");
      out += net.open(indent + 1, true);
    }
    out += std::string(static_cast<std::size_t>(indent) * 2, ' ') + "</nic>\n";
    if (!bare_nic) out += std::string(static_cast<std::size_t>(indent - 1) * 2, ' ') + "</pci>\n";
  };
  // One <cpu> per NUMA node; I/O attached to a package or host goes to the first NUMA node below it.
  std::vector<int> numas = t.nodes_of(NodeKind::Numa);
  auto numa_for = [&](int cpu_side) -> int {
    const Node& c = t.node(cpu_side);
    if (c.kind == NodeKind::Numa) return cpu_side;
    for (int id : numas)
      if (c.numa >= 0 && t.node(id).index == c.numa) return id;
    for (int li : t.links_of(cpu_side)) {
      const Link& l = t.links()[static_cast<std::size_t>(li)];
      const int o = l.a == cpu_side ? l.b : l.a;
      if (l.kind == LinkKind::Internal && t.node(o).kind == NodeKind::Numa) return o;
    }
    return numas.empty() ? -1 : numas.front();
  };
  std::map<int, std::vector<std::pair<int, const Link*>>> roots;  // numa id (-1 none) -> attached I/O
  for (const auto& l : t.links()) {
    if (l.kind != LinkKind::PCIe) continue;
    for (auto [c, d] : {std::pair{l.a, l.b}, std::pair{l.b, l.a}}) {
      const NodeKind ck = t.node(c).kind, dk = t.node(d).kind;
      const bool c_cpu = ck == NodeKind::Host || ck == NodeKind::CpuPackage || ck == NodeKind::Numa;
      const bool d_cpu = dk == NodeKind::Host || dk == NodeKind::CpuPackage || dk == NodeKind::Numa;
      if (c_cpu && !d_cpu && dk != NodeKind::NvSwitch) roots[numa_for(c)].emplace_back(d, &l);
    }
  }
  std::vector<int> cpu_ids = numas;
  if (cpu_ids.empty()) cpu_ids.push_back(-1);
  for (int c : cpu_ids) {
    Tag cpu{"cpu", {}};
    const Node* cn = c >= 0 ? &t.node(c) : nullptr;
    auto attr = [&](const char* k, const std::string& dflt) {
      return cn && cn->attrs.count(k) ? cn->attrs.at(k) : dflt;
    };
    cpu.add("numaid", std::to_string(cn ? cn->index : 0));
    if (cn && cn->attrs.count("affinity")) cpu.add("affinity", cn->attrs.at("affinity"));
    cpu.add("arch", attr("arch", "x86_64"));
    cpu.add("vendor", attr("vendor", "GenuineIntel"));
    cpu.add("familyid", attr("familyid", "6"));
    cpu.add("modelid", attr("modelid", "85"));
    const auto& rs = roots[c];
    out += cpu.open(1, rs.empty());
    if (rs.empty()) continue;
    for (const auto& [d, l] : rs)
      if (!done[static_cast<std::size_t>(d)]) emit(d, 2, l);
    out += "  </cpu>\n";
  }
  out += "</system>\n";
  return out;
}

}  // namespace hopwise::topology
