// The collectives per rank count, folded into the suite (same binary, same worlds as test_collectives_suite.cpp):
// every algorithm of the table at 1 to 9, 16 and 64 ranks, small chunks, a million elements and 16 Mi; every other
// collective at 1 to 9 ranks and at 16 and 64. A threads world runs every rank count; a world of processes (mpirun,
// torchrun) has one size, where the suite's own cases run, and skips these. Bodies are written from one rank's view, as
// the suite's: each rank computes every rank's input and the reference, runs its call and checks its own result.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "collectives_suite.h"

namespace {

// A case of `n` ranks runs in a threads world, at any rank count. A world of processes (mpirun, torchrun) has one
// size, at which test_collectives_suite.cpp's cases already run every algorithm and collective: it skips these.
std::vector<int> at(int n) {
  if (world().ranks == World::Ranks::kThreads) return {n};
  return {};
}

#define HOPWISE_RUNS_AT(n)              \
  const std::vector<int> sizes = at(n); \
  if (sizes.empty())                    \
  GTEST_SKIP() << world().name << " world: one size, the job's; the suite's own cases run every algorithm there"

hc::Options with(Algorithm a, std::size_t chunk_bytes = 256 << 10) {
  hc::Options o = suite_options(a);
  o.chunk_bytes = chunk_bytes;
  return o;
}

struct Sweep {
  Algorithm algo;
  int ranks;
};
void PrintTo(const Sweep& s, std::ostream* os) { *os << algo_name(s.algo) << " over " << s.ranks << " ranks"; }
std::string sweep_name(const ::testing::TestParamInfo<Sweep>& info) {
  return algo_name(info.param.algo) + "_" + std::to_string(info.param.ranks) + "ranks";
}
std::string ranks_name(const ::testing::TestParamInfo<int>& info) { return std::to_string(info.param) + "ranks"; }

// hopwise's own rows (native is the transport library's: it runs where the world has it, at the small sizes).
std::vector<Sweep> sweeps(std::initializer_list<int> ranks, bool with_native) {
  std::vector<Sweep> v;
  for (Algorithm a : allreduce_algorithms()) {
    if (hc::algorithm_info(a).needs_native && !with_native) continue;
    for (int n : ranks)
      if (!hc::algorithm_info(a).needs_native || n <= 4) v.push_back({a, n});
  }
  return v;
}

// ================================================================================ allreduce per rank count
class AllreduceSweep : public ::testing::TestWithParam<Sweep> {};

TEST_P(AllreduceSweep, EveryDtypeOpAndSmallCount) {
  const auto [algo, n] = GetParam();
  HOPWISE_RUNS_AT(n);
  each(
      [&] {
        SCOPED_TRACE(seed_note(g_seed));
        const Algorithm picked = comm().algorithm_for(Collective::kAllreduce, 1024);
        if (hc::algorithm_info(algo).needs_native && !world_has_native())
          EXPECT_NE(picked, algo) << "a world without native collectives falls back to the model's choice";
        else
          EXPECT_EQ(picked, algo);
        for (DataType dt : hopwise::kAllDataTypes)
          for (ReduceOp op : ops_for(dt))
            for (std::size_t count : small_counts(n)) allreduce_case(algo, dt, op, count, true);
      },
      sizes, with(algo));
}

INSTANTIATE_TEST_SUITE_P(Sizes, AllreduceSweep, ::testing::ValuesIn(sweeps({1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 64}, true)),
                         sweep_name);

// Small chunks: many messages per block, so the pipelining, the receive windows and the tail chunks all run.
class AllreduceChunked : public ::testing::TestWithParam<Sweep> {};

TEST_P(AllreduceChunked, SmallChunksManyMessages) {
  const auto [algo, n] = GetParam();
  HOPWISE_RUNS_AT(n);
  for (std::size_t chunk : {std::size_t{64}, std::size_t{100}}) {
    SCOPED_TRACE("chunk_bytes " + std::to_string(chunk));
    each(
        [&] {
          SCOPED_TRACE(seed_note(g_seed));
          for (DataType dt : hopwise::kAllDataTypes) {
            const ReduceOp op = hopwise::is_floating(dt) ? ReduceOp::kSum : ReduceOp::kProd;
            for (std::size_t count : {std::size_t{1000}, std::size_t{4099}}) {
              allreduce_case(algo, dt, op, count, true);
              allreduce_case(algo, dt, ReduceOp::kMax, count, false);
            }
          }
        },
        sizes, with(algo, chunk));
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, AllreduceChunked, ::testing::ValuesIn(sweeps({2, 3, 5, 8}, false)), sweep_name);

// 1000003 elements (prime: uneven blocks) on 2..5 ranks, a dtype/op subset that covers every dtype and op.
class AllreduceLarge : public ::testing::TestWithParam<Sweep> {};

TEST_P(AllreduceLarge, MillionElements) {
  const auto [algo, n] = GetParam();
  HOPWISE_RUNS_AT(n);
  each(
      [&] {
        SCOPED_TRACE(seed_note(g_seed));
        const std::pair<DataType, ReduceOp> cases[] = {
            {DataType::kFloat32, ReduceOp::kSum},  {DataType::kFloat64, ReduceOp::kAvg},
            {DataType::kFloat16, ReduceOp::kSum},  {DataType::kFloat16, ReduceOp::kProd},
            {DataType::kBFloat16, ReduceOp::kAvg}, {DataType::kBFloat16, ReduceOp::kMax},
            {DataType::kInt32, ReduceOp::kProd},   {DataType::kInt64, ReduceOp::kSum},
            {DataType::kUInt8, ReduceOp::kMin},    {DataType::kFloat32, ReduceOp::kMax}};
        int k = 0;
        for (const auto& [dt, op] : cases) allreduce_case(algo, dt, op, 1000003, (k++ + n) % 2 == 0);
      },
      sizes, with(algo));
}

INSTANTIATE_TEST_SUITE_P(Sizes, AllreduceLarge, ::testing::ValuesIn(sweeps({2, 3, 4, 5}, false)), sweep_name);

TEST(AllreduceHuge, Float32Sum16Mi) {
  for (int n : {2, 3}) {
    const std::vector<int> sizes = at(n);
    each(
        [&] {
          SCOPED_TRACE(seed_note(g_seed));
          allreduce_case(Algorithm::kRing, DataType::kFloat32, ReduceOp::kSum, std::size_t{16} << 20, false);
        },
        sizes, with(Algorithm::kRing));
  }
}

// ================================================================================ the other collectives
class PerRanks : public ::testing::TestWithParam<int> {};

TEST_P(PerRanks, ReduceScatter) {
  const int n = GetParam();
  HOPWISE_RUNS_AT(n);
  // Ring is the hopwise algorithm for reduce_scatter; forcing tree falls back to it.
  for (Algorithm algo : {Algorithm::kRing, Algorithm::kTree})
    for (std::size_t chunk : {std::size_t{256} << 10, std::size_t{64}})
      each(
          [&] {
            SCOPED_TRACE(seed_note(g_seed));
            EXPECT_EQ(comm().algorithm_for(Collective::kReduceScatter, 64), Algorithm::kRing);
            const int me = comm().rank();
            for (DataType dt : hopwise::kAllDataTypes)
              for (ReduceOp op : ops_for(dt))
                for (std::size_t rc :
                     {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{13}, std::size_t{301}}) {
                  if (chunk == 64 && rc != 301) continue;
                  if (chunk != 64 && rc == 301 && op != ReduceOp::kSum) continue;
                  SCOPED_TRACE(fmt::format("reduce_scatter(recvcount={}, {}, {}) over {} ranks, {}, chunk {}", rc,
                                           hopwise::to_string(dt), hopwise::to_string(op), n, algo_name(algo), chunk));
                  const std::uint64_t cs =
                      mix_seed(g_seed, {1, static_cast<std::uint64_t>(dt), static_cast<std::uint64_t>(op), rc, chunk});
                  const std::size_t total = rc * static_cast<std::size_t>(n), es = hopwise::dtype_size(dt);
                  const std::vector<Bytes> in = all_inputs(dt, op, total, cs);
                  const Expected e = reference(dt, op, ptrs(in), 0, total);
                  Bytes mine = in[static_cast<std::size_t>(me)];
                  Bytes out = make_garbage(rc * es + 16, cs ^ static_cast<std::uint64_t>(me));
                  const Bytes orig_out = out;
                  comm().reduce_scatter(mine.data(), out.data(), rc, dt, op);
                  EXPECT_EQ(compare(e, out.data(), static_cast<std::size_t>(me) * rc, rc), "");
                  EXPECT_EQ(compare_bytes(out.data() + rc * es, orig_out.data() + rc * es, 16), "")
                      << "wrote past recvcount";
                  EXPECT_EQ(compare_bytes(mine.data(), in[static_cast<std::size_t>(me)].data(), total * es), "")
                      << "input modified";
                }
          },
          sizes, with(algo, chunk));
}

TEST_P(PerRanks, Allgather) {
  const int n = GetParam();
  HOPWISE_RUNS_AT(n);
  for (std::size_t chunk : {std::size_t{256} << 10, std::size_t{64}})
    each(
        [&] {
          SCOPED_TRACE(seed_note(g_seed));
          const auto me = static_cast<std::size_t>(comm().rank());
          for (DataType dt : hopwise::kAllDataTypes)
            for (std::size_t sc : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{13}, std::size_t{301}}) {
              SCOPED_TRACE(fmt::format("allgather(sendcount={}, {}) over {} ranks, chunk {}", sc,
                                       hopwise::to_string(dt), n, chunk));
              const std::size_t es = hopwise::dtype_size(dt), total = sc * static_cast<std::size_t>(n);
              Bytes want;
              for (std::size_t r = 0; r < static_cast<std::size_t>(n); ++r) {
                const Bytes block = make_garbage(sc * es, mix_seed(g_seed, {2, static_cast<std::uint64_t>(dt), sc, r}));
                want.insert(want.end(), block.begin(), block.end());
              }
              const Bytes in(want.begin() + static_cast<std::ptrdiff_t>(me * sc * es),
                             want.begin() + static_cast<std::ptrdiff_t>((me + 1) * sc * es));
              Bytes out = make_garbage(total * es, g_seed + me), io = make_garbage(total * es, g_seed + me + 100);
              std::copy(in.begin(), in.end(), io.begin() + static_cast<std::ptrdiff_t>(me * sc * es));
              comm().allgather(in.data(), out.data(), sc, dt);
              comm().allgather(io.data() + me * sc * es, io.data(), sc, dt);  // in place: my block already in out
              EXPECT_EQ(compare_bytes(out.data(), want.data(), want.size()), "");
              EXPECT_EQ(compare_bytes(io.data(), want.data(), want.size()), "") << "in place";
            }
        },
        sizes, with(Algorithm::kRing, chunk));
}

TEST_P(PerRanks, BroadcastFromEveryRoot) {
  const int n = GetParam();
  HOPWISE_RUNS_AT(n);
  for (std::size_t chunk : {std::size_t{256} << 10, std::size_t{64}})
    each(
        [&] {
          SCOPED_TRACE(seed_note(g_seed));
          const int me = comm().rank();
          for (DataType dt : hopwise::kAllDataTypes)
            for (std::size_t count :
                 {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{13}, std::size_t{1001}}) {
              if (chunk == 64 && count < 1001) continue;
              SCOPED_TRACE(fmt::format("broadcast(count={}, {}) over {} ranks, chunk {}", count, hopwise::to_string(dt),
                                       n, chunk));
              const std::size_t bytes = count * hopwise::dtype_size(dt);
              auto data_of = [&](int root, int r) {
                return make_garbage(
                    bytes, mix_seed(g_seed, {3, static_cast<std::uint64_t>(dt), count, static_cast<std::uint64_t>(root),
                                             static_cast<std::uint64_t>(r)}));
              };
              for (int root = 0; root < n; ++root) {
                Bytes buf = data_of(root, me);
                comm().broadcast(buf.data(), count, dt, root);
                EXPECT_EQ(compare_bytes(buf.data(), data_of(root, root).data(), bytes), "") << "root " << root;
              }
            }
        },
        sizes, with(Algorithm::kTree, chunk));
}

TEST_P(PerRanks, ReduceToEveryRoot) {
  const int n = GetParam();
  HOPWISE_RUNS_AT(n);
  each(
      [&] {
        SCOPED_TRACE(seed_note(g_seed));
        const int me = comm().rank();
        for (DataType dt : hopwise::kAllDataTypes)
          for (ReduceOp op : ops_for(dt))
            for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{13}}) {
              SCOPED_TRACE(fmt::format("reduce(count={}, {}, {}) over {} ranks", count, hopwise::to_string(dt),
                                       hopwise::to_string(op), n));
              const std::uint64_t cs =
                  mix_seed(g_seed, {4, static_cast<std::uint64_t>(dt), static_cast<std::uint64_t>(op), count});
              const std::size_t bytes = count * hopwise::dtype_size(dt);
              const std::vector<Bytes> in = all_inputs(dt, op, count, cs);
              const Expected e = reference(dt, op, ptrs(in), 0, count);
              Bytes mine = in[static_cast<std::size_t>(me)];
              for (int root = 0; root < n; ++root) {
                // out is null away from the root; in place at the root in the second call.
                Bytes out = make_garbage(bytes, cs + static_cast<std::uint64_t>(root)), io = mine;
                comm().reduce(mine.data(), me == root ? out.data() : nullptr, count, dt, op, root);
                void* io_buf = me == root ? io.data() : nullptr;
                comm().reduce(me == root ? io_buf : mine.data(), io_buf, count, dt, op, root);
                if (me == root) {
                  EXPECT_EQ(compare(e, out.data(), 0, count), "") << "root " << root;
                  EXPECT_EQ(compare(e, io.data(), 0, count), "") << "root " << root << ", in place";
                }
              }
              EXPECT_EQ(compare_bytes(mine.data(), in[static_cast<std::size_t>(me)].data(), bytes), "")
                  << "input modified";
            }
      },
      sizes, with(Algorithm::kTree));
}

// No rank leaves a barrier before every rank has entered it: each rank counts its arrivals in a shared counter
// (threads) and then checks them after the barrier; ranks arrive late at random.
TEST_P(PerRanks, BarrierHoldsEveryoneBack) {
  const int n = GetParam();
  HOPWISE_RUNS_AT(n);
  if (world().ranks != World::Ranks::kThreads) GTEST_SKIP() << "the arrival count is shared memory of one process";
  for (Algorithm algo : {Algorithm::kRing, Algorithm::kAuto}) {
    constexpr int kRounds = 12;
    std::vector<std::atomic<int>> arrived(kRounds);
    std::atomic<int> early{0};
    each(
        [&] {
          std::mt19937 rng(static_cast<unsigned>(comm().rank() * 7919 + 1));
          for (int round = 0; round < kRounds; ++round) {
            if (rng() % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
            arrived[static_cast<std::size_t>(round)].fetch_add(1);
            comm().barrier();
            if (arrived[static_cast<std::size_t>(round)].load() != n) early.fetch_add(1);
          }
        },
        sizes, with(algo));
    EXPECT_EQ(early.load(), 0) << "a rank left a barrier before every rank had entered it (" << hc::to_string(algo)
                               << ")";
  }
}

TEST_P(PerRanks, SendRecvRing) {
  const int n = GetParam();
  HOPWISE_RUNS_AT(n);
  each(send_recv_ring, sizes, with(Algorithm::kAuto));
}

INSTANTIATE_TEST_SUITE_P(Sizes, PerRanks, ::testing::Range(1, 10), ranks_name);

// ================================================================================ many ranks
// The other collectives at 16 and 64 ranks: a few dtypes, small counts, a few roots.
class ManyRanks : public ::testing::TestWithParam<int> {};

TEST_P(ManyRanks, OtherCollectives) {
  const int n = GetParam();
  HOPWISE_RUNS_AT(n);
  each(
      [&] {
        SCOPED_TRACE(seed_note(g_seed));
        const auto me = static_cast<std::size_t>(comm().rank());
        const std::vector<int> roots{0, n / 2, n - 1};
        for (const auto& [dt, op] :
             {std::pair{DataType::kFloat32, ReduceOp::kSum}, std::pair{DataType::kInt32, ReduceOp::kMax},
              std::pair{DataType::kBFloat16, ReduceOp::kAvg}, std::pair{DataType::kUInt8, ReduceOp::kProd}})
          for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{100}}) {
            SCOPED_TRACE(
                fmt::format("{} {} count={} over {} ranks", hopwise::to_string(dt), hopwise::to_string(op), count, n));
            const std::size_t es = hopwise::dtype_size(dt), total = count * static_cast<std::size_t>(n);
            const std::uint64_t cs =
                mix_seed(g_seed, {6, static_cast<std::uint64_t>(dt), count, static_cast<std::uint64_t>(n)});
            const std::vector<Bytes> in = all_inputs(dt, op, total, cs);
            const Expected e = reference(dt, op, ptrs(in), 0, total);
            std::vector<const void*> firsts;  // reduce: the reduction over every rank's first `count` elements
            for (const auto& b : in) firsts.push_back(b.data());
            const Expected er = reference(dt, op, firsts, 0, count);
            Bytes rs = make_garbage(count * es, cs + me), ag = make_garbage(total * es, cs + me + 1);
            comm().reduce_scatter(in[me].data(), rs.data(), count, dt, op);
            comm().allgather(in[me].data() + me * count * es, ag.data(), count, dt);
            EXPECT_EQ(compare(e, rs.data(), me * count, count), "") << "reduce_scatter";
            for (std::size_t q = 0; q < static_cast<std::size_t>(n); ++q)
              EXPECT_EQ(compare_bytes(ag.data() + q * count * es, in[q].data() + q * count * es, count * es), "")
                  << "allgather, block " << q;
            for (int root : roots) {
              auto bc_of = [&](std::size_t r) {
                return make_garbage(count * es, mix_seed(cs, {static_cast<std::uint64_t>(root), r}));
              };
              Bytes bc = bc_of(me), red = make_garbage(count * es, cs + 7 * me);
              comm().broadcast(bc.data(), count, dt, root);
              comm().reduce(in[me].data(), static_cast<int>(me) == root ? red.data() : nullptr, count, dt, op, root);
              EXPECT_EQ(compare_bytes(bc.data(), bc_of(static_cast<std::size_t>(root)).data(), count * es), "")
                  << "broadcast from " << root;
              if (static_cast<int>(me) == root) {
                EXPECT_EQ(compare(er, red.data(), 0, count), "") << "reduce";
              }
            }
            comm().barrier();
          }
      },
      sizes, with(Algorithm::kAuto, 64));
}

INSTANTIATE_TEST_SUITE_P(Sizes, ManyRanks, ::testing::Values(16, 64), ranks_name);

}  // namespace
