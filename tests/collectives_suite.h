// What the collective suites share (test_collectives_suite.cpp: every algorithm and collective at the world's
// sizes; test_collectives_sizes.cpp: the same per rank count, up to 64 ranks in a threads world): the rank's
// communicator for a body written from one rank's view, the seed every rank agreed on, and the allreduce case
// checked against the reference every rank computes. Each test file includes it once (an anonymous namespace:
// each binary's file has its own).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "collective_reference.h"
#include "hopwise/comm/communicator.h"
#include "worlds.h"

// GoogleTest prints parameters (and ctest shows them) through PrintTo, found by ADL.
namespace hopwise::comm {
inline void PrintTo(Algorithm a, std::ostream* os) { *os << to_string(a); }
}  // namespace hopwise::comm

namespace {

using namespace hwtest;
namespace hc = hopwise::comm;
using hc::Algorithm;
using hc::Collective;
using Clock = std::chrono::steady_clock;

// The rank's communicator and the seed every rank agreed on, for the body running on this thread.
thread_local hc::Communicator* t_comm = nullptr;
thread_local std::uint64_t g_seed = 0;

inline hc::Communicator& comm() { return *t_comm; }

// Runs body on every rank of every size of the world, with comm() and g_seed set; the communicators are made with
// `options` (suite_options() by default).
inline void each(const std::function<void()>& body, const std::vector<int>& sizes = world().sizes(),
                 const hc::Options& options = suite_options()) {
  for (int n : sizes) {
    world().run(n, [&](std::unique_ptr<hc::Transport> t) {
      hc::Communicator c(std::move(t), options);
      t_comm = &c;
      std::int64_t seed = c.rank() == 0 ? static_cast<std::int64_t>(base_seed()) : 0;
      c.broadcast(&seed, 1, DataType::kInt64, 0);
      g_seed = static_cast<std::uint64_t>(seed);
      SCOPED_TRACE(fmt::format("{} world, {} ranks", world().name, n));
      body();
      t_comm = nullptr;
    });
  }
}

// The heavy cases run at one in-process size (threads on a shared machine) and at the job's size under MPI.
inline std::vector<int> heavy_sizes() {
  return world().ranks == World::Ranks::kThreads ? std::vector<int>{3} : world().sizes();
}

inline bool world_has_native() { return world().name == "mpi"; }

inline std::string algo_name(Algorithm a) { return std::string(hc::to_string(a)); }

// Every algorithm of the table that implements allreduce (built-ins: ring, hd, tree, native, one_shot, two_shot,
// hier).
inline std::vector<Algorithm> allreduce_algorithms() {
  std::vector<Algorithm> v;
  for (Algorithm a : hc::all_algorithms())
    if (hc::implements(a, Collective::kAllreduce)) v.push_back(a);
  return v;
}

inline std::vector<const void*> ptrs(const std::vector<Bytes>& v) {
  std::vector<const void*> p;
  for (const auto& b : v) p.push_back(b.data());
  return p;
}

// Every rank's input for one case (the reference needs all of them).
inline std::vector<Bytes> all_inputs(DataType dt, ReduceOp op, std::size_t count, std::uint64_t cs) {
  std::vector<Bytes> v;
  for (int r = 0; r < comm().size(); ++r) v.push_back(make_input(dt, op, count, r, comm().size(), cs));
  return v;
}

inline void allreduce_case(Algorithm algo, DataType dt, ReduceOp op, std::size_t count, bool in_place) {
  hc::Communicator& c = comm();
  const int n = c.size(), me = c.rank();
  const std::uint64_t cs = mix_seed(g_seed, {10, static_cast<std::uint64_t>(dt), static_cast<std::uint64_t>(op), count,
                                             static_cast<std::uint64_t>(algo)});
  SCOPED_TRACE(fmt::format("allreduce(count={}, {}, {}) over {} ranks, algorithm {}", count, hopwise::to_string(dt),
                           hopwise::to_string(op), n, algo_name(algo)));
  const std::vector<Bytes> in = all_inputs(dt, op, count, cs);
  const Expected e = reference(dt, op, ptrs(in), 0, count);
  const std::size_t bytes = count * hopwise::dtype_size(dt);
  Bytes mine = in[static_cast<std::size_t>(me)];
  Bytes out = make_garbage(bytes, cs + 1), io = mine;
  c.allreduce(mine.data(), out.data(), count, dt, op);
  if (in_place) c.allreduce(io.data(), io.data(), count, dt, op);
  EXPECT_EQ(compare(e, out.data(), 0, count), "") << "out of place";
  EXPECT_EQ(compare_bytes(mine.data(), in[static_cast<std::size_t>(me)].data(), bytes), "") << "input modified";
  if (in_place) {
    EXPECT_EQ(compare(e, io.data(), 0, count), "") << "in place";
  }
}

// Every rank sends to the next and receives from the previous: every dtype, counts 0 to 100003; then three sends
// on one tag arrive in order and one on another tag is matched by its tag.
inline void send_recv_ring() {
  SCOPED_TRACE(seed_note(g_seed));
  const int n = comm().size(), me = comm().rank(), next = (me + 1) % n, prev = (me + n - 1) % n;
  for (DataType dt : hopwise::kAllDataTypes)
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{100003}}) {
      SCOPED_TRACE(fmt::format("send/recv(count={}, {}) over {} ranks", count, hopwise::to_string(dt), n));
      const std::size_t bytes = count * hopwise::dtype_size(dt);
      auto data_of = [&](int r) {
        return make_garbage(
            bytes, mix_seed(g_seed, {15, static_cast<std::uint64_t>(dt), count, static_cast<std::uint64_t>(r)}));
      };
      const Bytes src = data_of(me), want = data_of(prev);
      Bytes dst = make_garbage(bytes, g_seed);
      const int tag = static_cast<int>(count % 5000) + 3;
      hc::Work s = comm().send_async(src.data(), count, dt, next, tag);
      comm().recv(dst.data(), count, dt, prev, tag);
      s.wait();
      EXPECT_EQ(compare_bytes(dst.data(), want.data(), bytes), "");
    }
  // Same tag: in order. Different tags: matched by tag.
  std::vector<int> got(4, -1);
  std::vector<hc::Work> sends;
  int vals[4] = {me * 10, me * 10 + 1, me * 10 + 2, me * 10 + 3};
  for (int i = 0; i < 3; ++i) sends.push_back(comm().send_async(&vals[i], 1, DataType::kInt32, next, 7));
  sends.push_back(comm().send_async(&vals[3], 1, DataType::kInt32, next, 8));
  comm().recv(&got[3], 1, DataType::kInt32, prev, 8);
  for (int i = 0; i < 3; ++i) comm().recv(&got[static_cast<std::size_t>(i)], 1, DataType::kInt32, prev, 7);
  for (auto& w : sends) w.wait();
  EXPECT_EQ(got, (std::vector<int>{prev * 10, prev * 10 + 1, prev * 10 + 2, prev * 10 + 3}));
}

}  // namespace
