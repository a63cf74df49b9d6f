// The planner's figures against the hardware: every topology file in the corpus has its expected ring bottleneck
// here, with where the number comes from. Parallel links add up (NVSwitch planes, bonded NVLinks, NIC rails), hops
// that stay in host memory are a realistic copy rate marked "assumed" (no 1000 GB/s placeholder), and the exported
// picture draws the plan. Files are read from tests/data/topologies (copied into the repository) or else from
// ../shared/topologies (HOPWISE_SHARED_TOPOLOGIES overrides); those found in neither are skipped.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "hopwise/topology/formats.h"
#include "hopwise/topology/graph.h"
#include "hopwise/topology/planner.h"

namespace fs = std::filesystem;
using namespace hopwise::topology;

namespace {

fs::path shared_dir() {
  const char* env = std::getenv("HOPWISE_SHARED_TOPOLOGIES");
  return env ? fs::path(env) : fs::path(HOPWISE_SHARED_TOPOLOGIES_DEFAULT);
}

// The repository's copy first, then the shared corpus; empty when neither has it.
fs::path find_file(const std::string& rel) {
  for (const fs::path& dir : {fs::path(HOPWISE_TEST_TOPOLOGIES), shared_dir()})
    if (fs::exists(dir / rel)) return dir / rel;
  return {};
}

// "GPU" + 3 (appended: GCC 12's -Wrestrict misfires on operator+ with a literal here).
std::string named(const char* prefix, int i) {
  std::string s(prefix);
  s.append(std::to_string(i));
  return s;
}

struct Expected {
  int ranks;
  double bottleneck_gbps;
};

// One rank per GPU (NUMA node / package without GPUs). "assumed" figures are defaults the output marks as such.
const std::map<std::string, Expected> kExpected = {
    // DGX-2: 6 NVLink2 links x 25 GB/s per GPU into the 6 NVSwitch planes of its board = 150; the trunks to the other
    // board (8 links per switch pair) are not in the file and are assumed.
    {"hwloc/nvidiaDGX2.xml", {16, 150.0}},
    // POWER8 Minsky: NVLink pairs at 40 GB/s, but between sockets the model routes over PCIe gen3 x8 (7.9).
    {"hwloc/power8gpudistances.xml", {4, 7.9}},
    // NUMA-node ranks, no GPUs: every hop a shared-memory copy, assumed 4 GB/s (kAssumedSharedMemoryGbps).
    {"hwloc/16amd64-4distances.xml", {8, 4.0}},
    {"hwloc/16intel64-manyVFs.xml", {2, 4.0}},                // 2 NUMA-node ranks: assumed shared-memory copy
    {"hwloc/192em64t-24n8c2t.xml", {24, 4.0}},                // 24 NUMA-node ranks: assumed shared-memory copy
    {"hwloc/28intel64-2p2g7c-CoDgroups.v1.xml", {4, 4.0}},    // 4 NUMA (cluster-on-die): assumed copy
    {"hwloc/32em64t-2n8c+dax+nvme+mic+dimms.xml", {2, 4.0}},  // 2 NUMA-node ranks: assumed copy
    {"hwloc/40intel64-2g2n4c+pcilocality.xml", {4, 4.0}},     // 4 NUMA-node ranks: assumed copy
    {"hwloc/64amd64-4p2n4ca2co.xml", {8, 4.0}},               // 8 NUMA-node ranks: assumed copy
    {"hwloc/64intel64-heteromem.xml", {8, 4.0}},              // KNL SNC4 DRAM+HBM NUMA ranks: assumed copy
    {"hwloc/devel09-pci.xml", {2, 4.0}},                      // 2 NUMA-node ranks: assumed copy
    {"hwloc/knl.xml", {8, 4.0}},                              // KNL 4 DDR + 4 MCDRAM NUMA ranks: assumed copy
    {"hwloc/memorysidecaches.xml", {4, 4.0}},                 // 4 SNC NUMA ranks: assumed copy
    {"nccl/aws-g5.48xl-topo.xml", {2, 4.0}},                  // no <gpu> tags: 2 NUMA-node ranks, assumed copy
    {"nccl/aws-p5.48xl-topo.2023-static.xml", {2, 4.0}},      // GPUs untagged: 2 NUMA-node ranks, assumed copy
    // One CPU-side device only: a single rank, no ring traffic.
    {"hwloc/8em64t-2p2ca2co-nonodesets.v1.xml", {1, 0.0}},
    {"hwloc/96em64t-4n4d3ca2co-pci.xml", {1, 0.0}},              // one rank: no ring
    {"hwloc/AMD-K10-Istanbul-8xOpteron-8439SE.xml", {1, 0.0}},   // CPUID-only, one rank: no ring
    {"hwloc/Intel-IvyBridge-12xXeon-E5-4620v2.xml", {1, 0.0}},   // CPUID-only, one rank: no ring
    {"hwloc/Intel-SapphireRapids-2xXeonMax9460.xml", {1, 0.0}},  // CPUID-only, one rank: no ring
    {"hwloc/cxlmem+dax.v3.xml", {1, 0.0}},                       // one package: no ring
    {"hwloc/nvidia-dgx-gb10.xml", {1, 0.0}},                     // GPU not in the capture: no ring
    // 3 Tesla M2070 + the ES1000 VGA the file lists as a GPU, whose link reads pci_link_speed 0.2 GB/s (PCIe 1 x1).
    {"hwloc/24em64t-2n6c2t-pci.xml", {4, 0.2}},
    {"hwloc/32em64t-2n8c2t-pci-wholeio.hwloc1x.xml", {3, 10.0}},  // GPUs on both sockets: SYS, assumed 10 GB/s
    {"hwloc/32em64t-2n8c2t-pci-wholeio.xml", {4, 10.0}},          // GPUs on both sockets: SYS, assumed 10 GB/s
    {"hwloc/irregulargroups-disallowed.xml", {2, 6.0}},           // 2 GPUs at PCIe gen2 x? read as 6 GB/s
    {"hwloc/llnl-arm64-ulna-hwloc1.xml", {2, 10.0}},              // 2 GPU-class devices across sockets: SYS assumed
    {"hwloc/llnl-coral-ea-hwloc1.xml", {4, 10.0}},                // P100 as DRM cards, no NVLink matrix: SYS assumed
    {"hwloc/llnl-cts1-pascal.xml", {2, 15.8}},                    // 2 P100-PCIE under one PLX switch: PCIe3 x16
    {"hwloc/llnl-epyc-corona-p2.xml", {8, 16.0}},                 // MI50s across sockets: inter-socket link 16 GB/s
    {"hwloc/llnl-g4dnmetal.xml", {8, 2.0}},                       // T4s: the file's pci_link_speed 2.0 on a bridge
    {"nccl/aws-p4d-24xl-topo.xml", {8, 10.0}},   // PCIe skeleton only (NVSwitch filled in at run time): SYS assumed
    {"nccl/aws-p4de-24xl-topo.xml", {8, 10.0}},  // as p4d
    {"nccl/aws-p5.48xl-topo.pr1226.xml", {8, 31.5}},  // H100s behind Gen5 switches, one NUMA: PCIe5 x16 = 31.5... x8
    {"nccl/azure-ncv4-graph.xml", {4, 10.0}},         // graph file: GPUs without links, SYS assumed
    {"nccl/azure-ncv4-topo.xml", {4, 16.0}},          // self-targeted NVLink ignored; PCIe4 x8 across NUMA: 16 GB/s
    {"nccl/azure-ndv2-topo.xml", {8, 10.0}},          // flat PCI list, no NVLink: SYS between NUMA nodes, assumed
    {"nccl/azure-ndv4-topo.xml", {8, 16.0}},          // PCIe skeleton: the NUMA-to-NUMA hop, 16 GB/s
    {"nccl/azure-ndv5-topo.xml", {8, 22.0}},          // PCIe skeleton: the inter-socket hop, 22 GB/s
    {"nccl/nccl-issue2397-2xA100pcie-host10.153.235.11-dump.xml", {2, 10.0}},  // 1 A100 per NUMA: SYS assumed
    {"nccl/nccl-issue2397-2xA100pcie-host10.153.235.13-dump.xml", {2, 10.0}},  // same hardware
    {"nccl/nccl-pr877-azure-ncv4-topo.xml", {4, 16.0}},      // NVLink pairs 0-1, 2-3 (12 links); pairs join across NUMA
    {"nccl/rccl-issue1185-8xHygonDCU-dump.xml", {8, 16.0}},  // PCIe only, no xGMI: the inter-NUMA hop 16 GB/s
    {"nccl/rccl-topo_16p1h.xml", {16, 50.0}},        // MI250 GCDs: single xGMI links at 50 GB/s between packages
    {"nccl/rccl-topo_4p4h.xml", {16, 15.8}},         // 4 xGMI hives of 4: the hives join over PCIe3 x16
    {"nccl/rccl-topo_8p_940.xml", {8, 50.0}},        // MI300X full xGMI mesh, 1 link x 50 GB/s per pair
    {"nccl/rccl-topo_8p_pcie.xml", {8, 15.8}},       // MI50 PCIe only: PCIe3 x16
    {"nccl/rccl-topo_8p_rome_4n_1.xml", {8, 16.0}},  // MI100 xGMI, NPS4: a hop across NUMA nodes at 16 GB/s
    {"nccl/simai-topo_4A100_2CX6.xml", {4, 240.0}},  // A100 NVSwitch: 12 links x NCCL's 20 GB/s per SM80 link
    {"nvidia-smi/aws-g6e.12xlarge-4xL40S.topo-m.txt", {4, 12.0}},   // L40S PCIe, NODE: assumed 12 GB/s
    {"nvidia-smi/aws-p4d.24xlarge-8xA100.topo-m.txt", {8, 300.0}},  // A100 NV12: 12 NVLink3 links x 25 GB/s
    {"nvidia-smi/aws-p5.48xlarge-8xH100.topo-m.txt", {8, 450.0}},   // H100 NV18: 18 NVLink4 links x 25 GB/s
    // DGX-1V hybrid cube mesh: NV2 pairs (2 NVLink2 links x 25 GB/s) form the best ring.
    {"nvidia-smi/dgx1-v100-8gpu-4ib.pytorch-ddp-readme.topo-m.txt", {8, 50.0}},
    // GB200 NV18: the matrix names no generation, so 18 x 25 GB/s (NVLink5 is 50 per link: the hardware has 900).
    {"nvidia-smi/gb200-4gpu.k8s-test-infra-issue371.topo-m.txt", {4, 450.0}},
    {"nvidia-smi/h100-4gpu-nv6-4nic.nccl-issue1617.topo-m.txt", {4, 150.0}},            // NV6: 6 NVLink4 x 25 GB/s
    {"nvidia-smi/hgx-a100-sxm4-80gb-8gpu-8nic.deepep-issue13.topo-m.txt", {8, 300.0}},  // NV12: 12 x 25 GB/s
    {"nvidia-smi/l40s-8gpu-pcie-1nic.nccl-tests-issue273.topo-m.txt", {8, 10.0}},       // L40S PCIe across sockets: SYS
};

}  // namespace

TEST(TopologyBandwidths, EveryFileHasTheExpectedBottleneck) {
  int checked = 0;
  for (const auto& [rel, want] : kExpected) {
    const fs::path f = find_file(rel);
    if (f.empty()) continue;
    SCOPED_TRACE(rel);
    const Topology t = load_topology(f.string());
    const Plan plan = plan_collectives(t, place_ranks(t));
    EXPECT_EQ(plan.ranks, want.ranks);
    EXPECT_NEAR(plan.ring_score.bottleneck_gbps, want.bottleneck_gbps, 0.051);
    for (const EdgeMetric& e : plan.ring_edges) EXPECT_LT(e.bandwidth_gbps, 1000.0) << "a placeholder figure";
    ++checked;
  }
  EXPECT_GE(checked, 7) << "the copies in tests/data/topologies are always there";
  // A new file in the corpus needs its expected figure here.
  if (fs::is_directory(shared_dir()))
    for (const auto& e : fs::recursive_directory_iterator(shared_dir())) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".xml" && ext != ".txt")) continue;
      EXPECT_TRUE(kExpected.count(fs::relative(e.path(), shared_dir()).generic_string()))
          << e.path() << " has no expected bottleneck in this test";
    }
}

// DGX-2: the six links of a GPU into the NVSwitch planes add up, within a board and across (assumed trunks).
TEST(TopologyBandwidths, Dgx2SumsTheNvswitchPlanes) {
  const Topology t = load_topology(find_file("hwloc/nvidiaDGX2.xml").string());
  const auto gpus = t.nodes_of(NodeKind::Gpu);
  ASSERT_EQ(gpus.size(), 16u);
  const EdgeMetric same_board = pair_metric(t, gpus[0], gpus[1]);
  EXPECT_EQ(same_board.cls, PathClass::NVL);
  EXPECT_DOUBLE_EQ(same_board.bandwidth_gbps, 150.0);
  EXPECT_FALSE(same_board.assumed);
  const EdgeMetric across = pair_metric(t, gpus[0], gpus[15]);
  EXPECT_EQ(across.cls, PathClass::NVL);
  EXPECT_DOUBLE_EQ(across.bandwidth_gbps, 150.0);
  EXPECT_TRUE(across.assumed);  // the trunks are not in the file
  const Plan plan = plan_collectives(t, place_ranks(t));
  EXPECT_DOUBLE_EQ(plan.ring_score.bottleneck_gbps, 150.0);
  for (const EdgeMetric& e : plan.ring_edges) EXPECT_EQ(e.cls, PathClass::NVL);
  // 256 MiB: faster than the DGX-1 (50 GB/s NV2 ring), not twice slower.
  const Topology dgx1 =
      load_topology(find_file("nvidia-smi/dgx1-v100-8gpu-4ib.pytorch-ddp-readme.topo-m.txt").string());
  const Plan p1 = plan_collectives(dgx1, place_ranks(dgx1));
  EXPECT_LT(plan.ring_allreduce_seconds(256.0 * 1024 * 1024), p1.ring_allreduce_seconds(256.0 * 1024 * 1024));
}

// Bonded links and parallel link entries add up as a flow, too.
TEST(TopologyBandwidths, ParallelLinksAddUp) {
  Topology t;
  const int h = t.add_node({.kind = NodeKind::Host, .name = "h"});
  const int a = t.add_node({.kind = NodeKind::Gpu, .name = "GPU0"});
  const int b = t.add_node({.kind = NodeKind::Gpu, .name = "GPU1"});
  t.add_link({h, a, LinkKind::PCIe, 1, 3, 16, 0, 0});
  t.add_link({h, b, LinkKind::PCIe, 1, 3, 16, 0, 0});
  t.add_link({a, b, LinkKind::NVLink, 2, 0, 0, 50, 0});
  t.add_link({a, b, LinkKind::NVLink, 1, 0, 0, 25, 0});
  EXPECT_DOUBLE_EQ(pair_metric(t, a, b).bandwidth_gbps, 75.0);
  EXPECT_DOUBLE_EQ(nvlink_flow(t, a, b).gbps, 75.0);
}

// Ranks in host memory: a memory-copy figure, marked assumed, never the old 1000 GB/s placeholder.
TEST(TopologyBandwidths, HostMemoryHopsAreAnAssumedCopyRate) {
  Topology t;
  const int h = t.add_node({.kind = NodeKind::Host, .name = "h"});
  const int numa = t.add_node({.kind = NodeKind::Numa, .name = "NUMA0", .index = 0});
  t.add_link({h, numa, LinkKind::Internal, 1, 0, 0, 0, 0});
  const Plan plan = plan_collectives(t, place_ranks(t, 4));
  ASSERT_EQ(plan.ring_edges.size(), 4u);
  for (const EdgeMetric& e : plan.ring_edges) {
    EXPECT_EQ(e.cls, PathClass::LOC);
    EXPECT_DOUBLE_EQ(e.bandwidth_gbps, kAssumedSharedMemoryGbps);
    EXPECT_TRUE(e.assumed);
  }
  EXPECT_TRUE(plan.bottleneck_assumed);
  const std::string text = plan.describe();
  EXPECT_EQ(text.find("1000.0"), std::string::npos) << text;
  EXPECT_NE(text.find("LOC 0 hop(s), 4.0 GB/s (assumed)"), std::string::npos) << text;
  // 16 MiB on 4 ranks: milliseconds (a real run measured 13 ms), not the placeholder's ~25 us.
  EXPECT_GT(plan.ring_allreduce_seconds(16.0 * 1024 * 1024), 3e-3);
}

// Multi-rail: a host's NICs add up between hosts.
TEST(TopologyBandwidths, NicRailsAddUp) {
  Topology t;
  const int net = t.add_node({.kind = NodeKind::Network, .name = "ib"});
  for (int host = 0; host < 2; ++host) {
    const int hid = t.add_node({.kind = NodeKind::Host, .name = named("h", host)});
    const int g = t.add_node({.kind = NodeKind::Gpu, .name = named("GPU", host)});
    t.add_link({hid, g, LinkKind::PCIe, 1, 4, 16, 0, 0});
    for (int rail = 0; rail < 4; ++rail) {
      const int nic = t.add_node({.kind = NodeKind::Nic, .name = named("mlx5_", host * 4 + rail)});
      t.add_link({hid, nic, LinkKind::PCIe, 1, 4, 16, 0, 0});
      t.add_link({nic, net, LinkKind::Network, 1, 0, 0, 25, 0});  // 200 Gb/s each
    }
  }
  const Plan plan = plan_collectives(t, place_ranks(t));
  ASSERT_EQ(plan.hosts, 2);
  EXPECT_DOUBLE_EQ(plan.ring_score.bottleneck_gbps, 100.0);
}

// The picture: one fabric vertex instead of 12 switches, the ring drawn as 16 numbered red arrows.
TEST(TopologyBandwidths, Dgx2PictureDrawsTheRing) {
  const Topology t = load_topology(find_file("hwloc/nvidiaDGX2.xml").string());
  const Plan plan = plan_collectives(t, place_ranks(t));
  const std::string dot = plan_to_dot(t, plan);
  EXPECT_NE(dot.find("rankdir=LR"), std::string::npos);
  EXPECT_NE(dot.find("nvswitch_fabric [label=\"NVSwitch fabric\\n12 switches"), std::string::npos);
  int arrows = 0;
  for (std::size_t at = dot.find(", color=red,"); at != std::string::npos; at = dot.find(", color=red,", at + 1))
    ++arrows;
  EXPECT_EQ(arrows, 16);
  EXPECT_NE(dot.find("label=\"16\""), std::string::npos);
  EXPECT_NE(dot.find("rank 15"), std::string::npos);
  EXPECT_EQ(to_dot(t).find("color=red"), std::string::npos);
}
