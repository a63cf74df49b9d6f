// Readers: format detection, hwloc XML, NCCL/RCCL topology XML, NCCL graph XML, `nvidia-smi topo -m`.
#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "hopwise/common/error.h"
#include "hopwise/topology/formats.h"
#include "xml.h"

namespace hopwise::topology {

using detail::fail_at;
using detail::XmlElement;

namespace {

std::string lower(std::string_view s) {
  std::string o(s);
  for (auto& c : o) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return o;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// Integer attribute; throws with the element's line when present but not a number.
long long int_attr(const XmlElement& e, std::string_view key, long long fallback, const std::string& src) {
  const std::string* v = e.attr(key);
  if (!v || v->empty()) return fallback;
  char* end = nullptr;
  const long long x = std::strtoll(v->c_str(), &end, 0);
  if (*end != '\0')
    fail_at(src, e.line, fmt::format("expected an integer for attribute {}=\"{}\" of <{}>", key, *v, e.name));
  return x;
}

// Integer attribute within [lo, hi] (link counts: an int cast of anything larger would be undefined or wrap).
int bounded_int_attr(const XmlElement& e, std::string_view key, int fallback, int lo, int hi, const std::string& src) {
  const long long x = int_attr(e, key, fallback, src);
  if (x < lo || x > hi)
    fail_at(src, e.line,
            fmt::format("attribute {}=\"{}\" of <{}> is out of range; expected {} to {}", key, x, e.name, lo, hi));
  return static_cast<int>(x);
}

double double_attr(const XmlElement& e, std::string_view key, double fallback, const std::string& src) {
  const std::string* v = e.attr(key);
  if (!v || v->empty()) return fallback;
  char* end = nullptr;
  const double x = std::strtod(v->c_str(), &end);
  if (*end != '\0' || !std::isfinite(x))
    fail_at(src, e.line, fmt::format("expected a number for attribute {}=\"{}\" of <{}>", key, *v, e.name));
  return x;
}

void check_nodes(const Topology& t, const std::string& src, int line) {
  if (static_cast<int>(t.nodes().size()) > kMaxNodes)
    fail_at(src, line, fmt::format("more than {} topology nodes; expected a single machine's topology", kMaxNodes));
}

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

// Inter-socket bandwidth in GB/s as NCCL picks it from the CPU (topo.h: BDW 6, SKL 10, SRP 22, ERP 40, AMD 16,
// ARM 6, POWER9 32); 0 when the attributes do not say.
double inter_socket_gbps(const Node& n) {
  auto get = [&](const char* k) { return n.attrs.count(k) ? n.attrs.at(k) : std::string(); };
  const std::string arch = get("arch"), vendor = get("vendor");
  const long model = std::strtol(get("modelid").c_str(), nullptr, 10);
  if (arch == "ppc64") return 32;
  if (arch == "arm64") return 6;
  if (vendor == "AuthenticAMD" || vendor == "AMD" || vendor == "HygonGenuine") return 16;
  if (vendor == "GenuineIntel") {
    if (model == 207) return 40;
    if (model == 143) return 22;
    if (model >= 85) return 10;
    return 6;
  }
  return 0;
}

// Sockets / NUMA nodes are fully meshed: k of them make k(k-1)/2 links, so k is bounded (a 100 KB file of empty
// <cpu/> elements would otherwise ask for billions). Real machines have at most a few hundred.
constexpr std::size_t kMaxMeshed = 1024;

void mesh(Topology& t, const std::vector<int>& ids, LinkKind kind, const std::string& src, int line) {
  if (ids.size() > kMaxMeshed)
    fail_at(src, line,
            fmt::format("{} sockets/NUMA nodes on one host, over the limit of {}; expected one machine's topology",
                        ids.size(), kMaxMeshed));
  for (std::size_t i = 0; i < ids.size(); ++i)
    for (std::size_t j = i + 1; j < ids.size(); ++j) {
      const double bw = std::min(inter_socket_gbps(t.node(ids[i])), inter_socket_gbps(t.node(ids[j])));
      t.add_link({ids[i], ids[j], kind, 1, 0, 0, bw, 0});
    }
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

// ---------------------------------------------------------------------------------------------- hwloc XML

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
  return std::move(b.t);
}

// ---------------------------------------------------------------------------------------------- NCCL XML

namespace {

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

// ---------------------------------------------------------------------------------------------- nvidia-smi

Topology parse_nvidia_smi(std::string_view text, const std::string& src) {
  std::vector<std::string> lines;
  {
    std::string cur;
    for (char c : text) {
      if (c == '\n') {
        lines.push_back(cur);
        cur.clear();
      } else if (c != '\r') {
        cur += c;
      }
    }
    if (!cur.empty()) lines.push_back(cur);
  }
  auto tokens = [](const std::string& l) {
    std::vector<std::string> out;
    std::stringstream ss(l);
    for (std::string w; ss >> w;) out.push_back(w);
    return out;
  };
  // Header: the first line whose first token is GPU0.
  std::size_t hi = 0;
  std::vector<std::string> cols;
  bool has_cpu = false, has_numa = false, has_gpu_numa = false;
  for (; hi < lines.size(); ++hi) {
    auto tk = tokens(lines[hi]);
    if (!tk.empty() && tk[0] == "GPU0") {
      for (std::size_t k = 0; k < tk.size(); ++k) {
        if (tk[k] == "CPU" && k + 1 < tk.size() && tk[k + 1] == "Affinity")
          has_cpu = true, ++k;
        else if (tk[k] == "NUMA" && k + 1 < tk.size() && tk[k + 1] == "Affinity")
          has_numa = true, ++k;
        else if (tk[k] == "GPU" && k + 2 < tk.size() && tk[k + 1] == "NUMA")
          has_gpu_numa = true, k += 2;
        else if (!has_cpu && !has_numa)
          cols.push_back(tk[k]);
        else
          fail_at(src, static_cast<int>(hi) + 1, fmt::format("unexpected header column '{}'", tk[k]));
      }
      break;
    }
    const std::string trimmed = tk.empty() ? "" : tk[0];
    if (!tk.empty() && trimmed[0] != '#' && lines[hi].find("nvidia-smi") == std::string::npos)
      fail_at(src, static_cast<int>(hi) + 1,
              "expected the `nvidia-smi topo -m` header row starting with GPU0 (after optional comment lines)");
  }
  if (hi == lines.size()) fail_at(src, static_cast<int>(lines.size()), "expected a header row starting with GPU0");
  const std::size_t n = cols.size();
  if (n > 4096) fail_at(src, static_cast<int>(hi) + 1, "more than 4096 devices in the matrix");
  Topology t;
  t.source_format = "nvidia-smi";
  t.source_name = src;
  Node h;
  h.kind = NodeKind::Host;
  h.name = "host0";
  const int host = t.add_node(std::move(h));
  std::vector<int> ids(n, -1);
  std::vector<std::vector<std::string>> cell(n);
  std::vector<int> numa_of(n, -1);
  std::vector<std::string> aff(n);
  std::size_t li = hi + 1;
  std::size_t rows = 0;
  for (; li < lines.size() && rows < n; ++li) {
    auto tk = tokens(lines[li]);
    if (tk.empty()) break;
    const int line = static_cast<int>(li) + 1;
    const auto it = std::find(cols.begin(), cols.end(), tk[0]);
    if (it == cols.end())
      fail_at(src, line,
              fmt::format("expected a matrix row starting with one of the header devices, found '{}'", tk[0]));
    const std::size_t r = static_cast<std::size_t>(it - cols.begin());
    if (!cell[r].empty()) fail_at(src, line, fmt::format("row '{}' appears twice", tk[0]));
    const bool gpu_row = starts_with(tk[0], "GPU");
    const std::size_t extra = gpu_row ? (has_cpu ? 1u : 0u) + (has_numa ? 1u : 0u) + (has_gpu_numa ? 1u : 0u) : 0u;
    if (tk.size() != 1 + n + extra && !(gpu_row && tk.size() == 1 + n))
      fail_at(src, line,
              fmt::format("row '{}' has {} fields; expected the device name, {} matrix cells and {} affinity columns",
                          tk[0], tk.size(), n, extra));
    cell[r].assign(tk.begin() + 1, tk.begin() + 1 + static_cast<long>(n));
    std::size_t k = 1 + n;
    if (gpu_row && tk.size() > k) {
      if (has_cpu) aff[r] = tk[k++];
      if (has_numa) {
        char* end = nullptr;
        const long v = std::strtol(tk[k].c_str(), &end, 10);
        if (*end == '\0') numa_of[r] = static_cast<int>(v);
        ++k;
      }
    }
    for (std::size_t c = 0; c < n; ++c) {
      const std::string& v = cell[r][c];
      const bool ok = v == "X" || v == "PIX" || v == "PXB" || v == "PHB" || v == "NODE" || v == "SYS" ||
                      (starts_with(v, "NV") && v.size() > 2 && v.size() <= 6 &&  // NV1..NV9999: atoi must not overflow
                       std::all_of(v.begin() + 2, v.end(), ::isdigit));
      if (!ok)
        fail_at(src, line,
                fmt::format("unknown cell '{}' in row '{}'; expected X, NV#, PIX, PXB, PHB, NODE or SYS", v, tk[0]));
      if ((c == r) != (v == "X"))
        fail_at(src, line, fmt::format("row '{}' column '{}': expected X exactly on the diagonal", tk[0], cols[c]));
    }
    ++rows;
  }
  if (rows < n) fail_at(src, static_cast<int>(li) + 1, fmt::format("expected {} matrix rows, found {}", n, rows));
  // NIC legend: "  NIC0: mlx5_0".
  std::map<std::string, std::string> legend;
  for (; li < lines.size(); ++li) {
    auto tk = tokens(lines[li]);
    if (tk.size() == 2 && tk[0].size() > 1 && tk[0].back() == ':' && starts_with(tk[0], "NIC"))
      legend[tk[0].substr(0, tk[0].size() - 1)] = tk[1];
  }
  // NUMA nodes.
  std::map<int, int> numa_node;
  for (int v : numa_of)
    if (v >= 0 && !numa_node.count(v)) {
      Node nn;
      nn.kind = NodeKind::Numa;
      nn.index = nn.numa = v;
      nn.name = fmt::format("NUMA{}", v);
      numa_node[v] = t.add_node(std::move(nn));
      t.add_link({host, numa_node[v], LinkKind::Internal, 1, 0, 0, 0, 0});
    }
  int gpus = 0, nics = 0, network = -1;
  for (std::size_t r = 0; r < n; ++r) {
    Node d;
    const bool gpu = starts_with(cols[r], "GPU");
    d.kind = gpu ? NodeKind::Gpu : NodeKind::Nic;
    d.index = gpu ? gpus++ : nics++;
    d.name = legend.count(cols[r]) ? legend[cols[r]] : cols[r];
    if (d.name != cols[r]) d.attrs["column"] = cols[r];
    d.cpu_affinity = aff[r] == "N/A" ? "" : aff[r];
    d.numa = numa_of[r];
    ids[r] = t.add_node(std::move(d));
  }
  // NICs take the NUMA node of the closest GPU.
  for (std::size_t r = 0; r < n; ++r) {
    if (t.node(ids[r]).kind != NodeKind::Nic) continue;
    int best = static_cast<int>(PathClass::SYS), numa = -1;
    for (std::size_t g = 0; g < n; ++g) {
      if (t.node(ids[g]).kind != NodeKind::Gpu || cell[r][g] == "X") continue;
      const int c = starts_with(cell[r][g], "NV") ? static_cast<int>(PathClass::NVL)
                                                  : static_cast<int>(path_class_from_string(cell[r][g]));
      if (c < best) best = c, numa = numa_of[g];
    }
    t.node(ids[r]).numa = numa;
  }
  for (std::size_t r = 0; r < n; ++r) {
    const Node& d = t.node(ids[r]);
    const int parent = d.numa >= 0 && numa_node.count(d.numa) ? numa_node[d.numa] : host;
    t.add_link({parent, ids[r], LinkKind::PCIe, 1, 0, 0, 0, 0});
    if (d.kind == NodeKind::Nic) {
      if (network < 0) {
        Node nw;
        nw.kind = NodeKind::Network;
        nw.name = "network0";
        network = t.add_node(std::move(nw));
      }
      t.add_link({ids[r], network, LinkKind::Network, 1, 0, 0, 0, 0});
    }
  }
  std::vector<int> numas;
  for (auto& [k, v] : numa_node) numas.push_back(v);
  if (numas.size() >= 2) mesh(t, numas, LinkKind::InterSocket, src, static_cast<int>(hi) + 1);
  for (std::size_t r = 0; r < n; ++r)
    for (std::size_t c = 0; c < n; ++c) {
      if (r == c) continue;
      const std::string& v = cell[r][c];
      if (v != cell[c][r])
        fail_at(src, static_cast<int>(hi + 2 + r),
                fmt::format("matrix is not symmetric: {}->{} is {} but {}->{} is {}", cols[r], cols[c], v, cols[c],
                            cols[r], cell[c][r]));
      if (starts_with(v, "NV")) {
        t.declare_path_class(ids[r], ids[c], PathClass::NVL);
        if (r < c) {
          const int count = std::atoi(v.c_str() + 2);
          t.add_link({ids[r], ids[c], LinkKind::NVLink, count, 0, 0, nvlink_bandwidth_gbps(count), 0});
        }
      } else {
        t.declare_path_class(ids[r], ids[c], path_class_from_string(v));
      }
    }
  return t;
}

// ---------------------------------------------------------------------------------------------- dispatch

std::string_view to_string(TopologyFormat f) {
  switch (f) {
    case TopologyFormat::HwlocXml:
      return "hwloc-xml";
    case TopologyFormat::NcclXml:
      return "nccl-xml";
    case TopologyFormat::NcclGraphXml:
      return "nccl-graph-xml";
    case TopologyFormat::NvidiaSmi:
      return "nvidia-smi";
    case TopologyFormat::Json:
      return "json";
    default:
      return "unknown";
  }
}

TopologyFormat detect_format(std::string_view text) {
  std::size_t i = 0;
  if (text.substr(0, 3) == "\xEF\xBB\xBF") i = 3;
  // Skip whitespace, XML declaration, comments and DOCTYPE to find the root element name.
  for (;;) {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    if (text.substr(i, 4) == "<!--") {
      const auto e = text.find("-->", i);
      if (e == std::string_view::npos) return TopologyFormat::Unknown;
      i = e + 3;
    } else if (text.substr(i, 2) == "<?" || text.substr(i, 9) == "<!DOCTYPE") {
      auto e = text.find('>', i);
      const auto bracket = text.find('[', i);
      if (text[i + 1] == '!' && bracket < e) {  // internal subset: skipped here, rejected by the XML reader
        e = text.find("]>", bracket);
        if (e != std::string_view::npos) ++e;
      }
      if (e == std::string_view::npos) return TopologyFormat::Unknown;
      i = e + 1;
    } else {
      break;
    }
  }
  if (i >= text.size()) return TopologyFormat::Unknown;
  if (text[i] == '{') return TopologyFormat::Json;
  if (text[i] == '<') {
    std::size_t e = i + 1;
    while (e < text.size() && (std::isalnum(static_cast<unsigned char>(text[e])) || text[e] == '_')) ++e;
    const std::string_view name = text.substr(i + 1, e - i - 1);
    if (name == "topology") return TopologyFormat::HwlocXml;
    if (name == "system") return TopologyFormat::NcclXml;
    if (name == "graphs") return TopologyFormat::NcclGraphXml;
    return TopologyFormat::Unknown;
  }
  // nvidia-smi: a line whose first token is GPU0 within the first lines.
  std::stringstream ss{std::string(text.substr(i, 64 * 1024))};
  int n = 0;
  for (std::string l; std::getline(ss, l) && n < 10; ++n) {
    std::stringstream ls(l);
    std::string first;
    ls >> first;
    if (first == "GPU0") return TopologyFormat::NvidiaSmi;
  }
  return TopologyFormat::Unknown;
}

Topology parse_topology(std::string_view text, const std::string& source) {
  if (text.size() > kMaxFileBytes)
    throw InvalidArgument(fmt::format("{}:1: input is {} bytes, over the limit of {} bytes for a topology file", source,
                                      text.size(), kMaxFileBytes));
  if (text.find('\0') != std::string_view::npos)
    throw InvalidArgument(fmt::format("{}:1: input contains NUL bytes; expected a text topology file", source));
  switch (detect_format(text)) {
    case TopologyFormat::HwlocXml:
      return parse_hwloc_xml(text, source);
    case TopologyFormat::NcclXml:
    case TopologyFormat::NcclGraphXml:
      return parse_nccl_xml(text, source);
    case TopologyFormat::NvidiaSmi:
      return parse_nvidia_smi(text, source);
    case TopologyFormat::Json:
      return parse_json(text, source);
    default:
      break;
  }
  // Say where the first unexpected content sits.
  int line = 1;
  std::size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) line += text[i++] == '\n';
  throw InvalidArgument(
      fmt::format("{}:{}: unrecognised topology format; expected hwloc XML (<topology>), NCCL XML "
                  "(<system version=\"1\">), an `nvidia-smi topo -m` matrix or hopwise JSON",
                  source, line));
}

Topology load_topology(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw InvalidArgument(fmt::format("{}: can not open the topology file; check the path", path));
  f.seekg(0, std::ios::end);
  const auto size = f.tellg();
  if (size < 0) throw InvalidArgument(fmt::format("{}: can not read the topology file", path));
  if (static_cast<std::size_t>(size) > kMaxFileBytes)
    throw InvalidArgument(fmt::format("{}:1: file is {} bytes, over the limit of {} bytes for a topology file", path,
                                      static_cast<long long>(size), kMaxFileBytes));
  f.seekg(0);
  std::string text(static_cast<std::size_t>(size), '\0');
  f.read(text.data(), size);
  if (!f) throw InvalidArgument(fmt::format("{}: read error", path));
  return parse_topology(text, path);
}

void save_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  if (!f) throw InvalidArgument(fmt::format("{}: can not write the file; check the directory exists", path));
}

}  // namespace hopwise::topology
