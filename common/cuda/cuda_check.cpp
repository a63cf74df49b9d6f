// The out-of-line half of cuda_check.h: the messages (fmt, which nvcc need not compile).
#include "hopwise/common/cuda_check.h"

#include <fmt/core.h>

#include "hopwise/common/error.h"

namespace hopwise::cuda {

std::string error_text(cudaError_t e) { return fmt::format("{} ({})", cudaGetErrorName(e), cudaGetErrorString(e)); }

void throw_error(cudaError_t e, std::string_view what, int rank) {
  cudaGetLastError();
  const std::string who = rank >= 0 ? fmt::format("rank {}: ", rank) : std::string();
  throw TransportError(
      fmt::format("{}{} failed: {}; check the GPU (nvidia-smi, CUDA_VISIBLE_DEVICES) and that "
                  "every buffer is live device memory of the right size",
                  who, what, error_text(e)));
}

void check_device_pointer(const void* p, std::size_t count, std::string_view where, std::string_view arg, int device,
                          std::string_view host_api) {
  if (count == 0) return;
  if (p == nullptr)
    throw InvalidArgument(
        fmt::format("{}: {} is null but count is {}; pass device memory of {} elements", where, arg, count, count));
  cudaPointerAttributes a{};
  const cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw InvalidArgument(
        fmt::format("{}: {} ({}) is not memory CUDA knows: {}; pass device memory (cudaMalloc) of "
                    "{} elements",
                    where, arg, p, error_text(e), count));
  }
  if (a.type == cudaMemoryTypeManaged) return;
  if (a.type != cudaMemoryTypeDevice)
    throw InvalidArgument(
        fmt::format("{}: {} ({}) is host memory; this call takes device memory only: copy the data "
                    "to the GPU (cudaMalloc + cudaMemcpy) or use {} for host buffers",
                    where, arg, p, host_api));
  if (device >= 0 && a.device != device)
    throw InvalidArgument(
        fmt::format("{}: {} ({}) lives on CUDA device {} but this call uses device {}; allocate it "
                    "on device {}",
                    where, arg, p, a.device, device, device));
}

}  // namespace hopwise::cuda
