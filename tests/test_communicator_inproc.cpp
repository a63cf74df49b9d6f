// The communicator's basics on in-process ranks (threads): point-to-point order, sizes and bad arguments, plans
// (ring orders, custom trees), the algorithm choice and its fallbacks, statistics, typed calls. The collectives per
// algorithm, dtype, op, count and rank count are the suite's (test_collectives_sizes.cpp, every world).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "collective_reference.h"
#include "hopwise/common/error.h"
#include "inproc_group.h"

namespace {

using namespace hwtest;
using hc::Algorithm;
using hc::Collective;

std::vector<const void*> ptrs(const std::vector<Bytes>& v) {
  std::vector<const void*> p;
  for (const auto& b : v) p.push_back(b.data());
  return p;
}

std::string algo_name(Algorithm a) { return std::string(hc::to_string(a)); }

// The algorithms hopwise implements itself, from the table (native is MPI's and does not exist in-process).
// One allreduce case on every rank of `g`: out of place, then in place; checks every rank. False when a rank
// threw (the group is then unusable and the caller stops).
bool allreduce_case(Group& g, Algorithm algo, DataType dt, ReduceOp op, std::size_t count, std::uint64_t seed,
                    bool in_place = true) {
  const int n = g.size();
  const std::uint64_t cs = mix_seed(seed, {static_cast<std::uint64_t>(dt), static_cast<std::uint64_t>(op), count,
                                           static_cast<std::uint64_t>(n), static_cast<std::uint64_t>(algo)});
  const std::string what = fmt::format("allreduce(count={}, {}, {}) over {} ranks, algorithm {}", count,
                                       hopwise::to_string(dt), hopwise::to_string(op), n, algo_name(algo));
  SCOPED_TRACE(what);
  const std::size_t bytes = count * hopwise::dtype_size(dt);
  std::vector<Bytes> in(static_cast<std::size_t>(n)), out(static_cast<std::size_t>(n)), io(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    in[static_cast<std::size_t>(r)] = make_input(dt, op, count, r, n, cs);
    out[static_cast<std::size_t>(r)] = make_garbage(bytes, cs + static_cast<std::uint64_t>(r));
    if (in_place) io[static_cast<std::size_t>(r)] = in[static_cast<std::size_t>(r)];
  }
  const std::vector<Bytes> orig = in;
  const Expected e = reference(dt, op, ptrs(in), 0, count);
  const std::string err = g.run([&](int r, hc::Communicator& c) {
    const auto i = static_cast<std::size_t>(r);
    c.allreduce(in[i].data(), out[i].data(), count, dt, op);
    if (in_place) c.allreduce(io[i].data(), io[i].data(), count, dt, op);
  });
  EXPECT_EQ(err, "");
  if (!err.empty()) return false;
  for (int r = 0; r < n; ++r) {
    const auto i = static_cast<std::size_t>(r);
    EXPECT_EQ(compare(e, out[i].data(), 0, count), "") << "rank " << r << ", out of place";
    EXPECT_EQ(compare_bytes(in[i].data(), orig[i].data(), bytes), "") << "rank " << r << ": input modified";
    if (in_place) {
      EXPECT_EQ(compare(e, io[i].data(), 0, count), "") << "rank " << r << ", in place";
    }
    // Every rank ends with the same bits (the reduction is done once and distributed).
    if (r > 0 && algo != Algorithm::kNative) {
      EXPECT_EQ(compare_bytes(out[i].data(), out[0].data(), bytes), "") << "rank " << r << " differs from rank 0";
    }
  }
  return true;
}

TEST(SendRecv, BlockingPairAndOrderAndTags) {
  Group g(2, test_options());
  std::vector<int> got_order(5, -1);
  int a = 0, b = 0;
  std::vector<std::int64_t> big(1 << 16), big_in(1 << 16, -1);
  std::iota(big.begin(), big.end(), 5);
  const std::string err = g.run([&](int r, hc::Communicator& c) {
    if (r == 0) {
      c.send(big.data(), big.size(), DataType::kInt64, 1, 0);             // blocks until rank 1 receives
      for (int i = 0; i < 5; ++i) c.send(&i, 1, DataType::kInt32, 1, 7);  // same tag: arrives in order
      const int x = 11, y = 22;
      hc::Work w1 = c.send_async(&x, 1, DataType::kInt32, 1, 1);
      hc::Work w2 = c.send_async(&y, 1, DataType::kInt32, 1, 2);
      w1.wait();
      w2.wait();
    } else {
      c.recv(big_in.data(), big_in.size(), DataType::kInt64, 0, 0);
      for (int i = 0; i < 5; ++i) c.recv(&got_order[static_cast<std::size_t>(i)], 1, DataType::kInt32, 0, 7);
      c.recv(&b, 1, DataType::kInt32, 0, 2);  // matched by tag, not by arrival order
      c.recv(&a, 1, DataType::kInt32, 0, 1);
    }
  });
  ASSERT_EQ(err, "");
  EXPECT_EQ(big_in, big);
  EXPECT_EQ(got_order, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(a, 11);
  EXPECT_EQ(b, 22);
}

TEST(SendRecv, LargerReceiveIsFineSmallerIsAnError) {
  Group g(2, test_options(Algorithm::kAuto, 256 << 10, 5));
  float src[4] = {1, 2, 3, 4}, dst[8] = {};
  const std::string err = g.run([&](int r, hc::Communicator& c) {
    if (r == 0)
      c.send(src, 4, DataType::kFloat32, 1, 3);
    else
      c.recv(dst, 8, DataType::kFloat32, 0, 3);
  });
  ASSERT_EQ(err, "");
  EXPECT_EQ(dst[0], 1);
  EXPECT_EQ(dst[3], 4);
  EXPECT_EQ(dst[4], 0);

  Group g2(2, test_options(Algorithm::kAuto, 256 << 10, 5));
  std::string recv_error;
  const std::string err2 = g2.run([&](int r, hc::Communicator& c) {
    if (r == 0) {
      try {
        c.send(src, 4, DataType::kFloat32, 1, 3);
      } catch (const hopwise::Error&) {
      }
    } else {
      try {
        c.recv(dst, 2, DataType::kFloat32, 0, 3);
      } catch (const hopwise::Error& e) {
        recv_error = e.what();
      }
    }
  });
  EXPECT_EQ(err2, "");
  EXPECT_NE(recv_error.find("overflows"), std::string::npos) << recv_error;
}

TEST(SendRecv, RejectsBadPeersAndTags) {
  Group g(3, test_options());
  float x = 0;
  auto& c = g.comm(0);
  EXPECT_THROW(c.send(&x, 1, DataType::kFloat32, 3), hopwise::InvalidArgument);
  EXPECT_THROW(c.send(&x, 1, DataType::kFloat32, -1), hopwise::InvalidArgument);
  EXPECT_THROW(c.recv(&x, 1, DataType::kFloat32, 5), hopwise::InvalidArgument);
  EXPECT_THROW(c.send(&x, 1, DataType::kFloat32, 1, -1), hopwise::InvalidArgument);
  EXPECT_THROW(c.send(&x, 1, DataType::kFloat32, 1, 10000), hopwise::InvalidArgument);  // hopwise's own tags
  EXPECT_THROW(c.recv_async(&x, 1, DataType::kFloat32, 1, 16200), hopwise::InvalidArgument);
  EXPECT_THROW(c.send(nullptr, 1, DataType::kFloat32, 1), hopwise::InvalidArgument);
  EXPECT_THROW(c.recv(nullptr, 3, DataType::kFloat32, 1), hopwise::InvalidArgument);
}

// ================================================================================ plans
std::vector<int> random_ring(int n, std::uint64_t seed) {
  std::vector<int> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(v.begin(), v.end(), rng);
  return v;
}

// Runs allreduce (every algorithm), reduce_scatter, allgather, broadcast and reduce from every root on g and
// checks them; used with non-default plans.
void check_all_collectives(Group& g, std::uint64_t seed, std::size_t count) {
  const int n = g.size();
  // direct uses neither the ring order nor the trees; the plan-driven algorithms are these.
  for (Algorithm a : {Algorithm::kRing, Algorithm::kHalvingDoubling, Algorithm::kTree}) {
    for (int r = 0; r < n; ++r) g.comm(r).set_algorithm(a);
    for (DataType dt : {DataType::kFloat32, DataType::kInt32, DataType::kFloat16})
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax})
        if (!allreduce_case(g, a, dt, op, count, seed)) return;
  }
  for (int r = 0; r < n; ++r) g.comm(r).set_algorithm(Algorithm::kAuto);
  const DataType dt = DataType::kInt64;
  const std::size_t total = count * static_cast<std::size_t>(n);
  std::vector<Bytes> in(static_cast<std::size_t>(n)), rs(static_cast<std::size_t>(n)), ag(static_cast<std::size_t>(n)),
      red(static_cast<std::size_t>(n));
  std::vector<std::vector<Bytes>> bc(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    const auto i = static_cast<std::size_t>(r);
    in[i] = make_input(dt, ReduceOp::kSum, total, r, n, seed + 1);
    rs[i].resize(count * 8);
    ag[i].resize(total * 8);
    red[i].resize(count * 8 * static_cast<std::size_t>(n));
    for (int root = 0; root < n; ++root)
      bc[i].push_back(make_garbage(count * 8, seed + 1000 + i * 64 + static_cast<std::size_t>(root)));
  }
  const Expected e = reference(dt, ReduceOp::kSum, ptrs(in), 0, total);
  const std::string err = g.run([&](int r, hc::Communicator& c) {
    const auto i = static_cast<std::size_t>(r);
    c.reduce_scatter(in[i].data(), rs[i].data(), count, dt, ReduceOp::kSum);
    c.allgather(in[i].data(), ag[i].data(), count, dt);
    for (int root = 0; root < n; ++root) {
      c.broadcast(bc[i][static_cast<std::size_t>(root)].data(), count, dt, root);
      c.reduce(in[i].data(), red[i].data() + static_cast<std::size_t>(root) * count * 8, count, dt, ReduceOp::kSum,
               root);
    }
  });
  ASSERT_EQ(err, "");
  Bytes want_ag;
  for (int r = 0; r < n; ++r)
    want_ag.insert(want_ag.end(), in[static_cast<std::size_t>(r)].begin(),
                   in[static_cast<std::size_t>(r)].begin() + static_cast<std::ptrdiff_t>(count * 8));
  for (int r = 0; r < n; ++r) {
    const auto i = static_cast<std::size_t>(r);
    EXPECT_EQ(compare(e, rs[i].data(), i * count, count), "") << "reduce_scatter, rank " << r;
    EXPECT_EQ(compare_bytes(ag[i].data(), want_ag.data(), want_ag.size()), "") << "allgather, rank " << r;
    for (int root = 0; root < n; ++root)
      EXPECT_EQ(compare_bytes(bc[i][static_cast<std::size_t>(root)].data(),
                              bc[static_cast<std::size_t>(root)][static_cast<std::size_t>(root)].data(), count * 8),
                "")
          << "broadcast from " << root << ", rank " << r;
  }
  for (int root = 0; root < n; ++root)
    EXPECT_EQ(
        compare(e, red[static_cast<std::size_t>(root)].data() + static_cast<std::size_t>(root) * count * 8, 0, count),
        "")
        << "reduce to " << root;
}

TEST(Plan, RandomRingOrderGivesTheSameResults) {
  const std::uint64_t seed = base_seed();
  SCOPED_TRACE(seed_note(seed));
  for (int n : {2, 3, 5, 8, 9}) {
    const std::vector<int> order = random_ring(n, seed + static_cast<std::uint64_t>(n));
    SCOPED_TRACE("ring order " + ::testing::PrintToString(order));
    Group g(n, test_options(Algorithm::kAuto, 128));
    for (int r = 0; r < n; ++r) g.comm(r).set_ring_order(order);
    for (int r = 0; r < n; ++r) EXPECT_EQ(g.comm(r).ring_order(), order);
    for (std::size_t count : {std::size_t{1}, std::size_t{13}, std::size_t{1000}})
      check_all_collectives(g, seed + count, count);
  }
}

TEST(Plan, CustomTrees) {
  const std::uint64_t seed = base_seed();
  SCOPED_TRACE(seed_note(seed));
  const int n = 6;
  // A chain rooted at 2 (depth 5) and a star rooted at 4.
  hopwise::topology::TreeShape chain;
  const std::vector<int> path{2, 0, 5, 1, 4, 3};
  chain.root = 2;
  chain.parent.assign(n, -1);
  chain.children.assign(n, {});
  for (std::size_t k = 1; k < path.size(); ++k) {
    chain.parent[static_cast<std::size_t>(path[k])] = path[k - 1];
    chain.children[static_cast<std::size_t>(path[k - 1])].push_back(path[k]);
  }
  hopwise::topology::TreeShape star;
  star.root = 4;
  star.parent.assign(n, 4);
  star.parent[4] = -1;
  star.children.assign(n, {});
  star.children[4] = {0, 1, 2, 3, 5};
  {
    SCOPED_TRACE("single chain tree");
    Group g(n, test_options(Algorithm::kTree, 64));
    for (int r = 0; r < n; ++r) g.comm(r).set_trees(chain);
    check_all_collectives(g, seed, 700);
  }
  {
    SCOPED_TRACE("chain + star double tree");
    Group g(n, test_options(Algorithm::kTree, 64));
    for (int r = 0; r < n; ++r) g.comm(r).set_trees(chain, star);
    check_all_collectives(g, seed + 1, 700);
    check_all_collectives(g, seed + 2, 3);
  }
  {
    Group g(n, test_options(Algorithm::kTree));
    hopwise::topology::TreeShape chain2 = chain;
    EXPECT_THROW(g.comm(0).set_trees(chain, chain2), hopwise::InvalidArgument) << "two trees with one root";
    hopwise::topology::TreeShape broken = chain;
    broken.parent[3] = 0;
    EXPECT_THROW(g.comm(0).set_trees(broken), hopwise::InvalidArgument);
    hopwise::topology::TreeShape small = hopwise::topology::binary_tree({0, 1, 2});
    EXPECT_THROW(g.comm(0).set_trees(small), hopwise::InvalidArgument);
  }
}

TEST(Plan, InvalidRingOrderThrows) {
  Group g(4, test_options(Algorithm::kRing));
  const std::vector<std::vector<int>> bad = {{0, 1, 2}, {0, 1, 2, 2}, {0, 1, 2, 4}, {-1, 0, 1, 2}, {0, 1, 2, 3, 0}, {}};
  for (const auto& order : bad) {
    SCOPED_TRACE(::testing::PrintToString(order));
    EXPECT_THROW(g.comm(1).set_ring_order(order), hopwise::InvalidArgument);
  }
  EXPECT_EQ(g.comm(1).ring_order(), (std::vector<int>{0, 1, 2, 3})) << "a rejected order must not be kept";
  // Still works afterwards.
  allreduce_case(g, Algorithm::kRing, DataType::kFloat64, ReduceOp::kSum, 10, base_seed());
}

// ================================================================================ algorithm choice, stats
TEST(Choice, ForcedAlgorithmsAndFallbacks) {
  Group g(4, test_options());
  auto& c = g.comm(0);
  for (Algorithm a : {Algorithm::kRing, Algorithm::kHalvingDoubling, Algorithm::kTree, Algorithm::kOneShot,
                      Algorithm::kTwoShot, Algorithm::kNative, Algorithm::kAuto}) {
    c.set_algorithm(a);
    for (Collective col : {Collective::kAllreduce, Collective::kReduceScatter, Collective::kAllgather,
                           Collective::kBroadcast, Collective::kReduce, Collective::kBarrier}) {
      for (std::size_t bytes : {std::size_t{8}, std::size_t{1} << 26}) {
        SCOPED_TRACE(algo_name(a) + " for " + std::string(hc::to_string(col)) + ", " + std::to_string(bytes) +
                     " bytes");
        const Algorithm got = c.algorithm_for(col, bytes);
        EXPECT_NE(got, Algorithm::kAuto);
        EXPECT_NE(got, Algorithm::kNative) << "no native collectives in-process";
        EXPECT_TRUE(hc::implements(got, col)) << algo_name(got);
        if (a != Algorithm::kAuto && a != Algorithm::kNative && hc::implements(a, col)) {
          EXPECT_EQ(got, a);
        }
      }
    }
  }
}

TEST(Choice, ImplementsTable) {
  using C = Collective;
  EXPECT_TRUE(hc::implements(Algorithm::kHalvingDoubling, C::kAllreduce));
  EXPECT_FALSE(hc::implements(Algorithm::kHalvingDoubling, C::kBroadcast));
  EXPECT_TRUE(hc::implements(Algorithm::kTree, C::kReduce));
  EXPECT_FALSE(hc::implements(Algorithm::kTree, C::kAllgather));
  EXPECT_TRUE(hc::implements(Algorithm::kRing, C::kReduceScatter));
  EXPECT_FALSE(hc::implements(Algorithm::kNative, C::kSend));
  EXPECT_TRUE(hc::implements(Algorithm::kOneShot, C::kAllreduce));
  EXPECT_FALSE(hc::implements(Algorithm::kOneShot, C::kReduceScatter));
  EXPECT_EQ(hc::parse_algorithm("oneshot"), Algorithm::kOneShot);
  EXPECT_EQ(hc::parse_algorithm("rabenseifner"), Algorithm::kHalvingDoubling);
  EXPECT_EQ(hc::parse_algorithm("mpi"), Algorithm::kNative);
  for (Algorithm a : {Algorithm::kAuto, Algorithm::kRing, Algorithm::kHalvingDoubling, Algorithm::kTree,
                      Algorithm::kNative, Algorithm::kOneShot, Algorithm::kTwoShot})
    EXPECT_EQ(hc::parse_algorithm(hc::to_string(a)), a);
  EXPECT_THROW(hc::parse_algorithm("butterfly"), hopwise::InvalidArgument);
}

TEST(Stats, CountsCallsAndBytes) {
  Group g(3, test_options());
  std::vector<std::vector<float>> bufs(3, std::vector<float>(100, 1.0f));
  const std::string err = g.run([&](int r, hc::Communicator& c) {
    for (int k = 0; k < 5; ++k)
      c.allreduce(bufs[static_cast<std::size_t>(r)].data(), bufs[static_cast<std::size_t>(r)].data(), 100,
                  DataType::kFloat32, ReduceOp::kMax);
  });
  ASSERT_EQ(err, "");
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(g.comm(r).stats().calls, 5u);
    EXPECT_EQ(g.comm(r).stats().bytes, 5u * 400u);
  }
}

TEST(Communicator, RanksAndSizes) {
  Group g(5, test_options());
  for (int r = 0; r < 5; ++r) {
    EXPECT_EQ(g.comm(r).rank(), r);
    EXPECT_EQ(g.comm(r).size(), 5);
    EXPECT_EQ(g.comm(r).transport().name(), "inproc");
    EXPECT_EQ(g.comm(r).ring_order(), (std::vector<int>{0, 1, 2, 3, 4}));
  }
  EXPECT_THROW(hc::make_inprocess_world(0), hopwise::InvalidArgument);
  auto w = hc::make_inprocess_world(2);
  EXPECT_THROW(hc::InProcessTransport(w, 2), hopwise::InvalidArgument);
  EXPECT_THROW(hc::Communicator(std::unique_ptr<hc::Transport>(), test_options()), hopwise::InvalidArgument);
}

TEST(Communicator, TypedAllreduce) {
  Group g(3, test_options());
  std::vector<std::vector<double>> v(3);
  for (int r = 0; r < 3; ++r) v[static_cast<std::size_t>(r)] = {1.0 * r, 2.0, -1.0 * r};
  const std::string err =
      g.run([&](int r, hc::Communicator& c) { c.allreduce(std::span<double>(v[static_cast<std::size_t>(r)])); });
  ASSERT_EQ(err, "");
  for (int r = 0; r < 3; ++r) EXPECT_EQ(v[static_cast<std::size_t>(r)], (std::vector<double>{3.0, 6.0, -3.0}));
  static_assert(hopwise::dtype_of<hopwise::bfloat16>() == DataType::kBFloat16);
  static_assert(hopwise::dtype_of<std::uint8_t>() == DataType::kUInt8);
}

}  // namespace
