// train_mnist's checkpoint: one file per rank (PATH.rankR), since each rank's momentum is its own under the
// averaging methods: the epochs done, the averaging method's state, the parameters and the momentum. The ranks
// save together and resume together: a checkpoint some rank could not write is renamed into place by none, and a
// resume from files of different epochs fails on every rank, naming them.
#pragma once

#include <cstddef>
#include <string>

#include "hopwise/comm/communicator.h"

namespace hopwise::examples {

struct Checkpoint {
  int epochs_done = 0;
  int ranks = 0;
  std::string averaging;  // ModelAverager::save()
};

std::string checkpoint_path(const std::string& base, int rank);
// Every rank writes PATH.rankR.tmp and syncs it; when every rank has, each renames its own into place and syncs
// the directory. Error on every rank, naming the ranks that failed, when some rank could not write.
void save_checkpoint(comm::Communicator& comm, const std::string& base, const Checkpoint& c, const float* params,
                     const float* velocity, std::size_t count);
// Every rank reads its own file; InvalidArgument on every rank naming the file and what does not fit (another
// model size, a torn file), or naming the ranks whose files hold other epochs than rank 0's.
Checkpoint load_checkpoint(comm::Communicator& comm, const std::string& base, float* params, float* velocity,
                           std::size_t count);

}  // namespace hopwise::examples
