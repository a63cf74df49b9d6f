#include "platform.h"

#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <numeric>
#include <random>

#include "hopwise/common/error.h"

namespace hopwise::sim_tool {

namespace {

// "25Gbps" -> (25, "Gbps").
std::pair<double, std::string> number_and_unit(const std::string& text, const std::string& what) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    throw InvalidArgument(fmt::format("{} '{}' is not a number with a unit", what, text));
  }
  if (!(v > 0)) throw InvalidArgument(fmt::format("{} '{}' must be above 0", what, text));
  return {v, text.substr(used)};
}

int positive(const std::string& key, const std::string& v) {
  try {
    std::size_t used = 0;
    const int n = std::stoi(v, &used);
    if (used == v.size() && n >= 1) return n;
  } catch (const std::exception&) {
  }
  throw InvalidArgument(fmt::format("fat-tree: {}={} must be a whole number >= 1", key, v));
}

}  // namespace

double parse_rate(const std::string& text) {
  const auto [v, unit] = number_and_unit(text, "rate");
  static const std::map<std::string, double> scale{
      {"", 1},           {"Bps", 1},        {"kBps", 1e3},     {"KBps", 1e3},     {"MBps", 1e6},
      {"GBps", 1e9},     {"TBps", 1e12},    {"bps", 1.0 / 8},  {"kbps", 1e3 / 8}, {"Kbps", 1e3 / 8},
      {"Mbps", 1e6 / 8}, {"Gbps", 1e9 / 8}, {"Tbps", 1e12 / 8}};
  const auto it = scale.find(unit);
  if (it == scale.end())
    throw InvalidArgument(
        fmt::format("rate '{}': unit '{}' is not one of bps Kbps Mbps Gbps Tbps Bps KBps MBps GBps TBps", text, unit));
  return v * it->second;
}

double parse_latency(const std::string& text) {
  const auto [v, unit] = number_and_unit(text, "latency");
  static const std::map<std::string, double> scale{{"", 1}, {"s", 1}, {"ms", 1e-3}, {"us", 1e-6}, {"ns", 1e-9}};
  const auto it = scale.find(unit);
  if (it == scale.end())
    throw InvalidArgument(fmt::format("latency '{}': unit '{}' is not one of s ms us ns", text, unit));
  return v * it->second;
}

FatTree parse_fat_tree(const std::string& spec) {
  const std::string head = "fat-tree:";
  if (spec.rfind(head, 0) != 0)
    throw InvalidArgument(fmt::format("platform '{}' is neither fat-tree:... nor a SimGrid .xml file", spec));
  FatTree t;
  bool leaf_given = false;
  std::string rest = spec.substr(head.size());
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    const std::string field = rest.substr(0, comma);
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
    const auto eq = field.find('=');
    if (eq == std::string::npos) throw InvalidArgument(fmt::format("fat-tree: '{}' is not KEY=VALUE", field));
    const std::string key = field.substr(0, eq), v = field.substr(eq + 1);
    if (key == "hosts")
      t.hosts = positive(key, v);
    else if (key == "ranks-per-host")
      t.ranks_per_host = positive(key, v);
    else if (key == "oversub")
      t.oversub = positive(key, v);
    else if (key == "leaf")
      t.leaf = positive(key, v), leaf_given = true;
    else if (key == "link")
      t.link_Bps = parse_rate(v), t.link_text = v;
    else if (key == "latency")
      t.latency_s = parse_latency(v), t.latency_text = v;
    else if (key == "local")
      t.local_Bps = parse_rate(v), t.local_text = v;
    else
      throw InvalidArgument(fmt::format(
          "fat-tree: no field '{}'; the fields: hosts, ranks-per-host, link, oversub, leaf, latency, local", key));
  }
  if (t.hosts == 0 || t.link_text.empty()) throw InvalidArgument("fat-tree: give hosts=H and link=RATE (e.g. 25Gbps)");
  if (!leaf_given) t.leaf = std::min(t.leaf, t.hosts);
  if (t.hosts % t.leaf != 0)
    throw InvalidArgument(
        fmt::format("fat-tree: hosts={} is not a multiple of leaf={} (hosts per leaf switch)", t.hosts, t.leaf));
  if (t.leaf % t.oversub != 0)
    throw InvalidArgument(
        fmt::format("fat-tree: leaf={} hosts cannot share {}:1 uplinks evenly; give an oversub that "
                    "divides leaf",
                    t.leaf, t.oversub));
  return t;
}

std::string fat_tree_xml(const FatTree& t) {
  const int leaves = t.hosts / t.leaf;
  // SimGrid's FAT_TREE: levels; children per node at each level; parents per node; links per parent.
  const std::string topo = leaves == 1 ? fmt::format("1;{};1;1", t.leaf)
                                       : fmt::format("2;{},{};1,{};1,1", t.leaf, leaves, t.leaf / t.oversub);
  return fmt::format(
      "<?xml version='1.0'?>\n<!DOCTYPE platform SYSTEM \"https://simgrid.org/simgrid.dtd\">\n"
      "<platform version=\"4.1\">\n  <zone id=\"world\" routing=\"Full\">\n"
      "    <cluster id=\"fat-tree\" prefix=\"n\" suffix=\"\" radical=\"0-{}\" speed=\"1Gf\" bw=\"{}\" lat=\"{}\"\n"
      "             topology=\"FAT_TREE\" topo_parameters=\"{}\" sharing_policy=\"SPLITDUPLEX\"\n"
      "             loopback_bw=\"{}\" loopback_lat=\"1us\"/>\n  </zone>\n</platform>\n",
      t.hosts - 1, t.link_text, t.latency_text, topo, t.local_text);
}

topology::Plan plan_on_fat_tree(const FatTree& t, const std::vector<int>& host_of) {
  // The cluster as hopwise's topology sees a job's hosts (topology/cluster.h): each host a machine with its NUMA
  // node and one NIC at the link's rate, the NICs joined by the network; hosts indexed in name order (n0, n1, ..).
  topology::Topology g;
  const int net = g.add_node({.kind = topology::NodeKind::Network, .name = "network"});
  std::vector<int> numa_of(static_cast<std::size_t>(t.hosts));
  for (int h = 0; h < t.hosts; ++h) {
    const std::string name = fmt::format("n{}", h);
    const int host = g.add_node({.kind = topology::NodeKind::Host, .name = name});
    const int numa = g.add_node({.kind = topology::NodeKind::Numa, .name = name + ":NUMA0", .numa = 0, .index = 0});
    const int nic = g.add_node(
        {.kind = topology::NodeKind::Nic, .name = name + ":nic0", .index = 0, .speed_gbps = t.link_Bps * 8 / 1e9});
    g.add_link({host, numa, topology::LinkKind::Internal});
    g.add_link({numa, nic, topology::LinkKind::PCIe, 1, 4, 16, 0, 0});
    g.add_link({nic, net, topology::LinkKind::Network, 1, 0, 0, t.link_Bps / 1e9, 0});
    numa_of[static_cast<std::size_t>(h)] = numa;
  }
  std::vector<topology::RankPlacement> placement;
  for (int h : host_of) placement.push_back({numa_of[static_cast<std::size_t>(h)], h});
  return topology::plan_collectives(g, placement);
}

std::vector<int> place(int hosts, int ranks_per_host, Placement how, std::uint64_t seed) {
  std::vector<int> slots(static_cast<std::size_t>(hosts) * static_cast<std::size_t>(ranks_per_host));
  for (std::size_t s = 0; s < slots.size(); ++s)
    slots[s] = how == Placement::kCyclic ? static_cast<int>(s % static_cast<std::size_t>(hosts))
                                         : static_cast<int>(s / static_cast<std::size_t>(ranks_per_host));
  if (how == Placement::kRandom) {
    std::mt19937_64 g(seed);
    std::shuffle(slots.begin(), slots.end(), g);
  }
  return slots;
}

}  // namespace hopwise::sim_tool
