// NcclPowerSgd: the host's two-allreduce PowerSGD recipe (communicator.cpp, powersgd_task) on device memory.
#include "hopwise/comm/nccl_powersgd.h"

#include <cuda_runtime.h>
#include <fmt/core.h>

#include <algorithm>
#include <string>
#include <vector>

#include "hopwise/common/error.h"

namespace hopwise::comm {

namespace {

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw TransportError(fmt::format("PowerSGD allreduce: {} failed: {}", what, cudaGetErrorString(e)));
}

// `waiter` waits (on the device) for the work queued on `producer` so far.
void stream_wait(cudaStream_t waiter, cudaStream_t producer) {
  if (waiter == producer) return;
  cudaEvent_t ev;
  cuda_check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
  cuda_check(cudaEventRecord(ev, producer), "cudaEventRecord");
  cuda_check(cudaStreamWaitEvent(waiter, ev, 0), "cudaStreamWaitEvent");
  cuda_check(cudaEventDestroy(ev), "cudaEventDestroy");  // released once the wait has been satisfied
}

}  // namespace

NcclPowerSgd::NcclPowerSgd(NcclCommunicator& comm, std::string_view spec)
    : comm_(comm), ps_(compression::cuda::DevicePowerSgd::from_spec(spec)) {}

void NcclPowerSgd::allreduce(std::span<const DevicePowerSgdTensor> tensors, ReduceOp op, void* stream) {
  if (op != ReduceOp::kSum && op != ReduceOp::kAvg)
    throw InvalidArgument(fmt::format("rank {}: PowerSGD allreduce: op {} is not available; PowerSGD sums (use sum "
                                      "or avg)",
                                      comm_.rank(), to_string(op)));
  const auto& host = ps_.host();
  std::size_t p_total = 0, q_total = 0;
  std::vector<const DevicePowerSgdTensor*> compressed, plain;
  for (const auto& t : tensors) {
    if (t.state == nullptr)
      throw InvalidArgument(fmt::format("rank {}: PowerSGD allreduce: a {}x{} matrix has no state; keep one "
                                        "DevicePowerSgdState per tensor",
                                        comm_.rank(), t.rows, t.cols));
    if (ps_.compressed_step(t.rows, t.cols, *t.state)) {
      compressed.push_back(&t);
      p_total += host.p_count(t.rows, t.cols);
      q_total += host.q_count(t.rows, t.cols);
    } else {
      plain.push_back(&t);
    }
  }
  const auto cs = static_cast<cudaStream_t>(comm_.stream());
  const auto caller = static_cast<cudaStream_t>(stream);
  wire_bytes_ = 0;

  // Warm-up and small matrices: plain allreduces (each waits for the caller's stream itself).
  for (const auto* t : plain) {
    comm_.allreduce(t->in, t->out, t->rows * t->cols, DataType::kFloat32, op, stream);
    if (host.compresses(t->rows, t->cols)) ps_.skip(*t->state);  // a warm-up step counts
    wire_bytes_ += t->rows * t->cols * sizeof(float);
  }
  if (!compressed.empty()) {
    factors_.reserve((p_total + q_total) * sizeof(float));
    float* p = factors_.as<float>();
    float* q = p + p_total;
    stream_wait(cs, caller);  // the gradients are ready once the caller's queued work is done
    std::size_t off = 0;
    for (const auto* t : compressed) {
      ps_.compute_p(t->in, t->rows, t->cols, p + off, *t->state, cs);
      off += host.p_count(t->rows, t->cols);
    }
    // P is orthonormalized after the sum, so only Q carries the scale: avg divides Q alone.
    comm_.allreduce(p, p, p_total, DataType::kFloat32, ReduceOp::kSum, cs);
    std::size_t poff = 0;
    off = 0;
    for (const auto* t : compressed) {
      ps_.compute_q(p + poff, t->rows, t->cols, q + off, *t->state, cs);
      poff += host.p_count(t->rows, t->cols);
      off += host.q_count(t->rows, t->cols);
    }
    comm_.allreduce(q, q, q_total, DataType::kFloat32, op, cs);
    off = 0;
    for (const auto* t : compressed) {
      ps_.decompress(q + off, t->rows, t->cols, t->out, *t->state, cs);
      off += host.q_count(t->rows, t->cols);
    }
    stream_wait(caller, cs);  // the caller's later work sees the outputs
    wire_bytes_ += (p_total + q_total) * sizeof(float);
  }
}

}  // namespace hopwise::comm
