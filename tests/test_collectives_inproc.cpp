// Collectives over the in-process transport (ranks as threads) against serial references: every algorithm,
// dtype, op and a spread of counts and rank counts. Inputs are random with a fresh seed per run (printed on
// failure; HOPWISE_TEST_SEED replays it).
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
const std::vector<Algorithm> kHopwiseAlgorithms = own_algorithms();

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

// ================================================================================ allreduce sweeps
struct Sweep {
  Algorithm algo;
  int ranks;
};
void PrintTo(const Sweep& s, std::ostream* os) { *os << algo_name(s.algo) << " over " << s.ranks << " ranks"; }
std::string sweep_name(const ::testing::TestParamInfo<Sweep>& info) {
  return algo_name(info.param.algo) + "_" + std::to_string(info.param.ranks) + "ranks";
}

std::vector<Sweep> small_sweeps() {
  std::vector<Sweep> v;
  for (Algorithm a : kHopwiseAlgorithms)
    for (int n : {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 64}) v.push_back({a, n});
  // Native does not exist in-process: forcing it falls back to the cost model's choice.
  for (int n : {1, 2, 3, 4}) v.push_back({Algorithm::kNative, n});
  return v;
}

class AllreduceSweep : public ::testing::TestWithParam<Sweep> {};

TEST_P(AllreduceSweep, EveryDtypeOpAndSmallCount) {
  const auto [algo, n] = GetParam();
  const std::uint64_t seed = base_seed();
  SCOPED_TRACE(seed_note(seed));
  Group g(n, test_options(algo));
  const Algorithm picked = g.comm(0).algorithm_for(Collective::kAllreduce, 1024);
  if (algo == Algorithm::kNative)
    EXPECT_NE(picked, Algorithm::kNative) << "in-process has no native collectives";
  else
    EXPECT_EQ(picked, algo);
  for (DataType dt : hopwise::kAllDataTypes)
    for (ReduceOp op : ops_for(dt))
      for (std::size_t count : small_counts(n))
        if (!allreduce_case(g, algo, dt, op, count, seed)) return;
}

INSTANTIATE_TEST_SUITE_P(InProcess, AllreduceSweep, ::testing::ValuesIn(small_sweeps()), sweep_name);

// Small chunks: many messages per block, so the pipelining, the receive windows and the tail chunks all run.
class AllreduceChunked : public ::testing::TestWithParam<Sweep> {};

TEST_P(AllreduceChunked, SmallChunksManyMessages) {
  const auto [algo, n] = GetParam();
  const std::uint64_t seed = base_seed();
  SCOPED_TRACE(seed_note(seed));
  for (std::size_t chunk : {std::size_t{64}, std::size_t{100}}) {
    SCOPED_TRACE("chunk_bytes " + std::to_string(chunk));
    Group g(n, test_options(algo, chunk));
    for (DataType dt : hopwise::kAllDataTypes) {
      const ReduceOp op = hopwise::is_floating(dt) ? ReduceOp::kSum : ReduceOp::kProd;
      for (std::size_t count : {std::size_t{1000}, std::size_t{4099}}) {
        if (!allreduce_case(g, algo, dt, op, count, seed + chunk)) return;
        if (!allreduce_case(g, algo, dt, ReduceOp::kMax, count, seed + chunk, false)) return;
      }
    }
  }
}

std::vector<Sweep> chunked_sweeps() {
  std::vector<Sweep> v;
  for (Algorithm a : kHopwiseAlgorithms)
    for (int n : {2, 3, 5, 8}) v.push_back({a, n});
  return v;
}
INSTANTIATE_TEST_SUITE_P(InProcess, AllreduceChunked, ::testing::ValuesIn(chunked_sweeps()), sweep_name);

// 1000003 elements (prime: uneven blocks) on 2..5 ranks, a dtype/op subset that covers every dtype and op.
class AllreduceLarge : public ::testing::TestWithParam<Sweep> {};

TEST_P(AllreduceLarge, MillionElements) {
  const auto [algo, n] = GetParam();
  const std::uint64_t seed = base_seed();
  SCOPED_TRACE(seed_note(seed));
  Group g(n, test_options(algo));
  const std::pair<DataType, ReduceOp> cases[] = {
      {DataType::kFloat32, ReduceOp::kSum},  {DataType::kFloat64, ReduceOp::kAvg},
      {DataType::kFloat16, ReduceOp::kSum},  {DataType::kFloat16, ReduceOp::kProd},
      {DataType::kBFloat16, ReduceOp::kAvg}, {DataType::kBFloat16, ReduceOp::kMax},
      {DataType::kInt32, ReduceOp::kProd},   {DataType::kInt64, ReduceOp::kSum},
      {DataType::kUInt8, ReduceOp::kMin},    {DataType::kFloat32, ReduceOp::kMax}};
  int k = 0;
  for (const auto& [dt, op] : cases)
    if (!allreduce_case(g, algo, dt, op, 1000003, seed, (k++ + n) % 2 == 0)) return;
}

std::vector<Sweep> large_sweeps() {
  std::vector<Sweep> v;
  for (Algorithm a : kHopwiseAlgorithms)
    for (int n : {2, 3, 4, 5}) v.push_back({a, n});
  return v;
}
INSTANTIATE_TEST_SUITE_P(InProcess, AllreduceLarge, ::testing::ValuesIn(large_sweeps()), sweep_name);

TEST(AllreduceHuge, Float32Sum16Mi) {
  const std::uint64_t seed = base_seed();
  SCOPED_TRACE(seed_note(seed));
  for (int n : {2, 3}) {
    Group g(n, test_options(Algorithm::kRing));
    if (!allreduce_case(g, Algorithm::kRing, DataType::kFloat32, ReduceOp::kSum, std::size_t{16} << 20, seed, false))
      return;
  }
}

// ================================================================================ reduce_scatter
class PerRanks : public ::testing::TestWithParam<int> {};
std::string ranks_name(const ::testing::TestParamInfo<int>& info) { return std::to_string(info.param) + "ranks"; }

TEST_P(PerRanks, ReduceScatter) {
  const int n = GetParam();
  const std::uint64_t seed = base_seed();
  SCOPED_TRACE(seed_note(seed));
  // Ring is the hopwise algorithm for reduce_scatter; forcing tree falls back to it.
  for (Algorithm algo : {Algorithm::kRing, Algorithm::kTree}) {
    for (std::size_t chunk : {std::size_t{256} << 10, std::size_t{64}}) {
      Group g(n, test_options(algo, chunk));
      EXPECT_EQ(g.comm(0).algorithm_for(Collective::kReduceScatter, 64), Algorithm::kRing);
      for (DataType dt : hopwise::kAllDataTypes)
        for (ReduceOp op : ops_for(dt))
          for (std::size_t rc : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{13}, std::size_t{301}}) {
            if (chunk == 64 && rc != 301) continue;
            if (chunk != 64 && rc == 301 && op != ReduceOp::kSum) continue;
            const std::string what =
                fmt::format("reduce_scatter(recvcount={}, {}, {}) over {} ranks, {}, chunk {}", rc,
                            hopwise::to_string(dt), hopwise::to_string(op), n, algo_name(algo), chunk);
            SCOPED_TRACE(what);
            const std::uint64_t cs = mix_seed(seed, {1, static_cast<std::uint64_t>(dt), static_cast<std::uint64_t>(op),
                                                     rc, static_cast<std::uint64_t>(n)});
            const std::size_t total = rc * static_cast<std::size_t>(n), es = hopwise::dtype_size(dt);
            std::vector<Bytes> in(static_cast<std::size_t>(n)), out(static_cast<std::size_t>(n));
            for (int r = 0; r < n; ++r) {
              in[static_cast<std::size_t>(r)] = make_input(dt, op, total, r, n, cs);
              out[static_cast<std::size_t>(r)] = make_garbage(rc * es + 16, cs ^ static_cast<std::uint64_t>(r));
            }
            const std::vector<Bytes> orig_in = in, orig_out = out;
            const Expected e = reference(dt, op, ptrs(in), 0, total);
            const std::string err = g.run([&](int r, hc::Communicator& c) {
              c.reduce_scatter(in[static_cast<std::size_t>(r)].data(), out[static_cast<std::size_t>(r)].data(), rc, dt,
                               op);
            });
            ASSERT_EQ(err, "");
            for (int r = 0; r < n; ++r) {
              const auto i = static_cast<std::size_t>(r);
              EXPECT_EQ(compare(e, out[i].data(), i * rc, rc), "") << "rank " << r;
              EXPECT_EQ(compare_bytes(out[i].data() + rc * es, orig_out[i].data() + rc * es, 16), "")
                  << "rank " << r << ": wrote past recvcount";
              EXPECT_EQ(compare_bytes(in[i].data(), orig_in[i].data(), total * es), "")
                  << "rank " << r << ": input modified";
            }
          }
    }
  }
}

// ================================================================================ allgather
TEST_P(PerRanks, Allgather) {
  const int n = GetParam();
  const std::uint64_t seed = base_seed();
  SCOPED_TRACE(seed_note(seed));
  for (std::size_t chunk : {std::size_t{256} << 10, std::size_t{64}}) {
    Group g(n, test_options(Algorithm::kRing, chunk));
    for (DataType dt : hopwise::kAllDataTypes)
      for (std::size_t sc : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{13}, std::size_t{301}}) {
        SCOPED_TRACE(
            fmt::format("allgather(sendcount={}, {}) over {} ranks, chunk {}", sc, hopwise::to_string(dt), n, chunk));
        const std::size_t es = hopwise::dtype_size(dt), total = sc * static_cast<std::size_t>(n);
        std::vector<Bytes> in(static_cast<std::size_t>(n)), out(static_cast<std::size_t>(n)),
            io(static_cast<std::size_t>(n));
        Bytes want;
        for (int r = 0; r < n; ++r) {
          const auto i = static_cast<std::size_t>(r);
          in[i] = make_garbage(sc * es, mix_seed(seed, {2, static_cast<std::uint64_t>(dt), sc, i}));
          want.insert(want.end(), in[i].begin(), in[i].end());
          out[i] = make_garbage(total * es, seed + i);
          io[i] = make_garbage(total * es, seed + i + 100);
          std::copy(in[i].begin(), in[i].end(), io[i].begin() + static_cast<std::ptrdiff_t>(i * sc * es));
        }
        const std::string err = g.run([&](int r, hc::Communicator& c) {
          const auto i = static_cast<std::size_t>(r);
          c.allgather(in[i].data(), out[i].data(), sc, dt);
          c.allgather(io[i].data() + i * sc * es, io[i].data(), sc, dt);  // in place: my block already in out
        });
        ASSERT_EQ(err, "");
        for (int r = 0; r < n; ++r) {
          EXPECT_EQ(compare_bytes(out[static_cast<std::size_t>(r)].data(), want.data(), want.size()), "")
              << "rank " << r;
          EXPECT_EQ(compare_bytes(io[static_cast<std::size_t>(r)].data(), want.data(), want.size()), "")
              << "rank " << r << ", in place";
        }
      }
  }
}

// ================================================================================ broadcast
TEST_P(PerRanks, BroadcastFromEveryRoot) {
  const int n = GetParam();
  const std::uint64_t seed = base_seed();
  SCOPED_TRACE(seed_note(seed));
  for (std::size_t chunk : {std::size_t{256} << 10, std::size_t{64}}) {
    Group g(n, test_options(Algorithm::kTree, chunk));
    for (DataType dt : hopwise::kAllDataTypes)
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{13}, std::size_t{1001}}) {
        if (chunk == 64 && count < 1001) continue;
        SCOPED_TRACE(
            fmt::format("broadcast(count={}, {}) over {} ranks, chunk {}", count, hopwise::to_string(dt), n, chunk));
        const std::size_t bytes = count * hopwise::dtype_size(dt);
        // bufs[root][rank]
        std::vector<std::vector<Bytes>> bufs(static_cast<std::size_t>(n));
        for (int root = 0; root < n; ++root)
          for (int r = 0; r < n; ++r)
            bufs[static_cast<std::size_t>(root)].push_back(
                make_garbage(bytes, mix_seed(seed, {3, static_cast<std::uint64_t>(dt), count,
                                                    static_cast<std::uint64_t>(root), static_cast<std::uint64_t>(r)})));
        std::vector<Bytes> want;
        for (int root = 0; root < n; ++root)
          want.push_back(bufs[static_cast<std::size_t>(root)][static_cast<std::size_t>(root)]);
        const std::string err = g.run([&](int r, hc::Communicator& c) {
          for (int root = 0; root < n; ++root)
            c.broadcast(bufs[static_cast<std::size_t>(root)][static_cast<std::size_t>(r)].data(), count, dt, root);
        });
        ASSERT_EQ(err, "");
        for (int root = 0; root < n; ++root)
          for (int r = 0; r < n; ++r)
            EXPECT_EQ(compare_bytes(bufs[static_cast<std::size_t>(root)][static_cast<std::size_t>(r)].data(),
                                    want[static_cast<std::size_t>(root)].data(), bytes),
                      "")
                << "root " << root << ", rank " << r;
      }
  }
}

// ================================================================================ reduce
TEST_P(PerRanks, ReduceToEveryRoot) {
  const int n = GetParam();
  const std::uint64_t seed = base_seed();
  SCOPED_TRACE(seed_note(seed));
  Group g(n, test_options(Algorithm::kTree));
  for (DataType dt : hopwise::kAllDataTypes)
    for (ReduceOp op : ops_for(dt))
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{13}}) {
        SCOPED_TRACE(fmt::format("reduce(count={}, {}, {}) over {} ranks", count, hopwise::to_string(dt),
                                 hopwise::to_string(op), n));
        const std::uint64_t cs =
            mix_seed(seed, {4, static_cast<std::uint64_t>(dt), static_cast<std::uint64_t>(op), count});
        const std::size_t bytes = count * hopwise::dtype_size(dt);
        std::vector<Bytes> in(static_cast<std::size_t>(n));
        for (int r = 0; r < n; ++r) in[static_cast<std::size_t>(r)] = make_input(dt, op, count, r, n, cs);
        const std::vector<Bytes> orig = in;
        const Expected e = reference(dt, op, ptrs(in), 0, count);
        std::vector<Bytes> out(static_cast<std::size_t>(n)), io(static_cast<std::size_t>(n));
        for (int root = 0; root < n; ++root) {
          out[static_cast<std::size_t>(root)] = make_garbage(bytes, cs + static_cast<std::uint64_t>(root));
          io[static_cast<std::size_t>(root)] = in[static_cast<std::size_t>(root)];
        }
        const std::string err = g.run([&](int r, hc::Communicator& c) {
          const auto i = static_cast<std::size_t>(r);
          for (int root = 0; root < n; ++root) {
            // out is null away from the root; in place at the root in the second call.
            c.reduce(in[i].data(), r == root ? out[static_cast<std::size_t>(root)].data() : nullptr, count, dt, op,
                     root);
            void* io_buf = r == root ? io[i].data() : nullptr;
            c.reduce(r == root ? io_buf : in[i].data(), io_buf, count, dt, op, root);
          }
        });
        ASSERT_EQ(err, "");
        for (int root = 0; root < n; ++root) {
          EXPECT_EQ(compare(e, out[static_cast<std::size_t>(root)].data(), 0, count), "") << "root " << root;
          EXPECT_EQ(compare(e, io[static_cast<std::size_t>(root)].data(), 0, count), "")
              << "root " << root << ", in place";
        }
        for (int r = 0; r < n; ++r)
          EXPECT_EQ(
              compare_bytes(in[static_cast<std::size_t>(r)].data(), orig[static_cast<std::size_t>(r)].data(), bytes),
              "")
              << "rank " << r << ": input modified";
      }
}

// ================================================================================ barrier
TEST_P(PerRanks, BarrierHoldsEveryoneBack) {
  const int n = GetParam();
  for (Algorithm algo : {Algorithm::kRing, Algorithm::kAuto}) {
    Group g(n, test_options(algo));
    constexpr int kRounds = 12;
    std::vector<std::atomic<int>> arrived(kRounds);
    std::atomic<int> early{0};
    const std::string err = g.run([&](int r, hc::Communicator& c) {
      std::mt19937 rng(static_cast<unsigned>(r * 7919 + 1));
      for (int round = 0; round < kRounds; ++round) {
        if (rng() % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
        arrived[static_cast<std::size_t>(round)].fetch_add(1);
        c.barrier();
        if (arrived[static_cast<std::size_t>(round)].load() != n) early.fetch_add(1);
      }
    });
    ASSERT_EQ(err, "");
    EXPECT_EQ(early.load(), 0) << "a rank left a barrier before every rank had entered it (" << hc::to_string(algo)
                               << ")";
  }
}

// ================================================================================ many ranks
// The other collectives at 16 and 64 ranks: a few dtypes, small counts, a few roots.
class ManyRanks : public ::testing::TestWithParam<int> {};

TEST_P(ManyRanks, OtherCollectives) {
  const int n = GetParam();
  const std::uint64_t seed = base_seed();
  SCOPED_TRACE(seed_note(seed));
  Group g(n, test_options(Algorithm::kAuto, 64));
  const std::vector<int> roots{0, n / 2, n - 1};
  for (const auto& dt_op :
       {std::pair{DataType::kFloat32, ReduceOp::kSum}, std::pair{DataType::kInt32, ReduceOp::kMax},
        std::pair{DataType::kBFloat16, ReduceOp::kAvg}, std::pair{DataType::kUInt8, ReduceOp::kProd}})
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{100}}) {
      // Plain variables, not a structured binding: the lambda below captures them (clang 14 cannot).
      const DataType dt = dt_op.first;
      const ReduceOp op = dt_op.second;
      SCOPED_TRACE(
          fmt::format("{} {} count={} over {} ranks", hopwise::to_string(dt), hopwise::to_string(op), count, n));
      const std::size_t es = hopwise::dtype_size(dt), total = count * static_cast<std::size_t>(n);
      const std::uint64_t cs =
          mix_seed(seed, {6, static_cast<std::uint64_t>(dt), count, static_cast<std::uint64_t>(n)});
      std::vector<Bytes> in(static_cast<std::size_t>(n)), rs(static_cast<std::size_t>(n)),
          ag(static_cast<std::size_t>(n)), red(static_cast<std::size_t>(n) * roots.size());
      std::vector<std::vector<Bytes>> bc(static_cast<std::size_t>(n));
      for (int r = 0; r < n; ++r) {
        const auto i = static_cast<std::size_t>(r);
        in[i] = make_input(dt, op, total, r, n, cs);
        rs[i] = make_garbage(count * es, cs + i);
        ag[i] = make_garbage(total * es, cs + i + 1);
        for (std::size_t k = 0; k < roots.size(); ++k) {
          bc[i].push_back(make_garbage(count * es, mix_seed(cs, {static_cast<std::uint64_t>(roots[k])})));
          red[i * roots.size() + k] = make_garbage(count * es, cs + 7 * i + k);
        }
      }
      const Expected e = reference(dt, op, ptrs(in), 0, total);
      const std::string err = g.run([&](int r, hc::Communicator& c) {
        const auto i = static_cast<std::size_t>(r);
        c.reduce_scatter(in[i].data(), rs[i].data(), count, dt, op);
        c.allgather(in[i].data() + i * count * es, ag[i].data(), count, dt);
        for (std::size_t k = 0; k < roots.size(); ++k) {
          c.broadcast(bc[i][k].data(), count, dt, roots[k]);
          c.reduce(in[i].data(), r == roots[k] ? red[i * roots.size() + k].data() : nullptr, count, dt, op, roots[k]);
        }
        c.barrier();
      });
      ASSERT_EQ(err, "");
      for (int r = 0; r < n; ++r) {
        const auto i = static_cast<std::size_t>(r);
        EXPECT_EQ(compare(e, rs[i].data(), i * count, count), "") << "reduce_scatter, rank " << r;
        for (int q = 0; q < n; ++q)
          EXPECT_EQ(compare_bytes(ag[i].data() + static_cast<std::size_t>(q) * count * es,
                                  in[static_cast<std::size_t>(q)].data() + static_cast<std::size_t>(q) * count * es,
                                  count * es),
                    "")
              << "allgather, rank " << r << ", block " << q;
        for (std::size_t k = 0; k < roots.size(); ++k)
          EXPECT_EQ(compare_bytes(bc[i][k].data(), bc[static_cast<std::size_t>(roots[k])][k].data(), count * es), "")
              << "broadcast from " << roots[k] << ", rank " << r;
      }
      for (std::size_t k = 0; k < roots.size(); ++k) {
        // reduce: element i of the reduction over every rank's first `count` elements
        std::vector<const void*> firsts;
        for (const auto& b : in) firsts.push_back(b.data());
        const Expected er = reference(dt, op, firsts, 0, count);
        EXPECT_EQ(compare(er, red[static_cast<std::size_t>(roots[k]) * roots.size() + k].data(), 0, count), "")
            << "reduce to " << roots[k];
      }
    }
}

INSTANTIATE_TEST_SUITE_P(InProcess, ManyRanks, ::testing::Values(16, 64), ranks_name);

// ================================================================================ send / recv
TEST_P(PerRanks, SendRecvRing) {
  const int n = GetParam();
  const std::uint64_t seed = base_seed();
  SCOPED_TRACE(seed_note(seed));
  Group g(n, test_options());
  for (DataType dt : hopwise::kAllDataTypes)
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{100003}}) {
      SCOPED_TRACE(fmt::format("send/recv(count={}, {}) over {} ranks", count, hopwise::to_string(dt), n));
      const std::size_t bytes = count * hopwise::dtype_size(dt);
      std::vector<Bytes> src(static_cast<std::size_t>(n)), dst(static_cast<std::size_t>(n));
      for (int r = 0; r < n; ++r) {
        src[static_cast<std::size_t>(r)] = make_garbage(
            bytes, mix_seed(seed, {5, static_cast<std::uint64_t>(dt), count, static_cast<std::uint64_t>(r)}));
        dst[static_cast<std::size_t>(r)] = make_garbage(bytes, seed ^ static_cast<std::uint64_t>(r));
      }
      const int tag = static_cast<int>(count % 9000) + 1;
      const std::string err = g.run([&](int r, hc::Communicator& c) {
        const int next = (r + 1) % n, prev = (r + n - 1) % n;
        // Sends complete on a match, so post the send first (with one rank it goes to itself).
        hc::Work s = c.send_async(src[static_cast<std::size_t>(r)].data(), count, dt, next, tag);
        c.recv(dst[static_cast<std::size_t>(r)].data(), count, dt, prev, tag);
        s.wait();
      });
      ASSERT_EQ(err, "");
      for (int r = 0; r < n; ++r)
        EXPECT_EQ(compare_bytes(dst[static_cast<std::size_t>(r)].data(),
                                src[static_cast<std::size_t>((r + n - 1) % n)].data(), bytes),
                  "")
            << "rank " << r;
    }
}

INSTANTIATE_TEST_SUITE_P(InProcess, PerRanks, ::testing::Range(1, 10), ranks_name);

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
