// CUDA tensors through the backend: hopwise's NCCL device communicator (comm/src/nccl/), made at the group's first
// CUDA call on that tensor's device, meeting through torch's store. Each call is enqueued after the caller's
// current stream (its producer), and that stream then waits for the result (cudaStreamWaitEvent), as with torch's
// NCCL backend: kernels the caller launches next see the result without the host waiting. The Work and its future
// complete on the host once the call's CUDA event has fired; the future records events for the tensors' device.
//
// The device communicator is one thread's at a time: calls here hold the side's mutex (DDP calls from autograd's
// thread, hooks from their callbacks). Built only where torch and hopwise both have CUDA (HOPWISE_TORCH_CUDA).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <fmt/core.h>

#include <cstdlib>

#include "backend.h"
#include "hopwise/comm/device_communicator.h"
#include "tensors.h"
#include "torch_store.h"
#include "translate.h"

namespace hopwise::torch_backend {

struct HopwiseBackend::DeviceSide {
  std::mutex mutex;
  c10::Device device{c10::DeviceType::CUDA, 0};
  std::unique_ptr<comm::DeviceCommunicator> comm;
};

namespace {

int local_rank_of(int rank) {
  const char* local = std::getenv("LOCAL_RANK");
  if (!local) local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  return local ? std::atoi(local) : rank;
}

void check_cuda(const at::Tensor& t, const c10::Device& device, const char* what) {
  TORCH_CHECK_VALUE(t.layout() == at::kStrided, "hopwise: ", what, ": sparse CUDA tensors are not supported");
  TORCH_CHECK_VALUE(t.device() == device, "hopwise: ", what, ": the tensor is on ", t.device().str(),
                    " but this group's CUDA calls run on ", device.str(),
                    " (one GPU per rank: torch.cuda.set_device before the first call)");
}

// The caller's stream waits for `w`; the torch work completes on the host when `w` does.
c10::intrusive_ptr<c10d::Work> finish(comm::DeviceWork w, c10::intrusive_ptr<HopwiseWork> work, void* stream,
                                      std::function<void()> after_on_stream = {}) {
  translated([&] { w.wait_on_stream(stream); });
  if (after_on_stream) after_on_stream();  // enqueued after the wait: it sees the result
  w.on_complete([work](std::exception_ptr e) { run_detached([work, e] { work->complete(e); }); });
  return work;
}

}  // namespace

HopwiseBackend::DeviceSide& HopwiseBackend::device_side(const at::Tensor& t) {
  std::lock_guard lock(works_mutex_);
  if (!device_) {
    auto side = std::make_shared<DeviceSide>();
    side->device = t.device();
    comm::DeviceOptions options = translated([] { return comm::DeviceOptions::from_env(); });
    options.device = t.device().index();
    options.timeout_s = static_cast<double>(timeout_.count()) / 1e3;
    c10::cuda::CUDAGuard guard(t.device());
    side->comm = translated([&] {
      return std::make_unique<comm::DeviceCommunicator>(std::make_shared<TorchStore>(store_), getRank(), getSize(),
                                                        local_rank_of(getRank()), options);
    });
    device_ = std::move(side);
  }
  return *device_;
}

// The side (made if need be), the tensor checked against its device, its mutex held, its device current, and the
// caller's stream.
#define HOPWISE_DEVICE_SIDE(t, what)       \
  DeviceSide& side = device_side(t);       \
  check_cuda(t, side.device, what);        \
  std::lock_guard side_lock(side.mutex);   \
  c10::cuda::CUDAGuard guard(side.device); \
  void* stream = at::cuda::getCurrentCUDAStream(side.device.index()).stream()

c10::intrusive_ptr<c10d::Work> HopwiseBackend::cuda_allreduce(const at::Tensor& t, const c10d::AllreduceOptions& opts) {
  HOPWISE_DEVICE_SIDE(t, "allreduce");
  const ReducePlan plan = plan_reduce(t.scalar_type(), opts.reduceOp, "allreduce");
  TORCH_CHECK_VALUE(plan.way == ReducePlan::Way::kNative, "hopwise: allreduce of CUDA tensors with ",
                    op_name(plan.torch_op), " is not supported; use SUM, AVG, PRODUCT, MIN or MAX");
  const Staged s = stage(t, plan.wide);  // torch's kernels, on the caller's stream
  auto work = make_work(c10d::OpType::ALLREDUCE, "hopwise:all_reduce", {t}, {side.device});
  auto w = translated(
      [&] { return side.comm->allreduce_async(s.data(), s.data(), s.count(), plan.dtype, plan.op, stream); });
  return finish(w, work, stream, [s] { s.finish(); });
}

c10::intrusive_ptr<c10d::Work> HopwiseBackend::cuda_broadcast(const at::Tensor& t, const c10d::BroadcastOptions& opts) {
  HOPWISE_DEVICE_SIDE(t, "broadcast");
  const int root = static_cast<int>(opts.rootRank);
  const Staged s = stage(t, at::ScalarType::Undefined, getRank() == root);
  auto work = make_work(c10d::OpType::BROADCAST, "hopwise:broadcast", {t}, {side.device});
  auto w = translated([&] { return side.comm->broadcast_async(s.data(), s.bytes(), DataType::kUInt8, root, stream); });
  return finish(w, work, stream, [s] { s.finish(); });
}

c10::intrusive_ptr<c10d::Work> HopwiseBackend::cuda_allgather_base(const at::Tensor& output, const at::Tensor& input) {
  HOPWISE_DEVICE_SIDE(input, "all_gather_into_tensor");
  check_cuda(output, side.device, "all_gather_into_tensor");
  TORCH_CHECK_VALUE(output.scalar_type() == input.scalar_type() && output.numel() == input.numel() * getSize(),
                    "hopwise: all_gather_into_tensor needs an output of the input's dtype and ", getSize(),
                    " times its elements");
  const Staged in = stage(input), out = stage(output, at::ScalarType::Undefined, false);
  auto work = make_work(c10d::OpType::_ALLGATHER_BASE, "hopwise:_all_gather_base", {output}, {side.device});
  auto w = translated(
      [&] { return side.comm->allgather_async(in.data(), out.data(), in.bytes(), DataType::kUInt8, stream); });
  return finish(w, work, stream, [in, out] { out.finish(); });
}

c10::intrusive_ptr<c10d::Work> HopwiseBackend::cuda_allgather(std::vector<at::Tensor>& outputs,
                                                              const at::Tensor& input) {
  HOPWISE_DEVICE_SIDE(input, "allgather");
  TORCH_CHECK_VALUE(static_cast<int>(outputs.size()) == getSize(), "hopwise: allgather needs ", getSize(),
                    " output tensors (one per rank)");
  for (int r = 0; r < getSize(); ++r) {  // all checked before the gather starts: a refusal leaves no peer waiting
    const at::Tensor& o = outputs[static_cast<std::size_t>(r)];
    TORCH_CHECK_VALUE(
        o.device() == input.device() && o.scalar_type() == input.scalar_type() && o.numel() == input.numel(),
        "hopwise: allgather: output ", r, " is ", o.device().str(), " ", c10::toString(o.scalar_type()), " of ",
        o.numel(), " elements; each must be like the input (", input.device().str(), " ",
        c10::toString(input.scalar_type()), " of ", input.numel(), ")");
  }
  const Staged in = stage(input.reshape({-1}));
  at::Tensor flat = at::empty({getSize() * input.numel()}, input.options());
  auto work = make_work(c10d::OpType::ALLGATHER, "hopwise:all_gather", outputs, {side.device});
  auto w = translated(
      [&] { return side.comm->allgather_async(in.data(), flat.data_ptr(), in.bytes(), DataType::kUInt8, stream); });
  // The copies into the outputs follow on the caller's stream, after its wait for the gather.
  return finish(w, work, stream, [in, flat, outputs, n = input.numel()] {
    for (std::size_t r = 0; r < outputs.size(); ++r) {
      at::Tensor o = outputs[r];
      o.copy_(flat.narrow(0, static_cast<int64_t>(r) * n, n).view(o.sizes()));
    }
  });
}

c10::intrusive_ptr<c10d::Work> HopwiseBackend::cuda_reduce_scatter_base(const at::Tensor& output,
                                                                        const at::Tensor& input,
                                                                        const c10d::ReduceScatterOptions& opts) {
  HOPWISE_DEVICE_SIDE(input, "reduce_scatter_tensor");
  check_cuda(output, side.device, "reduce_scatter_tensor");
  TORCH_CHECK_VALUE(output.scalar_type() == input.scalar_type() && input.numel() == output.numel() * getSize(),
                    "hopwise: reduce_scatter_tensor needs an input of the output's dtype and ", getSize(),
                    " times its elements");
  const ReducePlan plan = plan_reduce(input.scalar_type(), opts.reduceOp, "reduce_scatter_tensor");
  TORCH_CHECK_VALUE(plan.way == ReducePlan::Way::kNative, "hopwise: reduce_scatter_tensor of CUDA tensors with ",
                    op_name(plan.torch_op), " is not supported; use SUM, AVG, PRODUCT, MIN or MAX");
  const Staged in = stage(input, plan.wide), out = stage(output, plan.wide, false);
  auto work = make_work(c10d::OpType::_REDUCE_SCATTER_BASE, "hopwise:reduce_scatter", {output}, {side.device});
  auto w = translated(
      [&] { return side.comm->reduce_scatter_async(in.data(), out.data(), out.count(), plan.dtype, plan.op, stream); });
  return finish(w, work, stream, [in, out] { out.finish(); });
}

}  // namespace hopwise::torch_backend
