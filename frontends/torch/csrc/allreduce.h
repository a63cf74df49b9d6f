// hopwise.torch.allreduce's C++ side: a compressed allreduce of one plain float32 tensor (a DiLoCo pseudo-gradient,
// any buffer of the user's own loop) through any hopwise codec, with the codec's per-tensor state (error-feedback
// residual, step, seed) kept here between calls: hopwise.torch.CodecState holds one. The call starts through the
// backend's sequencer, as the comm hooks' do, so it is ordered with the group's other collectives.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "backend.h"
#include "hopwise/compression/codec.h"

namespace hopwise::torch_backend {

class TensorCodecState : public std::enable_shared_from_this<TensorCodecState> {
 public:
  // spec: a codec's, or network:CODEC (comm::split_compression_scope); rank and size: the group's, which every
  // call checks. seed: the same on every rank (randomk's indices, stochastic rounding's streams).
  TensorCodecState(const std::string& spec, int rank, int size, std::uint64_t seed);
  std::string spec() const { return prefix() + codec_->name(); }
  int rank() const { return rank_; }
  int size() const { return size_; }

  // `tensor` (float32, CPU, contiguous) summed or averaged over the group in place, in one compressed call. The
  // first call binds the state to the tensor's element count; a call with another count is refused. op: "sum" or
  // "avg".
  c10::intrusive_ptr<c10d::Work> allreduce(HopwiseBackend& pg, const at::Tensor& tensor, const std::string& op);

  // The state as it stands between calls; each refuses while a call on this state is in flight.
  std::optional<std::vector<float>> residual() const;  // none until an ef=1 codec's first call
  std::uint64_t step() const;
  std::uint64_t seed() const;
  int64_t numel() const;  // -1 until the first call
  void set(std::uint64_t step, std::uint64_t seed, int64_t numel, std::optional<std::vector<float>> residual);
  void reset();  // residual, step and element count forgotten; the codec and seed kept
  bool busy() const;

  // The canonical spec of `spec` (parameters sorted, defaults filled in): what a state compares.
  static std::string canonical(const std::string& spec);

 private:
  void check_idle(const char* what) const;  // holds mutex_
  std::string prefix() const { return scope_ == comm::CompressionScope::kNetwork ? "network:" : ""; }
  comm::CompressionScope scope_;
  std::unique_ptr<compression::Codec> codec_;
  int rank_, size_;
  mutable std::mutex mutex_;
  compression::CodecState state_;  // the communicator writes it during a call (busy_ > 0)
  int64_t numel_ = -1;
  int busy_ = 0;  // calls launched whose completion has not yet run
};

}  // namespace hopwise::torch_backend
