// Live discovery (hwloc on this machine, NIC speeds from a sysfs tree, GPUs through a stand-in NVML) and the
// assembly of per-rank views into one cluster graph.
#include <gtest/gtest.h>
#include <unistd.h>

#include <climits>
#include <filesystem>
#include <fstream>

#include "hopwise/common/error.h"
#include "hopwise/topology/cluster.h"
#include "hopwise/topology/discover.h"
#include "hopwise/topology/formats.h"
#include "hopwise/topology/planner.h"

using namespace hopwise::topology;
namespace fs = std::filesystem;

namespace {

std::string hostname() {
  char buf[HOST_NAME_MAX + 1] = {};
  gethostname(buf, HOST_NAME_MAX);
  return buf;
}

void write_file(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text << "\n";
}

// host - package - NUMA0 (cpus 0-3) / NUMA1 (cpus 4-7); one GPU and one NIC under each NUMA node.
Topology two_socket_machine() {
  Topology t;
  const int host = t.add_node({.kind = NodeKind::Host, .name = "box"});
  int prev_numa = -1;
  for (int s = 0; s < 2; ++s) {
    const int pkg = t.add_node({.kind = NodeKind::CpuPackage, .name = "Package" + std::to_string(s), .index = s});
    const int numa = t.add_node({.kind = NodeKind::Numa,
                                 .name = "NUMA" + std::to_string(s),
                                 .numa = s,
                                 .index = s,
                                 .cpu_affinity = s == 0 ? "0-3" : "4-7"});
    t.add_link({host, pkg, LinkKind::Internal});
    t.add_link({pkg, numa, LinkKind::Internal});
    if (prev_numa >= 0) t.add_link({prev_numa, numa, LinkKind::InterSocket, 1, 0, 0, 40, 0});
    prev_numa = numa;
    const int gpu = t.add_node({.kind = NodeKind::Gpu,
                                .name = "GPU" + std::to_string(s),
                                .pci_bus_id = s == 0 ? "0000:1a:00.0" : "0000:9a:00.0",
                                .numa = s,
                                .index = s});
    t.add_link({numa, gpu, LinkKind::PCIe, 1, 4, 16, 0, 0});
    const int nic =
        t.add_node({.kind = NodeKind::Nic, .name = "mlx5_" + std::to_string(s), .numa = s, .speed_gbps = 200});
    t.add_link({numa, nic, LinkKind::PCIe, 1, 4, 16, 0, 0});
  }
  return t;
}

}  // namespace

TEST(Cpulist, ParsesAndFormats) {
  EXPECT_EQ(parse_cpulist("0-3,8,10-11"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_cpulist(""), std::vector<int>{});
  EXPECT_EQ(parse_cpulist("5,1,1"), (std::vector<int>{1, 5}));
  EXPECT_EQ(format_cpulist({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(format_cpulist({}), "");
  for (const char* bad : {"a", "3-1", "1-", "-2", "1,,x", "0-99999999"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(parse_cpulist(bad), hopwise::InvalidArgument);
  }
}

TEST(Discovery, ThisMachine) {
  GpuProbe probe;
  const Topology t = discover_machine(&probe);
  ASSERT_EQ(t.count(NodeKind::Host), 1);
  EXPECT_EQ(t.node(t.nodes_of(NodeKind::Host).front()).name, hostname());
  EXPECT_GE(t.count(NodeKind::Numa) + t.count(NodeKind::CpuPackage), 1);
  for (int id : t.nodes_of(NodeKind::Numa)) {
    EXPECT_FALSE(t.node(id).cpu_affinity.empty()) << t.node(id).name;
    EXPECT_NO_THROW(parse_cpulist(t.node(id).cpu_affinity));
  }
  const auto mine = parse_cpulist(process_cpus());
  EXPECT_FALSE(mine.empty());
  EXPECT_LE(static_cast<long>(mine.size()), sysconf(_SC_NPROCESSORS_CONF));
  // Whatever was found saves and loads unchanged, and can be planned on.
  const std::string j = to_json(t);
  EXPECT_EQ(to_json(parse_json(j, "discovered")), j);
  EXPECT_NO_THROW(plan_collectives(t, place_ranks(t, 2)));
  if (!probe.nvml_loaded) {
    EXPECT_FALSE(probe.nvml_note.empty());
  }
}

TEST(Discovery, NicSpeedsFromSysfs) {
  const fs::path root = fs::temp_directory_path() / ("hopwise-sysfs-" + std::to_string(getpid()));
  write_file(root / "class/net/eth7/speed", "25000");
  write_file(root / "class/net/eth8/speed", "-1");
  write_file(root / "class/infiniband/mlx5_3/ports/1/rate", "100 Gb/sec (4X EDR)");
  Topology t;
  const int host = t.add_node({.kind = NodeKind::Host, .name = "h"});
  const int eth = t.add_node({.kind = NodeKind::Nic, .name = "eth7"});
  const int down = t.add_node({.kind = NodeKind::Nic, .name = "eth8"});
  Node ib{.kind = NodeKind::Nic, .name = "mlx5_3"};
  ib.attrs["osdevs"] = "mlx5_3,ib3";
  const int ibid = t.add_node(ib);
  for (int id : {eth, down, ibid}) t.add_link({host, id, LinkKind::PCIe});
  add_nic_speeds(t, root.string());
  EXPECT_DOUBLE_EQ(t.node(eth).speed_gbps, 25.0);
  EXPECT_DOUBLE_EQ(t.node(down).speed_gbps, 0.0);  // link down or virtual: unknown, not negative
  EXPECT_DOUBLE_EQ(t.node(ibid).speed_gbps, 100.0);
  fs::remove_all(root);
}

TEST(Discovery, GpusAndNvlinkFromNvml) {
  Topology t;
  const int host = t.add_node({.kind = NodeKind::Host, .name = "h"});
  // hwloc found GPU 1 by PCI class already; NVML completes it and adds the other three.
  const int known = t.add_node({.kind = NodeKind::Gpu, .name = "GPU0", .pci_bus_id = "0000:1b:00.0"});
  t.add_link({host, known, LinkKind::PCIe});
  const GpuProbe p = add_gpus(t, HOPWISE_FAKE_NVML);
  ASSERT_TRUE(p.nvml_loaded) << p.nvml_note;
  EXPECT_EQ(p.nvml_gpus, 4);
  EXPECT_EQ(t.count(NodeKind::Gpu), 4);
  EXPECT_EQ(t.count(NodeKind::NvSwitch), 1);
  EXPECT_EQ(p.nvlinks, 2 * 4 + 4 * 2);  // two bonded pairs of 4, and 2 lanes from each GPU to the switch
  EXPECT_EQ(t.node(known).model, "Fake H100 1");
  EXPECT_EQ(t.node(known).attrs.at("sm"), "90");
  const auto g = t.nodes_of(NodeKind::Gpu);
  const PathInfo pair = t.path(*t.find_by_bus_id("0000:1a:00.0"), known);
  EXPECT_EQ(pair.cls, PathClass::NVL);
  EXPECT_NEAR(pair.bottleneck_gbps, 4 * 20.6, 1e-9);
  // Every ring hop is NVLink (through the switch between pairs).
  const Plan plan = plan_collectives(t, place_ranks(t));
  for (const auto& e : plan.ring_edges) EXPECT_EQ(e.cls, PathClass::NVL);
}

TEST(Discovery, MissingNvmlLeavesTheModelAlone) {
  Topology t;
  t.add_node({.kind = NodeKind::Host, .name = "h"});
  const GpuProbe p = add_gpus(t, "/nonexistent/libnvidia-ml.so.1");
  EXPECT_FALSE(p.nvml_loaded);
  EXPECT_NE(p.nvml_note.find("/nonexistent/libnvidia-ml.so.1"), std::string::npos) << p.nvml_note;
  EXPECT_EQ(t.nodes().size(), 1u);
}

TEST(Cluster, OneHostPlacesRanksByBindingAndGpu) {
  const Topology m = two_socket_machine();
  const std::vector<std::string> views = {
      encode_view({0, "box", "0-1", ""}, &m),
      encode_view({1, "box", "6", ""}, nullptr),
      encode_view({2, "box", "", "0000:9A:00.0"}, nullptr),
      encode_view({3, "box", "", ""}, nullptr),
  };
  const Cluster c = assemble_cluster(views);
  ASSERT_EQ(c.hosts, std::vector<std::string>{"box"});
  ASSERT_EQ(c.placement.size(), 4u);
  EXPECT_EQ(c.topology.node(c.placement[0].device).name, "NUMA0");
  EXPECT_EQ(c.topology.node(c.placement[1].device).name, "NUMA1");
  EXPECT_EQ(c.topology.node(c.placement[2].device).name, "GPU1");
  EXPECT_EQ(c.topology.node(c.placement[3].device).name, "NUMA0");  // unbound: the first NUMA node
  EXPECT_EQ(c.topology.count(NodeKind::Network), 0);
}

TEST(Cluster, HostsJoinedByTheNetworkAndRingCrossesEachOnce) {
  const Topology m = two_socket_machine();
  std::vector<std::string> views;
  // Ranks interleaved across hosts, as `--map-by node` places them.
  for (int r = 0; r < 8; ++r) {
    const std::string host = r % 2 ? "nodeB" : "nodeA";
    views.push_back(encode_view({r, host, (r / 2) % 2 ? "4-7" : "0-3", ""}, r < 2 ? &m : nullptr));
  }
  const Cluster c = assemble_cluster(views);
  ASSERT_EQ(c.hosts, (std::vector<std::string>{"nodeA", "nodeB"}));
  EXPECT_EQ(c.topology.count(NodeKind::Host), 2);
  EXPECT_EQ(c.topology.count(NodeKind::Network), 1);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(c.placement[static_cast<std::size_t>(r)].host, r % 2);
  EXPECT_EQ(c.topology.node(c.placement[1].device).name, "nodeB:NUMA0");
  const Plan plan = plan_collectives(c.topology, c.placement);
  int crossings = 0;
  for (std::size_t i = 0; i < plan.ring.size(); ++i)
    crossings += c.placement[static_cast<std::size_t>(plan.ring[i])].host !=
                 c.placement[static_cast<std::size_t>(plan.ring[(i + 1) % plan.ring.size()])].host;
  EXPECT_EQ(crossings, 2);
  // Within a host the hops run at the assumed host-memory copy rate (4 GB/s), below the hosts' rails: the ring is
  // chosen for its total cost (two network crossings instead of eight), not its narrowest hop.
  EXPECT_LT(plan.ring_score.total_cost, plan.identity_score.total_cost);
  // Each host's two 200 Gb/s NICs (one per socket) are rails of one link: 400 Gb/s, 50 GB/s.
  for (const auto& e : plan.ring_edges)
    if (e.cls == PathClass::NET) {
      EXPECT_NEAR(e.bandwidth_gbps, 50.0, 1e-9);
    }
}

TEST(Cluster, HostsAreIndexedInTheirNamesNumberOrderNotByTheirFirstRank) {
  EXPECT_TRUE(host_name_less("n2", "n10"));
  EXPECT_FALSE(host_name_less("n10", "n2"));
  EXPECT_TRUE(host_name_less("n7", "n007"));  // equal numbers: fewer leading zeros first
  EXPECT_TRUE(host_name_less("rack1-n9", "rack2-n1"));
  EXPECT_TRUE(host_name_less("n", "n0"));
  EXPECT_FALSE(host_name_less("n3", "n3"));
  EXPECT_TRUE(host_name_less("gpu-a", "gpu-b"));
  // A scheduler's random placement: rank 0 lands on n10, rank 1 on n2, rank 2 on n9.
  const Topology m = two_socket_machine();
  const std::vector<std::string> hosts{"n10", "n2", "n9", "n10", "n2", "n9"};
  std::vector<std::string> views;
  for (int r = 0; r < 6; ++r)
    views.push_back(encode_view({r, hosts[static_cast<std::size_t>(r)], "0-3", ""}, r < 3 ? &m : nullptr));
  const Cluster c = assemble_cluster(views);
  ASSERT_EQ(c.hosts, (std::vector<std::string>{"n2", "n9", "n10"}));
  const std::vector<int> want{2, 0, 1, 2, 0, 1};
  for (int r = 0; r < 6; ++r)
    EXPECT_EQ(c.placement[static_cast<std::size_t>(r)].host, want[static_cast<std::size_t>(r)]) << r;
  // The ring visits the hosts in that order, each once.
  const Plan plan = plan_collectives(c.topology, c.placement);
  std::vector<int> visited;
  for (int r : plan.ring) {
    const int h = c.placement[static_cast<std::size_t>(r)].host;
    if (visited.empty() || visited.back() != h) visited.push_back(h);
  }
  EXPECT_EQ(visited, (std::vector<int>{0, 1, 2}));
}

TEST(Cluster, BadViewsAreNamed) {
  const Topology m = two_socket_machine();
  auto message = [](const std::vector<std::string>& v) {
    try {
      assemble_cluster(v);
    } catch (const hopwise::InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({"not json"}).find("view 0 does not parse"), std::string::npos);
  EXPECT_NE(message({encode_view({1, "box", "", ""}, &m)}).find("from rank 1"), std::string::npos);
  EXPECT_NE(message({encode_view({0, "box", "", ""}, &m), encode_view({1, "other", "", ""}, nullptr)})
                .find("no rank on host 'other' sent its machine"),
            std::string::npos);
  EXPECT_NE(message({}).find("at least one"), std::string::npos);
  EXPECT_NE(message({encode_view({0, "box", "", ""}, nullptr) + "\n{broken"}).find("machine of host 'box'"),
            std::string::npos);
}

TEST(Cluster, HeadsAndMachinesSentApartAssembleAlike) {
  const Topology m = two_socket_machine();
  const std::vector<std::string> heads = {encode_view({0, "a", "0-3", ""}, nullptr),
                                          encode_view({1, "b", "4-7", ""}, nullptr)};
  const std::vector<std::string> machines = {to_json(m), to_json(m)};
  const Cluster apart = assemble_cluster(heads, machines);
  const Cluster whole = assemble_cluster({encode_view({0, "a", "0-3", ""}, &m), encode_view({1, "b", "4-7", ""}, &m)});
  EXPECT_EQ(to_json(apart.topology), to_json(whole.topology));
  EXPECT_EQ(apart.placement[1].device, whole.placement[1].device);
  EXPECT_THROW(assemble_cluster(heads, {to_json(m)}), hopwise::InvalidArgument);
}
