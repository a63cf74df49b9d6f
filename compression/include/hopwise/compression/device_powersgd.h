// PowerSGD (see powersgd.h) on device memory (CUDA): the same three calls per step, the same math and the same
// errors, with the matrix products in cuBLAS (float32, no TF32) and the modified Gram-Schmidt in double in a
// kernel. Every call is asynchronous on `stream` (cudaStream_t as void*, nullptr = the legacy default stream),
// except the first compute_p of a state (allocates its buffers and uploads the initial Q, then synchronizes
// `stream`) and residual() (synchronizes `stream`).
//
//   dps.compute_p(grad, rows, cols, p, state, s);  // p: rows x r'  -> allreduce-sum p (float32, kSum)
//   dps.compute_q(p, rows, cols, q, state, s);     // p: the summed P; q: r' x cols -> allreduce-sum q
//   dps.decompress(q, rows, cols, out, state, s);  // q: the summed Q; out: rows x cols
//
// Agreement with the CPU PowerSgd: the initial Q is the CPU's, bit for bit (drawn by the CPU code itself). P, Q,
// the output and the residual agree within float rounding (cuBLAS sums in another order than the CPU loops;
// tests/test_cuda_powersgd.cpp checks relative L2 differences against a tolerance), not bit for bit. On GPUs of
// the same kind the device results are deterministic, so every rank forms the same P^ from the same summed P.
// With ef=0 the gradient is read in place by compute_p and again by compute_q: it must not change in between
// (nor may the work queued on `stream` be overtaken by a write on another stream).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "hopwise/common/device_buffer.h"
#include "hopwise/compression/powersgd.h"

namespace hopwise::compression {

// Per-tensor state, as PowerSgdState, in device memory; keep one per tensor across steps. The buffers are
// allocated at the first compute_p and reused after.
struct DevicePowerSgdState {
  DevicePowerSgdState() = default;
  explicit DevicePowerSgdState(std::uint64_t seed) : seed(seed) {}
  std::uint64_t seed = 0;         // the same on every rank for the same tensor
  std::uint64_t step = 0;         // completed steps: decompress() calls and skip()ped warm-up steps
  DeviceBuffer q;                 // warm start, r' x cols floats
  DeviceBuffer m;                 // ef=1: this step's M = grad + residual, rows x cols floats
  DeviceBuffer p_hat;             // orthonormalized P of this step, rows x r' floats
  DeviceBuffer q_local;           // ef=1: this rank's P^T M of the last step, r' x cols floats
  DeviceBuffer basis;             // rows x r' doubles: Gram-Schmidt's working copy of P^
  std::size_t q_count = 0;        // floats in q: what PowerSgdState::q.size() would be
  std::size_t q_local_count = 0;  // floats in q_local: PowerSgdState::q_local.size() (0 until the first step)
  const float* grad = nullptr;    // ef=0: M is the gradient itself (device memory), read again by compute_q
  std::size_t rows = 0, cols = 0;
  int phase = 0;  // 0: next call is compute_p, 1: compute_q, 2: decompress
};

class DevicePowerSgd {
 public:
  explicit DevicePowerSgd(const PowerSgd& config);
  // "powersgd[:rank=4,ef=1,warmup=0]", with PowerSgd::from_spec's errors.
  static DevicePowerSgd from_spec(std::string_view spec) { return DevicePowerSgd(PowerSgd::from_spec(spec)); }
  static DevicePowerSgd from_spec(const CodecSpec& spec) { return DevicePowerSgd(PowerSgd::from_spec(spec)); }

  // The CPU PowerSgd of the same configuration: name(), rank(), warmup(), compresses(), effective_rank(),
  // p_count(), q_count().
  const PowerSgd& host() const { return host_; }
  bool compressed_step(std::size_t rows, std::size_t cols, const DevicePowerSgdState& state) const {
    return host_.compresses(rows, cols) && state.step >= host_.warmup();
  }
  void skip(DevicePowerSgdState& state) const { ++state.step; }

  // Device pointers throughout; rows and cols at most 2^31 - 1 each (cuBLAS takes int dimensions).
  void compute_p(const float* grad, std::size_t rows, std::size_t cols, float* p, DevicePowerSgdState& state,
                 void* stream) const;
  void compute_q(const float* p_sum, std::size_t rows, std::size_t cols, float* q, DevicePowerSgdState& state,
                 void* stream) const;
  void decompress(const float* q_sum, std::size_t rows, std::size_t cols, float* out, DevicePowerSgdState& state,
                  void* stream) const;
  // M - P^ q_local copied to the host (for tests; allocates scratch and synchronizes `stream`). Empty with ef=0 or
  // before the first step, as PowerSgd::residual.
  std::vector<float> residual(const DevicePowerSgdState& state, void* stream) const;

 private:
  PowerSgd host_;
  bool ef_;
};

}  // namespace hopwise::compression
