// The hardware-topology model: a small undirected multigraph of devices (GPUs, NICs, PCI switches, CPU
// packages, NUMA nodes, NVSwitches, hosts, networks) and the links between them, plus path queries that classify
// the route between two devices the way NCCL (LOC, NVL, NVB, C2C, PIX, PXB, PHB, SYS, NET) and
// `nvidia-smi topo -m` (which adds NODE) do.
//
// Why not Boost.Graph: a machine is a few hundred vertices at most, and a cluster is machines joined through one
// network vertex that the planner never searches across; the only algorithms needed are breadth-first searches over
// link subsets. A plain adjacency list keeps topology/ free of a heavy header dependency (and of its ABI in the
// installed headers). Vertices are dense ints 0..n-1, so swapping in boost::adjacency_list is mechanical if ever
// needed.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hopwise::topology {

enum class NodeKind {
  Host,        // one machine
  CpuPackage,  // a socket (hwloc Package)
  Numa,        // a NUMA node (NCCL's <cpu> element is one of these)
  PciSwitch,   // a PCI switch, root port or host bridge (host_bridge = true)
  Gpu,
  NvSwitch,
  Nic,
  Network,  // the fabric a NIC attaches to (IB, Ethernet, EFA); joins hosts
};

enum class LinkKind {
  Internal,  // containment on the CPU side: host - package - NUMA node
  PCIe,
  NVLink,       // also AMD xGMI / Infinity Fabric (Node attribute "fabric" says which)
  InterSocket,  // QPI/UPI/Infinity Fabric between packages or NUMA nodes
  C2C,          // NVLink-C2C GPU <-> CPU (Grace)
  Network,      // NIC <-> network
};

// Path classes, best to worst. NODE is nvidia-smi's "across host bridges within one NUMA node".
enum class PathClass { LOC, NVL, NVB, C2C, PIX, PXB, PHB, NODE, SYS, NET, DIS };

std::string_view to_string(NodeKind k);
std::string_view to_string(LinkKind k);
std::string_view to_string(PathClass c);
// Inverse of to_string; throws InvalidArgument naming the accepted values.
NodeKind node_kind_from_string(std::string_view s);
LinkKind link_kind_from_string(std::string_view s);
PathClass path_class_from_string(std::string_view s);

struct Node {
  int id = -1;  // index in Topology::nodes()
  NodeKind kind = NodeKind::Host;
  std::string name;                          // "GPU0", "mlx5_0", "NUMA1", "Package0", "0000:0c:00.0" for switches
  std::string pci_bus_id;                    // "dddd:bb:dd.f" lowercase, empty if none
  int numa = -1;                             // NUMA affinity (NUMA node os index), -1 unknown
  int index = -1;                            // os index (package/NUMA), CUDA/NCCL device index for GPUs and NICs
  std::string cpu_affinity;                  // Linux cpulist ("0-19,40-59") when known
  std::string model;                         // GPU model, CPU model, NIC model
  double speed_gbps = 0;                     // NIC port speed in Gb/s (bits), 0 unknown
  bool host_bridge = false;                  // PciSwitch only: a PCI host bridge / root complex
  std::map<std::string, std::string> attrs;  // everything else worth keeping (vendor, device, class, ...)
};

struct Link {
  int a = -1, b = -1;
  LinkKind kind = LinkKind::PCIe;
  int count = 1;              // NVLink/xGMI lanes bonded, 1 otherwise
  int pcie_gen = 0;           // 1..6, 0 unknown
  int pcie_width = 0;         // lanes, 0 unknown
  double bandwidth_gbps = 0;  // GB/s (bytes) one direction; 0 unknown
  double latency_us = 0;      // 0 unknown
  bool assumed = false;       // bandwidth inferred by a reader (e.g. DGX-2 baseboard trunks), not read from the file
};

struct PathInfo {
  PathClass cls = PathClass::DIS;
  int hops = -1;               // links on the route found, -1 when no route is in the graph
  double bottleneck_gbps = 0;  // smallest known link bandwidth on the route (0 unknown)
  double latency_us = 0;       // sum of the known link latencies on the route
  std::vector<int> route;      // node ids from source to destination (empty if none)
};

// GB/s of one PCIe link: gen 1..6 at `width` lanes (after encoding overhead).
double pcie_bandwidth_gbps(int gen, int width);
// GB/s of `count` NVLinks at `per_link_gbps` each (25 GB/s per direction for NVLink 2-4; used for nvidia-smi's
// NV#, which names no GPU generation). The NCCL reader uses NCCL's per-SM figures instead (20 for SM70/80, 20.6 for
// SM90, 40 for SM100), xGMI 50 per link; the hwloc reader takes NVLinkBandwidth/XGMIBandwidth matrices (MB/s).
double nvlink_bandwidth_gbps(int count, int per_link_gbps = 25);

// Bandwidth (GB/s, one direction) from a to b over NVLink through NVSwitches only: a max flow, so that parallel
// links, bonded lanes and NVSwitch planes add up (a DGX-2 GPU has six 25 GB/s links, one per switch plane: 150).
// `assumed` is set when the flow crosses a link whose bandwidth was inferred. 0 when there is no such route.
struct NvlinkFlow {
  double gbps = 0;
  bool assumed = false;
};
class Topology;
NvlinkFlow nvlink_flow(const Topology& t, int a, int b);

class Topology {
 public:
  int add_node(Node n);  // assigns n.id; returns it
  int add_link(Link l);  // throws InvalidArgument on unknown endpoints or a self link; returns the link index
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Link>& links() const { return links_; }
  const Node& node(int id) const;
  Node& node(int id);
  std::vector<int> nodes_of(NodeKind k) const;  // ids in insertion order
  int count(NodeKind k) const { return static_cast<int>(nodes_of(k).size()); }
  std::optional<int> find_by_name(std::string_view name) const;
  std::optional<int> find_by_bus_id(std::string_view bus_id) const;  // compares normalised bus ids
  std::vector<int> links_of(int id) const;                           // link indices touching node id

  // Path between two nodes. Uses a declared class when the source file stated one (nvidia-smi matrix),
  // otherwise classifies the shortest route found in the graph.
  PathInfo path(int a, int b) const;

  // The class a file stated for a pair (both orders are stored). Used by the nvidia-smi parser.
  void declare_path_class(int a, int b, PathClass c);
  const std::map<std::pair<int, int>, PathClass>& declared_path_classes() const { return declared_; }

  // Where the model came from ("hwloc-xml v2.0", "nccl-xml v1", "nvidia-smi", "json v1").
  std::string source_format;
  std::string source_name;

 private:
  std::vector<Node> nodes_;
  std::vector<Link> links_;
  std::vector<std::vector<int>> adj_;  // node -> link indices
  std::map<std::pair<int, int>, PathClass> declared_;
};

// "0000:0C:00.0" / "c:0.0" / "0000:0c:00" -> "0000:0c:00.0". Leaves strings it cannot read unchanged (lowercased).
std::string normalize_bus_id(std::string_view s);

}  // namespace hopwise::topology
