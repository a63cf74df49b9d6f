// DevicePowerSgdAllreduce: the PowerSGD recipe the host runs too (compressed/powersgd_recipe.h) over a device
// backend made of the DeviceCommunicator's public calls and the DevicePowerSgd kernels on the communicator's
// stream. avg divides Q alone (allreduce_q passes the op on; P is orthonormalized after its sum, so Q carries the
// scale), so finish() has nothing left to do.
#include "hopwise/comm/device_powersgd_allreduce.h"

#include <cuda_runtime.h>
#include <fmt/core.h>

#include <vector>

#include "../call_checks.h"
#include "../compressed/powersgd_recipe.h"
#include "hopwise/common/cuda_check.h"
#include "hopwise/common/error.h"

namespace hopwise::comm {

namespace {

class DevicePowerSgdBackend {
 public:
  using M = DevicePowerSgdTensor;
  DevicePowerSgdBackend(DeviceCommunicator& comm, const compression::DevicePowerSgd& ps, DeviceBuffer& factors,
                        std::size_t& wire, void* caller)
      : comm_(comm),
        ps_(ps),
        factors_(factors),
        wire_(wire),
        caller_(static_cast<cudaStream_t>(caller)),
        cs_(static_cast<cudaStream_t>(comm.stream())) {}

  bool compressed_step(const M& m) const { return ps_.compressed_step(m.rows, m.cols, *m.state); }
  bool compresses(const M& m) const { return ps_.host().compresses(m.rows, m.cols); }
  void skip(const M& m) const { ps_.skip(*m.state); }
  std::size_t p_count(const M& m) const { return ps_.host().p_count(m.rows, m.cols); }
  std::size_t q_count(const M& m) const { return ps_.host().q_count(m.rows, m.cols); }
  // Warm-up and small matrices: one plain allreduce each (each waits for the caller's stream itself).
  void allreduce_plain(const std::vector<const M*>& plain, ReduceOp op) {
    for (const M* m : plain) comm_.allreduce(m->in, m->out, m->rows * m->cols, DataType::kFloat32, op, caller_);
  }
  float* factors(std::size_t floats) {
    factors_.reserve(floats * sizeof(float));
    stream_wait(cs_, caller_);  // the gradients are ready once the caller's queued work is done
    used_factors_ = true;
    return factors_.as<float>();
  }
  void compute_p(const M& m, float* p) { ps_.compute_p(m.in, m.rows, m.cols, p, *m.state, cs_); }
  void compute_q(const float* p, const M& m, float* q) { ps_.compute_q(p, m.rows, m.cols, q, *m.state, cs_); }
  void decompress(const float* q, const M& m) { ps_.decompress(q, m.rows, m.cols, m.out, *m.state, cs_); }
  void allreduce_p(float* p, std::size_t n) { comm_.allreduce(p, p, n, DataType::kFloat32, ReduceOp::kSum, cs_); }
  void allreduce_q(float* q, std::size_t n, ReduceOp op) { comm_.allreduce(q, q, n, DataType::kFloat32, op, cs_); }
  void add_wire_bytes(std::size_t b) { wire_ += b; }
  void finish(std::span<const M>, ReduceOp) {}

  // The caller's later work sees the outputs the communicator's stream wrote.
  void hand_back() {
    if (used_factors_) stream_wait(caller_, cs_);
  }

 private:
  // `waiter` waits (on the device) for the work queued on `producer` so far.
  void stream_wait(cudaStream_t waiter, cudaStream_t producer) {
    if (waiter == producer) return;
    const int rank = comm_.rank();
    cudaEvent_t ev;
    cuda::check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "PowerSGD allreduce: cudaEventCreate", rank);
    cuda::check(cudaEventRecord(ev, producer), "PowerSGD allreduce: cudaEventRecord", rank);
    cuda::check(cudaStreamWaitEvent(waiter, ev, 0), "PowerSGD allreduce: cudaStreamWaitEvent", rank);
    // Released once the wait has been satisfied.
    cuda::check(cudaEventDestroy(ev), "PowerSGD allreduce: cudaEventDestroy", rank);
  }

  DeviceCommunicator& comm_;
  const compression::DevicePowerSgd& ps_;
  DeviceBuffer& factors_;
  std::size_t& wire_;
  cudaStream_t caller_, cs_;
  bool used_factors_ = false;
};

}  // namespace

DevicePowerSgdAllreduce::DevicePowerSgdAllreduce(DeviceCommunicator& comm, std::string_view spec)
    : comm_(comm), ps_(compression::DevicePowerSgd::from_spec(spec)) {}

void DevicePowerSgdAllreduce::allreduce(std::span<const DevicePowerSgdTensor> tensors, ReduceOp op, void* stream) {
  checks::sum_or_avg(fmt::format("rank {}: PowerSGD allreduce", comm_.rank()), op, "PowerSGD sums");
  for (const auto& t : tensors)
    if (t.state == nullptr)
      throw InvalidArgument(
          fmt::format("rank {}: PowerSGD allreduce: a {}x{} matrix has no state; keep one "
                      "DevicePowerSgdState per tensor",
                      comm_.rank(), t.rows, t.cols));
  wire_bytes_ = 0;
  DevicePowerSgdBackend b(comm_, ps_, factors_, wire_bytes_, stream);
  compressed::powersgd_allreduce(b, tensors, op);
  b.hand_back();
}

}  // namespace hopwise::comm
