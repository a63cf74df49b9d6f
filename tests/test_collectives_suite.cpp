// The collectives over every world of worlds.h (in-process threads; MPI processes under mpirun -np 2/3/4): every
// algorithm of the table against references that every rank computes locally (each rank regenerates every rank's
// input from a seed that rank 0 picks and broadcasts). Bodies are written from one rank's view; every rank runs
// the same tests in the same order; checks use EXPECT so that no rank skips a collective.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "collective_reference.h"
#include "collectives_suite.h"
#include "hopwise/comm/communicator.h"
#include "hopwise/comm/transports/mpi_transport.h"
#include "hopwise/common/error.h"
#include "worlds.h"

namespace {

class PerAlgorithm : public ::testing::TestWithParam<Algorithm> {};
std::string algo_param_name(const ::testing::TestParamInfo<Algorithm>& info) { return algo_name(info.param); }

// ================================================================================ allreduce
TEST_P(PerAlgorithm, AllreduceEveryDtypeOpSmallCounts) {
  if (GetParam() == Algorithm::kNative && !world_has_native())
    GTEST_SKIP() << "no native collectives in the " << world().name << " world";
  each([&] {
    const Algorithm algo = GetParam();
    SCOPED_TRACE(seed_note(g_seed));
    comm().set_algorithm(algo);
    EXPECT_EQ(comm().algorithm_for(Collective::kAllreduce, 1024), algo);
    for (DataType dt : hopwise::kAllDataTypes)
      for (ReduceOp op : ops_for(dt))
        for (std::size_t count : small_counts(comm().size())) allreduce_case(algo, dt, op, count, true);
    comm().set_algorithm(Algorithm::kAuto);
  });
}

TEST_P(PerAlgorithm, AllreduceMillionElements) {
  if (GetParam() == Algorithm::kNative && !world_has_native())
    GTEST_SKIP() << "no native collectives in the " << world().name << " world";
  each(
      [&] {
        const Algorithm algo = GetParam();
        SCOPED_TRACE(seed_note(g_seed));
        comm().set_algorithm(algo);
        // 1000003 (prime: uneven blocks and chunk tails) for every dtype and op; in place every other case.
        int k = 0;
        for (DataType dt : hopwise::kAllDataTypes)
          for (ReduceOp op : ops_for(dt)) allreduce_case(algo, dt, op, 1000003, k++ % 2 == 0);
        comm().set_algorithm(Algorithm::kAuto);
      },
      heavy_sizes());
}

// Small chunks: many messages per block through MPI.
TEST_P(PerAlgorithm, AllreduceAcrossChunks) {
  if (GetParam() == Algorithm::kNative && !world_has_native())
    GTEST_SKIP() << "no native collectives in the " << world().name << " world";
  each(
      [&] {
        const Algorithm algo = GetParam();
        SCOPED_TRACE(seed_note(g_seed));
        comm().set_algorithm(algo);
        for (DataType dt : {DataType::kFloat32, DataType::kBFloat16, DataType::kInt64})
          for (std::size_t count : {std::size_t{65537}, std::size_t{300001}})
            allreduce_case(algo, dt, ReduceOp::kSum, count, true);
        comm().set_algorithm(Algorithm::kAuto);
      },
      heavy_sizes());
}

INSTANTIATE_TEST_SUITE_P(Table, PerAlgorithm, ::testing::ValuesIn(allreduce_algorithms()), algo_param_name);

// ================================================================================ other collectives
class RingOrNative : public ::testing::TestWithParam<Algorithm> {};

TEST_P(RingOrNative, ReduceScatter) {
  if (GetParam() == Algorithm::kNative && !world_has_native())
    GTEST_SKIP() << "no native collectives in the " << world().name << " world";
  each([&] {
    const Algorithm algo = GetParam();
    SCOPED_TRACE(seed_note(g_seed));
    comm().set_algorithm(algo);
    EXPECT_EQ(comm().algorithm_for(Collective::kReduceScatter, 64), algo);
    const int n = comm().size(), me = comm().rank();
    for (DataType dt : hopwise::kAllDataTypes)
      for (ReduceOp op : ops_for(dt))
        for (std::size_t rc : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{13}, std::size_t{100003}}) {
          if (rc == 100003 && op != ReduceOp::kSum) continue;
          SCOPED_TRACE(fmt::format("reduce_scatter(recvcount={}, {}, {}) over {} ranks, {}", rc, hopwise::to_string(dt),
                                   hopwise::to_string(op), n, algo_name(algo)));
          const std::size_t total = rc * static_cast<std::size_t>(n), es = hopwise::dtype_size(dt);
          const std::vector<Bytes> in =
              all_inputs(dt, op, total,
                         mix_seed(g_seed, {11, static_cast<std::uint64_t>(dt), static_cast<std::uint64_t>(op), rc}));
          const Expected e = reference(dt, op, ptrs(in), 0, total);
          Bytes out = make_garbage(rc * es, g_seed);
          comm().reduce_scatter(in[static_cast<std::size_t>(me)].data(), out.data(), rc, dt, op);
          EXPECT_EQ(compare(e, out.data(), static_cast<std::size_t>(me) * rc, rc), "");
        }
    comm().set_algorithm(Algorithm::kAuto);
  });
}

TEST_P(RingOrNative, Allgather) {
  if (GetParam() == Algorithm::kNative && !world_has_native())
    GTEST_SKIP() << "no native collectives in the " << world().name << " world";
  each([&] {
    const Algorithm algo = GetParam();
    SCOPED_TRACE(seed_note(g_seed));
    comm().set_algorithm(algo);
    const int n = comm().size(), me = comm().rank();
    for (DataType dt : hopwise::kAllDataTypes)
      for (std::size_t sc : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{13}, std::size_t{100003}}) {
        SCOPED_TRACE(fmt::format("allgather(sendcount={}, {}) over {} ranks, {}", sc, hopwise::to_string(dt), n,
                                 algo_name(algo)));
        const std::size_t es = hopwise::dtype_size(dt), bytes = sc * es;
        Bytes want;
        for (int r = 0; r < n; ++r) {
          const Bytes b = make_garbage(
              bytes, mix_seed(g_seed, {12, static_cast<std::uint64_t>(dt), sc, static_cast<std::uint64_t>(r)}));
          want.insert(want.end(), b.begin(), b.end());
        }
        const Bytes mine(want.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(me) * bytes),
                         want.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(me + 1) * bytes));
        Bytes out = make_garbage(want.size(), g_seed + 1), io = make_garbage(want.size(), g_seed + 2);
        std::copy(mine.begin(), mine.end(),
                  io.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(me) * bytes));
        comm().allgather(mine.data(), out.data(), sc, dt);
        comm().allgather(io.data() + static_cast<std::size_t>(me) * bytes, io.data(), sc, dt);  // in place
        EXPECT_EQ(compare_bytes(out.data(), want.data(), want.size()), "");
        EXPECT_EQ(compare_bytes(io.data(), want.data(), want.size()), "") << "in place";
      }
    comm().set_algorithm(Algorithm::kAuto);
  });
}

TEST_P(RingOrNative, Barrier) {
  if (GetParam() == Algorithm::kNative && !world_has_native())
    GTEST_SKIP() << "no native collectives in the " << world().name << " world";
  each([&] {
    const Algorithm algo = GetParam();
    comm().set_algorithm(algo);
    const int n = comm().size(), me = comm().rank();
    // Rank r enters 200*r ms after a common start; nobody may leave before the last has entered.
    for (int round = 0; round < 2; ++round) {
      int sync = 0;  // a common start (an allreduce: not the barrier under test)
      comm().allreduce(&sync, &sync, 1, DataType::kInt32, ReduceOp::kSum);
      const auto t0 = Clock::now();
      std::this_thread::sleep_for(std::chrono::milliseconds(200 * me));
      comm().barrier();
      const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
      // 80 ms of slack for the skew of the start's exits; a barrier that does not wait is 200 ms short or more.
      EXPECT_GE(waited, 0.200 * (n - 1) - 0.08) << "rank " << me << " left the " << algo_name(algo) << " barrier early";
    }
    comm().set_algorithm(Algorithm::kAuto);
  });
}

INSTANTIATE_TEST_SUITE_P(Table, RingOrNative, ::testing::Values(Algorithm::kRing, Algorithm::kNative), algo_param_name);

class TreeOrNative : public ::testing::TestWithParam<Algorithm> {};

TEST_P(TreeOrNative, BroadcastFromEveryRoot) {
  if (GetParam() == Algorithm::kNative && !world_has_native())
    GTEST_SKIP() << "no native collectives in the " << world().name << " world";
  each([&] {
    const Algorithm algo = GetParam();
    SCOPED_TRACE(seed_note(g_seed));
    comm().set_algorithm(algo);
    EXPECT_EQ(comm().algorithm_for(Collective::kBroadcast, 64), algo);
    const int n = comm().size(), me = comm().rank();
    for (DataType dt : hopwise::kAllDataTypes)
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{100003}})
        for (int root = 0; root < n; ++root) {
          SCOPED_TRACE(fmt::format("broadcast(count={}, {}, root={}) over {} ranks, {}", count, hopwise::to_string(dt),
                                   root, n, algo_name(algo)));
          const std::size_t bytes = count * hopwise::dtype_size(dt);
          const std::uint64_t cs =
              mix_seed(g_seed, {13, static_cast<std::uint64_t>(dt), count, static_cast<std::uint64_t>(root)});
          const Bytes want = make_garbage(bytes, cs);
          Bytes buf = me == root ? want : make_garbage(bytes, cs + 1 + static_cast<std::uint64_t>(me));
          comm().broadcast(buf.data(), count, dt, root);
          EXPECT_EQ(compare_bytes(buf.data(), want.data(), bytes), "");
        }
    comm().set_algorithm(Algorithm::kAuto);
  });
}

TEST_P(TreeOrNative, ReduceToEveryRoot) {
  if (GetParam() == Algorithm::kNative && !world_has_native())
    GTEST_SKIP() << "no native collectives in the " << world().name << " world";
  each([&] {
    const Algorithm algo = GetParam();
    SCOPED_TRACE(seed_note(g_seed));
    comm().set_algorithm(algo);
    EXPECT_EQ(comm().algorithm_for(Collective::kReduce, 64), algo);
    const int n = comm().size(), me = comm().rank();
    for (DataType dt : hopwise::kAllDataTypes)
      for (ReduceOp op : ops_for(dt))
        for (std::size_t count :
             {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{13}, std::size_t{70001}}) {
          if (count == 70001 && op != ReduceOp::kMax) continue;
          const std::vector<Bytes> in =
              all_inputs(dt, op, count,
                         mix_seed(g_seed, {14, static_cast<std::uint64_t>(dt), static_cast<std::uint64_t>(op), count}));
          const Expected e = reference(dt, op, ptrs(in), 0, count);
          const std::size_t bytes = count * hopwise::dtype_size(dt);
          for (int root = 0; root < n; ++root) {
            SCOPED_TRACE(fmt::format("reduce(count={}, {}, {}, root={}) over {} ranks, {}", count,
                                     hopwise::to_string(dt), hopwise::to_string(op), root, n, algo_name(algo)));
            Bytes mine = in[static_cast<std::size_t>(me)];
            Bytes out = make_garbage(bytes, g_seed + static_cast<std::uint64_t>(root));
            comm().reduce(mine.data(), me == root ? out.data() : nullptr, count, dt, op, root);  // out null elsewhere
            if (me == root) {
              EXPECT_EQ(compare(e, out.data(), 0, count), "");
            }
            // In place at the root.
            comm().reduce(mine.data(), me == root ? mine.data() : nullptr, count, dt, op, root);
            if (me == root) {
              EXPECT_EQ(compare(e, mine.data(), 0, count), "") << "in place";
            } else {
              EXPECT_EQ(compare_bytes(mine.data(), in[static_cast<std::size_t>(me)].data(), bytes), "")
                  << "input modified";
            }
          }
        }
    comm().set_algorithm(Algorithm::kAuto);
  });
}

INSTANTIATE_TEST_SUITE_P(Table, TreeOrNative, ::testing::Values(Algorithm::kTree, Algorithm::kNative), algo_param_name);

// ================================================================================ point to point
TEST(P2P, SendRecvRing) { each(send_recv_ring); }

// ================================================================================ async
TEST(Async, AllreduceOverlapsComputation) {
  each(
      [&] {
        SCOPED_TRACE(seed_note(g_seed));
        const int n = comm().size(), me = comm().rank();
        for (Algorithm algo : {Algorithm::kAuto, Algorithm::kRing, Algorithm::kNative}) {
          if (algo == Algorithm::kNative && !world_has_native()) continue;
          SCOPED_TRACE(algo_name(algo));
          comm().set_algorithm(algo);
          const std::size_t count = std::size_t{4} << 20;
          const std::vector<Bytes> in = all_inputs(DataType::kFloat32, ReduceOp::kSum, count,
                                                   mix_seed(g_seed, {16, static_cast<std::uint64_t>(algo)}));
          const Expected e = reference(DataType::kFloat32, ReduceOp::kSum, ptrs(in), 0, count);
          Bytes buf = in[static_cast<std::size_t>(me)];
          hc::Work w = comm().allreduce_async(buf.data(), buf.data(), count, DataType::kFloat32, ReduceOp::kSum);
          // Compute while the allreduce progresses; with ring, keep computing until test() says it is done.
          std::vector<double> x(1 << 16);
          std::iota(x.begin(), x.end(), 1.0);
          double acc = 0;
          const auto deadline = Clock::now() + std::chrono::seconds(60);
          for (int it = 0; it < 200 || (algo == Algorithm::kRing && !w.test() && Clock::now() < deadline); ++it)
            for (double v : x) acc += std::sqrt(v + it);
          if (algo == Algorithm::kRing) {
            EXPECT_TRUE(w.test()) << "Work::test() never became true";
          }
          w.wait();
          EXPECT_GT(acc, 0);
          EXPECT_TRUE(w.test());
          EXPECT_EQ(compare(e, buf.data(), 0, count), "") << "over " << n << " ranks";
        }
        comm().set_algorithm(Algorithm::kAuto);
      },
      heavy_sizes());
}

TEST(Async, BackToBackMixedKinds) {
  each([&] {
    SCOPED_TRACE(seed_note(g_seed));
    const int n = comm().size(), me = comm().rank();
    const auto i = static_cast<std::size_t>(me);
    const std::vector<Bytes> a = all_inputs(DataType::kFloat64, ReduceOp::kAvg, 100003, g_seed + 1);
    const std::vector<Bytes> b =
        all_inputs(DataType::kInt32, ReduceOp::kSum, 77 * static_cast<std::size_t>(n), g_seed + 2);
    const std::vector<Bytes> d = all_inputs(DataType::kFloat16, ReduceOp::kMax, 13, g_seed + 3);
    const std::vector<Bytes> f = all_inputs(DataType::kBFloat16, ReduceOp::kSum, 5000, g_seed + 4);
    const Expected ea = reference(DataType::kFloat64, ReduceOp::kAvg, ptrs(a), 0, 100003);
    const Expected eb = reference(DataType::kInt32, ReduceOp::kSum, ptrs(b), 0, 77 * static_cast<std::size_t>(n));
    const Expected ed = reference(DataType::kFloat16, ReduceOp::kMax, ptrs(d), 0, 13);
    const Expected ef = reference(DataType::kBFloat16, ReduceOp::kSum, ptrs(f), 0, 5000);
    Bytes abuf = a[i], bout(77 * 4), dout(13 * 2), fout = make_garbage(5000 * 2, 1);
    Bytes gin = make_garbage(11, g_seed + 10 + i), gout(11 * static_cast<std::size_t>(n));
    Bytes bc = me == n - 1 ? make_garbage(3001 * 8, g_seed + 99) : Bytes(3001 * 8);
    const Bytes bc_want = make_garbage(3001 * 8, g_seed + 99);
    std::vector<hc::Work> w;
    w.push_back(comm().allreduce_async(abuf.data(), abuf.data(), 100003, DataType::kFloat64, ReduceOp::kAvg));
    w.push_back(comm().reduce_scatter_async(b[i].data(), bout.data(), 77, DataType::kInt32, ReduceOp::kSum));
    w.push_back(comm().allgather_async(gin.data(), gout.data(), 11, DataType::kUInt8));
    w.push_back(comm().broadcast_async(bc.data(), 3001, DataType::kFloat64, n - 1));
    w.push_back(comm().barrier_async());
    w.push_back(
        comm().reduce_async(d[i].data(), me == 0 ? dout.data() : nullptr, 13, DataType::kFloat16, ReduceOp::kMax, 0));
    w.push_back(comm().allreduce_async(f[i].data(), fout.data(), 5000, DataType::kBFloat16, ReduceOp::kSum));
    for (auto& x : w) x.wait();
    EXPECT_EQ(compare(ea, abuf.data(), 0, 100003), "") << "allreduce avg";
    EXPECT_EQ(compare(eb, bout.data(), i * 77, 77), "") << "reduce_scatter";
    EXPECT_EQ(compare_bytes(bc.data(), bc_want.data(), bc.size()), "") << "broadcast";
    if (me == 0) {
      EXPECT_EQ(compare(ed, dout.data(), 0, 13), "") << "reduce";
    }
    EXPECT_EQ(compare(ef, fout.data(), 0, 5000), "") << "allreduce bf16";
    for (int r = 0; r < n; ++r)
      EXPECT_EQ(compare_bytes(gout.data() + static_cast<std::size_t>(r) * 11,
                              make_garbage(11, g_seed + 10 + static_cast<std::size_t>(r)).data(), 11),
                "")
          << "allgather block " << r;
  });
}

// Shared-slot calls right after large message-passing ones, back to back: the last large send of a ring may still
// need the receiver's library to acknowledge it, and a rank that only spun on the slots' flags never let it
// (found by the tuner, which alternates algorithms: shm after ring at 64 MiB hung under mpirun).
TEST(SharedSlots, AfterLargeMessagesBackToBack) {
  each([&] {
    if (comm().transport().shared_slots() == nullptr) GTEST_SKIP() << "no shared slots in this world";
    // 64 MiB of float32 (rendezvous messages) where a library moves them; in-process, 4 MiB covers the algorithms.
    const bool library = world().ranks != World::Ranks::kThreads;
    const std::size_t count = std::size_t{1} << (library ? 24 : 20);
    const float n = static_cast<float>(comm().size());
    std::vector<float> x(count, 1.0f), y(count);
    for (int it = 0; it < 2; ++it)
      for (Algorithm a : {Algorithm::kTwoShot, Algorithm::kRing, Algorithm::kTwoShot, Algorithm::kHalvingDoubling}) {
        comm().set_algorithm(a);
        std::fill(y.begin(), y.end(), -1.0f);
        comm().allreduce(x.data(), y.data(), count, DataType::kFloat32, ReduceOp::kSum);
        ASSERT_EQ(y[0], n) << algo_name(a);
        ASSERT_EQ(y[count - 1], n) << algo_name(a);
      }
    comm().set_algorithm(Algorithm::kAuto);
  });
}

// ================================================================================ plans and errors
TEST(Plan, RandomRingOrder) {
  each([&] {
    SCOPED_TRACE(seed_note(g_seed));
    const int n = comm().size();
    std::vector<int> order(static_cast<std::size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::mt19937_64 rng(g_seed);  // the same permutation on every rank
    std::shuffle(order.begin(), order.end(), rng);
    SCOPED_TRACE("ring order " + ::testing::PrintToString(order));
    comm().set_ring_order(order);
    EXPECT_EQ(comm().ring_order(), order);
    for (Algorithm a : {Algorithm::kRing, Algorithm::kHalvingDoubling, Algorithm::kTree}) {
      comm().set_algorithm(a);
      for (std::size_t count : {std::size_t{1}, std::size_t{13}, std::size_t{100003}}) {
        allreduce_case(a, DataType::kFloat32, ReduceOp::kSum, count, true);
        allreduce_case(a, DataType::kInt64, ReduceOp::kProd, count, false);
      }
    }
    comm().set_algorithm(Algorithm::kAuto);
    comm().set_ring_order(hopwise::topology::identity_ring(n));
  });
}

TEST(Errors, BadArgumentsAreRejectedLocally) {
  each([&] {
    float x[4] = {};
    EXPECT_THROW(comm().allreduce(nullptr, x, 4, DataType::kFloat32), hopwise::InvalidArgument);
    EXPECT_THROW(comm().broadcast(x, 4, DataType::kFloat32, comm().size()), hopwise::InvalidArgument);
    EXPECT_THROW(comm().allreduce(x, x, 2, DataType::kInt32, ReduceOp::kAvg), hopwise::InvalidArgument);
    EXPECT_THROW(comm().send(x, 1, DataType::kFloat32, -1), hopwise::InvalidArgument);
    EXPECT_THROW(comm().set_ring_order({comm().size()}), hopwise::InvalidArgument);  // not a rank
    // Still usable.
    allreduce_case(Algorithm::kAuto, DataType::kFloat32, ReduceOp::kMax, 5, false);
  });
}

// A communicator over a split of MPI_COMM_WORLD, used alongside the world communicator.
TEST(MpiComm, SubCommunicatorAlongsideWorld) {
  if (world().name != "mpi") GTEST_SKIP() << "MPI communicators only";
  each([&] {
    SCOPED_TRACE(seed_note(g_seed));
    const int me = comm().rank(), n = comm().size();
    MPI_Comm half = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, me % 2, me, &half);
    hc::Options opts = hc::Options::from_env();
    opts.timeout_s = 60;
    opts.calibrate = false;
    {
      hc::Communicator sub(std::make_unique<hc::MpiTransport>(half), opts);
      std::vector<int> members;
      for (int r = me % 2; r < n; r += 2) members.push_back(r);
      EXPECT_EQ(sub.size(), static_cast<int>(members.size()));  // EXPECT: every rank must reach the collectives
      EXPECT_EQ(sub.rank(), me / 2);
      const std::size_t count = 30011;
      // Inputs keyed by world rank; the reference reduces the members of my half only.
      std::vector<Bytes> world_in = all_inputs(DataType::kFloat64, ReduceOp::kSum, count, g_seed + 77);
      std::vector<const void*> half_in;
      for (int r : members) half_in.push_back(world_in[static_cast<std::size_t>(r)].data());
      const Expected e_half = reference(DataType::kFloat64, ReduceOp::kSum, half_in, 0, count);
      const Expected e_world = reference(DataType::kFloat64, ReduceOp::kSum, ptrs(world_in), 0, count);
      Bytes out_half(count * 8), out_world(count * 8);
      hc::Work w = comm().allreduce_async(world_in[static_cast<std::size_t>(me)].data(), out_world.data(), count,
                                          DataType::kFloat64, ReduceOp::kSum);
      for (Algorithm a : {Algorithm::kRing, Algorithm::kTree, Algorithm::kNative}) {
        sub.set_algorithm(a);
        std::fill(out_half.begin(), out_half.end(), 0);
        sub.allreduce(world_in[static_cast<std::size_t>(me)].data(), out_half.data(), count, DataType::kFloat64,
                      ReduceOp::kSum);
        EXPECT_EQ(compare(e_half, out_half.data(), 0, count), "") << "sub-communicator, " << algo_name(a);
      }
      w.wait();
      EXPECT_EQ(compare(e_world, out_world.data(), 0, count), "") << "world communicator";
    }
    MPI_Comm_free(&half);
  });
}

TEST(MpiComm, RanksAndHosts) {
  if (world().name != "mpi") GTEST_SKIP() << "MPI communicators only";
  each([&] {
    int wr = -1, ws = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &wr);
    MPI_Comm_size(MPI_COMM_WORLD, &ws);
    EXPECT_EQ(comm().rank(), wr);
    EXPECT_EQ(comm().size(), ws);
    EXPECT_EQ(comm().transport().name(), "mpi");
    EXPECT_NE(comm().transport().native(), nullptr);
    EXPECT_GE(comm().local_rank(), 0);
    EXPECT_LT(comm().local_rank(), comm().local_size());
    // Hosts are numbered in rank order from 0: all 0 on one machine, more on a cluster (scripts/local-cluster.sh).
    if (comm().rank() == 0 || comm().local_size() == comm().size()) {
      EXPECT_EQ(comm().host_id(), 0);
    }
    EXPECT_LT(comm().host_id(), comm().size());
  });
}

}  // namespace

#include "world_main.h"
