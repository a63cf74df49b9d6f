// The transports the parameterized suites (test_transport_contract, test_collectives_suite) run over, one row
// each: a new transport joins by adding its row to worlds() and, if it needs a launcher, one ctest line.
//
// A suite's body is written from one rank's view: body(transport) runs on every rank. The "inproc" world runs
// it on one thread per rank; the "mpi" world runs this process's rank of the job (the binary is started under
// mpirun, and the world's size is the job's). main() (world_main.h) picks the world: "mpi" under mpirun (or
// HOPWISE_TEST_WORLD=mpi), else "inproc".
#pragma once

#include <fmt/core.h>

#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "hopwise/comm/communicator.h"
#include "hopwise/comm/store.h"
#include "hopwise/comm/transports/inproc_transport.h"
#include "hopwise/comm/transports/mpi_store.h"
#include "hopwise/comm/transports/mpi_transport.h"

namespace hwtest {

namespace hc = hopwise::comm;

using RankBody = std::function<void(std::unique_ptr<hc::Transport>)>;
using StoreBody = std::function<void(hc::Store& store, int rank, int size)>;

struct World {
  std::string name;
  // The world sizes a case runs at.
  std::function<std::vector<int>()> sizes;
  // Runs body on every rank of a world of `ranks` ranks, each with a transport of its own; rethrows the first
  // rank's exception (after every rank has finished).
  std::function<void(int ranks, const RankBody& body)> run;
  bool can_abandon = true;  // abandon() leaves the world usable for the next case
  // Runs body on every rank with the world's way to meet (one store shared by all ranks).
  std::function<void(int ranks, const StoreBody& body)> run_store;
};

inline void run_inprocess_world(int ranks, const RankBody& body) {
  auto world = hc::make_inprocess_world(ranks);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        body(std::make_unique<hc::InProcessTransport>(world, r));
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

inline void run_inprocess_store(int ranks, const StoreBody& body) {
  hc::InProcessStore store;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        body(store, r, ranks);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

inline int mpi_job_size() {
  const char* s = std::getenv("OMPI_COMM_WORLD_SIZE");
  return s ? std::atoi(s) : 1;
}

inline const std::vector<World>& worlds() {
  static const std::vector<World> all = {
      {"inproc",
       [] {
         return std::vector<int>{1, 2, 3, 4, 7};
       },
       run_inprocess_world, true, run_inprocess_store},
      {"mpi", [] { return std::vector<int>{mpi_job_size()}; },
       [](int, const RankBody& body) { body(std::make_unique<hc::MpiTransport>()); }, false,
       [](int, const StoreBody& body) {
         hc::MpiStore store;
         std::exception_ptr error;
         try {
           body(store, store.rank(), store.size());
         } catch (...) {
           error = std::current_exception();
         }
         MPI_Barrier(MPI_COMM_WORLD);  // every rank's last request answered before rank 0's server stops
         if (error) std::rethrow_exception(error);
       }},
  };
  return all;
}

// The world this process runs (set by world_main.h).
inline const World*& current_world() {
  static const World* w = nullptr;
  return w;
}

inline const World& world() { return *current_world(); }

// Options for a communicator in a suite: no calibration or discovery (cheap, and deterministic choices).
inline hc::Options suite_options(hc::Algorithm a = hc::Algorithm::kAuto, double timeout_s = 60) {
  hc::Options o;
  o.algorithm = a;
  o.timeout_s = timeout_s;
  o.calibrate = false;
  o.discover_topology = false;
  return o;
}

// Runs body(communicator) on every rank of every size of the current world.
inline void for_each_world_size(const std::function<void(hc::Communicator&)>& body,
                                hc::Algorithm a = hc::Algorithm::kAuto) {
  for (int n : world().sizes())
    world().run(n, [&](std::unique_ptr<hc::Transport> t) {
      hc::Communicator c(std::move(t), suite_options(a));
      body(c);
    });
}

}  // namespace hwtest
