// main() of a parameterized suite: picks the world (worlds.h) — HOPWISE_TEST_WORLD, else "mpi" under mpirun,
// else "inproc" — and, where ranks are processes, prints the failures of ranks other than 0 as "[rank N]" lines;
// under mpirun every rank's exit status is nonzero when any rank failed (a launcher such as torchrun fails the
// job when any rank exits nonzero).
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "rank_printer.h"
#include "worlds.h"

namespace hwtest {

inline int world_main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const char* forced = std::getenv("HOPWISE_TEST_WORLD");
  const std::string name = forced ? forced : (std::getenv("OMPI_COMM_WORLD_SIZE") ? "mpi" : "inproc");
  for (const World& w : worlds())
    if (w.name == name) current_world() = &w;
  if (current_world() == nullptr) {
    std::fprintf(stderr, "HOPWISE_TEST_WORLD=%s is not a world of tests/worlds.h\n", name.c_str());
    return 2;
  }
  const World::Ranks ranks = current_world()->ranks;
  if (ranks == World::Ranks::kThreads) return RUN_ALL_TESTS();
  int rank = 0;
  if (ranks == World::Ranks::kMpirun) {
    hc::ensure_mpi_initialized();
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  } else {
    rank = hc::detect_launch().rank;
  }
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  const int rc = RUN_ALL_TESTS();
  if (ranks == World::Ranks::kLaunched) return rc;
  int failed = rc != 0 || ::testing::UnitTest::GetInstance()->Failed() ? 1 : 0, any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && any && !failed) std::printf("[  FAILED  ] another rank failed (see [rank N] lines)\n");
  return any;
}

}  // namespace hwtest

int main(int argc, char** argv) { return hwtest::world_main(argc, argv); }
