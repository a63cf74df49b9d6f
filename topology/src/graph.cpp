#include "hopwise/topology/graph.h"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <deque>
#include <functional>

#include "hopwise/common/error.h"

namespace hopwise::topology {

namespace {
constexpr std::array<std::string_view, 8> kNodeNames = {"host", "cpu_package", "numa", "pci_switch",
                                                        "gpu",  "nvswitch",    "nic",  "network"};
constexpr std::array<std::string_view, 6> kLinkNames = {"internal", "pcie", "nvlink", "inter_socket", "c2c", "network"};
constexpr std::array<std::string_view, 11> kPathNames = {"LOC", "NVL",  "NVB", "C2C", "PIX", "PXB",
                                                         "PHB", "NODE", "SYS", "NET", "DIS"};

template <typename E, std::size_t N>
E from_name(std::string_view s, const std::array<std::string_view, N>& names, const char* what) {
  for (std::size_t i = 0; i < N; ++i)
    if (names[i] == s) return static_cast<E>(i);
  std::string all;
  for (auto n : names) all += (all.empty() ? "" : ", ") + std::string(n);
  throw InvalidArgument(fmt::format("unknown {} '{}'; use one of: {}", what, s, all));
}
}  // namespace

std::string_view to_string(NodeKind k) { return kNodeNames[static_cast<std::size_t>(k)]; }
std::string_view to_string(LinkKind k) { return kLinkNames[static_cast<std::size_t>(k)]; }
std::string_view to_string(PathClass c) { return kPathNames[static_cast<std::size_t>(c)]; }
NodeKind node_kind_from_string(std::string_view s) { return from_name<NodeKind>(s, kNodeNames, "node kind"); }
LinkKind link_kind_from_string(std::string_view s) { return from_name<LinkKind>(s, kLinkNames, "link kind"); }
PathClass path_class_from_string(std::string_view s) { return from_name<PathClass>(s, kPathNames, "path class"); }

double pcie_bandwidth_gbps(int gen, int width) {
  // GT/s per lane times encoding efficiency, / 8 bits.
  static constexpr double per_lane[] = {0,
                                        2.5 * 0.8 / 8,
                                        5.0 * 0.8 / 8,
                                        8.0 * 128 / 130 / 8,
                                        16.0 * 128 / 130 / 8,
                                        32.0 * 128 / 130 / 8,
                                        64.0 * 242 / 256 / 8};
  if (gen < 1 || gen > 6 || width <= 0) return 0;
  return per_lane[gen] * width;
}

double nvlink_bandwidth_gbps(int count, int per_link_gbps) { return count * static_cast<double>(per_link_gbps); }

std::string normalize_bus_id(std::string_view s) {
  std::string low;
  for (char c : s) low += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  unsigned dom = 0, bus = 0, dev = 0, fn = 0;
  int used = 0;
  if (std::sscanf(low.c_str(), "%x:%x:%x.%x%n", &dom, &bus, &dev, &fn, &used) == 4 &&
      used == static_cast<int>(low.size()))
    return fmt::format("{:04x}:{:02x}:{:02x}.{:x}", dom, bus, dev, fn);
  if (std::sscanf(low.c_str(), "%x:%x.%x%n", &bus, &dev, &fn, &used) == 3 && used == static_cast<int>(low.size()))
    return fmt::format("0000:{:02x}:{:02x}.{:x}", bus, dev, fn);
  return low;
}

int Topology::add_node(Node n) {
  n.id = static_cast<int>(nodes_.size());
  if (!n.pci_bus_id.empty()) n.pci_bus_id = normalize_bus_id(n.pci_bus_id);
  nodes_.push_back(std::move(n));
  adj_.emplace_back();
  return nodes_.back().id;
}

int Topology::add_link(Link l) {
  const int n = static_cast<int>(nodes_.size());
  if (l.a < 0 || l.a >= n || l.b < 0 || l.b >= n || l.a == l.b)
    throw InvalidArgument(
        fmt::format("link {} - {} is invalid in a topology of {} nodes; link two distinct "
                    "existing nodes",
                    l.a, l.b, n));
  links_.push_back(l);
  const int idx = static_cast<int>(links_.size()) - 1;
  adj_[static_cast<std::size_t>(l.a)].push_back(idx);
  adj_[static_cast<std::size_t>(l.b)].push_back(idx);
  return idx;
}

const Node& Topology::node(int id) const {
  if (id < 0 || id >= static_cast<int>(nodes_.size()))
    throw InvalidArgument(fmt::format("node id {} out of range 0..{}", id, static_cast<int>(nodes_.size()) - 1));
  return nodes_[static_cast<std::size_t>(id)];
}
Node& Topology::node(int id) { return const_cast<Node&>(static_cast<const Topology&>(*this).node(id)); }

std::vector<int> Topology::nodes_of(NodeKind k) const {
  std::vector<int> out;
  for (const auto& n : nodes_)
    if (n.kind == k) out.push_back(n.id);
  return out;
}

std::optional<int> Topology::find_by_name(std::string_view name) const {
  for (const auto& n : nodes_)
    if (n.name == name) return n.id;
  return std::nullopt;
}

std::optional<int> Topology::find_by_bus_id(std::string_view bus_id) const {
  const std::string want = normalize_bus_id(bus_id);
  for (const auto& n : nodes_)
    if (!n.pci_bus_id.empty() && n.pci_bus_id == want) return n.id;
  return std::nullopt;
}

std::vector<int> Topology::links_of(int id) const {
  node(id);
  return adj_[static_cast<std::size_t>(id)];
}

void Topology::declare_path_class(int a, int b, PathClass c) {
  node(a);
  node(b);
  declared_[{a, b}] = c;
  declared_[{b, a}] = c;
}

namespace {
// BFS from a to b over links accepted by `use_link`, passing only through intermediate nodes accepted by `via`.
// Returns the link indices of the route (empty if a == b or no route; `found` says which).
std::vector<int> bfs(const Topology& t, const std::vector<std::vector<int>>& adj, int a, int b,
                     const std::function<bool(const Link&)>& use_link, const std::function<bool(const Node&)>& via,
                     bool& found) {
  const std::size_t n = t.nodes().size();
  std::vector<int> prev_link(n, -1);
  std::vector<char> seen(n, 0);
  std::deque<int> q{a};
  seen[static_cast<std::size_t>(a)] = 1;
  found = false;
  while (!q.empty()) {
    const int u = q.front();
    q.pop_front();
    if (u == b) {
      found = true;
      break;
    }
    if (u != a && !via(t.node(u))) continue;
    for (int li : adj[static_cast<std::size_t>(u)]) {
      const Link& l = t.links()[static_cast<std::size_t>(li)];
      if (!use_link(l)) continue;
      const int v = l.a == u ? l.b : l.a;
      if (seen[static_cast<std::size_t>(v)]) continue;
      seen[static_cast<std::size_t>(v)] = 1;
      prev_link[static_cast<std::size_t>(v)] = li;
      q.push_back(v);
    }
  }
  std::vector<int> route;
  if (!found) return route;
  for (int v = b; v != a;) {
    const int li = prev_link[static_cast<std::size_t>(v)];
    route.push_back(li);
    const Link& l = t.links()[static_cast<std::size_t>(li)];
    v = l.a == v ? l.b : l.a;
  }
  std::reverse(route.begin(), route.end());
  return route;
}

bool cpu_side(NodeKind k) { return k == NodeKind::Host || k == NodeKind::CpuPackage || k == NodeKind::Numa; }
}  // namespace

PathInfo Topology::path(int a, int b) const {
  node(a);
  node(b);
  PathInfo p;
  if (a == b) {
    p.cls = PathClass::LOC;
    p.hops = 0;
    p.route = {a};
    return p;
  }
  auto fill = [&](const std::vector<int>& route_links) {
    p.hops = static_cast<int>(route_links.size());
    p.route = {a};
    double bw = 0;
    for (int li : route_links) {
      const Link& l = links_[static_cast<std::size_t>(li)];
      p.route.push_back(p.route.back() == l.a ? l.b : l.a);
      p.latency_us += l.latency_us;
      if (l.kind == LinkKind::Internal) continue;  // containment, not a data link
      if (l.bandwidth_gbps > 0) bw = bw == 0 ? l.bandwidth_gbps : std::min(bw, l.bandwidth_gbps);
    }
    p.bottleneck_gbps = bw;
  };
  auto nv_link = [](const Link& l) { return l.kind == LinkKind::NVLink; };
  bool found = false;
  std::optional<PathClass> cls;
  // 1. NVLink only, through NVSwitches: NVL. 2. NVLink through other GPUs: NVB.
  auto r = bfs(
      *this, adj_, a, b, nv_link, [](const Node& n) { return n.kind == NodeKind::NvSwitch; }, found);
  if (found) {
    cls = PathClass::NVL;
  } else {
    r = bfs(
        *this, adj_, a, b, nv_link,
        [](const Node& n) { return n.kind == NodeKind::NvSwitch || n.kind == NodeKind::Gpu; }, found);
    if (found) cls = PathClass::NVB;
  }
  // 3. Within one host over PCIe and the CPU side (no NVLink, no network).
  if (!found) {
    r = bfs(
        *this, adj_, a, b, [](const Link& l) { return l.kind != LinkKind::NVLink && l.kind != LinkKind::Network; },
        [](const Node& n) { return n.kind != NodeKind::Gpu && n.kind != NodeKind::Nic; }, found);
    if (found) {
      bool inter = false, c2c = false;
      int host_bridges = 0, cpus = 0, switches = 0;
      std::vector<int> numas;
      for (int li : r) {
        const Link& l = links_[static_cast<std::size_t>(li)];
        inter |= l.kind == LinkKind::InterSocket;
        c2c |= l.kind == LinkKind::C2C;
      }
      fill(r);
      for (std::size_t i = 1; i + 1 < p.route.size(); ++i) {
        const Node& n = nodes_[static_cast<std::size_t>(p.route[i])];
        if (n.kind == NodeKind::Host) inter = true;
        if (cpu_side(n.kind)) ++cpus;
        if (n.kind == NodeKind::Numa && std::find(numas.begin(), numas.end(), n.id) == numas.end())
          numas.push_back(n.id);
        if (n.kind == NodeKind::PciSwitch) (n.host_bridge ? host_bridges : switches)++;
      }
      if (inter || numas.size() >= 2)
        cls = PathClass::SYS;
      else if (c2c)
        cls = PathClass::C2C;
      else if (cpus > 0)
        cls = host_bridges >= 2 ? PathClass::NODE : PathClass::PHB;
      else if (host_bridges > 0)
        cls = PathClass::PHB;
      else
        cls = switches <= 1 ? PathClass::PIX : PathClass::PXB;
    }
  }
  // 4. Anything, network included: NET.
  if (!found) {
    r = bfs(
        *this, adj_, a, b, [](const Link&) { return true; }, [](const Node&) { return true; }, found);
    if (found) cls = PathClass::NET;
  }
  if (found && p.route.empty()) fill(r);
  if (cls) p.cls = *cls;
  if (auto it = declared_.find({a, b}); it != declared_.end()) {
    p.cls = it->second;
    if (p.hops < 0) p.hops = p.cls == PathClass::LOC ? 0 : 1;
  }
  return p;
}

}  // namespace hopwise::topology
