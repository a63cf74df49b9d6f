// The NCCL/RCCL topology XML reader (<system version="1"> / "2"): CPUs, the nested PCI tree, GPUs with their NVLink /
// xGMI / C2C links and NICs with their ports; NCCL graph files (<graphs>) load as the GPUs and NICs their channels use.
#include "hopwise/topology/formats.h"

#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "parse_util.h"
#include "xml.h"

namespace hopwise::topology {

using detail::check_nodes;
using detail::double_attr;
using detail::fail_at;
using detail::int_attr;
using detail::mesh;
using detail::starts_with;
using detail::XmlElement;

namespace {

std::string lower(std::string_view s) {
  std::string o(s);
  for (auto& c : o) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return o;
}

// Integer attribute within [lo, hi] (link counts: an int cast of anything larger would be undefined or wrap).
int bounded_int_attr(const XmlElement& e, std::string_view key, int fallback, int lo, int hi, const std::string& src) {
  const long long x = int_attr(e, key, fallback, src);
  if (x < lo || x > hi)
    fail_at(src, e.line,
            fmt::format("attribute {}=\"{}\" of <{}> is out of range; expected {} to {}", key, x, e.name, lo, hi));
  return static_cast<int>(x);
}

int gen_from_link_speed(const std::string& s) {
  if (s.empty()) return 0;
  const double gt = std::strtod(s.c_str(), nullptr);
  if (gt >= 60) return 6;
  if (gt >= 30) return 5;
  if (gt >= 15) return 4;
  if (gt >= 7.5) return 3;
  if (gt >= 4.5) return 2;
  if (gt >= 2) return 1;
  return 0;
}

// Links bonded between two devices in one element (NCCL files say 1-18); bounds the sums below.
constexpr int kMaxLinkCount = 1024;

double nvlink_per_link(int sm) {
  if (sm >= 100) return 40.0;
  if (sm >= 90) return 20.6;
  if (sm >= 70) return 20.0;
  return 18.0;
}

struct NcclBuilder {
  Topology t;
  const std::string& src;
  int host = -1, network = -1;
  int gpus = 0, nics = 0;
  bool rccl = false;
  struct PendingLink {
    int gpu;
    std::string target;
    int count;
    std::string tclass;
    int line;
    bool xgmi;
  };
  std::vector<PendingLink> pending;
  explicit NcclBuilder(const std::string& s) : src(s) {}

  int new_node(Node n, int line) {
    const int id = t.add_node(std::move(n));
    check_nodes(t, src, line);
    return id;
  }

  void add_nic(const XmlElement& nic, int id, int cpu_numa) {
    Node& n = t.node(id);
    n.kind = NodeKind::Nic;
    n.numa = cpu_numa;
    std::string names;
    double speed = 0;
    for (const auto& net : nic.children) {
      if (net.name != "net") continue;
      const std::string nm = net.attr_or("name");
      names += (names.empty() ? "" : ",") + nm;
      double sp = static_cast<double>(int_attr(net, "speed", 0, src));
      if (sp <= 0) sp = 10000;
      speed += sp / 1000.0;
      if (n.index < 0) n.index = static_cast<int>(int_attr(net, "dev", -1, src));
      for (const char* k : {"port", "guid", "gdr", "maxconn", "latency", "coll"})
        if (const auto* v = net.attr(k); v && !t.node(id).attrs.count(k)) t.node(id).attrs[k] = *v;
    }
    Node& m = t.node(id);
    m.speed_gbps = speed;
    m.name = names.empty() ? fmt::format("NIC{}", nics) : names.substr(0, names.find(','));
    if (names.find(',') != std::string::npos) m.attrs["ports"] = names;
    ++nics;
    const double lat = m.attrs.count("latency") ? std::strtod(m.attrs.at("latency").c_str(), nullptr) : 0;
    if (network < 0) {  // invalidates m
      Node nw;
      nw.kind = NodeKind::Network;
      nw.name = "network0";
      network = new_node(std::move(nw), nic.line);
    }
    t.add_link({id, network, LinkKind::Network, 1, 0, 0, speed / 8.0, std::isfinite(lat) && lat > 0 ? lat : 0});
  }

  void pci(const XmlElement& e, int parent, int cpu, int cpu_numa) {
    const std::string* busid = e.attr("busid");
    if (!busid || busid->empty()) fail_at(src, e.line, "expected a busid=\"dddd:bb:dd.f\" attribute on <pci>");
    const std::string cls = lower(e.attr_or("class"));
    Node n;
    n.pci_bus_id = *busid;
    n.numa = cpu_numa;
    if (starts_with(cls, "0x068000"))
      n.kind = NodeKind::NvSwitch;
    else if (starts_with(cls, "0x03") || starts_with(cls, "0x12"))
      n.kind = NodeKind::Gpu;
    else if (starts_with(cls, "0x02"))
      n.kind = NodeKind::Nic;
    else
      n.kind = NodeKind::PciSwitch;
    for (const char* k :
         {"class", "vendor", "device", "subsystem_vendor", "subsystem_device", "link_speed", "link_width"})
      if (const auto* v = e.attr(k)) n.attrs[k] = *v;
    if (n.kind == NodeKind::PciSwitch)
      n.name = "PCI" + normalize_bus_id(*busid);
    else if (n.kind == NodeKind::NvSwitch)
      n.name = "NVSwitch" + normalize_bus_id(*busid);
    else if (n.kind == NodeKind::Gpu) {
      n.index = gpus;
      n.name = fmt::format("GPU{}", gpus++);
    } else
      n.name = "NIC" + normalize_bus_id(*busid);
    const bool was_nic_class = n.kind == NodeKind::Nic;
    const int id = new_node(std::move(n), e.line);
    Link l{parent, id, LinkKind::PCIe, 1, gen_from_link_speed(e.attr_or("link_speed")), 0, 0, 0};
    l.pcie_width = static_cast<int>(int_attr(e, "link_width", 0, src));
    if (l.pcie_gen > 0) l.bandwidth_gbps = pcie_bandwidth_gbps(l.pcie_gen, l.pcie_width > 0 ? l.pcie_width : 16);
    t.add_link(l);
    bool nic_seen = false;
    for (const auto& c : e.children) {
      if (c.name == "pci")
        pci(c, id, cpu, cpu_numa);
      else if (c.name == "gpu")
        gpu(c, id, cpu);
      else if (c.name == "nic") {
        add_nic(c, id, cpu_numa);
        nic_seen = true;
      }
    }
    if (was_nic_class && !nic_seen) t.node(id).name = fmt::format("NIC{}", nics++);
  }

  void gpu(const XmlElement& g, int id, int cpu) {
    Node& n = t.node(id);
    if (n.kind != NodeKind::Gpu) {
      n.kind = NodeKind::Gpu;
      n.index = gpus;
      n.name = fmt::format("GPU{}", gpus++);
    }
    const long long dev = int_attr(g, "dev", -1, src);
    for (const char* k : {"dev", "sm", "rank", "gdr", "gcn", "arch"})
      if (const auto* v = g.attr(k)) t.node(id).attrs[k] = *v;
    if (dev >= 0) t.node(id).attrs["dev"] = std::to_string(dev);
    for (const auto& c : g.children) {
      if (c.name == "nvlink" || c.name == "xgmi") {
        const std::string* target = c.attr("target");
        if (!target) fail_at(src, c.line, fmt::format("expected a target=\"busid\" attribute on <{}>", c.name));
        pending.push_back({id, *target, bounded_int_attr(c, "count", 1, 0, kMaxLinkCount, src),
                           lower(c.attr_or("tclass")), c.line, c.name == "xgmi"});
      } else if (c.name == "c2c") {
        const double bw = double_attr(c, "bw", 0, src);
        const int cnt = bounded_int_attr(c, "count", 1, 0, kMaxLinkCount, src);
        if (!std::isfinite(bw * cnt / 1000.0))
          fail_at(src, c.line, fmt::format("<c2c bw=\"{}\" count=\"{}\"> overflows; expected MB/s per link", bw, cnt));
        t.add_link({id, cpu, LinkKind::C2C, cnt, 0, 0, bw * cnt / 1000.0, 0});
      }
    }
  }

  void resolve_links() {
    int nvs = -1;
    std::map<std::string, int> by_bus;  // normalised bus id -> first node with it, as find_by_bus_id answers
    std::map<int, int> numa_by_index;   // NUMA os index -> last such node
    for (const auto& n : t.nodes()) {
      if (!n.pci_bus_id.empty()) by_bus.emplace(n.pci_bus_id, n.id);
      if (n.kind == NodeKind::Numa) numa_by_index[n.index] = n.id;
    }
    std::map<std::pair<int, int>, int> added;  // merged NVSwitch / dedup of mutual GPU links
    for (const auto& p : pending) {
      const auto& ga = t.node(p.gpu).attrs;
      const int sm = ga.count("sm") ? static_cast<int>(std::strtol(ga.at("sm").c_str(), nullptr, 10)) : 0;
      const double per = p.xgmi ? 50.0 : nvlink_per_link(sm);
      int other = -1;
      if (starts_with(p.tclass, "0x068000")) {
        if (nvs < 0) {
          Node n;
          n.kind = NodeKind::NvSwitch;
          n.name = "NVS";
          nvs = new_node(std::move(n), p.line);
        }
        other = nvs;
      } else if (starts_with(p.tclass, "0x068001")) {
        // NVLink to the CPU: the GPU's NUMA node.
        if (auto it = numa_by_index.find(t.node(p.gpu).numa); it != numa_by_index.end()) other = it->second;
      } else {
        const auto f = by_bus.find(normalize_bus_id(p.target));
        if (f != by_bus.end() && f->second != p.gpu) other = f->second;
      }
      if (other < 0) continue;  // self-targets (Azure's NC A100 v4 file) and unknown peers carry no edge
      const std::pair<int, int> key{std::min(p.gpu, other), std::max(p.gpu, other)};
      if (other == nvs) {
        if (auto it = added.find(key); it != added.end()) {
          Link& l = const_cast<Link&>(t.links()[static_cast<std::size_t>(it->second)]);
          l.count = std::min(l.count + p.count, kMaxLinkCount * 1024);  // saturates instead of overflowing
          l.bandwidth_gbps = l.count * per;
          continue;
        }
      } else if (added.count(key)) {
        continue;
      }
      Link l{p.gpu, other, LinkKind::NVLink, p.count, 0, 0, p.count * per, 0};
      added[key] = t.add_link(l);
      if (p.xgmi) t.node(p.gpu).attrs["fabric"] = "xgmi";
    }
  }
};

}  // namespace

Topology parse_nccl_xml(std::string_view text, const std::string& src) {
  const XmlElement root = detail::parse_xml(text, src, kMaxXmlDepth);
  NcclBuilder b(src);
  b.t.source_name = src;
  if (root.name == "graphs") {
    // NCCL graph file: the GPUs and NICs its channels use, no links.
    b.t.source_format = "nccl-graph-xml v" + root.attr_or("version", "?");
    Node h;
    h.kind = NodeKind::Host;
    h.name = "host0";
    b.host = b.t.add_node(std::move(h));
    std::set<long long> gpus, nets;
    for (const auto& g : root.children) {
      if (g.name != "graph") continue;
      for (const auto& ch : g.children)
        for (const auto& d : ch.children) {
          const long long dev = int_attr(d, "dev", -1, src);
          if (dev < 0) fail_at(src, d.line, fmt::format("expected a dev=\"N\" attribute on <{}>", d.name));
          if (d.name == "gpu")
            gpus.insert(dev);
          else if (d.name == "net")
            nets.insert(dev);
        }
    }
    for (long long g : gpus) {
      Node n;
      n.kind = NodeKind::Gpu;
      n.index = static_cast<int>(g);
      n.name = fmt::format("GPU{}", g);
      const int id = b.new_node(std::move(n), root.line);
      b.t.add_link({b.host, id, LinkKind::PCIe, 1, 0, 0, 0, 0});
    }
    for (long long g : nets) {
      Node n;
      n.kind = NodeKind::Nic;
      n.index = static_cast<int>(g);
      n.name = fmt::format("NIC{}", g);
      const int id = b.new_node(std::move(n), root.line);
      b.t.add_link({b.host, id, LinkKind::PCIe, 1, 0, 0, 0, 0});
    }
    return std::move(b.t);
  }
  if (root.name != "system")
    fail_at(src, root.line,
            fmt::format("expected the NCCL root element <system version=\"1\">, found <{}>", root.name));
  const std::string version = root.attr_or("version");
  if (version != "1" && version != "2")
    fail_at(
        src, root.line,
        fmt::format("expected <system version=\"1\"> (NCCL) or version=\"2\" (RCCL), found version=\"{}\"", version));
  b.rccl = version == "2";
  b.t.source_format = "nccl-xml v" + version;
  Node h;
  h.kind = NodeKind::Host;
  h.name = "host0";
  if (const auto* nm = root.attr("name")) h.attrs["name"] = *nm;
  b.host = b.t.add_node(std::move(h));
  std::vector<int> cpus;
  for (const auto& c : root.children) {
    if (c.name != "cpu") continue;
    Node n;
    n.kind = NodeKind::Numa;
    n.index = static_cast<int>(int_attr(c, "numaid", -1, src));
    n.numa = n.index;
    n.name = fmt::format("NUMA{}", n.index >= 0 ? n.index : static_cast<int>(cpus.size()));
    for (const char* k : {"affinity", "arch", "vendor", "familyid", "modelid", "host_hash"})
      if (const auto* v = c.attr(k)) n.attrs[k] = *v;
    const int id = b.new_node(std::move(n), c.line);
    cpus.push_back(id);
    b.t.add_link({b.host, id, LinkKind::Internal, 1, 0, 0, 0, 0});
    for (const auto& d : c.children) {
      if (d.name == "pci")
        b.pci(d, id, id, b.t.node(id).index);
      else if (d.name == "nic") {
        Node nn;
        nn.kind = NodeKind::Nic;
        const int nid = b.new_node(std::move(nn), d.line);
        b.t.add_link({id, nid, LinkKind::PCIe, 1, 0, 0, 0, 0});
        b.add_nic(d, nid, b.t.node(id).index);
      }
    }
  }
  if (cpus.size() >= 2) mesh(b.t, cpus, LinkKind::InterSocket, src, root.line);
  b.resolve_links();
  return std::move(b.t);
}

}  // namespace hopwise::topology
