// Live discovery through hwloc and sysfs (GPUs: gpu_probe.cpp).
#include "hopwise/topology/discover.h"

#include <fmt/core.h>
#include <hwloc.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>

#include "hopwise/common/error.h"
#include "hopwise/topology/formats.h"

namespace hopwise::topology {

namespace {

struct HwlocTopology {
  hwloc_topology_t t = nullptr;
  // with_io: PCI bridges, GPUs, NICs and their OS devices (eth0, mlx5_0, nvml0), what the planner needs; without,
  // CPUs and memory only (enough for a binding, and much cheaper to load).
  explicit HwlocTopology(bool with_io) {
    if (hwloc_topology_init(&t) != 0) throw Error("hwloc_topology_init failed; is libhwloc installed correctly?");
    if (with_io) hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_load(t) != 0) {
      hwloc_topology_destroy(t);
      throw Error("hwloc_topology_load failed; set HOPWISE_TOPO_FILE to a topology file instead of discovering");
    }
  }
  ~HwlocTopology() { hwloc_topology_destroy(t); }
  HwlocTopology(const HwlocTopology&) = delete;
  HwlocTopology& operator=(const HwlocTopology&) = delete;
};

std::string bitmap_list(hwloc_const_bitmap_t b) {
  char* s = nullptr;
  if (hwloc_bitmap_list_asprintf(&s, b) < 0 || !s) return {};
  std::string out(s);
  std::free(s);
  return out;
}

std::string read_first_line(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  if (f) std::getline(f, line);
  return line;
}

std::string local_hostname() {
  char buf[HOST_NAME_MAX + 1] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

}  // namespace

std::vector<int> parse_cpulist(const std::string& list) {
  std::vector<int> cpus;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) {
    if (item.empty()) continue;
    const auto dash = item.find('-');
    char* end = nullptr;
    const long lo = std::strtol(item.c_str(), &end, 10);
    long hi = lo;
    bool ok = end != item.c_str() && lo >= 0;
    if (dash != std::string::npos) {
      ok = ok && end == item.c_str() + dash;
      const char* h = item.c_str() + dash + 1;
      hi = std::strtol(h, &end, 10);
      ok = ok && end != h;
    }
    ok = ok && *end == '\0' && hi >= lo && hi < (1 << 20);
    if (!ok)
      throw InvalidArgument(fmt::format("cpu list '{}': '{}' is not a CPU number or a range like 0-3", list, item));
    for (long c = lo; c <= hi; ++c) cpus.push_back(static_cast<int>(c));
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::string format_cpulist(const std::vector<int>& cpus) {
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += j == i ? std::to_string(cpus[i]) : fmt::format("{}-{}", cpus[i], cpus[j]);
    i = j + 1;
  }
  return out;
}

Topology discover_hwloc() {
  HwlocTopology h(true);
  char* xml = nullptr;
  int len = 0;
  if (hwloc_topology_export_xmlbuffer(h.t, &xml, &len, 0) != 0 || !xml)
    throw Error("hwloc could not export the discovered topology as XML");
  // The buffer length counts the terminating NUL.
  const std::string text(xml, static_cast<std::size_t>(len > 0 ? len - 1 : 0));
  hwloc_free_xmlbuffer(h.t, xml);
  Topology t = parse_topology(text, "hwloc (this machine)");
  // CPU sets of NUMA nodes and packages, so that a rank's binding can be placed on one.
  for (hwloc_obj_type_t type : {HWLOC_OBJ_NUMANODE, HWLOC_OBJ_PACKAGE}) {
    const NodeKind kind = type == HWLOC_OBJ_NUMANODE ? NodeKind::Numa : NodeKind::CpuPackage;
    for (hwloc_obj_t o = hwloc_get_next_obj_by_type(h.t, type, nullptr); o;
         o = hwloc_get_next_obj_by_type(h.t, type, o))
      for (int id : t.nodes_of(kind))
        if (t.node(id).index == static_cast<int>(o->os_index) && o->cpuset)
          t.node(id).cpu_affinity = bitmap_list(o->cpuset);
  }
  for (int id : t.nodes_of(NodeKind::Host)) t.node(id).name = local_hostname();
  t.source_format = "hwloc-live";
  t.source_name = local_hostname();
  return t;
}

void add_nic_speeds(Topology& t, const std::string& sysfs_root) {
  for (int id : t.nodes_of(NodeKind::Nic)) {
    Node& n = t.node(id);
    std::vector<std::string> osdevs;
    std::stringstream ss(n.attrs.count("osdevs") ? n.attrs.at("osdevs") : n.name);
    for (std::string o; std::getline(ss, o, ',');) osdevs.push_back(o);
    double best = 0;
    for (const auto& o : osdevs) {
      // Ethernet (and IPoIB): Mb/s, or -1 / an error when the link is down or virtual.
      const std::string mbps = read_first_line(sysfs_root + "/class/net/" + o + "/speed");
      if (!mbps.empty() && std::isdigit(static_cast<unsigned char>(mbps[0])))
        best = std::max(best, std::strtod(mbps.c_str(), nullptr) / 1000.0);
      // InfiniBand / RoCE: "100 Gb/sec (4X EDR)" per port.
      const std::string rate = read_first_line(sysfs_root + "/class/infiniband/" + o + "/ports/1/rate");
      if (!rate.empty() && std::isdigit(static_cast<unsigned char>(rate[0])))
        best = std::max(best, std::strtod(rate.c_str(), nullptr));
    }
    if (best > 0) n.speed_gbps = best;
  }
}

std::string process_cpus() {
  HwlocTopology h(false);
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  std::string out;
  if (hwloc_get_cpubind(h.t, set, HWLOC_CPUBIND_PROCESS) == 0) out = bitmap_list(set);
  hwloc_bitmap_free(set);
  if (out.empty()) out = bitmap_list(hwloc_topology_get_allowed_cpuset(h.t));
  return out;
}

Topology discover_machine(GpuProbe* probe) {
  Topology t = discover_hwloc();
  add_nic_speeds(t);
  const GpuProbe p = add_gpus(t);
  if (probe) *probe = p;
  return t;
}

}  // namespace hopwise::topology
