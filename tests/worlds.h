// The transports the parameterized suites (test_transport_contract, test_collectives_suite) run over, one row
// each: a new transport joins by adding its row to worlds() and, if it needs a launcher, one ctest line.
//
// A suite's body is written from one rank's view: body(transport) runs on every rank. The "inproc" and
// "ucx-threads" worlds run it on one thread per rank (InProcessTransport; UcxTransport meeting through one
// InProcessStore); the "mpi" and "ucx" worlds run this process's rank of an mpirun job (MpiTransport; UcxTransport
// meeting through an MpiStore); the "launch" world runs this process's rank of a job started any way (torchrun),
// with the transport the launch chooses (launch.h), no MPI. main() (world_main.h) picks the world:
// HOPWISE_TEST_WORLD, else "mpi" under mpirun, else "inproc".
#pragma once

#include <fmt/core.h>

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "hopwise/comm/communicator.h"
#include "hopwise/comm/launch.h"
#include "hopwise/comm/store.h"
#include "hopwise/comm/stores/file_store.h"
#include "hopwise/comm/stores/tcp_store.h"
#include "hopwise/comm/transports/inproc_transport.h"
#include "hopwise/comm/transports/mpi_store.h"
#include "hopwise/comm/transports/mpi_transport.h"
#include "hopwise/comm/transports/ucx_transport.h"

namespace hwtest {

namespace hc = hopwise::comm;

using RankBody = std::function<void(std::unique_ptr<hc::Transport>)>;
using StoreBody = std::function<void(hc::Store& store, int rank, int size)>;

struct World {
  std::string name;
  enum class Ranks { kThreads, kMpirun, kLaunched } ranks = Ranks::kThreads;  // what a rank is
  // The world sizes a case runs at.
  std::function<std::vector<int>()> sizes;
  // Runs body on every rank of a world of `ranks` ranks, each with a transport of its own; rethrows the first
  // rank's exception (after every rank has finished).
  std::function<void(int ranks, const RankBody& body)> run;
  bool can_abandon = true;  // abandon() leaves the world usable for the next case
  // The ways this world's ranks can meet: each runs body on every rank with that kind of store.
  std::vector<std::pair<std::string, std::function<void(int ranks, const StoreBody& body)>>> stores;
};

// Runs fn(rank) on one thread per rank; rethrows the first rank's exception once every rank has finished.
inline void on_threads(int ranks, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

inline void run_inprocess_world(int ranks, const RankBody& body) {
  auto world = hc::make_inprocess_world(ranks);
  on_threads(ranks, [&](int r) { body(std::make_unique<hc::InProcessTransport>(world, r)); });
}

inline std::string unique_test_name(const char* what) {
  static std::atomic<int> n{0};
  return fmt::format("hopwise-test-{}-{}-{}", what, ::getpid(), n++);
}

// The in-process ways to meet: one InProcessStore shared by the threads; a FileStore per thread on one directory
// (rank 0 claims it); a TcpStore per thread, rank 0 serving on a port the kernel picks.
inline void inprocess_shared_store(int ranks, const StoreBody& body) {
  hc::InProcessStore store;
  on_threads(ranks, [&](int r) { body(store, r, ranks); });
}

inline void inprocess_file_stores(int ranks, const StoreBody& body) {
  const std::string dir = (std::filesystem::temp_directory_path() / unique_test_name("store")).string();
  const std::string job = unique_test_name("job");
  hc::FileStore claimed(dir, true, job);
  on_threads(ranks, [&](int r) {
    hc::FileStore mine(dir, false, job, std::chrono::seconds(30));
    body(mine, r, ranks);
  });
  std::filesystem::remove_all(dir);
}

inline void inprocess_tcp_stores(int ranks, const StoreBody& body) {
  const std::string job = unique_test_name("job");
  hc::TcpStore server("127.0.0.1", 0, true, job);  // rank 0's server, and its client
  const int port = server.port();
  on_threads(ranks, [&](int r) {
    if (r == 0) return body(server, 0, ranks);
    hc::TcpStore mine("127.0.0.1", port, false, job, std::chrono::seconds(30));
    body(mine, r, ranks);
  });
}

// Under MPI: the ranks agree on the directory or port through MPI, then meet through the store alone.
inline void mpi_world_stores(const std::string& kind, const StoreBody& body) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::exception_ptr error;
  std::unique_ptr<hc::Store> store;
  std::string dir;
  try {
    if (kind == "mpi") {
      store = std::make_unique<hc::MpiStore>();
    } else if (kind == "file") {
      char name[256] = {};
      if (rank == 0)
        std::snprintf(name, sizeof name, "%s",
                      (std::filesystem::temp_directory_path() / unique_test_name("mpistore")).c_str());
      MPI_Bcast(name, sizeof name, MPI_CHAR, 0, MPI_COMM_WORLD);
      dir = name;
      store = std::make_unique<hc::FileStore>(dir, rank == 0, std::string("job-") + name, std::chrono::seconds(30));
    } else {
      int port = 0;
      std::unique_ptr<hc::TcpStore> server;
      if (rank == 0) {
        server = std::make_unique<hc::TcpStore>("127.0.0.1", 0, true, "mpi-tcp-job");
        port = server->port();
      }
      MPI_Bcast(&port, 1, MPI_INT, 0, MPI_COMM_WORLD);
      if (server)
        store = std::move(server);
      else
        store = std::make_unique<hc::TcpStore>("127.0.0.1", port, false, "mpi-tcp-job", std::chrono::seconds(30));
    }
    body(*store, rank, size);
  } catch (...) {
    error = std::current_exception();
  }
  MPI_Barrier(MPI_COMM_WORLD);  // every rank's last request answered before rank 0's server stops
  store.reset();
  if (rank == 0 && !dir.empty()) std::filesystem::remove_all(dir);
  if (error) std::rethrow_exception(error);
}

// UCX ranks as threads: one UcxTransport per thread, meeting through one InProcessStore.
inline void run_ucx_threads(int ranks, const RankBody& body) {
  auto store = std::make_shared<hc::InProcessStore>();
  on_threads(ranks, [&](int r) {
    body(std::make_unique<hc::UcxTransport>(store, r, ranks, "ucx-threads", std::chrono::seconds(60)));
  });
}

// UCX ranks as the processes of an mpirun job, meeting through an MpiStore made for the case; the barrier lets
// every rank finish with the store before rank 0's goes.
inline void run_ucx_mpirun(const RankBody& body) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::exception_ptr error;
  {
    auto store = std::make_shared<hc::MpiStore>();
    try {
      body(std::make_unique<hc::UcxTransport>(store, rank, size, "ucx-mpirun", std::chrono::seconds(60)));
    } catch (...) {
      error = std::current_exception();
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  if (error) std::rethrow_exception(error);
}

// The launch's store (torchrun: the TCP store at MASTER_ADDR:MASTER_PORT), for the store contract.
inline void launched_store(const StoreBody& body) {
  const hc::Launch l = hc::detect_launch();
  auto store = hc::launch_store(l, std::chrono::seconds(60));
  static int calls = 0;
  const std::string done = fmt::format("contract-done/{}", calls++);
  std::exception_ptr error;
  try {
    body(*store, l.rank, l.size);
  } catch (...) {
    error = std::current_exception();
  }
  // Rank 0 serves the store: it stays in this case until every rank is done with it.
  store->add(done, 1);
  while (l.rank == 0 && store->add(done, 0) < l.size) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (error) std::rethrow_exception(error);
}

inline int mpi_job_size() {
  const char* s = std::getenv("OMPI_COMM_WORLD_SIZE");
  return s ? std::atoi(s) : 1;
}

inline const std::vector<World>& worlds() {
  static const std::vector<World> all = {
      {"inproc",
       World::Ranks::kThreads,
       [] {
         return std::vector<int>{1, 2, 3, 4, 7};
       },
       run_inprocess_world,
       true,
       {{"inproc", inprocess_shared_store}, {"file", inprocess_file_stores}, {"tcp", inprocess_tcp_stores}}},
      {"ucx-threads",
       World::Ranks::kThreads,
       [] {
         return std::vector<int>{1, 2, 3, 4};
       },
       run_ucx_threads,
       true,
       {{"inproc", inprocess_shared_store}}},
      {"ucx",
       World::Ranks::kMpirun,
       [] { return std::vector<int>{mpi_job_size()}; },
       [](int, const RankBody& body) { run_ucx_mpirun(body); },
       false,  // abandon() tells the MPI store a peer is lost: no MPI_Finalize at exit, which mpirun reports
       {{"mpi", [](int, const StoreBody& b) { mpi_world_stores("mpi", b); }}}},
      {"launch",
       World::Ranks::kLaunched,
       [] { return std::vector<int>{hc::detect_launch().size}; },
       [](int, const RankBody& body) {
         const hc::Launch l = hc::detect_launch();
         body(hc::make_world_transport(l, std::chrono::seconds(60)));
       },
       true,
       {{"launch", [](int, const StoreBody& b) { launched_store(b); }}}},
      {"mpi",
       World::Ranks::kMpirun,
       [] { return std::vector<int>{mpi_job_size()}; },
       [](int, const RankBody& body) { body(std::make_unique<hc::MpiTransport>()); },
       false,
       {{"mpi", [](int, const StoreBody& b) { mpi_world_stores("mpi", b); }},
        {"file", [](int, const StoreBody& b) { mpi_world_stores("file", b); }},
        {"tcp", [](int, const StoreBody& b) { mpi_world_stores("tcp", b); }}}},
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
  o.tune = false;
  return o;
}

}  // namespace hwtest
