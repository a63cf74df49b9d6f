// Every averaging method under mpirun (the job's own transport: MPI, or UCX with HOPWISE_TRANSPORT=ucx), each rank
// checked against the serial simulation it computes itself; ranks compare their final bits with rank 0's.
//   mpirun -np 4 averaging_mpi
#include <fmt/core.h>

#include <cstdio>

#include "averaging_problem.h"
#include "hopwise/comm/communicator.h"

using namespace hwtest::averaging;

int main() {
  try {
    hc::Communicator comm;
    const int n = comm.size(), r = comm.rank();
    std::vector<int> one_host(static_cast<std::size_t>(n), 0);  // hier here: every rank on this machine
    int failed = 0;
    for (const std::string& spec : kSpecs) {
      const std::vector<float> got = train_rank(r, comm, {spec});
      const Models want = simulate({spec}, n, one_host, comm.ring_order());
      std::string why = compare(got, want[static_cast<std::size_t>(r)], 2e-4);
      std::vector<float> first(got);
      comm.broadcast(first.data(), first.size(), hopwise::DataType::kFloat32, 0);
      if (std::memcmp(first.data(), got.data(), got.size() * sizeof(float)) != 0) why += " (other bits than rank 0)";
      int bad = why.empty() ? 0 : 1;
      comm.allreduce(&bad, &bad, 1, hopwise::DataType::kInt32, hopwise::ReduceOp::kMax);
      if (!why.empty()) std::fprintf(stderr, "averaging_mpi: rank %d: %s differs: %s\n", r, spec.c_str(), why.c_str());
      failed += bad;
    }
    if (r == 0)
      std::printf("averaging_mpi: %zu of %zu methods match the serial simulation on %d ranks over %s\n",
                  kSpecs.size() - static_cast<std::size_t>(failed), kSpecs.size(), n, comm.transport().name().c_str());
    return failed ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "averaging_mpi: %s\n", e.what());
    return 1;
  }
}
