// Assembling the job's cluster graph from the ranks' views.
#include "hopwise/topology/cluster.h"

#include <fmt/core.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "hopwise/common/error.h"
#include "hopwise/topology/discover.h"
#include "hopwise/topology/formats.h"

namespace hopwise::topology {

namespace {

constexpr const char* kSchema = "hopwise-rank-view";

struct Received {
  RankView view;
  std::string machine;  // JSON, empty when the rank sent the header only
};

Received decode(const std::string& bytes, int index) {
  const auto nl = bytes.find('\n');
  const std::string head = bytes.substr(0, nl);
  Received r;
  try {
    const auto j = nlohmann::json::parse(head);
    if (j.value("schema", "") != kSchema || j.value("version", 0) != 1)
      throw InvalidArgument("its header is not schema hopwise-rank-view version 1");
    r.view.rank = j.at("rank").get<int>();
    r.view.host = j.at("host").get<std::string>();
    r.view.cpus = j.value("cpus", "");
    r.view.gpu_bus = j.value("gpu", "");
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(
        fmt::format("topology view {} does not parse ({}); every rank must run the same hopwise", index, e.what()));
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("topology view {}: {}; every rank must run the same hopwise", index, e.what()));
  }
  if (r.view.rank != index)
    throw InvalidArgument(
        fmt::format("topology view {} says it is from rank {}; views must be in rank order", index, r.view.rank));
  if (r.view.host.empty()) throw InvalidArgument(fmt::format("topology view {} names no host", index));
  if (nl != std::string::npos) r.machine = bytes.substr(nl + 1);
  return r;
}

// Copies `m` into `t`, renaming its host vertex; returns the new ids of m's nodes.
std::vector<int> append_machine(Topology& t, const Topology& m, const std::string& host, bool prefix) {
  std::vector<int> ids(m.nodes().size());
  bool has_host = false;
  for (const Node& n : m.nodes()) {
    Node c = n;
    if (n.kind == NodeKind::Host) {
      c.name = host;
      has_host = true;
    } else if (prefix) {
      c.name = host + ":" + n.name;
    }
    ids[static_cast<std::size_t>(n.id)] = t.add_node(std::move(c));
  }
  for (Link l : m.links()) {
    l.a = ids[static_cast<std::size_t>(l.a)];
    l.b = ids[static_cast<std::size_t>(l.b)];
    t.add_link(l);
  }
  for (const auto& [ends, cls] : m.declared_path_classes())
    t.declare_path_class(ids[static_cast<std::size_t>(ends.first)], ids[static_cast<std::size_t>(ends.second)], cls);
  if (!has_host) {
    Node h;
    h.kind = NodeKind::Host;
    h.name = host;
    const int hid = t.add_node(std::move(h));
    for (const Node& n : m.nodes())
      if (n.kind == NodeKind::CpuPackage || (n.kind == NodeKind::Numa && m.count(NodeKind::CpuPackage) == 0))
        t.add_link({hid, ids[static_cast<std::size_t>(n.id)], LinkKind::Internal, 1, 0, 0, 0, 0});
    ids.push_back(hid);
  }
  return ids;
}

int overlap(const std::vector<int>& a, const std::vector<int>& b) {
  int n = 0;
  for (std::size_t i = 0, j = 0; i < a.size() && j < b.size();) {
    if (a[i] == b[j]) {
      ++n, ++i, ++j;
    } else if (a[i] < b[j]) {
      ++i;
    } else {
      ++j;
    }
  }
  return n;
}

// The device of one rank among the node ids of its host.
int place(const Topology& t, const std::vector<int>& host_ids, const RankView& v) {
  if (!v.gpu_bus.empty()) {
    const std::string bus = normalize_bus_id(v.gpu_bus);
    for (int id : host_ids)
      if (t.node(id).kind == NodeKind::Gpu && normalize_bus_id(t.node(id).pci_bus_id) == bus) return id;
  }
  std::vector<int> cpus;
  try {
    cpus = parse_cpulist(v.cpus);
  } catch (const InvalidArgument&) {
    cpus.clear();  // an unreadable binding places the rank on its host
  }
  for (NodeKind k : {NodeKind::Numa, NodeKind::CpuPackage}) {
    int best = -1, best_overlap = 0;
    for (int id : host_ids) {
      if (t.node(id).kind != k || t.node(id).cpu_affinity.empty()) continue;
      int o = 0;
      try {
        o = overlap(cpus, parse_cpulist(t.node(id).cpu_affinity));
      } catch (const InvalidArgument&) {
        continue;
      }
      if (o > best_overlap) best = id, best_overlap = o;
    }
    if (best >= 0) return best;
  }
  // No binding known: the first NUMA node, package or the host itself.
  for (NodeKind k : {NodeKind::Numa, NodeKind::CpuPackage, NodeKind::Host})
    for (int id : host_ids)
      if (t.node(id).kind == k) return id;
  return host_ids.front();
}

}  // namespace

std::string encode_view(const RankView& v, const Topology* machine) {
  nlohmann::json j;
  j["schema"] = kSchema;
  j["version"] = 1;
  j["rank"] = v.rank;
  j["host"] = v.host;
  j["cpus"] = v.cpus;
  j["gpu"] = v.gpu_bus;
  std::string out = j.dump();
  if (machine) out += "\n" + to_json(*machine);
  return out;
}

bool host_name_less(const std::string& a, const std::string& b) {
  auto digit = [](char ch) { return ch >= '0' && ch <= '9'; };
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (digit(a[i]) && digit(b[j])) {
      std::size_t ie = i, je = j;
      while (ie < a.size() && digit(a[ie])) ++ie;
      while (je < b.size() && digit(b[je])) ++je;
      std::size_t iz = i, jz = j;  // past leading zeros: the longer run of significant digits is the larger
      while (iz + 1 < ie && a[iz] == '0') ++iz;
      while (jz + 1 < je && b[jz] == '0') ++jz;
      if (ie - iz != je - jz) return ie - iz < je - jz;
      const int c = a.compare(iz, ie - iz, b, jz, je - jz);
      if (c != 0) return c < 0;
      if (ie - i != je - j) return ie - i < je - j;  // equal numbers: fewer leading zeros first
      i = ie, j = je;
    } else {
      if (a[i] != b[j]) return static_cast<unsigned char>(a[i]) < static_cast<unsigned char>(b[j]);
      ++i, ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

Cluster assemble_cluster(const std::vector<std::string>& views) {
  if (views.empty()) throw InvalidArgument("assemble_cluster needs at least one rank's view");
  std::vector<Received> got;
  got.reserve(views.size());
  for (std::size_t i = 0; i < views.size(); ++i) got.push_back(decode(views[i], static_cast<int>(i)));
  Cluster c;
  std::map<std::string, int> host_index;
  std::map<std::string, const std::string*> machine_of;
  for (const auto& r : got) {
    if (!host_index.count(r.view.host)) {
      host_index[r.view.host] = 0;
      c.hosts.push_back(r.view.host);
    }
    if (!r.machine.empty() && !machine_of.count(r.view.host)) machine_of[r.view.host] = &r.machine;
    c.views.push_back(r.view);
  }
  std::stable_sort(c.hosts.begin(), c.hosts.end(), host_name_less);
  for (std::size_t h = 0; h < c.hosts.size(); ++h) host_index[c.hosts[h]] = static_cast<int>(h);
  const bool many = c.hosts.size() > 1;
  std::vector<std::vector<int>> ids_of_host;
  for (const auto& h : c.hosts) {
    auto it = machine_of.find(h);
    if (it == machine_of.end())
      throw InvalidArgument(fmt::format("no rank on host '{}' sent its machine; the first rank of each host must", h));
    const Topology m = parse_json(*it->second, fmt::format("machine of host '{}'", h));
    ids_of_host.push_back(append_machine(c.topology, m, h, many));
  }
  if (many) {
    Node net;
    net.kind = NodeKind::Network;
    net.name = "network";
    const int nid = c.topology.add_node(std::move(net));
    for (const auto& ids : ids_of_host) {
      bool linked = false;
      for (int id : ids) {
        const Node& n = c.topology.node(id);
        if (n.kind != NodeKind::Nic) continue;
        c.topology.add_link({id, nid, LinkKind::Network, 1, 0, 0, n.speed_gbps / 8.0, 0});
        linked = true;
      }
      if (!linked)  // no NIC in the model: the host still reaches the others, at the network's default figures
        for (int id : ids)
          if (c.topology.node(id).kind == NodeKind::Host) {
            c.topology.add_link({id, nid, LinkKind::Network, 1, 0, 0, 0, 0});
            break;
          }
    }
  }
  for (const auto& v : c.views) {
    const auto& ids = ids_of_host[static_cast<std::size_t>(host_index[v.host])];
    const int device = place(c.topology, ids, v);
    c.placement.push_back({device, host_index_of(c.topology, device)});
  }
  c.topology.source_format = "cluster";
  c.topology.source_name = fmt::format("{} rank(s) on {} host(s)", views.size(), c.hosts.size());
  return c;
}

Cluster assemble_cluster(const std::vector<std::string>& heads, const std::vector<std::string>& machines) {
  if (heads.size() != machines.size())
    throw InvalidArgument(fmt::format("assemble_cluster: {} headers but {} machines; give one of each per rank",
                                      heads.size(), machines.size()));
  std::vector<std::string> views(heads.size());
  for (std::size_t r = 0; r < heads.size(); ++r)
    views[r] = machines[r].empty() ? heads[r] : heads[r] + "\n" + machines[r];
  return assemble_cluster(views);
}

}  // namespace hopwise::topology
