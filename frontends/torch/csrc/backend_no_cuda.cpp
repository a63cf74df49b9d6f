// A build without CUDA (torch without it, or hopwise built with HOPWISE_WITH_CUDA=OFF): CUDA tensors refused by name.
#include <c10/util/Exception.h>

#include "backend.h"

namespace hopwise::torch_backend {

namespace {

[[noreturn]] void refuse(const at::Tensor& t, const char* what) {
  TORCH_CHECK_VALUE(false, "hopwise: ", what, ": the tensor is on ", t.device().str(),
                    ", and this hopwise.torch was built without CUDA (torch or the CUDA toolkit lacked it at build "
                    "time); rebuild where both have it, or use backend \"nccl\" for CUDA tensors");
}

}  // namespace

c10::intrusive_ptr<c10d::Work> HopwiseBackend::cuda_allreduce(const at::Tensor& t, const c10d::AllreduceOptions&) {
  refuse(t, "allreduce");
}
c10::intrusive_ptr<c10d::Work> HopwiseBackend::cuda_broadcast(const at::Tensor& t, const c10d::BroadcastOptions&) {
  refuse(t, "broadcast");
}
c10::intrusive_ptr<c10d::Work> HopwiseBackend::cuda_allgather(std::vector<at::Tensor>&, const at::Tensor& input) {
  refuse(input, "allgather");
}
c10::intrusive_ptr<c10d::Work> HopwiseBackend::cuda_allgather_base(const at::Tensor&, const at::Tensor& input) {
  refuse(input, "all_gather_into_tensor");
}
c10::intrusive_ptr<c10d::Work> HopwiseBackend::cuda_reduce_scatter_base(const at::Tensor&, const at::Tensor& input,
                                                                        const c10d::ReduceScatterOptions&) {
  refuse(input, "reduce_scatter_tensor");
}

}  // namespace hopwise::torch_backend
