// DeviceCommunicator on one GPU per rank (mpirun -np N; -np 1 on a one-GPU machine): every collective, sync and
// async, every dtype and op, awkward sizes (0, 1, fewer elements than ranks, primes, 1000003), against host
// references that every rank computes locally (each rank regenerates every rank's input from a seed that rank 0
// picks and broadcasts). Floating results: exact with one rank, within the rounding bound of
// collective_reference.h with more. Every rank runs the same collectives in the same order (checks use EXPECT).
// Without a visible GPU the program prints "[  SKIPPED ] needs a CUDA GPU: <why>" and exits 77.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "collective_reference.h"
#include "hopwise/comm/device_communicator.h"
#include "hopwise/comm/device_powersgd_allreduce.h"
#include "hopwise/comm/transports/mpi_store.h"
#include "hopwise/common/cuda_reduce.h"
#include "hopwise/common/device_buffer.h"
#include "hopwise/common/error.h"
#include "hopwise/compression/codec.h"
#include "hopwise/compression/device_codec.h"
#include "hopwise/compression/powersgd.h"
#include "nccl_test_main.h"
#include "powersgd_reference.h"

namespace {

using namespace hwtest;
namespace hc = hopwise::comm;
namespace hcc = hopwise::compression;
using hc::DeviceAlgorithm;
using hopwise::DeviceBuffer;

// Device copy of host bytes (at least one byte, so that data() is never null).
DeviceBuffer to_device(const Bytes& h) {
  DeviceBuffer d(std::max<std::size_t>(h.size(), 1));
  if (!h.empty()) hopwise::cuda::copy_to_device(d.data(), h.data(), h.size());
  return d;
}
Bytes to_host(const void* d, std::size_t bytes) {
  Bytes h(bytes);
  if (bytes > 0) hopwise::cuda::copy_to_host(h.data(), d, bytes);
  return h;
}

std::vector<const void*> ptrs(const std::vector<Bytes>& v) {
  std::vector<const void*> p;
  for (const auto& b : v) p.push_back(b.data());
  return p;
}

// Every rank's input for one case (the reference needs all of them).
std::vector<Bytes> all_inputs(DataType dt, ReduceOp op, std::size_t count, std::uint64_t cs) {
  std::vector<Bytes> v;
  for (int r = 0; r < comm().size(); ++r) v.push_back(make_input(dt, op, count, r, comm().size(), cs));
  return v;
}

// The reference; with one rank every result must be exact (a reduction over one rank is a copy).
Expected ref(DataType dt, ReduceOp op, const std::vector<Bytes>& in, std::size_t first, std::size_t count) {
  Expected e = reference(dt, op, ptrs(in), first, count);
  if (comm().size() == 1) std::fill(e.tol.begin(), e.tol.end(), 0.0);
  return e;
}

std::vector<std::size_t> counts() {
  std::vector<std::size_t> v = small_counts(comm().size());  // 0, 1, 2, 7, 13 and size - 1
  v.push_back(1000003);
  return v;
}

std::uint64_t u(DataType dt) { return static_cast<std::uint64_t>(dt); }
std::uint64_t u(ReduceOp op) { return static_cast<std::uint64_t>(op); }

// ---- allreduce (native and ring) ----
void allreduce_case(DeviceAlgorithm algo, DataType dt, ReduceOp op, std::size_t count,
                    hc::DeviceCommunicator* other = nullptr) {
  hc::DeviceCommunicator& c = other ? *other : comm();
  const int me = c.rank();
  c.set_algorithm(algo);
  const std::uint64_t cs = mix_seed(g_seed, {10, u(dt), u(op), count, static_cast<std::uint64_t>(algo)});
  SCOPED_TRACE(fmt::format("allreduce(count={}, {}, {}) over {} ranks, {}", count, hopwise::to_string(dt),
                           hopwise::to_string(op), c.size(), hc::to_string(algo)));
  const std::vector<Bytes> in = all_inputs(dt, op, count, cs);
  const Expected e = ref(dt, op, in, 0, count);
  const std::size_t bytes = count * hopwise::dtype_size(dt);
  const Bytes& mine = in[static_cast<std::size_t>(me)];

  // Sync, out of place.
  DeviceBuffer din = to_device(mine), dout = to_device(make_garbage(bytes, cs + 1));
  c.allreduce(din.data(), dout.data(), count, dt, op);
  EXPECT_EQ(compare(e, to_host(dout.data(), bytes).data(), 0, count), "") << "sync, out of place";
  EXPECT_EQ(compare_bytes(to_host(din.data(), bytes).data(), mine.data(), bytes), "") << "input modified";

  // Async, in place, after a producer stream that uploads the input; the consumer stream waits on the work.
  Stream s;
  DeviceBuffer dio(std::max<std::size_t>(bytes, 1));
  cuda_ok(cudaMemcpyAsync(dio.data(), mine.data(), bytes, cudaMemcpyHostToDevice, s.s), "cudaMemcpyAsync H2D");
  hc::DeviceWork w = c.allreduce_async(dio.data(), dio.data(), count, dt, op, s.s);
  w.wait_on_stream(s.s);
  Bytes got(bytes);
  cuda_ok(cudaMemcpyAsync(got.data(), dio.data(), bytes, cudaMemcpyDeviceToHost, s.s), "cudaMemcpyAsync D2H");
  s.sync();
  w.wait();
  EXPECT_TRUE(w.test());
  EXPECT_GE(w.elapsed_ms(), 0.0);
  EXPECT_EQ(compare(e, got.data(), 0, count), "") << "async, in place";
  c.set_algorithm(DeviceAlgorithm::kNative);
}

TEST(DeviceAllreduce, NativeEveryDtypeOpAndSize) {
  for (DataType dt : hopwise::kAllDataTypes)
    for (ReduceOp op : ops_for(dt))
      for (std::size_t n : counts()) allreduce_case(DeviceAlgorithm::kNative, dt, op, n);
}

TEST(DeviceAllreduce, RingEveryDtypeOpAndSize) {
  for (DataType dt : hopwise::kAllDataTypes)
    for (ReduceOp op : ops_for(dt))
      for (std::size_t n : counts()) allreduce_case(DeviceAlgorithm::kRing, dt, op, n);
}

TEST(DeviceAllreduce, RingFollowsAPlannedOrderAndSmallChunks) {
  hc::DeviceCommunicator& c = comm();
  // A shuffled ring, the same on every rank (drawn from the shared seed).
  std::vector<int> order(static_cast<std::size_t>(c.size()));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), Rng(mix_seed(g_seed, {11})));
  c.set_ring_order(order);
  EXPECT_EQ(c.ring_order(), order);
  for (DataType dt : {DataType::kFloat32, DataType::kBFloat16, DataType::kInt64})
    for (std::size_t n : {std::size_t{3}, std::size_t{65537}, std::size_t{1000003}})
      allreduce_case(DeviceAlgorithm::kRing, dt, hopwise::is_floating(dt) ? ReduceOp::kAvg : ReduceOp::kSum, n);
  std::vector<int> identity(order.size());
  std::iota(identity.begin(), identity.end(), 0);
  c.set_ring_order(identity);

  // Chunks of 24 bytes (3 int64, 6 float32, 12 bfloat16): every ring step runs many chunks, some empty.
  hc::DeviceOptions o = hc::DeviceOptions::from_env();
  o.ring_chunk_bytes = 24;
  hc::DeviceCommunicator small(MPI_COMM_WORLD, o);
  small.set_ring_order(order);
  for (DataType dt : {DataType::kFloat32, DataType::kBFloat16, DataType::kInt64})
    for (std::size_t n : {std::size_t{1}, std::size_t{5}, std::size_t{13}, std::size_t{4099}})
      allreduce_case(DeviceAlgorithm::kRing, dt, hopwise::is_floating(dt) ? ReduceOp::kAvg : ReduceOp::kSum, n, &small);
}

// ---- reduce_scatter ----
TEST(DeviceCollectives, ReduceScatter) {
  hc::DeviceCommunicator& c = comm();
  const int n = c.size(), me = c.rank();
  for (DataType dt : hopwise::kAllDataTypes)
    for (ReduceOp op : ops_for(dt))
      for (std::size_t count : counts()) {
        if (count == 1000003 && !(dt == DataType::kFloat32 || dt == DataType::kUInt8)) continue;  // keep it quick
        SCOPED_TRACE(fmt::format("reduce_scatter(recvcount={}, {}, {}) over {} ranks", count, hopwise::to_string(dt),
                                 hopwise::to_string(op), n));
        const std::uint64_t cs = mix_seed(g_seed, {20, u(dt), u(op), count});
        const std::size_t es = hopwise::dtype_size(dt), total = count * static_cast<std::size_t>(n);
        const std::vector<Bytes> in = all_inputs(dt, op, total, cs);
        const Expected e = ref(dt, op, in, static_cast<std::size_t>(me) * count, count);
        const Bytes& mine = in[static_cast<std::size_t>(me)];
        DeviceBuffer din = to_device(mine), dout = to_device(make_garbage(count * es, cs + 1));
        c.reduce_scatter(din.data(), dout.data(), count, dt, op);
        EXPECT_EQ(compare(e, to_host(dout.data(), count * es).data(), 0, count), "") << "sync, out of place";
        // Async with out == in (staged), and NCCL's in-place form (out = in + rank * recvcount).
        DeviceBuffer a = to_device(mine), b = to_device(mine);
        Stream s;
        hc::DeviceWork w1 = c.reduce_scatter_async(a.data(), a.data(), count, dt, op, s.s);
        char* bin = b.as<char>();
        hc::DeviceWork w2 =
            c.reduce_scatter_async(bin, bin + static_cast<std::size_t>(me) * count * es, count, dt, op, s.s);
        w1.wait();
        w2.wait();
        EXPECT_EQ(compare(e, to_host(a.data(), count * es).data(), 0, count), "") << "out == in";
        EXPECT_EQ(compare(e, to_host(bin + static_cast<std::size_t>(me) * count * es, count * es).data(), 0, count), "")
            << "NCCL in place";
      }
}

// ---- allgather ----
TEST(DeviceCollectives, Allgather) {
  hc::DeviceCommunicator& c = comm();
  const int n = c.size(), me = c.rank();
  for (DataType dt : hopwise::kAllDataTypes)
    for (std::size_t count : counts()) {
      SCOPED_TRACE(fmt::format("allgather(sendcount={}, {}) over {} ranks", count, hopwise::to_string(dt), n));
      const std::uint64_t cs = mix_seed(g_seed, {30, u(dt), count});
      const std::size_t bytes = count * hopwise::dtype_size(dt), total = bytes * static_cast<std::size_t>(n);
      const std::vector<Bytes> in = all_inputs(dt, ReduceOp::kSum, count, cs);
      Bytes want;
      for (const Bytes& b : in) want.insert(want.end(), b.begin(), b.end());
      const Bytes& mine = in[static_cast<std::size_t>(me)];
      DeviceBuffer din = to_device(mine), dout = to_device(make_garbage(total, cs + 1));
      c.allgather(din.data(), dout.data(), count, dt);
      EXPECT_EQ(compare_bytes(to_host(dout.data(), total).data(), want.data(), total), "") << "sync";
      // Async: NCCL's in-place form (in = out + rank * sendcount) and out == in (staged).
      Bytes place = make_garbage(total, cs + 2);
      if (bytes > 0) std::memcpy(place.data() + static_cast<std::size_t>(me) * bytes, mine.data(), bytes);
      DeviceBuffer a = to_device(place);
      Bytes first = make_garbage(total, cs + 3);
      if (bytes > 0) std::memcpy(first.data(), mine.data(), bytes);
      DeviceBuffer b = to_device(first);
      Stream s;
      hc::DeviceWork w1 =
          c.allgather_async(a.as<char>() + static_cast<std::size_t>(me) * bytes, a.data(), count, dt, s.s);
      hc::DeviceWork w2 = c.allgather_async(b.data(), b.data(), count, dt, s.s);
      w1.wait();
      w2.wait();
      EXPECT_EQ(compare_bytes(to_host(a.data(), total).data(), want.data(), total), "") << "NCCL in place";
      EXPECT_EQ(compare_bytes(to_host(b.data(), total).data(), want.data(), total), "") << "out == in";
    }
}

// ---- broadcast and reduce (every root would be slow at many ranks: first and last) ----
TEST(DeviceCollectives, Broadcast) {
  hc::DeviceCommunicator& c = comm();
  const int n = c.size(), me = c.rank();
  for (int root : {0, n - 1})
    for (DataType dt : hopwise::kAllDataTypes)
      for (std::size_t count : counts()) {
        SCOPED_TRACE(
            fmt::format("broadcast(count={}, {}, root {}) over {} ranks", count, hopwise::to_string(dt), root, n));
        const std::uint64_t cs = mix_seed(g_seed, {40, u(dt), count, static_cast<std::uint64_t>(root)});
        const std::size_t bytes = count * hopwise::dtype_size(dt);
        const Bytes data = make_input(dt, ReduceOp::kSum, count, root, n, cs);
        DeviceBuffer d = to_device(me == root ? data : make_garbage(bytes, cs + 1 + static_cast<std::uint64_t>(me)));
        c.broadcast(d.data(), count, dt, root);
        EXPECT_EQ(compare_bytes(to_host(d.data(), bytes).data(), data.data(), bytes), "") << "sync";
        DeviceBuffer d2 = to_device(me == root ? data : make_garbage(bytes, cs + 7));
        Stream s;
        c.broadcast_async(d2.data(), count, dt, root, s.s).wait();
        EXPECT_EQ(compare_bytes(to_host(d2.data(), bytes).data(), data.data(), bytes), "") << "async";
      }
}

TEST(DeviceCollectives, Reduce) {
  hc::DeviceCommunicator& c = comm();
  const int n = c.size(), me = c.rank();
  for (int root : {0, n - 1})
    for (DataType dt : hopwise::kAllDataTypes)
      for (ReduceOp op : ops_for(dt))
        for (std::size_t count : counts()) {
          if (count == 1000003 && dt != DataType::kFloat64) continue;  // keep it quick
          SCOPED_TRACE(fmt::format("reduce(count={}, {}, {}, root {}) over {} ranks", count, hopwise::to_string(dt),
                                   hopwise::to_string(op), root, n));
          const std::uint64_t cs = mix_seed(g_seed, {50, u(dt), u(op), count, static_cast<std::uint64_t>(root)});
          const std::size_t bytes = count * hopwise::dtype_size(dt);
          const std::vector<Bytes> in = all_inputs(dt, op, count, cs);
          const Expected e = ref(dt, op, in, 0, count);
          const Bytes& mine = in[static_cast<std::size_t>(me)];
          DeviceBuffer din = to_device(mine), dout = to_device(make_garbage(bytes, cs + 1));
          // Out is only needed at the root: pass null elsewhere.
          c.reduce(din.data(), me == root ? dout.data() : nullptr, count, dt, op, root);
          if (me == root) {
            EXPECT_EQ(compare(e, to_host(dout.data(), bytes).data(), 0, count), "") << "sync";
          }
          DeviceBuffer io = to_device(mine);
          c.reduce_async(io.data(), io.data(), count, dt, op, root).wait();
          if (me == root) {
            EXPECT_EQ(compare(e, to_host(io.data(), bytes).data(), 0, count), "") << "async, in place";
          }
        }
}

// ---- point-to-point ----
TEST(DevicePointToPoint, SendRecvAlongTheRing) {
  hc::DeviceCommunicator& c = comm();
  const int n = c.size(), me = c.rank();
  const int to = (me + 1) % n, from = (me + n - 1) % n;  // with one rank: itself
  for (DataType dt : hopwise::kAllDataTypes)
    for (std::size_t count : counts()) {
      SCOPED_TRACE(fmt::format("send_recv({} {}) to {} from {}", count, hopwise::to_string(dt), to, from));
      const std::uint64_t cs = mix_seed(g_seed, {60, u(dt), count});
      const std::size_t bytes = count * hopwise::dtype_size(dt);
      const Bytes mine = make_input(dt, ReduceOp::kSum, count, me, n, cs);
      const Bytes theirs = make_input(dt, ReduceOp::kSum, count, from, n, cs);
      DeviceBuffer sbuf = to_device(mine), rbuf = to_device(make_garbage(bytes, cs + 1));
      c.send_recv(sbuf.data(), count, to, rbuf.data(), count, from, dt);
      EXPECT_EQ(compare_bytes(to_host(rbuf.data(), bytes).data(), theirs.data(), bytes), "") << "sync";
      DeviceBuffer rbuf2 = to_device(make_garbage(bytes, cs + 2));
      Stream s;
      c.send_recv_async(sbuf.data(), count, to, rbuf2.data(), count, from, dt, s.s).wait();
      EXPECT_EQ(compare_bytes(to_host(rbuf2.data(), bytes).data(), theirs.data(), bytes), "") << "async";
    }
}

TEST(DevicePointToPoint, SendAndRecvBetweenPairs) {
  hc::DeviceCommunicator& c = comm();
  const int n = c.size(), me = c.rank();
  if (n < 2) GTEST_SKIP() << "needs two ranks (send/recv with oneself is send_recv, tested above)";
  const int partner = me % 2 == 0 ? me + 1 : me - 1;
  if (partner >= n) return;  // the odd one out
  for (std::size_t count : {std::size_t{1}, std::size_t{13}, std::size_t{1000003}}) {
    const std::uint64_t cs = mix_seed(g_seed, {61, count});
    const std::size_t bytes = count * sizeof(float);
    const Bytes a = make_input(DataType::kFloat32, ReduceOp::kSum, count, std::min(me, partner), n, cs);
    DeviceBuffer d = to_device(me % 2 == 0 ? a : make_garbage(bytes, cs + 1));
    if (me % 2 == 0) {
      c.send(d.data(), count, DataType::kFloat32, partner);
      DeviceBuffer back = to_device(make_garbage(bytes, cs + 2));
      c.recv_async(back.data(), count, DataType::kFloat32, partner).wait();
      EXPECT_EQ(compare_bytes(to_host(back.data(), bytes).data(), a.data(), bytes), "") << "echo";
    } else {
      c.recv(d.data(), count, DataType::kFloat32, partner);
      EXPECT_EQ(compare_bytes(to_host(d.data(), bytes).data(), a.data(), bytes), "") << "received";
      c.send_async(d.data(), count, DataType::kFloat32, partner).wait();
    }
  }
}

TEST(DeviceCollectives, BarrierAndStats) {
  hc::DeviceCommunicator& c = comm();
  const auto before = c.stats();
  c.barrier();
  hc::DeviceWork w = c.barrier_async();
  w.wait();
  EXPECT_TRUE(w.test());
  EXPECT_EQ(c.stats().calls, before.calls + 2);
  EXPECT_FALSE(c.aborted());
}

TEST(DeviceCollectives, ManagedMemoryWorks) {
  hc::DeviceCommunicator& c = comm();
  const std::size_t count = 4099;
  float* m = nullptr;
  cuda_ok(cudaMallocManaged(&m, count * sizeof(float)), "cudaMallocManaged");
  for (std::size_t i = 0; i < count; ++i) m[i] = static_cast<float>(i % 97);
  c.allreduce(m, m, count, DataType::kFloat32, ReduceOp::kMax);
  for (std::size_t i = 0; i < count; ++i) EXPECT_EQ(m[i], static_cast<float>(i % 97)) << "element " << i;
  cudaFree(m);
}

// ---- bad arguments: InvalidArgument naming the argument; the communicator stays usable ----
TEST(DeviceErrors, BadArgumentsAreInvalidArgument) {
  hc::DeviceCommunicator& c = comm();
  const int n = c.size();
  DeviceBuffer d(64 * sizeof(float));
  std::vector<float> host(64, 1.0f);
  using hopwise::InvalidArgument;

  EXPECT_THROW(c.allreduce(host.data(), d.data(), 64, DataType::kFloat32), InvalidArgument);
  EXPECT_THROW(c.allreduce(d.as<float>(), d.as<float>() + 1, 32, DataType::kFloat32), InvalidArgument)
      << "partly overlapping input and output";
  EXPECT_NE(message_of([&] { c.allreduce(host.data(), d.data(), 64, DataType::kFloat32); }).find("input buffer"),
            std::string::npos);
  EXPECT_NE(message_of([&] { c.allreduce(d.data(), host.data(), 64, DataType::kFloat32); }).find("host memory"),
            std::string::npos);
  void* pinned = nullptr;
  cuda_ok(cudaMallocHost(&pinned, 256), "cudaMallocHost");
  EXPECT_THROW(c.broadcast(pinned, 64, DataType::kFloat32, 0), InvalidArgument) << "pinned host memory";
  cudaFreeHost(pinned);
  EXPECT_NE(message_of([&] { c.allreduce(nullptr, d.data(), 64, DataType::kFloat32); }).find("null"),
            std::string::npos);
  EXPECT_THROW(c.allgather(d.data(), nullptr, 4, DataType::kInt32), InvalidArgument);
  EXPECT_NO_THROW(c.allreduce(nullptr, nullptr, 0, DataType::kFloat32));  // nothing to do, on every rank
  EXPECT_NE(message_of([&] { c.broadcast(d.data(), 8, DataType::kFloat32, n); }).find("root"), std::string::npos);
  EXPECT_THROW(c.broadcast(d.data(), 8, DataType::kFloat32, -1), InvalidArgument);
  EXPECT_THROW(c.reduce(d.data(), d.data(), 8, DataType::kFloat32, ReduceOp::kSum, n), InvalidArgument);
  EXPECT_NE(message_of([&] { c.send(d.data(), 8, DataType::kFloat32, n); }).find("peer"), std::string::npos);
  EXPECT_THROW(c.recv(d.data(), 8, DataType::kFloat32, -1), InvalidArgument);
  EXPECT_THROW(c.send(d.data(), 8, DataType::kFloat32, c.rank()), InvalidArgument) << "send to itself";
  EXPECT_THROW(c.send_recv(d.data(), 8, n, d.data(), 8, 0, DataType::kFloat32), InvalidArgument);
  EXPECT_THROW(c.allreduce(d.data(), d.data(), 8, DataType::kInt32, ReduceOp::kAvg), InvalidArgument);
  EXPECT_THROW(c.set_ring_order({}), InvalidArgument);
  std::vector<int> dup(static_cast<std::size_t>(n), 0);
  if (n > 1) {
    EXPECT_THROW(c.set_ring_order(dup), InvalidArgument);
  }
  std::vector<int> too_many(static_cast<std::size_t>(n) + 1);
  std::iota(too_many.begin(), too_many.end(), 0);
  EXPECT_THROW(c.set_ring_order(too_many), InvalidArgument);
  EXPECT_THROW(hc::parse_device_algorithm("tree"), InvalidArgument);
  EXPECT_THROW(hc::DeviceWork().wait(), InvalidArgument);
  // Still usable.
  const std::vector<float> ones(64, 1.0f);
  hopwise::cuda::copy_to_device(d.data(), ones.data(), 64 * sizeof(float));
  c.allreduce(d.data(), d.data(), 64, DataType::kFloat32, ReduceOp::kSum);
  std::vector<float> got(64);
  hopwise::cuda::copy_to_host(got.data(), d.data(), 64 * sizeof(float));
  for (float v : got) EXPECT_EQ(v, static_cast<float>(n));
}

// ---- compressed allreduce against the CPU codec of the same spec on the same data ----
void compressed_case(const std::string& spec, std::size_t count, ReduceOp op, bool async) {
  hc::DeviceCommunicator& c = comm();
  const int n = c.size(), me = c.rank();
  SCOPED_TRACE(fmt::format("allreduce_compressed('{}', count={}, {}) over {} ranks{}", spec, count,
                           hopwise::to_string(op), n, async ? ", async" : ""));
  const std::uint64_t cs = mix_seed(g_seed, {70, std::hash<std::string>{}(spec), count, u(op)});
  const std::uint64_t state_seed = cs ^ 0x5eed;
  auto cpu = hcc::make_codec(spec);
  hcc::DeviceCodec dev(spec);
  if (count == 0) {  // nothing to encode: a no-op that must not fail (null buffers are fine)
    hcc::DeviceCodecState ds(state_seed, me, n);
    EXPECT_NO_THROW(c.allreduce_compressed(nullptr, nullptr, 0, dev, ds, op));
    return;
  }

  // Every rank's gradient: values in (-1, 1) times a power of two from 2^-4 to 2^4, some exact zeros.
  std::vector<std::vector<float>> x(static_cast<std::size_t>(n), std::vector<float>(count));
  for (int r = 0; r < n; ++r) {
    Rng rng(mix_seed(cs, {static_cast<std::uint64_t>(r)}));
    for (float& v : x[static_cast<std::size_t>(r)]) {
      const std::uint64_t bits = rng();
      v = (bits & 31) == 0 ? 0.0f
                           : static_cast<float>((rng.unit() * 2 - 1) * std::ldexp(1.0, static_cast<int>(bits % 9) - 4));
    }
  }
  // The host reference: the communicator's recipe run with the CPU codec.
  std::vector<hcc::CodecState> states;
  for (int r = 0; r < n; ++r) states.emplace_back(state_seed, r, n);
  const std::size_t sc = cpu->scale_count(count);
  std::vector<float> agreed(sc, 0.0f), local(sc);
  for (int r = 0; r < n && sc > 0; ++r) {
    cpu->local_scales(x[static_cast<std::size_t>(r)].data(), count, local.data(), states[static_cast<std::size_t>(r)]);
    for (std::size_t k = 0; k < sc; ++k) agreed[k] = r == 0 ? local[k] : std::max(agreed[k], local[k]);
  }
  const float* scales = sc > 0 ? agreed.data() : nullptr;
  const std::size_t pb = cpu->payload_bytes(count);
  std::vector<std::vector<std::byte>> payloads(static_cast<std::size_t>(n), std::vector<std::byte>(pb));
  for (int r = 0; r < n; ++r)
    cpu->encode(x[static_cast<std::size_t>(r)].data(), count, payloads[static_cast<std::size_t>(r)].data(),
                states[static_cast<std::size_t>(r)], scales);
  std::vector<float> want(count, 0.0f);
  hcc::CodecState& mine = states[static_cast<std::size_t>(me)];
  if (cpu->pattern() == hcc::Pattern::kAggregatable) {
    std::vector<std::byte> sum = payloads[0];
    for (int r = 1; r < n; ++r) cpu->sum_payloads(sum.data(), payloads[static_cast<std::size_t>(r)].data(), count);
    if (count > 0) cpu->decode(sum.data(), count, want.data(), mine, scales);
  } else {
    for (int r = 0; r < n && count > 0; ++r)
      cpu->decode_add(payloads[static_cast<std::size_t>(r)].data(), count, want.data(), mine, scales);
  }
  if (op == ReduceOp::kAvg && n > 1)
    for (float& v : want) v *= static_cast<float>(1.0 / n);  // as the device scales: x * float(1/n)

  // The device: the same data, a state with the same seed and rank.
  hcc::DeviceCodecState ds(state_seed, me, n);
  const std::size_t bytes = count * sizeof(float);
  Bytes xin(bytes);
  if (bytes > 0) std::memcpy(xin.data(), x[static_cast<std::size_t>(me)].data(), bytes);
  DeviceBuffer din = to_device(xin), dout = to_device(make_garbage(bytes, cs + 1));
  const auto wire_before = c.stats().wire_bytes;
  if (async) {
    Stream s;
    c.allreduce_compressed_async(din.as<float>(), dout.as<float>(), count, dev, ds, op, s.s).wait();
  } else {
    c.allreduce_compressed(din.as<float>(), dout.as<float>(), count, dev, ds, op);
  }
  EXPECT_GE(c.stats().wire_bytes, wire_before + pb);
  std::vector<float> got(count);
  if (bytes > 0) hopwise::cuda::copy_to_host(got.data(), dout.data(), bytes);
  // One rank: exactly the CPU codec's decode(encode(x)). More: payload sums may round in another order (fp16,
  // none), bounded by n * 2^-10 of the sum of magnitudes.
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < count; ++i) {
    double mag = 0;
    for (int r = 0; r < n; ++r) mag += std::fabs(x[static_cast<std::size_t>(r)][i]);
    const double tol = n == 1 ? 0.0 : n * std::ldexp(mag, -10);
    if (!(std::fabs(static_cast<double>(got[i]) - want[i]) <= tol) && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << "first at element " << first << ": got " << (count ? got[first] : 0.0f) << ", expected "
                     << (count ? want[first] : 0.0f);
}

TEST(DeviceCompressed, MatchesTheCpuCodec) {
  for (const std::string spec : {"none", "fp16", "int8", "topk:ratio=0.1"})
    for (std::size_t count :
         {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{13}, std::size_t{1000}, std::size_t{100003}})
      compressed_case(spec, count, ReduceOp::kSum, false);
}

TEST(DeviceCompressed, AverageAndAsync) {
  for (const std::string spec : {"none", "fp16", "int8", "topk:ratio=0.1"}) {
    compressed_case(spec, 4099, ReduceOp::kAvg, false);
    compressed_case(spec, 4099, ReduceOp::kSum, true);
  }
  hcc::DeviceCodec dev("fp16");
  hcc::DeviceCodecState ds(1, comm().rank(), comm().size());
  DeviceBuffer d(64);
  EXPECT_THROW(comm().allreduce_compressed(d.as<float>(), d.as<float>(), 8, dev, ds, ReduceOp::kMax),
               hopwise::InvalidArgument);
}

// ---- PowerSGD over the communicator, against the CPU PowerSGD run on every rank's inputs ----
Bytes float_bytes(const std::vector<float>& v) {
  Bytes b(v.size() * sizeof(float));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

TEST(DevicePowerSgdAllreduce, MatchesTheCpuPowerSgdOverRanks) {
  hc::DeviceCommunicator& c = comm();
  const int n = c.size(), me = c.rank();
  const std::string spec = "powersgd:rank=4,warmup=1";
  const auto cpu = hcc::PowerSgd::from_spec(spec);
  hc::DevicePowerSgdAllreduce dev(c, spec);
  // Compressed matrices, one that compresses() rejects (plain) and a 1-row one.
  const std::vector<std::pair<std::size_t, std::size_t>> shapes = {{64, 48}, {257, 33}, {6, 5}, {1, 7}};
  std::vector<std::vector<hcc::PowerSgdState>> cpu_states(shapes.size());  // [tensor][rank]
  std::vector<hcc::DevicePowerSgdState> dev_states;
  for (std::size_t t = 0; t < shapes.size(); ++t) {
    for (int r = 0; r < n; ++r) cpu_states[t].emplace_back(100 + t);
    dev_states.emplace_back(100 + t);
  }
  for (int step = 0; step < 3; ++step) {  // step 0 is the warm-up: all plain
    SCOPED_TRACE("step " + std::to_string(step));
    const std::uint64_t cs = mix_seed(g_seed, {40, static_cast<std::uint64_t>(step)});
    std::vector<DeviceBuffer> in, out;
    std::vector<hc::DevicePowerSgdTensor> tensors;
    std::vector<std::vector<float>> expect;
    for (std::size_t t = 0; t < shapes.size(); ++t) {
      const auto [rows, cols] = shapes[t];
      const std::size_t count = rows * cols;
      std::vector<std::vector<float>> x(static_cast<std::size_t>(n), std::vector<float>(count));
      for (int r = 0; r < n; ++r) {
        Rng rng(mix_seed(cs, {t, static_cast<std::uint64_t>(r)}));
        for (float& v : x[static_cast<std::size_t>(r)]) v = static_cast<float>(rng.unit() * 2 - 1);
      }
      // Reference: the communicator's recipe with the CPU PowerSGD, every rank's state here; averaged.
      std::vector<float> sum(count, 0.0f);
      auto& st = cpu_states[t];
      if (cpu.compressed_step(rows, cols, st[0])) {
        sum = powersgd_step(cpu, x, rows, cols, st);
      } else {
        for (int r = 0; r < n; ++r) {
          for (std::size_t i = 0; i < count; ++i) sum[i] += x[static_cast<std::size_t>(r)][i];
          if (cpu.compresses(rows, cols)) cpu.skip(st[static_cast<std::size_t>(r)]);
        }
      }
      for (float& v : sum) v /= static_cast<float>(n);
      expect.push_back(sum);
      in.push_back(to_device(float_bytes(x[static_cast<std::size_t>(me)])));
      out.emplace_back(count * sizeof(float) + 4);
      tensors.push_back({in.back().as<float>(), out.back().as<float>(), rows, cols, &dev_states[t]});
    }
    dev.allreduce(tensors, hopwise::ReduceOp::kAvg);
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    for (std::size_t t = 0; t < shapes.size(); ++t) {
      const std::size_t count = shapes[t].first * shapes[t].second;
      std::vector<float> got(count);
      cuda_ok(cudaMemcpy(got.data(), out[t].data(), count * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
      // cuBLAS sums in another order than the CPU loops (tests/test_cuda_powersgd.cpp: the same bound).
      EXPECT_LE(relative_l2(got, expect[t]), 1e-4) << shapes[t].first << "x" << shapes[t].second;
      EXPECT_EQ(dev_states[t].step, cpu_states[t][0].step);
    }
  }
  EXPECT_THROW(dev.allreduce({}, hopwise::ReduceOp::kMax), hopwise::InvalidArgument);
}

// ---- DeviceWork::on_complete: once, after the result is in place, off the caller's thread unless complete ----
TEST(DeviceWorkCallbacks, RunOnceAfterTheResultIsInPlace) {
  hc::DeviceCommunicator& c = comm();
  const int n = c.size();
  const std::size_t count = 1 << 20;
  const std::vector<float> ones(count, 1.0f);
  DeviceBuffer d(count * sizeof(float));
  hopwise::cuda::copy_to_device(d.data(), ones.data(), count * sizeof(float));
  std::atomic<int> calls{0};
  std::promise<std::vector<float>> seen;
  auto result = seen.get_future();
  const auto caller = std::this_thread::get_id();
  hc::DeviceWork w = c.allreduce_async(d.data(), d.data(), count, DataType::kFloat32, ReduceOp::kSum);
  w.on_complete([&](std::exception_ptr e) {
    ++calls;
    std::vector<float> got(count, 0.0f);
    if (!e) hopwise::cuda::copy_to_host(got.data(), d.data(), count * sizeof(float));  // the result is in place
    seen.set_value(std::move(got));
  });
  ASSERT_EQ(result.wait_for(std::chrono::seconds(60)), std::future_status::ready) << "the callback never ran";
  const std::vector<float> got = result.get();
  EXPECT_EQ(std::count(got.begin(), got.end(), static_cast<float>(n)), static_cast<std::ptrdiff_t>(count));
  w.wait();
  EXPECT_EQ(calls.load(), 1);

  // Already complete: at once, on this thread.
  std::thread::id here;
  w.on_complete([&](std::exception_ptr e) {
    EXPECT_FALSE(e);
    here = std::this_thread::get_id();
  });
  EXPECT_EQ(here, caller);

  // A dropped handle still calls back; an empty handle and an empty callback are InvalidArgument.
  std::promise<void> dropped;
  c.barrier_async().on_complete([&](std::exception_ptr) { dropped.set_value(); });
  EXPECT_EQ(dropped.get_future().wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_THROW(hc::DeviceWork().on_complete([](std::exception_ptr) {}), hopwise::InvalidArgument);
  EXPECT_THROW(c.barrier_async().on_complete(nullptr), hopwise::InvalidArgument);
  c.barrier();  // every rank issued the same barriers above
}

TEST(DeviceWorkCallbacks, ACallbackMayIssueAndWaitForANewCall) {
  hc::DeviceCommunicator& c = comm();
  const int n = c.size();
  DeviceBuffer a(64 * sizeof(float)), b(64 * sizeof(float));
  const std::vector<float> ones(64, 1.0f);
  hopwise::cuda::copy_to_device(a.data(), ones.data(), 64 * sizeof(float));
  hopwise::cuda::copy_to_device(b.data(), ones.data(), 64 * sizeof(float));
  std::promise<std::string> inner;
  auto done = inner.get_future();
  c.allreduce_async(a.data(), a.data(), 64, DataType::kFloat32, ReduceOp::kSum).on_complete([&](std::exception_ptr e) {
    if (e) return inner.set_value("the first allreduce failed");
    try {
      c.allreduce(b.data(), b.data(), 64, DataType::kFloat32, ReduceOp::kSum);  // same communicator, waited for
      inner.set_value("");
    } catch (const std::exception& x) {
      inner.set_value(x.what());
    }
  });
  ASSERT_EQ(done.wait_for(std::chrono::seconds(120)), std::future_status::ready)
      << "a callback that waits for a new call on the same communicator deadlocked";
  EXPECT_EQ(done.get(), "");
  std::vector<float> got(64);
  hopwise::cuda::copy_to_host(got.data(), b.data(), 64 * sizeof(float));
  for (float v : got) EXPECT_EQ(v, static_cast<float>(n));
}

// ---- meeting through a Store instead of MPI, and the small host-side agreements ----
TEST(DeviceRendezvous, AStoreOfTheLaunchersAndHostAgreements) {
  hc::DeviceCommunicator& c = comm();
  const auto all = c.host_allgather("test_ranks", std::to_string(c.rank()));
  ASSERT_EQ(all.size(), static_cast<std::size_t>(c.size()));
  for (int r = 0; r < c.size(); ++r) EXPECT_EQ(all[static_cast<std::size_t>(r)], std::to_string(r));
  EXPECT_EQ(c.host_broadcast("test_root", c.rank() == 0 ? "from rank 0" : ""), "from rank 0");
  EXPECT_THROW(c.host_broadcast("test_bad_root", "", c.size()), hopwise::InvalidArgument);

  auto store = std::make_shared<hc::MpiStore>(MPI_COMM_WORLD);
  {
    hc::DeviceCommunicator s(store, c.rank(), c.size(), c.local_rank(), hc::DeviceOptions::from_env());
    EXPECT_EQ(s.rank(), c.rank());
    EXPECT_EQ(s.device(), c.device());
    allreduce_case(DeviceAlgorithm::kNative, DataType::kFloat32, ReduceOp::kSum, 4099, &s);
  }
  EXPECT_THROW(hc::DeviceCommunicator(nullptr, 0, 1, 0), hopwise::InvalidArgument);
  EXPECT_THROW(hc::DeviceCommunicator(store, c.size(), c.size(), 0), hopwise::InvalidArgument);
  MPI_Barrier(MPI_COMM_WORLD);  // no rank's store calls are left when rank 0's store goes
}

// ---- timeouts (need a peer that does not show up: more than one rank). Last: it aborts a communicator. ----
TEST(DeviceErrors, TimeoutAbortsAndNamesTheCollective) {
  if (comm().size() < 2) GTEST_SKIP() << "needs two ranks (a peer that never joins the collective)";
  hc::DeviceOptions o = hc::DeviceOptions::from_env();
  o.timeout_s = 5;
  {
    hc::DeviceCommunicator c(MPI_COMM_WORLD, o);
    if (c.rank() == 0) {
      DeviceBuffer d(4194304 * sizeof(float));
      try {
        c.allreduce(d.data(), d.data(), 4194304, DataType::kFloat32);
        ADD_FAILURE() << "an allreduce that no peer joined returned";
      } catch (const hopwise::TimeoutError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("rank 0: NCCL allreduce of 4194304 float32"), std::string::npos) << msg;
        EXPECT_NE(msg.find("did not complete within 5 s"), std::string::npos) << msg;
        EXPECT_NE(msg.find("HOPWISE_TIMEOUT_S"), std::string::npos) << msg;
      } catch (const std::exception& e) {
        ADD_FAILURE() << "expected a TimeoutError, got: " << e.what();
      }
      EXPECT_TRUE(c.aborted());
      // Later calls fail at once, saying why.
      EXPECT_NE(message_of([&] { c.barrier(); }).find("aborted"), std::string::npos);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }  // the other ranks' destructors give up on rank 0 after the timeout
}

// An abort ends NCCL's kernels, so the events of work queued before it fire: that work must not count as done.
TEST(DeviceErrors, EarlierWorkAfterAbortIsNotReportedDone) {
  if (comm().size() < 2) GTEST_SKIP() << "needs two ranks (a peer that never joins the collective)";
  hc::DeviceOptions o = hc::DeviceOptions::from_env();
  o.timeout_s = 2;
  {
    hc::DeviceCommunicator c(MPI_COMM_WORLD, o);
    if (c.rank() == 0) {
      DeviceBuffer d(1024 * sizeof(float)), e(1024 * sizeof(float));
      hc::DeviceWork w1 = c.allreduce_async(d.data(), d.data(), 1024, DataType::kFloat32);
      EXPECT_ANY_THROW(c.allreduce(e.data(), e.data(), 1024, DataType::kFloat32));
      EXPECT_NE(message_of([&] { w1.wait(); }).find("aborted"), std::string::npos)
          << "work no peer joined reported complete after the abort";
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}
}  // namespace

int main(int argc, char** argv) { return hwtest::run_nccl_tests(argc, argv); }
