// Topology model, readers and writers, against the real topology files in ../shared/topologies (skipped where that
// directory is absent) and against small inputs written here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <typeinfo>
#include <vector>

#include "hopwise/common/error.h"
#include "hopwise/topology/formats.h"
#include "hopwise/topology/graph.h"

namespace fs = std::filesystem;
using namespace hopwise::topology;

namespace {

fs::path shared_dir() {
  const char* env = std::getenv("HOPWISE_SHARED_TOPOLOGIES");
  return env ? fs::path(env) : fs::path(HOPWISE_SHARED_TOPOLOGIES_DEFAULT);
}

#define REQUIRE_SHARED()                                                                                          \
  do {                                                                                                            \
    if (!fs::is_directory(shared_dir())) GTEST_SKIP() << "no shared topology files at " << shared_dir().string(); \
  } while (0)

std::vector<std::string> shared_files() {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(shared_dir(), ec)) return {"(none)"};
  for (const auto& e : fs::recursive_directory_iterator(shared_dir(), ec))
    if (e.is_regular_file() && (e.path().extension() == ".xml" || e.path().extension() == ".txt"))
      out.push_back(fs::relative(e.path(), shared_dir()).generic_string());
  std::sort(out.begin(), out.end());
  if (out.empty()) out.push_back("(none)");
  return out;
}

Topology load(const std::string& rel) { return load_topology((shared_dir() / rel).string()); }

int id(const Topology& t, const std::string& name) {
  auto i = t.find_by_name(name);
  EXPECT_TRUE(i.has_value()) << "no node named " << name;
  return i.value_or(0);
}

PathClass cls(const Topology& t, const std::string& a, const std::string& b) { return t.path(id(t, a), id(t, b)).cls; }

// Expects InvalidArgument whose message names `source` and line `line`.
void expect_invalid(const std::string& text, const std::string& source, int line, const std::string& also = "") {
  try {
    parse_topology(text, source);
    ADD_FAILURE() << "no exception for input:\n" << text.substr(0, 200);
  } catch (const hopwise::InvalidArgument& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find(source + ":" + std::to_string(line) + ":"), std::string::npos) << w;
    if (!also.empty()) {
      EXPECT_NE(w.find(also), std::string::npos) << w;
    }
  }
}

// The rules of NCCL's hand-written XML parser (src/graph/xml.cc): no declaration, no tabs, one tag per line with all
// its attributes, exactly one space before each attribute, double quotes, names and values <= 255 characters,
// at most 16 attributes.
void expect_nccl_parsable(const std::string& xml) {
  ASSERT_EQ(xml.rfind("<system version=\"1\">\n", 0), 0u) << xml.substr(0, 80);
  EXPECT_EQ(xml.find('\t'), std::string::npos);
  std::size_t start = 0;
  while (start < xml.size()) {
    const std::size_t end = xml.find('\n', start);
    const std::string line = xml.substr(start, end - start);
    start = end + 1;
    const std::size_t lt = line.find('<');
    ASSERT_NE(lt, std::string::npos) << line;
    EXPECT_EQ(line.find_first_not_of(' '), lt) << line;
    EXPECT_EQ(std::count(line.begin(), line.end(), '<'), 1) << line;
    EXPECT_EQ(line.back(), '>') << line;
    EXPECT_EQ(line.find("  ", lt), std::string::npos) << line;
    EXPECT_EQ(std::count(line.begin(), line.end(), '"') % 2, 0) << line;
    EXPECT_LE(std::count(line.begin(), line.end(), '='), 16) << line;
    for (std::size_t q = line.find('"'); q != std::string::npos;) {
      const std::size_t q2 = line.find('"', q + 1);
      EXPECT_LE(q2 - q - 1, 255u) << line;
      q = line.find('"', q2 + 1);
    }
  }
}

}  // namespace

// ------------------------------------------------------------------ every shared file loads

class SharedFile : public ::testing::TestWithParam<std::string> {};

TEST_P(SharedFile, LoadsAndRoundTrips) {
  REQUIRE_SHARED();
  if (GetParam() == "(none)") GTEST_SKIP() << "no topology files";
  const Topology t = load(GetParam());
  EXPECT_GT(t.nodes().size(), 0u);
  EXPECT_EQ(t.count(NodeKind::Host), 1) << GetParam();
  // JSON round trip is exact, DOT names every node, the NCCL writer's output reads back with the same GPUs.
  const std::string j = to_json(t);
  EXPECT_EQ(to_json(parse_json(j, "rt.json")), j);
  // (Several NVSwitches are drawn as one fabric vertex.)
  const std::string dot = to_dot(t);
  const bool fabric = t.count(NodeKind::NvSwitch) >= 2;
  for (const auto& n : t.nodes()) {
    if (fabric && n.kind == NodeKind::NvSwitch) continue;
    EXPECT_NE(dot.find("n" + std::to_string(n.id) + " [label=\"" + n.name), std::string::npos);
  }
  if (fabric) {
    EXPECT_NE(dot.find("nvswitch_fabric [label=\"NVSwitch fabric"), std::string::npos);
  }
  if (t.source_format.rfind("nccl-graph", 0) != 0) {
    const std::string xml = to_nccl_xml(t);
    expect_nccl_parsable(xml);
    const Topology back = parse_nccl_xml(xml, "written.xml");
    EXPECT_EQ(back.count(NodeKind::Gpu), t.count(NodeKind::Gpu));
    EXPECT_EQ(back.count(NodeKind::Nic), t.count(NodeKind::Nic));
  }
  // Every GPU pair has a path class.
  const auto gpus = t.nodes_of(NodeKind::Gpu);
  for (std::size_t i = 0; i + 1 < gpus.size() && i < 4; ++i)
    EXPECT_NE(t.path(gpus[i], gpus[i + 1]).cls, PathClass::DIS);
}

INSTANTIATE_TEST_SUITE_P(Shared, SharedFile, ::testing::ValuesIn(shared_files()),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string s = i.param;
                           for (char& c : s)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return s;
                         });

// ------------------------------------------------------------------ counts checked by hand against the files

TEST(TopologyCounts, NcclSimaiHgxA100Subset) {
  REQUIRE_SHARED();
  const Topology t = load("nccl/simai-topo_4A100_2CX6.xml");  // 4 <gpu>, 3 <nic>, 1 <cpu>
  EXPECT_EQ(t.source_format, "nccl-xml v1");
  EXPECT_EQ(t.count(NodeKind::Gpu), 4);
  EXPECT_EQ(t.count(NodeKind::Nic), 3);
  EXPECT_EQ(t.count(NodeKind::Numa), 1);
  EXPECT_EQ(t.count(NodeKind::NvSwitch), 1);  // NCCL merges the 6 NVSwitch targets into one node
  EXPECT_DOUBLE_EQ(t.node(id(t, "mlx5_bond_0")).speed_gbps, 200.0);
}

TEST(TopologyCounts, RcclMi300x) {
  REQUIRE_SHARED();
  const Topology t = load("nccl/rccl-topo_8p_940.xml");  // version 2, 8 GPUs, 8 NICs, 2 <cpu>
  EXPECT_EQ(t.source_format, "nccl-xml v2");
  EXPECT_EQ(t.count(NodeKind::Gpu), 8);
  EXPECT_EQ(t.count(NodeKind::Nic), 8);
  EXPECT_EQ(t.count(NodeKind::Numa), 2);
  EXPECT_EQ(cls(t, "GPU0", "GPU7"), PathClass::NVL);  // full xGMI mesh
}

TEST(TopologyCounts, HwlocAwsG4dnMetal) {
  REQUIRE_SHARED();
  const Topology t = load("hwloc/llnl-g4dnmetal.xml");  // 8 PCIDev class 0302 (T4), EFA + ENA, 2 NUMANode objects
  EXPECT_EQ(t.source_format, "hwloc-xml v2.0");
  EXPECT_EQ(t.count(NodeKind::Gpu), 8);
  EXPECT_EQ(t.count(NodeKind::Nic), 2);
  EXPECT_EQ(t.count(NodeKind::Numa), 2);
  EXPECT_EQ(t.count(NodeKind::CpuPackage), 2);
  EXPECT_EQ(t.node(id(t, "GPU0")).pci_bus_id, "0000:18:00.0");
  EXPECT_EQ(t.node(id(t, "GPU0")).numa, 0);
}

TEST(TopologyCounts, HwlocDgx2) {
  REQUIRE_SHARED();
  const Topology t = load("hwloc/nvidiaDGX2.xml");  // 16 PCIDev 0302, 12 NVSwitch PCIDevs, 2 NUMA
  EXPECT_EQ(t.count(NodeKind::Gpu), 16);
  EXPECT_EQ(t.count(NodeKind::NvSwitch), 12);  // the matrix names 28 objects: 16 GPUs + 12 NVSwitches
  EXPECT_EQ(t.count(NodeKind::Numa), 2);
  // The NVLinkBandwidth matrix gives NVLink edges: GPUs reach each other through NVSwitches.
  EXPECT_EQ(cls(t, "GPU0", "GPU1"), PathClass::NVL);
  EXPECT_DOUBLE_EQ(t.path(id(t, "GPU0"), id(t, "GPU1")).bottleneck_gbps, 25.0);  // 25000 MB/s per GPU-switch pair
}

TEST(TopologyCounts, NvidiaSmiHgxA100) {
  REQUIRE_SHARED();
  const Topology t = load("nvidia-smi/hgx-a100-sxm4-80gb-8gpu-8nic.deepep-issue13.topo-m.txt");
  EXPECT_EQ(t.count(NodeKind::Gpu), 8);
  EXPECT_EQ(t.count(NodeKind::Nic), 8);
  EXPECT_EQ(t.count(NodeKind::Numa), 2);
  EXPECT_EQ(t.node(id(t, "GPU4")).cpu_affinity, "32-63,96-127");
  EXPECT_EQ(t.node(id(t, "mlx5_5")).numa, 1);                              // NIC5 is PXB to GPU4/5 on NUMA 1
  EXPECT_EQ(t.path(id(t, "GPU0"), id(t, "GPU1")).bottleneck_gbps, 300.0);  // NV12
}

// ------------------------------------------------------------------ path classes match the files

TEST(TopologyPaths, NvidiaSmiDgx1) {
  REQUIRE_SHARED();
  const Topology t = load("nvidia-smi/dgx1-v100-8gpu-4ib.pytorch-ddp-readme.topo-m.txt");
  EXPECT_EQ(cls(t, "GPU0", "GPU0"), PathClass::LOC);
  EXPECT_EQ(cls(t, "GPU0", "GPU1"), PathClass::NVL);  // NV1
  EXPECT_EQ(cls(t, "GPU0", "GPU3"), PathClass::NVL);  // NV2
  EXPECT_EQ(cls(t, "GPU0", "GPU5"), PathClass::SYS);
  EXPECT_EQ(cls(t, "GPU0", "mlx5_0"), PathClass::PIX);
  EXPECT_EQ(cls(t, "GPU0", "mlx5_1"), PathClass::PHB);
  EXPECT_EQ(cls(t, "mlx5_2", "mlx5_3"), PathClass::PHB);
  EXPECT_EQ(t.path(id(t, "GPU0"), id(t, "GPU3")).hops, 1);
  const Link& nv2 = t.links()[static_cast<std::size_t>(t.links_of(id(t, "GPU0")).back())];
  EXPECT_EQ(nv2.kind, LinkKind::NVLink);
  // Every cell of the file is reproduced.
  EXPECT_EQ(t.declared_path_classes().size(), 12u * 11u);
}

TEST(TopologyPaths, NvidiaSmiNodeClass) {
  REQUIRE_SHARED();
  const Topology t = load("nvidia-smi/hgx-a100-sxm4-80gb-8gpu-8nic.deepep-issue13.topo-m.txt");
  EXPECT_EQ(cls(t, "GPU0", "mlx5_0"), PathClass::PXB);
  EXPECT_EQ(cls(t, "GPU0", "mlx5_2"), PathClass::NODE);
  EXPECT_EQ(cls(t, "GPU0", "mlx5_4"), PathClass::SYS);
  EXPECT_EQ(cls(t, "mlx5_0", "mlx5_1"), PathClass::PIX);
}

TEST(TopologyPaths, NcclXmlSimai) {
  REQUIRE_SHARED();
  const Topology t = load("nccl/simai-topo_4A100_2CX6.xml");
  const PathInfo p = t.path(id(t, "GPU0"), id(t, "GPU3"));
  EXPECT_EQ(p.cls, PathClass::NVL);  // both have 6 NVSwitch targets x 2 links
  EXPECT_EQ(p.hops, 2);              // GPU - NVS - GPU
  EXPECT_DOUBLE_EQ(p.bottleneck_gbps, 12 * 20.0);
  // GPU0 (13:00.0) and mlx5_bond_1 (1a:00.0) share the switch 0c:00.0 through 0e/11 and 15: several switches.
  EXPECT_EQ(cls(t, "GPU0", "mlx5_bond_1"), PathClass::PXB);
  // mlx5_bond_0 hangs directly off the CPU.
  EXPECT_EQ(cls(t, "GPU0", "mlx5_bond_0"), PathClass::PHB);
  // GPU1 (19:00.0 under 17:00.0 under 15:00.0) and mlx5_bond_1 (1a:00.0 under 15:00.0): two switches.
  EXPECT_EQ(cls(t, "GPU1", "mlx5_bond_1"), PathClass::PXB);
}

TEST(TopologyWriters, NcclXmlKeepsPathClasses) {
  REQUIRE_SHARED();
  for (const char* rel : {"nccl/simai-topo_4A100_2CX6.xml", "nccl/rccl-topo_8p_940.xml",
                          "nccl/nccl-issue2397-2xA100pcie-host10.153.235.11-dump.xml"}) {
    const Topology t = load(rel);
    const Topology back = parse_nccl_xml(to_nccl_xml(t), "written.xml");
    std::vector<int> a = t.nodes_of(NodeKind::Gpu), b = back.nodes_of(NodeKind::Gpu);
    for (int n : t.nodes_of(NodeKind::Nic)) a.push_back(n);
    for (int n : back.nodes_of(NodeKind::Nic)) b.push_back(n);
    ASSERT_EQ(a.size(), b.size()) << rel;
    for (std::size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(t.node(a[i]).pci_bus_id, back.node(b[i]).pci_bus_id) << rel;
      for (std::size_t j = 0; j < a.size(); ++j)
        EXPECT_EQ(t.path(a[i], a[j]).cls, back.path(b[i], b[j]).cls)
            << rel << " " << t.node(a[i]).name << " - " << t.node(a[j]).name;
    }
  }
}

TEST(TopologyPaths, NcclXmlTwoSockets) {
  REQUIRE_SHARED();
  const Topology t = load("nccl/nccl-issue2397-2xA100pcie-host10.153.235.11-dump.xml");
  EXPECT_EQ(cls(t, "GPU0", "GPU1"), PathClass::SYS);    // one per <cpu>
  EXPECT_EQ(cls(t, "GPU0", "mlx5_0"), PathClass::PHB);  // both directly under cpu 0
  EXPECT_EQ(t.node(id(t, "mlx5_0")).attrs.at("ports"), "mlx5_0,mlx5_1");
  const Topology pr877 = load("nccl/nccl-pr877-azure-ncv4-topo.xml");
  EXPECT_EQ(cls(pr877, "GPU0", "GPU1"), PathClass::NVL);  // NVLink pair, 12 links
  EXPECT_EQ(cls(pr877, "GPU0", "GPU2"), PathClass::SYS);
}

// ------------------------------------------------------------------ model, writers

TEST(TopologyModel, ClassifiesPcieTree) {
  Topology t;
  const int host = t.add_node({.kind = NodeKind::Host, .name = "h"});
  const int p0 = t.add_node({.kind = NodeKind::CpuPackage, .name = "P0"});
  const int p1 = t.add_node({.kind = NodeKind::CpuPackage, .name = "P1"});
  const int hb0 = t.add_node({.kind = NodeKind::PciSwitch, .name = "HB0", .host_bridge = true});
  const int hb1 = t.add_node({.kind = NodeKind::PciSwitch, .name = "HB1", .host_bridge = true});
  const int sw = t.add_node({.kind = NodeKind::PciSwitch, .name = "SW"});
  const int sw2 = t.add_node({.kind = NodeKind::PciSwitch, .name = "SW2"});
  const int g0 = t.add_node({.kind = NodeKind::Gpu, .name = "G0"});
  const int g1 = t.add_node({.kind = NodeKind::Gpu, .name = "G1"});
  const int g2 = t.add_node({.kind = NodeKind::Gpu, .name = "G2"});
  const int g3 = t.add_node({.kind = NodeKind::Gpu, .name = "G3"});
  const int g4 = t.add_node({.kind = NodeKind::Gpu, .name = "G4"});
  auto pcie = [&](int a, int b) { t.add_link({a, b, LinkKind::PCIe, 1, 4, 16, pcie_bandwidth_gbps(4, 16), 0}); };
  t.add_link({host, p0, LinkKind::Internal});
  t.add_link({host, p1, LinkKind::Internal});
  t.add_link({p0, p1, LinkKind::InterSocket, 1, 0, 0, 20, 0});
  pcie(p0, hb0);
  pcie(p0, hb1);
  pcie(hb0, sw);
  pcie(sw, g0);
  pcie(sw, g1);
  pcie(sw, sw2);
  pcie(sw2, g2);
  pcie(hb1, g3);
  const int hb2 = t.add_node({.kind = NodeKind::PciSwitch, .name = "HB2", .host_bridge = true});
  pcie(p1, hb2);
  pcie(hb2, g4);
  EXPECT_EQ(t.path(g0, g1).cls, PathClass::PIX);
  EXPECT_EQ(t.path(g0, g2).cls, PathClass::PXB);
  EXPECT_EQ(t.path(g0, g3).cls, PathClass::NODE);
  EXPECT_EQ(t.path(g0, g4).cls, PathClass::SYS);
  EXPECT_DOUBLE_EQ(t.path(g0, g4).bottleneck_gbps, 20.0);
  EXPECT_EQ(t.path(g0, g4).hops, 6);  // G0 SW HB0 P0 P1 HB2 G4
  t.add_link({g0, g4, LinkKind::NVLink, 4, 0, 0, 100, 0});
  t.add_link({g4, g3, LinkKind::NVLink, 2, 0, 0, 50, 0});
  EXPECT_EQ(t.path(g0, g4).cls, PathClass::NVL);
  const PathInfo nvb = t.path(g0, g3);
  EXPECT_EQ(nvb.cls, PathClass::NVB);
  EXPECT_DOUBLE_EQ(nvb.bottleneck_gbps, 50.0);
  EXPECT_EQ(nvb.route, (std::vector<int>{g0, g4, g3}));
  EXPECT_THROW(t.add_link({g0, g0, LinkKind::PCIe}), hopwise::InvalidArgument);
  EXPECT_THROW(t.path(g0, 999), hopwise::InvalidArgument);
}

TEST(TopologyWriters, JsonRoundTripAndNcclXmlShape) {
  const std::string smi =
      "        GPU0    GPU1    NIC0    CPU Affinity    NUMA Affinity\n"
      "GPU0     X      NV4     PIX     0-7     0\n"
      "GPU1    NV4      X      SYS     8-15    1\n"
      "NIC0    PIX     SYS      X\n"
      "\nNIC Legend:\n\n  NIC0: mlx5_0\n";
  const Topology t = parse_topology(smi, "mini.txt");
  const std::string j = to_json(t);
  const Topology back = parse_topology(j, "mini.json");
  EXPECT_EQ(to_json(back), j);
  EXPECT_EQ(back.path(id(back, "GPU0"), id(back, "mlx5_0")).cls, PathClass::PIX);
  const std::string xml = to_nccl_xml(t);
  EXPECT_EQ(xml.rfind("<system version=\"1\">", 0), 0u) << xml;  // no XML declaration
  EXPECT_EQ(xml.find('\t'), std::string::npos);
  std::size_t start = 0;
  while (start < xml.size()) {
    const std::size_t end = xml.find('\n', start);
    const std::string line = xml.substr(start, end - start);
    EXPECT_EQ(std::count(line.begin(), line.end(), '<'), 1) << line;  // one tag per line, attributes on it
    EXPECT_LE(std::count(line.begin(), line.end(), '='), 16) << line;
    start = end + 1;
  }
  const Topology x = parse_topology(xml, "written.xml");
  EXPECT_EQ(x.count(NodeKind::Gpu), 2);
  EXPECT_EQ(x.count(NodeKind::Numa), 2);
  EXPECT_EQ(x.path(id(x, "GPU0"), id(x, "GPU1")).cls, PathClass::NVL);
  const std::string dot = to_dot(t);
  EXPECT_EQ(dot.rfind("graph topology {", 0), 0u);
  for (const auto& n : t.nodes()) {
    std::string want = "n";
    want += std::to_string(n.id);
    want += " [label=\"";
    EXPECT_NE(dot.find(want), std::string::npos) << want;
  }
}

TEST(TopologyFormats, Detects) {
  EXPECT_EQ(detect_format("<?xml version=\"1.0\"?>\n<!DOCTYPE topology SYSTEM \"hwloc2.dtd\">\n<topology>"),
            TopologyFormat::HwlocXml);
  EXPECT_EQ(detect_format("<!-- c -->\n<system version=\"1\">"), TopologyFormat::NcclXml);
  EXPECT_EQ(detect_format("<graphs version=\"1\">"), TopologyFormat::NcclGraphXml);
  EXPECT_EQ(detect_format("\tGPU0\tGPU1\n"), TopologyFormat::NvidiaSmi);
  EXPECT_EQ(detect_format("{\"schema\":1}"), TopologyFormat::Json);
  EXPECT_EQ(detect_format("hello"), TopologyFormat::Unknown);
}

// ------------------------------------------------------------------ malformed input

TEST(TopologyMalformed, TruncatedXml) {
  expect_invalid("<system version=\"1\">\n  <cpu numaid=\"0\">\n    <pci busid=\"0000:01:00.0\"", "trunc.xml", 3,
                 "unterminated");
  expect_invalid("<topology version=\"2.0\">\n  <object type=\"Machine\">\n", "trunc2.xml", 3, "expected </object>");
}

TEST(TopologyMalformed, WrongRootAndVersion) {
  expect_invalid("<?xml version=\"1.0\"?>\n<system version=\"7\">\n</system>\n", "ver.xml", 2, "version");
  expect_invalid("\n\n<html><body/></html>", "root.xml", 3, "unrecognised");
  try {
    parse_nccl_xml("<foo/>", "f.xml");
    ADD_FAILURE();
  } catch (const hopwise::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("f.xml:1: expected the NCCL root element"), std::string::npos) << e.what();
  }
  try {
    parse_hwloc_xml("<system version=\"1\"/>", "h.xml");
    ADD_FAILURE();
  } catch (const hopwise::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("h.xml:1:"), std::string::npos) << e.what();
  }
}

TEST(TopologyMalformed, Garbage) {
  expect_invalid("\x01\x02\x03 not a topology", "garbage.bin", 1);
  expect_invalid(std::string("<system\0version", 15), "nul.xml", 1, "NUL");
  expect_invalid("<system version=\"1\">\n<cpu numaid=\"zero\"/>\n</system>", "attr.xml", 2, "integer");
  expect_invalid("<system version=\"1\">\n<cpu numaid=\"0\"><pci class=\"0x030200\"/></cpu>\n</system>", "busid.xml", 2,
                 "busid");
  expect_invalid("<system version=\"1\">\n</cpu>\n", "close.xml", 2, "expected </system>");
  expect_invalid("<system version=\"1\"></system>\ntrailing", "trail.xml", 2, "end of the document");
  expect_invalid("        GPU0    GPU1\nGPU0     X      NV4\nGPU1    FOO      X\n", "smi.txt", 3, "unknown cell");
  expect_invalid("        GPU0    GPU1\nGPU0     X      NV4\n", "short.txt", 3, "matrix rows");
  expect_invalid("{\"schema\": \"hopwise-topology\", \"version\": 1,\n \"nodes\": [", "bad.json", 2, "JSON");
  expect_invalid("{\"schema\": \"other\"}", "other.json", 1, "schema");
}

TEST(TopologyMalformed, TooDeep) {
  std::string s = "<system version=\"1\">\n";
  for (int i = 0; i < kMaxXmlDepth + 5; ++i) s += "<pci busid=\"0000:00:00.0\">\n";
  expect_invalid(s, "deep.xml", kMaxXmlDepth + 1, "deeper");
  std::string huge(kMaxFileBytes + 1, ' ');
  expect_invalid(huge, "huge.xml", 1, "limit");
}

TEST(TopologyMalformed, NoEntityExpansion) {
  expect_invalid(
      "<?xml version=\"1.0\"?>\n<!DOCTYPE system [\n<!ENTITY xxe SYSTEM \"file:///etc/passwd\">\n]>\n"
      "<system version=\"1\" name=\"&xxe;\"></system>",
      "xxe.xml", 2, "DOCTYPE");
  expect_invalid("<system version=\"1\" name=\"&xxe;\">\n</system>", "ent.xml", 1, "unknown entity");
  const Topology t = parse_topology("<system version=\"1\" name=\"a&amp;b&#x41;\">\n</system>", "ok.xml");
  EXPECT_EQ(t.node(0).attrs.at("name"), "a&bA");
}

TEST(TopologyMalformed, MissingFile) { EXPECT_THROW(load_topology("/nonexistent/topo.xml"), hopwise::InvalidArgument); }

// Truncated and corrupted copies of real files: each either loads or throws InvalidArgument, never anything else.
// Fresh seed per run, printed on failure; HOPWISE_TEST_SEED=<seed> replays one.
TEST(TopologyMalformed, MutatedFilesNeverCrash) {
  REQUIRE_SHARED();
  const char* env = std::getenv("HOPWISE_TEST_SEED");
  const unsigned seed = env ? static_cast<unsigned>(std::strtoul(env, nullptr, 10)) : std::random_device{}();
  SCOPED_TRACE("HOPWISE_TEST_SEED=" + std::to_string(seed));
  std::mt19937 rng(seed);
  for (const char* rel :
       {"nccl/simai-topo_4A100_2CX6.xml", "nccl/rccl-topo_8p_940.xml", "hwloc/devel09-pci.xml",
        "hwloc/28intel64-2p2g7c-CoDgroups.v1.xml", "nvidia-smi/dgx1-v100-8gpu-4ib.pytorch-ddp-readme.topo-m.txt"}) {
    std::ifstream f(shared_dir() / rel, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    ASSERT_FALSE(text.empty()) << rel;
    const std::string json = to_json(parse_topology(text, rel));
    for (const std::string* base : {&text, &json}) {
      for (int k = 0; k < 60; ++k) {
        std::string m = *base;
        if (k % 2 == 0) {
          m.resize(std::uniform_int_distribution<std::size_t>(0, m.size() - 1)(rng));
        } else {
          for (int flips = 0; flips < 4; ++flips)
            m[std::uniform_int_distribution<std::size_t>(0, m.size() - 1)(rng)] =
                "<>\"'=/ \n&;x0[]{}:,"[std::uniform_int_distribution<int>(0, 18)(rng)];
        }
        try {
          const Topology t = parse_topology(m, "mutated");
          (void)to_json(t);
          (void)to_nccl_xml(t);
          (void)to_dot(t);
          for (int g : t.nodes_of(NodeKind::Gpu)) (void)t.path(g, t.nodes_of(NodeKind::Gpu).front());
        } catch (const hopwise::InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find("mutated:"), std::string::npos) << e.what();
        } catch (const std::exception& e) {
          ADD_FAILURE() << rel << " mutation " << k << ": unexpected " << typeid(e).name() << ": " << e.what();
        }
      }
    }
  }
}
