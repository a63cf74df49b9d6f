// hopwise-topo: look at a machine's topology (this machine, a whole mpirun job, or a file: hwloc XML, NCCL XML,
// `nvidia-smi topo -m`, hopwise JSON), print the path-class matrix, plan rings and trees over its devices, and
// export it to other formats.
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hopwise/comm/communicator.h"
#include "hopwise/comm/launch.h"
#include "hopwise/comm/topology_exchange.h"
#include "hopwise/common/env.h"
#include "hopwise/common/error.h"
#include "hopwise/topology/cluster.h"
#include "hopwise/topology/discover.h"
#include "hopwise/topology/formats.h"
#include "hopwise/topology/graph.h"
#include "hopwise/topology/planner.h"

namespace fs = std::filesystem;
using namespace hopwise::topology;

namespace {

constexpr const char* kUsage = R"(usage: hopwise-topo <command> [FILE | --input FILE] [options]

Without FILE: this machine, discovered with hwloc (CPUs, NUMA, PCIe, NICs with sysfs speeds) and NVML/CUDA when
a GPU driver is there; under mpirun or torchrun, the whole job: every rank's view gathered, ranks placed on their devices,
printed once by rank 0. FILE is a topology file: hwloc XML (lstopo --of xml), NCCL/RCCL topology XML
(NCCL_TOPO_DUMP_FILE), `nvidia-smi topo -m` output, or hopwise JSON; the format is detected from the content.

commands:
  show                               tree view: host, packages, NUMA nodes, PCI switches, GPUs, NICs; then
                                     NVLink, inter-socket and network links (and, for a job, where each rank runs)
  matrix                             GPU x GPU and GPU x NIC path classes, as `nvidia-smi topo -m` prints them
  plan [--ranks N] [--exact-limit K] [--format text|json]
                                     place N ranks (default: one per device; a job: its own ranks) round-robin on
                                     the GPUs, or the NUMA nodes / CPU packages when there are none; print the ring
                                     (each hop with its path class and GB/s), the double binary trees, the
                                     bottleneck and cost, the same for the rank-order ring, and allreduce estimates
  export --format json|nccl-xml|dot|png|svg [-o OUT] [--plan [--ranks N]]
                                     write the model in another format (stdout without -o; png/svg need -o and
                                     Graphviz's `dot`); with --plan, dot/png/svg draw the plan over the machine:
                                     the ring as red arrows numbered in hop order, tree edges off it in blue
  convert --to json|nccl|dot [-o OUT]   older spelling of export
  dot -o OUT [--plan [--ranks N]]    Graphviz by OUT's extension: .dot text, .png / .svg / .pdf through `dot`

options:
  --input FILE                       read FILE instead of discovering (same as giving FILE)
  -h, --help                         this help
)";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Args {
  std::string command;
  std::string file;
  std::map<std::string, std::string> opts;
};

// Parses `argv` for `command`, whose accepted value-taking flags are `flags` (long form; "-o" is an alias of
// "--output").
Args parse_args(int argc, char** argv, const std::vector<std::string>& flags) {
  Args a;
  a.command = argv[1];
  for (int i = 2; i < argc; ++i) {
    std::string s = argv[i];
    if (s == "-h" || s == "--help") {
      a.opts["help"] = "1";
      continue;
    }
    if (s == "--plan" && std::find(flags.begin(), flags.end(), s) != flags.end()) {  // a switch: takes no value
      a.opts[s] = "1";
      continue;
    }
    if (!s.empty() && s[0] == '-' && s != "-") {
      std::string name = s, value;
      bool has_value = false;
      if (auto eq = s.find('='); eq != std::string::npos && s.rfind("--", 0) == 0) {
        name = s.substr(0, eq);
        value = s.substr(eq + 1);
        has_value = true;
      }
      if (name == "-o") name = "--output";
      if (std::find(flags.begin(), flags.end(), name) == flags.end()) {
        std::vector<std::string> shown;
        for (const auto& f : flags) shown.push_back(f == "--output" ? "-o/--output" : f);
        throw UsageError(
            fmt::format("unknown option '{}' for '{}'; it takes: {}", s, a.command,
                        shown.empty() ? std::string("no options") : fmt::format("{}", fmt::join(shown, ", "))));
      }
      if (!has_value) {
        if (i + 1 >= argc) throw UsageError(fmt::format("option '{}' needs a value", s));
        value = argv[++i];
      }
      a.opts[name] = value;
      continue;
    }
    if (!a.file.empty()) throw UsageError(fmt::format("unexpected argument '{}': '{}' takes one FILE", s, a.command));
    a.file = s;
  }
  if (auto in = a.opts.find("--input"); in != a.opts.end()) {
    if (!a.file.empty() && a.file != in->second)
      throw UsageError(fmt::format("give the topology once: FILE '{}' and --input '{}'", a.file, in->second));
    a.file = in->second;
  }
  return a;
}

int parse_int(const std::string& flag, const std::string& v, int lo, int hi) {
  char* end = nullptr;
  const long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || x < lo || x > hi)
    throw UsageError(fmt::format("{} wants an integer in {}..{}, got '{}'", flag, lo, hi, v));
  return static_cast<int>(x);
}

// What the commands look at: a topology and, for a job, where its ranks run.
struct Source {
  Topology topology;
  std::vector<RankPlacement> placement;  // empty: place ranks round-robin (a file, or this machine)
  std::vector<RankView> views;           // per rank, for a job
};

std::string node_label(const Node& n) {
  std::string s;
  switch (n.kind) {
    case NodeKind::Host: s = "Host"; break;
    case NodeKind::CpuPackage: s = "Package"; break;
    case NodeKind::Numa: s = "NUMANode"; break;
    case NodeKind::PciSwitch: s = n.host_bridge ? "HostBridge" : "PCIBridge"; break;
    case NodeKind::Gpu: s = "GPU"; break;
    case NodeKind::NvSwitch: s = "NVSwitch"; break;
    case NodeKind::Nic: s = "NIC"; break;
    case NodeKind::Network: s = "Network"; break;
  }
  s += " " + n.name;
  std::vector<std::string> extra;
  if (!n.pci_bus_id.empty() && n.pci_bus_id != n.name) extra.push_back(n.pci_bus_id);
  if (!n.model.empty()) extra.push_back(n.model);
  if (n.kind == NodeKind::Nic && n.speed_gbps > 0) extra.push_back(fmt::format("{:g} Gb/s", n.speed_gbps));
  if (n.numa >= 0 && n.kind != NodeKind::Numa) extra.push_back(fmt::format("numa {}", n.numa));
  if (!n.cpu_affinity.empty()) extra.push_back("cpus " + n.cpu_affinity);
  if (!extra.empty()) s += " (" + fmt::format("{}", fmt::join(extra, ", ")) + ")";
  return s;
}

std::string link_label(const Link& l) {
  std::string s(to_string(l.kind));
  if (l.kind == LinkKind::NVLink && l.count > 1) s += fmt::format(" x{}", l.count);
  if (l.kind == LinkKind::PCIe && l.pcie_gen > 0)
    s += fmt::format(" gen{}{}", l.pcie_gen, l.pcie_width > 0 ? fmt::format(" x{}", l.pcie_width) : "");
  if (l.bandwidth_gbps > 0) s += fmt::format(", {:.1f} GB/s{}", l.bandwidth_gbps, l.assumed ? " (assumed)" : "");
  if (l.latency_us > 0) s += fmt::format(", {:.1f} us", l.latency_us);
  return s;
}

int kind_rank(NodeKind k) {
  switch (k) {
    case NodeKind::Host: return 0;
    case NodeKind::CpuPackage: return 1;
    case NodeKind::Numa: return 2;
    case NodeKind::PciSwitch: return 3;
    case NodeKind::NvSwitch: return 4;
    case NodeKind::Gpu: return 5;
    case NodeKind::Nic: return 6;
    case NodeKind::Network: return 7;
  }
  return 8;
}

void summary(const Topology& t) {
  fmt::print(
      "{} ({}): {} hosts, {} packages, {} NUMA nodes, {} PCI switches/bridges, {} GPUs, {} NVSwitches, {} "
      "NICs, {} links\n",
      t.source_name, t.source_format, t.count(NodeKind::Host), t.count(NodeKind::CpuPackage), t.count(NodeKind::Numa),
      t.count(NodeKind::PciSwitch), t.count(NodeKind::Gpu), t.count(NodeKind::NvSwitch), t.count(NodeKind::Nic),
      t.links().size());
}

int cmd_show(const Source& src) {
  const Topology& t = src.topology;
  summary(t);
  const size_t n = t.nodes().size();
  // Containment tree: BFS over Internal / PCIe / C2C links from the outermost nodes.
  std::vector<int> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return kind_rank(t.node(a).kind) < kind_rank(t.node(b).kind); });
  std::vector<int> parent(n, -1);
  std::vector<char> seen(n, 0);
  std::vector<std::vector<int>> kids(n);
  std::vector<int> roots;
  auto tree_link = [](LinkKind k) { return k == LinkKind::Internal || k == LinkKind::PCIe || k == LinkKind::C2C; };
  for (int root : order) {
    if (seen[static_cast<size_t>(root)] || t.node(root).kind == NodeKind::Network) continue;
    roots.push_back(root);
    seen[static_cast<size_t>(root)] = 1;
    std::deque<int> q{root};
    while (!q.empty()) {
      const int u = q.front();
      q.pop_front();
      std::vector<int> next;
      for (int li : t.links_of(u)) {
        const Link& l = t.links()[static_cast<size_t>(li)];
        if (!tree_link(l.kind)) continue;
        const int v = l.a == u ? l.b : l.a;
        // Do not climb from a device back up to a containing CPU-side node.
        if (seen[static_cast<size_t>(v)] || kind_rank(t.node(v).kind) < kind_rank(t.node(u).kind) - 0) {
          if (seen[static_cast<size_t>(v)] || kind_rank(t.node(v).kind) < 3) continue;
        }
        seen[static_cast<size_t>(v)] = 1;
        parent[static_cast<size_t>(v)] = u;
        next.push_back(v);
      }
      std::stable_sort(next.begin(), next.end(),
                       [&](int a, int b) { return kind_rank(t.node(a).kind) < kind_rank(t.node(b).kind); });
      for (int v : next) {
        kids[static_cast<size_t>(u)].push_back(v);
        q.push_back(v);
      }
    }
  }
  std::function<void(int, const std::string&, bool, bool)> rec = [&](int u, const std::string& prefix, bool last,
                                                                     bool top) {
    fmt::print("{}{}{}\n", prefix, top ? "" : (last ? "└─ " : "├─ "), node_label(t.node(u)));
    const std::string child_prefix = top ? prefix : prefix + (last ? "   " : "│  ");
    const auto& k = kids[static_cast<size_t>(u)];
    for (size_t i = 0; i < k.size(); ++i) rec(k[i], child_prefix, i + 1 == k.size(), false);
  };
  for (int r : roots) rec(r, "", true, true);
  auto list = [&](LinkKind kind, const char* title) {
    bool any = false;
    for (const Link& l : t.links()) {
      if (l.kind != kind) continue;
      if (!any) fmt::print("{}:\n", title);
      any = true;
      fmt::print("  {} <-> {}: {}\n", t.node(l.a).name, t.node(l.b).name, link_label(l));
    }
  };
  list(LinkKind::NVLink, "NVLink");
  list(LinkKind::InterSocket, "Inter-socket");
  list(LinkKind::Network, "Network");
  for (const auto& nd : t.nodes())
    if (nd.kind == NodeKind::Network) fmt::print("network {}\n", node_label(nd));
  if (!src.views.empty()) {
    fmt::print("ranks:\n");
    for (std::size_t r = 0; r < src.views.size(); ++r) {
      const RankView& v = src.views[r];
      fmt::print("  rank {}: host {}, cpus {}, on {}{}\n", r, v.host, v.cpus.empty() ? "?" : v.cpus,
                 t.node(src.placement[r].device).name, v.gpu_bus.empty() ? "" : ", GPU " + v.gpu_bus);
    }
  }
  return 0;
}

// "NV#" as nvidia-smi prints it: the NVLinks bonded between the pair (or from a to the NVSwitches).
std::string cell(const Topology& t, int a, int b) {
  if (a == b) return "X";
  const PathInfo p = t.path(a, b);
  if (p.cls == PathClass::NVL) {
    int direct = 0, to_switch = 0;
    for (int li : t.links_of(a)) {
      const Link& l = t.links()[static_cast<size_t>(li)];
      if (l.kind != LinkKind::NVLink) continue;
      const int o = l.a == a ? l.b : l.a;
      if (o == b) direct += l.count;
      if (t.node(o).kind == NodeKind::NvSwitch) to_switch += l.count;
    }
    if (direct > 0) return fmt::format("NV{}", direct);
    if (to_switch > 0) return fmt::format("NV{}", to_switch);
  }
  return std::string(to_string(p.cls));
}

int cmd_matrix(const Topology& t) {
  const auto gpus = t.nodes_of(NodeKind::Gpu);
  const auto nics = t.nodes_of(NodeKind::Nic);
  std::vector<int> cols = gpus;
  cols.insert(cols.end(), nics.begin(), nics.end());
  if (cols.empty()) {
    fmt::print("{}: no GPUs or NICs in this topology; nothing to tabulate (try `show`)\n", t.source_name);
    return 0;
  }
  size_t w = 6;
  for (int c : cols) w = std::max(w, t.node(c).name.size() + 2);
  std::string head = fmt::format("{:<{}}", "", w);
  for (int c : cols) head += fmt::format("{:<{}}", t.node(c).name, w);
  head += "CPU Affinity    NUMA Affinity";
  fmt::print("{}\n", head);
  for (int r : cols) {
    std::string line = fmt::format("{:<{}}", t.node(r).name, w);
    for (int c : cols) line += fmt::format("{:<{}}", cell(t, r, c), w);
    if (t.node(r).kind == NodeKind::Gpu) {
      const Node& nd = t.node(r);
      line += fmt::format("{:<16}{}", nd.cpu_affinity.empty() ? "N/A" : nd.cpu_affinity,
                          nd.numa >= 0 ? std::to_string(nd.numa) : "N/A");
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    fmt::print("{}\n", line);
  }
  fmt::print(R"(
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
  NVB  = Connection traversing NVLink through another GPU (NCCL's NVB)
  C2C  = NVLink-C2C between GPU and CPU
  NET  = Connection across the network
  DIS  = No route in the model
)");
  return 0;
}

nlohmann::ordered_json plan_json(const Plan& plan) {
  // A hop's figures, from the ring's own edges (the model's paths are the same both ways, so a reversed channel's
  // hops are the ring's read backwards).
  std::map<std::pair<int, int>, EdgeMetric> edges;
  for (std::size_t i = 0; i < plan.ring.size() && plan.ring.size() > 1; ++i) {
    const int a = plan.ring[i], b = plan.ring[(i + 1) % plan.ring.size()];
    edges[{a, b}] = edges[{b, a}] = plan.ring_edges[i];
  }
  auto edge = [&](int a, int b) { return edges.at({a, b}); };
  auto ring_json = [&](const std::vector<int>& order, const RingScore& score, bool hops) {
    nlohmann::ordered_json r;
    r["order"] = order;
    if (hops) {
      auto& h = r["hops"] = nlohmann::ordered_json::array();
      for (std::size_t i = 0; i < order.size() && order.size() > 1; ++i) {
        const EdgeMetric& e = edge(order[i], order[(i + 1) % order.size()]);
        h.push_back({{"from", order[i]},
                     {"to", order[(i + 1) % order.size()]},
                     {"path", std::string(to_string(e.cls))},
                     {"hops", e.hops},
                     {"bw_gbs", e.bandwidth_gbps},
                     {"bw_assumed", e.assumed},
                     {"latency_us", e.latency_us}});
      }
    }
    r["bottleneck_gbs"] = score.bottleneck_gbps;
    r["cost"] = score.total_cost;
    r["max_latency_us"] = score.max_latency_us;
    return r;
  };
  nlohmann::ordered_json j;
  j["ranks"] = plan.ranks;
  j["hosts"] = plan.hosts;
  j["exact"] = plan.exact;
  auto& dev = j["placement"] = nlohmann::ordered_json::array();
  for (std::size_t r = 0; r < plan.placement.size(); ++r)
    dev.push_back({{"rank", r}, {"device", plan.device_names[r]}, {"host", plan.placement[r].host}});
  auto& rings = j["rings"] = nlohmann::ordered_json::array({ring_json(plan.ring, plan.ring_score, true)});
  for (std::size_t c = 1; c < plan.channels.size(); ++c)
    rings.push_back(ring_json(plan.channels[c], plan.ring_score, true));  // the reverse: the same figures
  auto& trees = j["trees"] = nlohmann::ordered_json::array();
  for (const TreeShape* t : {&plan.trees.first, &plan.trees.second})
    trees.push_back({{"root", t->root}, {"parent", t->parent}, {"depth", t->depth()}});
  j["bottleneck_assumed"] = plan.bottleneck_assumed;
  j["tree_bottleneck_gbs"] = plan.tree_bottleneck_gbps;
  j["baseline"] = ring_json(plan.identity_ring_order, plan.identity_score, false);
  auto& est = j["allreduce_estimate_us"] = nlohmann::ordered_json::array();
  for (double bytes : {8192.0, 1048576.0, 268435456.0})
    est.push_back({{"bytes", bytes},
                   {"ring", plan.ring_allreduce_seconds(bytes) * 1e6},
                   {"tree", plan.tree_allreduce_seconds(bytes) * 1e6}});
  return j;
}

int cmd_plan(const Source& src, const Args& a) {
  const Topology& t = src.topology;
  int ranks = 0;
  if (auto it = a.opts.find("--ranks"); it != a.opts.end()) {
    if (!src.placement.empty())
      throw UsageError("--ranks does not apply to a job: its ranks are where mpirun put them");
    ranks = parse_int("--ranks", it->second, 1, 4096);
  }
  PlannerOptions o;
  if (auto it = a.opts.find("--exact-limit"); it != a.opts.end())
    o.exact_limit = parse_int("--exact-limit", it->second, 0, kMaxExactRanks);
  const std::string format = a.opts.count("--format") ? a.opts.at("--format") : "text";
  if (format != "text" && format != "json")
    throw UsageError(fmt::format("--format '{}' is not a plan format; use text or json", format));
  const auto placement = src.placement.empty() ? place_ranks(t, ranks) : src.placement;
  const Plan plan = plan_collectives(t, placement, o);
  if (format == "json") {
    fmt::print("{}\n", plan_json(plan).dump(1));
    return 0;
  }
  summary(t);
  fmt::print("placement:");
  for (size_t r = 0; r < placement.size(); ++r)
    fmt::print(" {}={}{}", r, t.node(placement[r].device).name,
               placement[r].host != 0 ? fmt::format("@host{}", placement[r].host) : "");
  fmt::print("\n");
  fmt::print("{}", plan.describe());
  return 0;
}

std::string render(const Topology& t, const std::string& to) {
  if (to == "json") return to_json(t);
  if (to == "nccl" || to == "nccl-xml") return to_nccl_xml(t);
  if (to == "dot") return to_dot(t);
  throw UsageError(fmt::format("'{}' is not a format; use one of: json, nccl-xml, dot, png, svg", to));
}

void write_text(const Args& a, const std::string& text) {
  if (auto o = a.opts.find("--output"); o != a.opts.end() && o->second != "-")
    save_text(o->second, text);
  else
    fmt::print("{}", text);
}

// Renders DOT to `out` with Graphviz's `dot -T<format>`.
void render_graphviz(const std::string& dot, const std::string& out, const std::string& format) {
  if (std::system("command -v dot >/dev/null 2>&1") != 0)
    throw hopwise::InvalidArgument(fmt::format(
        "rendering {} needs Graphviz's `dot` on PATH, which was not found; install graphviz or write -o {}.dot", out,
        fs::path(out).replace_extension("").string()));
  const std::string tmp = out + ".tmp.dot";
  save_text(tmp, dot);
  auto quote = [](const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
  };
  const std::string cmd = fmt::format("dot -T{} -o {} {}", format, quote(out), quote(tmp));
  const int rc = std::system(cmd.c_str());
  std::error_code ec;
  fs::remove(tmp, ec);
  if (rc != 0) throw hopwise::InvalidArgument(fmt::format("`{}` failed (status {})", cmd, rc));
}

// The DOT picture: the machine, or with --plan the plan drawn over it (ranks as `plan` places them).
std::string picture(const Source& src, const Args& a) {
  if (!a.opts.count("--plan")) {
    if (a.opts.count("--ranks")) throw UsageError("--ranks applies with --plan");
    return to_dot(src.topology);
  }
  int ranks = 0;
  if (auto it = a.opts.find("--ranks"); it != a.opts.end()) {
    if (!src.placement.empty())
      throw UsageError("--ranks does not apply to a job: its ranks are where mpirun put them");
    ranks = parse_int("--ranks", it->second, 1, 4096);
  }
  const auto placement = src.placement.empty() ? place_ranks(src.topology, ranks) : src.placement;
  return plan_to_dot(src.topology, plan_collectives(src.topology, placement));
}

int cmd_export(const Source& src, const Args& a) {
  auto it = a.opts.find("--format");
  if (it == a.opts.end()) throw UsageError("export needs --format json|nccl-xml|dot|png|svg");
  const std::string& f = it->second;
  const bool drawn = f == "dot" || f == "png" || f == "svg" || f == "pdf";
  if (!drawn && a.opts.count("--plan"))
    throw UsageError(fmt::format("--plan draws on a picture; use --format dot, png or svg, not {}", f));
  if (f == "png" || f == "svg" || f == "pdf") {
    auto o = a.opts.find("--output");
    if (o == a.opts.end() || o->second == "-") throw UsageError(fmt::format("--format {} needs -o OUT", f));
    render_graphviz(picture(src, a), o->second, f);
    return 0;
  }
  write_text(a, f == "dot" ? picture(src, a) : render(src.topology, f));
  return 0;
}

int cmd_convert(const Topology& t, const Args& a) {
  auto it = a.opts.find("--to");
  if (it == a.opts.end()) throw UsageError("convert needs --to json|nccl|dot");
  write_text(a, render(t, it->second));
  return 0;
}

int cmd_dot(const Source& src, const Args& a) {
  auto o = a.opts.find("--output");
  if (o == a.opts.end()) throw UsageError("dot needs -o OUT (OUT.dot, OUT.png or OUT.svg)");
  const std::string out = o->second;
  const std::string ext = fs::path(out).extension().string();
  if (ext == ".dot" || ext == ".gv" || ext.empty()) {
    save_text(out, picture(src, a));
    return 0;
  }
  if (ext != ".png" && ext != ".svg" && ext != ".pdf")
    throw UsageError(fmt::format("dot: cannot write '{}'; use an OUT ending in .dot, .png, .svg or .pdf", out));
  render_graphviz(picture(src, a), out, ext.substr(1));
  return 0;
}

// The job: every rank discovers its host, the views are all-gathered, rank 0 gets the assembled cluster. Other
// ranks return nullopt and print nothing.
std::optional<Source> gather_job() {
  hopwise::comm::Options o = hopwise::comm::Options::from_env();
  o.discover_topology = false;  // gathered once, below, whatever HOPWISE_TOPO_* say
  o.calibrate = false;          // a topology tool needs no cost model
  hopwise::comm::Communicator comm(o);
  Cluster c = hopwise::comm::gather_cluster(comm);
  if (comm.rank() != 0) return std::nullopt;
  return Source{std::move(c.topology), std::move(c.placement), std::move(c.views)};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string cmd = argv[1];
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const std::map<std::string, std::vector<std::string>> commands = {
      {"show", {"--input"}},
      {"matrix", {"--input"}},
      {"plan", {"--input", "--ranks", "--exact-limit", "--format"}},
      {"export", {"--input", "--format", "--output", "--plan", "--ranks"}},
      {"convert", {"--input", "--to", "--output"}},
      {"dot", {"--input", "--output", "--plan", "--ranks"}},
  };
  auto c = commands.find(cmd);
  if (c == commands.end()) {
    std::fprintf(stderr,
                 "hopwise-topo: unknown command '%s'; use one of: show, matrix, plan, export, convert, dot (-h for "
                 "help)\n",
                 cmd.c_str());
    return 2;
  }
  try {
    const Args a = parse_args(argc, argv, c->second);
    if (a.opts.count("help")) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    Source src;
    if (!a.file.empty()) {
      // Launched as a job with a file every rank would print the same: only the first one does.
      if (hopwise::comm::launched_as_job() && hopwise::comm::detect_launch().rank != 0) return 0;
      src.topology = load_topology(a.file);
    } else if (hopwise::comm::launched_as_job()) {  // mpirun, torchrun: the whole job's topology
      auto job = gather_job();
      if (!job) return 0;
      src = std::move(*job);
    } else {
      src.topology = discover_machine();
    }
    const Topology& t = src.topology;
    if (cmd == "show") return cmd_show(src);
    if (cmd == "matrix") return cmd_matrix(t);
    if (cmd == "plan") return cmd_plan(src, a);
    if (cmd == "export") return cmd_export(src, a);
    if (cmd == "convert") return cmd_convert(t, a);
    return cmd_dot(src, a);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "hopwise-topo: %s (-h for help)\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hopwise-topo: %s\n", e.what());
    return 1;
  }
}
