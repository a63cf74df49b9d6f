// train_mnist's checkpoint: one file per rank (PATH.rankR), since each rank's momentum is its own under the
// averaging methods: the epochs done, the averaging method's state, the parameters and the momentum.
#pragma once

#include <cstddef>
#include <string>

namespace hopwise::examples {

struct Checkpoint {
  int epochs_done = 0;
  int ranks = 0;
  std::string averaging;  // ModelAverager::save()
};

std::string checkpoint_path(const std::string& base, int rank);
void save_checkpoint(const std::string& base, int rank, const Checkpoint& c, const float* params,
                     const float* velocity, std::size_t count);
// Throws hopwise::InvalidArgument naming the file and what does not fit (another model size, a torn file).
Checkpoint load_checkpoint(const std::string& base, int rank, float* params, float* velocity, std::size_t count);

}  // namespace hopwise::examples
