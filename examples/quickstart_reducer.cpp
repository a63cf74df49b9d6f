#include <cstdio>
#include <span>
#include <vector>

#include "hopwise/comm/communicator.h"
#include "hopwise/training/reducer.h"

int main() {
  hopwise::comm::Communicator comm;  // the job as launched: mpirun, torchrun or srun
  std::vector<float> w_grad(1024 * 784), b_grad(1024);

  hopwise::comm::GradientReducer reducer(comm);  // buckets up to HOPWISE_BUCKET_MB, codec HOPWISE_COMPRESSION
  const int w = reducer.add_parameter("fc1.weight", w_grad.data(), 1024, 784);  // forward order
  const int b = reducer.add_parameter("fc1.bias", b_grad.data(), b_grad.size());
  reducer.finalize();  // collective: every rank has the same layout

  for (int step = 0; step < 3; ++step) {
    // ... backward writes b_grad, then w_grad: hand each over the moment it is done ...
    reducer.mark_ready(b);  // a full bucket is all-reduced while backward goes on
    reducer.mark_ready(w);
    reducer.finish();  // waits: the averages are in place (returns bytes and times)
    // ... optimizer step ...
  }
  comm.allreduce(std::span<float>(b_grad), hopwise::ReduceOp::kAvg);  // any collective, sync or _async
  if (comm.rank() == 0) std::printf("3 steps reduced over %d ranks\n", comm.size());
}
