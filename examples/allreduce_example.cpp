// The smallest hopwise program: average a vector across ranks, sync and async.
//   mpirun -np 4 build/bin/allreduce_example
#include <fmt/core.h>

#include <numeric>
#include <vector>

#include "hopwise/comm/communicator.h"

int main() {
  hopwise::comm::Communicator comm;  // MPI_COMM_WORLD; initializes MPI if needed
  std::vector<float> grad(1 << 20);
  std::iota(grad.begin(), grad.end(), static_cast<float>(comm.rank()));

  comm.allreduce(std::span<float>(grad), hopwise::ReduceOp::kAvg);  // in place, rank-averaged

  // Async: start the reduction, do other work, then wait.
  std::vector<float> other(1000, 1.0f);
  hopwise::comm::Work w = comm.allreduce_async(other.data(), other.data(), other.size(), hopwise::DataType::kFloat32);
  w.wait();

  if (comm.rank() == 0)
    fmt::print("{} ranks: grad[0] = {} (expected {}), other[0] = {} (expected {}), algorithm for 4 MiB: {}\n",
               comm.size(), grad[0], (comm.size() - 1) / 2.0, other[0], comm.size(),
               hopwise::comm::to_string(comm.algorithm_for(hopwise::comm::Collective::kAllreduce, 4 << 20)));
  return grad[0] == static_cast<float>(comm.size() - 1) / 2 && other[0] == static_cast<float>(comm.size()) ? 0 : 1;
}
