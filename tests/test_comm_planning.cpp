// The communicator plans on the job's topology: discovery gathered over the transport, or HOPWISE_TOPO_FILE.
#include <fmt/core.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <thread>

#include "hopwise/comm/communicator.h"
#include "hopwise/comm/transports/inproc_transport.h"
#include "hopwise/topology/cluster.h"
#include "hopwise/topology/formats.h"
#include "inproc_group.h"

namespace hc = hopwise::comm;
namespace ht = hopwise::topology;
namespace fs = std::filesystem;

namespace {

// A host with one package, one NUMA node (cpus 0-7), two GPUs on PCIe and a 100 Gb/s NIC.
ht::Topology small_machine() {
  ht::Topology t;
  const int host = t.add_node({.kind = ht::NodeKind::Host, .name = "m"});
  const int pkg = t.add_node({.kind = ht::NodeKind::CpuPackage, .name = "Package0", .index = 0});
  const int numa =
      t.add_node({.kind = ht::NodeKind::Numa, .name = "NUMA0", .numa = 0, .index = 0, .cpu_affinity = "0-7"});
  t.add_link({host, pkg, ht::LinkKind::Internal});
  t.add_link({pkg, numa, ht::LinkKind::Internal});
  for (int g = 0; g < 2; ++g) {
    const int gpu = t.add_node({.kind = ht::NodeKind::Gpu, .name = "GPU" + std::to_string(g), .index = g});
    t.add_link({numa, gpu, ht::LinkKind::PCIe, 1, 4, 16, 0, 0});
  }
  const int nic = t.add_node({.kind = ht::NodeKind::Nic, .name = "eth0", .speed_gbps = 100});
  t.add_link({numa, nic, ht::LinkKind::PCIe, 1, 4, 16, 0, 0});
  return t;
}

struct ScopedEnv {
  std::string name;
  ScopedEnv(std::string n, const std::string& v) : name(std::move(n)) { setenv(name.c_str(), v.c_str(), 1); }
  ~ScopedEnv() { unsetenv(name.c_str()); }
};

}  // namespace

TEST(CommPlanning, DiscoveryIsGatheredOverTheTransport) {
  const int n = 3;
  auto world = hc::make_inprocess_world(n);
  hc::Options o = hwtest::test_options();
  o.discover_topology = true;  // collective: every rank builds its communicator on its own thread
  std::vector<std::unique_ptr<hc::Communicator>> comms(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      comms[static_cast<size_t>(r)] =
          std::make_unique<hc::Communicator>(std::make_unique<hc::InProcessTransport>(world, r), o);
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    const ht::Cluster* c = comms[static_cast<size_t>(r)]->cluster();
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(c->hosts.size(), 1u);
    EXPECT_EQ(c->placement.size(), static_cast<size_t>(n));
    EXPECT_NE(comms[static_cast<size_t>(r)]->plan_description().find("from discovery (3 rank(s) on 1 host(s))"),
              std::string::npos)
        << comms[static_cast<size_t>(r)]->plan_description();
  }
}

TEST(CommPlanning, TopologyFileAcrossHostsPlansAndBoundsTheModel) {
  const ht::Topology m = small_machine();
  const ht::Cluster c =
      ht::assemble_cluster({ht::encode_view({0, "a", "", ""}, &m), ht::encode_view({1, "b", "", ""}, &m)});
  const fs::path file = fs::temp_directory_path() / ("hopwise-two-hosts-" + std::to_string(getpid()) + ".json");
  ht::save_text(file.string(), ht::to_json(c.topology));
  const fs::path dump = fs::path(file).replace_extension(".dump.json");
  {
    ScopedEnv topo("HOPWISE_TOPO_FILE", file.string());
    ScopedEnv out("HOPWISE_TOPO_DUMP_FILE", dump.string());
    hwtest::Group g(4, hwtest::test_options());
    // Ranks round-robin on a:GPU0, a:GPU1, b:GPU0, b:GPU1: two hosts, each entered once.
    EXPECT_NE(g.comm(0).plan_description().find("4 ranks on 2 host(s)"), std::string::npos)
        << g.comm(0).plan_description();
    const auto& model = g.comm(0).cost_model().params();
    EXPECT_EQ(model.source, "defaults bounded by the plan");
    EXPECT_GE(model.beta, 1e-9 / 12.5 - 1e-15);  // 100 Gb/s NICs: 12.5 GB/s at best
    // Collectives stay correct on the planned ring and trees.
    const std::string err = g.run([](int r, hc::Communicator& comm) {
      for (auto a : {hc::Algorithm::kRing, hc::Algorithm::kTree, hc::Algorithm::kAuto, hc::Algorithm::kHierarchical}) {
        comm.set_algorithm(a);
        std::vector<float> v(1001, static_cast<float>(r + 1));
        comm.allreduce(std::span<float>(v));
        for (float x : v)
          if (x != 10.0f) throw std::runtime_error("wrong sum " + std::to_string(x));
      }
    });
    EXPECT_EQ(err, "");
  }
  // Rank 0 wrote what the plan was made on; it loads back as the same two hosts.
  const ht::Topology back = ht::load_topology(dump.string());
  EXPECT_EQ(back.count(ht::NodeKind::Host), 2);
  fs::remove(file);
  fs::remove(dump);
}

// The hierarchical allreduce (reduce within each host, ring across the hosts' leaders, broadcast within) on three
// hosts of unequal rank counts: every size, op and dtype it is given matches a plain reduction.
TEST(CommPlanning, HierarchicalAllreduceAcrossUnevenHosts) {
  const ht::Topology m = small_machine();
  const ht::Cluster c =
      ht::assemble_cluster({ht::encode_view({0, "a", "", ""}, &m), ht::encode_view({1, "b", "", ""}, &m),
                            ht::encode_view({2, "c", "", ""}, &m)});
  const fs::path file = fs::temp_directory_path() / ("hopwise-three-hosts-" + std::to_string(getpid()) + ".json");
  ht::save_text(file.string(), ht::to_json(c.topology));
  ScopedEnv topo("HOPWISE_TOPO_FILE", file.string());
  const int p = 5;  // round-robin on a:GPU0, a:GPU1, b:GPU0, b:GPU1, c:GPU0: hosts of 2, 2 and 1 ranks
  hc::Options o = hwtest::test_options(hc::Algorithm::kHierarchical, 1024);  // small chunks: pipelined trees
  hwtest::Group g(p, o);
  ASSERT_NE(g.comm(0).plan_description().find("5 ranks on 3 host(s)"), std::string::npos)
      << g.comm(0).plan_description();
  const std::string err = g.run([&](int r, hc::Communicator& comm) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{1009}, std::size_t{70001}}) {
      for (auto op : {hopwise::ReduceOp::kSum, hopwise::ReduceOp::kMax, hopwise::ReduceOp::kAvg}) {
        std::vector<double> v(n), want(n, op == hopwise::ReduceOp::kMax ? -1e300 : 0.0);
        for (std::size_t i = 0; i < n; ++i) {
          v[i] = static_cast<double>((i * 7 + static_cast<std::size_t>(r) * 13) % 101) - 50;
          for (int q = 0; q < p; ++q) {
            const double x = static_cast<double>((i * 7 + static_cast<std::size_t>(q) * 13) % 101) - 50;
            want[i] = op == hopwise::ReduceOp::kMax ? std::max(want[i], x) : want[i] + x;
          }
          if (op == hopwise::ReduceOp::kAvg) want[i] /= p;
        }
        comm.allreduce(v.data(), v.data(), n, hopwise::DataType::kFloat64, op);
        for (std::size_t i = 0; i < n; ++i)
          if (std::abs(v[i] - want[i]) > 1e-9)
            throw std::runtime_error(
                fmt::format("n={} op={} [{}] = {} want {}", n, hopwise::to_string(op), i, v[i], want[i]));
      }
      std::vector<std::int32_t> iv(n, r + 1);
      comm.allreduce(iv.data(), iv.data(), n, hopwise::DataType::kInt32, hopwise::ReduceOp::kSum);
      for (auto x : iv)
        if (x != p * (p + 1) / 2) throw std::runtime_error("int32 sum " + std::to_string(x));
    }
  });
  EXPECT_EQ(err, "");
  fs::remove(file);
}

// Two ring channels side by side (a ring and its reverse): every size, op and dtype matches a plain reduction,
// whether the buffer is split between them or too small to split.
TEST(CommPlanning, RingChannelsSideBySide) {
  const int p = 4;
  hwtest::Group g(p, hwtest::test_options(hc::Algorithm::kRing, 1024));
  for (int r = 0; r < p; ++r) {
    g.comm(r).set_ring_channels({{0, 2, 1, 3}, {0, 3, 1, 2}});
    ASSERT_EQ(g.comm(r).ring_channels().size(), 2u);
    ASSERT_EQ(g.comm(r).ring_order(), (std::vector<int>{0, 2, 1, 3}));
  }
  const std::string err = g.run([&](int r, hc::Communicator& comm) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{4099}, std::size_t{100003}}) {
      std::vector<float> v(n);
      for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 3 + static_cast<std::size_t>(r)) % 17);
      comm.allreduce(v.data(), v.data(), n, hopwise::DataType::kFloat32, hopwise::ReduceOp::kSum);
      for (std::size_t i = 0; i < n; ++i) {
        float want = 0;
        for (int q = 0; q < p; ++q) want += static_cast<float>((i * 3 + static_cast<std::size_t>(q)) % 17);
        if (v[i] != want) throw std::runtime_error(fmt::format("float sum n={} [{}] = {} want {}", n, i, v[i], want));
      }
      std::vector<std::int32_t> iv(n);
      for (std::size_t i = 0; i < n; ++i) iv[i] = static_cast<std::int32_t>((i + static_cast<std::size_t>(r) * 7) % 23);
      comm.allreduce(iv.data(), iv.data(), n, hopwise::DataType::kInt32, hopwise::ReduceOp::kMax);
      for (std::size_t i = 0; i < n; ++i) {
        std::int32_t want = 0;
        for (int q = 0; q < p; ++q)
          want = std::max(want, static_cast<std::int32_t>((i + static_cast<std::size_t>(q) * 7) % 23));
        if (iv[i] != want) throw std::runtime_error(fmt::format("int32 max n={} [{}] = {} want {}", n, i, iv[i], want));
      }
    }
  });
  EXPECT_EQ(err, "");
  g.comm(0).set_ring_order({0, 1, 2, 3});  // one ring again
  EXPECT_TRUE(g.comm(0).ring_channels().empty());
}
