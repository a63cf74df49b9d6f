// The main of the MPI programs that test the NCCL path (test_nccl_communicator, test_device_reducer): every rank
// skips (exit 77, ctest's SKIP_RETURN_CODE) when any rank has no GPU, so that nobody waits in a collective; the
// tests share one DeviceCommunicator (g_comm) and a seed rank 0 picks (g_seed); ranks other than 0 print only their
// failures, prefixed with the rank. Also the small CUDA helpers both tests use.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>

#include "collective_reference.h"
#include "hopwise/comm/device_communicator.h"
#include "hopwise/common/cuda_reduce.h"
#include "rank_printer.h"

namespace hwtest {

inline hopwise::comm::DeviceCommunicator* g_comm = nullptr;
inline std::uint64_t g_seed = 0;

inline hopwise::comm::DeviceCommunicator& comm() { return *g_comm; }

inline void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(e));
}

// A non-blocking stream standing for the caller's compute stream.
struct Stream {
  cudaStream_t s = nullptr;
  Stream() { cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"); }
  ~Stream() { cudaStreamDestroy(s); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  void sync() const { cuda_ok(cudaStreamSynchronize(s), "cudaStreamSynchronize"); }
};

inline int run_nccl_tests(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::string why;
  const int have = hopwise::cuda::device_count(&why) > 0 ? 1 : 0;
  int all_have = 0;
  MPI_Allreduce(&have, &all_have, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all_have) {
    if (rank == 0) std::printf("[  SKIPPED ] needs a CUDA GPU: %s\n", have ? "another rank has none" : why.c_str());
    std::fflush(stdout);
    MPI_Finalize();
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  int any_failed = 0;
  {
    hopwise::comm::DeviceOptions opts = hopwise::comm::DeviceOptions::from_env();
    opts.timeout_s = std::min(opts.timeout_s, 120.0);  // a stuck collective fails the test instead of hanging ctest
    auto c = std::make_unique<hopwise::comm::DeviceCommunicator>(MPI_COMM_WORLD, opts);
    g_comm = c.get();
    std::uint64_t seed = rank == 0 ? base_seed() : 0;
    MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    g_seed = seed;
    if (rank == 0)
      std::printf("[ INFO     ] %d ranks, device %d, %s\n", c->size(), c->device(), seed_note(seed).c_str());
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    if (rank != 0) {
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new RankFailurePrinter(rank));
    }
    const int rc = RUN_ALL_TESTS();
    int failed = rc != 0 || ::testing::UnitTest::GetInstance()->Failed() ? 1 : 0;
    MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0 && any_failed && !failed) std::printf("[  FAILED  ] another rank failed (see [rank N] lines)\n");
    g_comm = nullptr;
  }  // the communicator goes before MPI_Finalize
  MPI_Finalize();
  return any_failed;
}

}  // namespace hwtest
