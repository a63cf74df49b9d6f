// main() of a parameterized suite: picks the world (worlds.h) — "mpi" under mpirun or with
// HOPWISE_TEST_WORLD=mpi, else "inproc" — and, under MPI, makes every rank's exit status nonzero when any rank
// failed, with the failures of ranks other than 0 printed as "[rank N]" lines.
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
  if (name != "mpi") return RUN_ALL_TESTS();
  hc::ensure_mpi_initialized();
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  const int rc = RUN_ALL_TESTS();
  int failed = rc != 0 || ::testing::UnitTest::GetInstance()->Failed() ? 1 : 0, any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && any && !failed) std::printf("[  FAILED  ] another rank failed (see [rank N] lines)\n");
  return any;
}

}  // namespace hwtest

int main(int argc, char** argv) { return hwtest::world_main(argc, argv); }
