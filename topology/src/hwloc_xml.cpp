// The hwloc XML reader (lstopo output, 1.x to 3.0): machines, packages, NUMA nodes and the PCI tree's GPUs, NICs and
// NVSwitches become nodes; NVLinkBandwidth / XGMIBandwidth distance matrices become NVLink edges.
#include "hopwise/topology/formats.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
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

// Guess PCIe generation and width from a link bandwidth in GB/s (hwloc's pci_link_speed).
void guess_pcie(double gbps, Link& l) {
  l.bandwidth_gbps = gbps > 0 ? gbps : 0;
  double best = 0.02 * gbps;  // closest standard gen x width within 2%
  for (int gen = 1; gen <= 6; ++gen)
    for (int w : {1, 2, 4, 8, 16, 32}) {
      const double err = std::abs(pcie_bandwidth_gbps(gen, w) - gbps);
      if (gbps > 0 && err < best) {
        best = err;
        l.pcie_gen = gen;
        l.pcie_width = w;
      }
    }
}

// hwloc bitmap "0x000000ff,,0x1" -> NCCL cpumask "000000ff,00000000,00000001".
std::string hwloc_to_nccl_mask(const std::string& bitmap) {
  std::string out;
  std::stringstream ss(bitmap);
  for (std::string w; std::getline(ss, w, ',');) {
    if (starts_with(w, "0x")) w = w.substr(2);
    if (w.empty()) w = "00000000";
    out += (out.empty() ? "" : ",") + w;
  }
  return out;
}

// Single set bit of an hwloc bitmap ("0x00000002", "0x0,,0x1"), or -1.
int single_bit(const std::string& bitmap) {
  if (bitmap.empty()) return -1;
  std::vector<std::string> words;
  std::stringstream ss(bitmap);
  for (std::string w; std::getline(ss, w, ',');) words.push_back(w);
  int found = -1;
  for (std::size_t k = 0; k < words.size(); ++k) {
    const std::size_t pos_from_lsb = words.size() - 1 - k;
    const unsigned long long v = words[k].empty() ? 0 : std::strtoull(words[k].c_str(), nullptr, 16);
    for (int bit = 0; bit < 32; ++bit)
      if (v >> bit & 1) {
        if (found >= 0) return -1;
        found = static_cast<int>(pos_from_lsb * 32 + bit);
      }
  }
  return found;
}

struct PciType {
  unsigned cls = 0, vendor = 0, device = 0;
};
PciType pci_type(const std::string& s) {
  PciType p;
  std::sscanf(s.c_str(), "%x [%x:%x]", &p.cls, &p.vendor, &p.device);
  return p;
}

enum class IoRole { None, Gpu, NvSwitch, Nic };

IoRole pcidev_role(const XmlElement& e) {
  const PciType t = pci_type(e.attr_or("pci_type"));
  const bool gpu_vendor = t.vendor == 0x10de || t.vendor == 0x1002 || t.vendor == 0x1d94;
  if (t.cls == 0x0680 && t.vendor == 0x10de) return IoRole::NvSwitch;
  if (e.attr_or("subtype") == "NVSwitch") return IoRole::NvSwitch;
  if (t.cls == 0x0302 || ((t.cls >> 8 == 0x03 || t.cls == 0x1200) && gpu_vendor)) return IoRole::Gpu;
  for (const auto& c : e.children) {
    if (c.name != "object" || c.attr_or("type") != "OSDev") continue;
    const std::string n = c.attr_or("name");
    if (starts_with(n, "cuda") || starts_with(n, "nvml") || starts_with(n, "rsmi")) return IoRole::Gpu;
  }
  if (t.cls >> 8 == 0x02 || t.cls == 0x0c06) return IoRole::Nic;
  return IoRole::None;
}

bool io_interesting(const XmlElement& e) {
  if (e.name != "object") return false;
  const std::string type = e.attr_or("type");
  if (type == "PCIDev") return pcidev_role(e) != IoRole::None;
  if (type == "Bridge")
    return std::any_of(e.children.begin(), e.children.end(), [](const XmlElement& c) { return io_interesting(c); });
  return false;
}

struct HwlocBuilder {
  Topology t;
  const std::string& src;
  int host = -1;
  int gpus = 0, nics = 0, hbs = 0;
  std::vector<int> packages, numas;
  std::map<long long, int> gp_to_node;  // gp_index of PCIDev/OSDev -> node
  std::map<long long, int> os_numa_to_node;
  std::string arch;  // NCCL spelling: x86_64, arm64, ppc64

  void read_arch(const XmlElement& e) {
    for (const auto& i : e.children)
      if (i.name == "info" && i.attr_or("name") == "Architecture") {
        const std::string a = i.attr_or("value");
        arch = a == "aarch64" ? "arm64" : starts_with(a, "ppc64") ? "ppc64" : a;
      }
  }

  explicit HwlocBuilder(const std::string& s) : src(s) {}

  int new_node(Node n, int line) {
    const int id = t.add_node(std::move(n));
    check_nodes(t, src, line);
    return id;
  }

  // cpu: nearest CPU-side node; io: nearest PCI node (-1 none); numa: NUMA affinity of the context.
  void walk(const XmlElement& e, int cpu, int io, int numa) {
    for (const auto& c : e.children) {
      if (c.name != "object") continue;
      const std::string type = c.attr_or("type");
      if (type.empty()) fail_at(src, c.line, "expected a type=\"...\" attribute on <object>");
      const long long os = int_attr(c, "os_index", -1, src);
      const int ctx_numa = [&] {
        const int b = single_bit(c.attr_or("nodeset"));
        return b >= 0 ? b : numa;
      }();
      if (type == "Machine") {
        int id = host;
        if (host < 0 || cpu != host) {
          Node n;
          n.kind = NodeKind::Host;
          n.name = fmt::format("host{}", t.count(NodeKind::Host));
          id = new_node(std::move(n), c.line);
          if (host < 0) host = id;
        }
        read_arch(c);
        if (!arch.empty()) t.node(id).attrs["arch"] = arch;
        walk(c, id, -1, ctx_numa);
      } else if (type == "Package" || type == "Socket") {
        Node n;
        n.kind = NodeKind::CpuPackage;
        n.index = static_cast<int>(os);
        n.name = fmt::format("Package{}", os >= 0 ? os : static_cast<long long>(packages.size()));
        n.numa = ctx_numa;
        for (const auto& i : c.children) {
          if (i.name != "info") continue;
          const std::string k = i.attr_or("name"), v = i.attr_or("value");
          if (k == "CPUModel") n.model = v;
          if (!arch.empty()) n.attrs["arch"] = arch;
          if (k == "CPUVendor") n.attrs["vendor"] = v;
          if (k == "CPUModelNumber") n.attrs["modelid"] = v;
          if (k == "CPUFamilyNumber") {
            // NCCL's familyid is base + (extended << 4): family 23 (Zen2) is 143.
            const long f = std::strtol(v.c_str(), nullptr, 10);
            n.attrs["familyid"] = std::to_string(f >= 15 ? 15 + ((f - 15) << 4) : f);
          }
        }
        const int id = new_node(std::move(n), c.line);
        packages.push_back(id);
        t.add_link({cpu, id, LinkKind::Internal, 1, 0, 0, 0, 0});
        walk(c, id, -1, ctx_numa);
      } else if (type == "NUMANode") {
        Node n;
        n.kind = NodeKind::Numa;
        n.index = static_cast<int>(os >= 0 ? os : static_cast<long long>(numas.size()));
        n.numa = n.index;
        n.name = fmt::format("NUMA{}", n.index);
        if (const auto* st = c.attr("subtype")) n.attrs["subtype"] = *st;
        if (const auto* m = c.attr("local_memory")) n.attrs["local_memory"] = *m;
        if (const auto* cs = c.attr("cpuset")) n.attrs["affinity"] = hwloc_to_nccl_mask(*cs);
        if (!arch.empty()) n.attrs["arch"] = arch;
        for (const char* k : {"vendor", "familyid", "modelid"})
          if (t.node(cpu).attrs.count(k)) n.attrs[k] = t.node(cpu).attrs.at(k);
        const int id = new_node(std::move(n), c.line);
        numas.push_back(id);
        os_numa_to_node[os] = id;
        t.add_link({cpu, id, LinkKind::Internal, 1, 0, 0, 0, 0});
        walk(c, id, -1, t.node(id).index);  // 1.x: NUMA nodes are parents of cores and I/O
      } else if (type == "Bridge") {
        if (!io_interesting(c)) continue;
        const bool hostb = c.attr_or("bridge_type") == "0-1" || (!c.attr("pci_busid") && io < 0);
        const PciType pt = pci_type(c.attr_or("pci_type"));
        int id = -1;
        if (!hostb && io >= 0 && t.node(io).kind == NodeKind::PciSwitch && !t.node(io).host_bridge &&
            t.node(io).attrs.count("vendor") && t.node(io).attrs.at("vendor") == fmt::format("0x{:04x}", pt.vendor) &&
            t.node(io).attrs.at("device") == fmt::format("0x{:04x}", pt.device) && pt.vendor != 0x8086 &&
            pt.vendor != 0x1022) {
          id = io;  // a downstream port of the same switch: one switch node
        } else {
          Node n;
          n.kind = NodeKind::PciSwitch;
          n.host_bridge = hostb;
          n.numa = ctx_numa;
          n.pci_bus_id = c.attr_or("pci_busid");
          n.name = hostb ? fmt::format("HostBridge{}", hbs++) : "PCI" + normalize_bus_id(n.pci_bus_id);
          if (!hostb) {
            n.attrs["vendor"] = fmt::format("0x{:04x}", pt.vendor);
            n.attrs["device"] = fmt::format("0x{:04x}", pt.device);
          }
          if (const auto* bp = c.attr("bridge_pci")) n.attrs["bridge_pci"] = *bp;
          id = new_node(std::move(n), c.line);
          Link l{io >= 0 ? io : cpu, id, LinkKind::PCIe, 1, 0, 0, 0, 0};
          guess_pcie(double_attr(c, "pci_link_speed", 0, src), l);
          t.add_link(l);
        }
        walk(c, cpu, id, ctx_numa);
      } else if (type == "PCIDev") {
        const IoRole role = pcidev_role(c);
        if (role == IoRole::None) continue;
        const PciType pt = pci_type(c.attr_or("pci_type"));
        Node n;
        n.kind = role == IoRole::Gpu ? NodeKind::Gpu : role == IoRole::Nic ? NodeKind::Nic : NodeKind::NvSwitch;
        n.pci_bus_id = c.attr_or("pci_busid");
        n.numa = ctx_numa;
        n.attrs["vendor"] = fmt::format("0x{:04x}", pt.vendor);
        n.attrs["device"] = fmt::format("0x{:04x}", pt.device);
        n.attrs["class"] = fmt::format("0x{:04x}00", pt.cls);
        std::string first_os, ofed_name, net_name;
        std::vector<std::string> osdevs;
        for (const auto& i : c.children) {
          if (i.name == "info" && (i.attr_or("name") == "PCIDevice")) n.model = i.attr_or("value");
          if (i.name != "object" || i.attr_or("type") != "OSDev") continue;
          const std::string on = i.attr_or("name");
          osdevs.push_back(on);
          if (first_os.empty()) first_os = on;
          if (starts_with(on, "mlx") || starts_with(on, "hfi") || starts_with(on, "qib") || starts_with(on, "rdmap") ||
              starts_with(on, "usnic"))
            if (ofed_name.empty()) ofed_name = on;
          if (net_name.empty() && !starts_with(on, "cuda") && !starts_with(on, "nvml") && !starts_with(on, "opencl"))
            net_name = on;
          for (const auto& inf : i.children)
            if (inf.name == "info" && inf.attr_or("name") == "GPUModel") n.model = inf.attr_or("value");
          if (i.attr("gp_index")) gp_to_node[int_attr(i, "gp_index", -1, src)] = static_cast<int>(t.nodes().size());
        }
        if (!osdevs.empty()) {
          std::string all;
          for (const auto& o : osdevs) all += (all.empty() ? "" : ",") + o;
          n.attrs["osdevs"] = all;
        }
        if (n.kind == NodeKind::Gpu) {
          n.index = gpus;
          n.name = fmt::format("GPU{}", gpus++);
        } else if (n.kind == NodeKind::Nic) {
          n.index = nics++;
          n.name = !ofed_name.empty()  ? ofed_name
                   : !net_name.empty() ? net_name
                                       : "NIC" + normalize_bus_id(n.pci_bus_id);
        } else {
          n.name = "NVSwitch" + normalize_bus_id(n.pci_bus_id);
        }
        const int id = new_node(std::move(n), c.line);
        if (c.attr("gp_index")) gp_to_node[int_attr(c, "gp_index", -1, src)] = id;
        Link l{io >= 0 ? io : cpu, id, LinkKind::PCIe, 1, 0, 0, 0, 0};
        guess_pcie(double_attr(c, "pci_link_speed", 0, src), l);
        t.add_link(l);
      } else if (type == "OSDev" || type == "Misc" || type == "Core" || type == "PU") {
        continue;  // OSDevs are read with their PCIDev; cores/PUs carry nothing for the graph
      } else {
        walk(c, cpu, io, ctx_numa);  // Group, Die, caches, MemCache, System: transparent
      }
    }
  }

  // distances2hetero/distances2 named NVLinkBandwidth / XGMIBandwidth: NVLink edges.
  void distances(const XmlElement& d) {
    const std::string name = d.attr_or("name");
    if (name != "NVLinkBandwidth" && name != "XGMIBandwidth") return;
    const long long nb = int_attr(d, "nbobjs", -1, src);
    if (nb <= 0 || nb > 4096) fail_at(src, d.line, "expected nbobjs between 1 and 4096 in the distances matrix");
    std::vector<std::string> idx;
    std::vector<double> vals;
    for (const auto& c : d.children) {
      std::stringstream ss(c.text);
      if (c.name == "indexes")
        for (std::string w; ss >> w;) idx.push_back(w);
      else if (c.name == "u64values")
        for (std::string w; ss >> w;) {
          const double v = std::strtod(w.c_str(), nullptr);
          if (!std::isfinite(v))  // "1e999" or "nan" would become an infinite or NaN bandwidth
            fail_at(src, c.line, fmt::format("expected a finite number in <u64values>, found '{}'", w));
          vals.push_back(v);
        }
    }
    const std::size_t n = static_cast<std::size_t>(nb);
    if (idx.size() != n || vals.size() != n * n)
      fail_at(src, d.line,
              fmt::format("distances '{}' declares {} objects but has {} indexes and {} values; expected {} and {}",
                          name, nb, idx.size(), vals.size(), n, n * n));
    std::vector<int> node_of(n, -1);
    for (std::size_t i = 0; i < n; ++i) {
      const auto colon = idx[i].find(':');
      const long long gp = std::strtoll(idx[i].c_str() + (colon == std::string::npos ? 0 : colon + 1), nullptr, 10);
      if (auto it = gp_to_node.find(gp); it != gp_to_node.end())
        node_of[i] = it->second;
      else if (starts_with(idx[i], "Package:") || starts_with(idx[i], "NUMANode:"))
        node_of[i] = -1;
    }
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = i + 1; j < n; ++j) {
        const double v = std::max(vals[i * n + j], vals[j * n + i]);
        if (v <= 0 || node_of[i] < 0 || node_of[j] < 0 || node_of[i] == node_of[j]) continue;
        Link l{node_of[i], node_of[j], LinkKind::NVLink, 0, 0, 0, v / 1000.0, 0};
        t.add_link(l);
      }
  }
};

// hwloc sees the GPU <-> NVSwitch links of an HGX-2 / DGX-2 but not the trunks between its two baseboards: the
// NVSwitches fall into two groups serving disjoint GPU halves, with no NVLink between them. Each switch has 8 ports
// to its counterpart on the other board (NVIDIA's DGX-2 architecture), so join them pairwise with 8 links at the
// per-link bandwidth the file gives, marked assumed.
void join_nvswitch_baseboards(Topology& t) {
  constexpr int kTrunkLinks = 8;
  std::map<std::vector<int>, std::vector<int>> switches_by_gpus;
  double per_link = 0;
  for (int sw : t.nodes_of(NodeKind::NvSwitch)) {
    std::vector<int> gpus;
    for (int li : t.links_of(sw)) {
      const Link& l = t.links()[static_cast<std::size_t>(li)];
      if (l.kind != LinkKind::NVLink) continue;
      const int other = l.a == sw ? l.b : l.a;
      if (t.node(other).kind != NodeKind::Gpu) return;  // switch-to-switch links are described: nothing to infer
      gpus.push_back(other);
      per_link = std::max(per_link, l.bandwidth_gbps / std::max(1, l.count));
    }
    if (gpus.empty()) continue;
    std::sort(gpus.begin(), gpus.end());
    switches_by_gpus[gpus].push_back(sw);
  }
  if (switches_by_gpus.size() != 2 || per_link <= 0) return;
  const auto& a = switches_by_gpus.begin()->second;
  const auto& b = std::next(switches_by_gpus.begin())->second;
  const auto& ga = switches_by_gpus.begin()->first;
  const auto& gb = std::next(switches_by_gpus.begin())->first;
  std::vector<int> common;
  std::set_intersection(ga.begin(), ga.end(), gb.begin(), gb.end(), std::back_inserter(common));
  if (a.size() != b.size() || !common.empty()) return;
  for (std::size_t i = 0; i < a.size(); ++i) {
    Link l{a[i], b[i], LinkKind::NVLink, kTrunkLinks, 0, 0, kTrunkLinks * per_link, 0};
    l.assumed = true;
    t.add_link(l);
  }
}

}  // namespace

Topology parse_hwloc_xml(std::string_view text, const std::string& src) {
  const XmlElement root = detail::parse_xml(text, src, kMaxXmlDepth);
  if (root.name != "topology")
    fail_at(src, root.line, fmt::format("expected the hwloc root element <topology>, found <{}>", root.name));
  HwlocBuilder b(src);
  const std::string version = root.attr_or("version", "1.x");
  if (version != "1.x" && version != "2.0" && version != "3.0" && !starts_with(version, "2.") &&
      !starts_with(version, "3."))
    fail_at(src, root.line,
            fmt::format("unsupported hwloc XML version \"{}\"; expected 2.x or 3.x (or none for 1.x)", version));
  b.t.source_format = "hwloc-xml v" + version;
  b.read_arch(root);  // 3.0 keeps the global infos at topology level
  b.t.source_name = src;
  bool any = false;
  for (const auto& c : root.children) any |= c.name == "object";
  if (!any) fail_at(src, root.line, "expected at least one <object> inside <topology>");
  // A root that is not a Machine (System in 1.x) still gets a host vertex.
  {
    const XmlElement* top = nullptr;
    for (const auto& c : root.children)
      if (c.name == "object") top = &c;
    if (top->attr_or("type") != "Machine") {
      Node n;
      n.kind = NodeKind::Host;
      n.name = "host0";
      b.host = b.t.add_node(std::move(n));
    }
  }
  b.walk(root, b.host, -1, -1);
  if (b.host < 0) fail_at(src, root.line, "expected a Machine object");
  if (b.packages.size() >= 2)
    mesh(b.t, b.packages, LinkKind::InterSocket, src, root.line);
  else if (b.packages.empty() && b.numas.size() >= 2)
    mesh(b.t, b.numas, LinkKind::InterSocket, src, root.line);
  for (const auto& c : root.children)
    if (c.name == "distances2hetero" || c.name == "distances2") b.distances(c);
  join_nvswitch_baseboards(b.t);
  return std::move(b.t);
}

}  // namespace hopwise::topology
