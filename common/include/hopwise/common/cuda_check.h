// The CUDA runtime helpers every device source shares (common/cuda, compression/cuda, comm's device communicator
// and reducer), one copy each: the error check of runtime calls, the check that a buffer is device memory, and the
// guard that makes a device current for a scope. For sources built with CUDA (it includes the runtime header).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <string_view>

namespace hopwise::cuda {

// "cudaErrorInvalidValue (invalid argument)".
std::string error_text(cudaError_t e);

[[noreturn]] void throw_error(cudaError_t e, std::string_view what, int rank);

// Throws TransportError naming the call, and the rank where rank >= 0; clears a non-sticky error so that later
// calls do not report it again.
inline void check(cudaError_t e, std::string_view what, int rank = -1) {
  if (e != cudaSuccess) throw_error(e, what, rank);
}

// InvalidArgument unless `p`, holding `count` elements, is device memory (of `device` where device >= 0) or
// managed memory; count 0 accepts anything. `where` opens the message ("rank 0: allreduce"), `arg` names the
// buffer ("input buffer"), `host_api` is what to use instead for host memory.
void check_device_pointer(const void* p, std::size_t count, std::string_view where, std::string_view arg,
                          int device = -1, std::string_view host_api = "the host API");

// Makes `device` current for the scope (the caller's thread may have moved to another GPU).
class CurrentGuard {
 public:
  explicit CurrentGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      cudaGetLastError();
      previous_ = -1;
    }
    if (previous_ != device)
      cudaSetDevice(device);  // an error here surfaces on the next CUDA call, with its name
    else
      previous_ = -1;  // nothing to restore
  }
  ~CurrentGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  CurrentGuard(const CurrentGuard&) = delete;
  CurrentGuard& operator=(const CurrentGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace hopwise::cuda
