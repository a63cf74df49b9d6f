// hopwise.torch.fsdp's C++ side: FSDP2's reduce-scatter and all-gather of one module's flat buffer through a hopwise
// codec (Communicator::reduce_scatter_compressed / allgather_compressed), with the codec's state kept here between
// calls: one CodecState per rank's block, so that error feedback keeps a residual for each block this rank sends.
// float32 buffers go as they are; bfloat16 ones are widened to float32 for the codec and written back. Calls start
// through the backend's sequencer, ordered with the group's other collectives.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "backend.h"
#include "hopwise/compression/codec.h"

namespace hopwise::torch_backend {

class ShardedCodecState : public std::enable_shared_from_this<ShardedCodecState> {
 public:
  // spec: a codec's (network: is not taken: a reduce-scatter's blocks go to every rank); rank and size: the group's,
  // which every call checks; seed: the same on every rank.
  ShardedCodecState(const std::string& spec, int rank, int size, std::uint64_t seed);
  std::string spec() const { return codec_->name(); }

  // output: this rank's block of the sum (or average) of every rank's `input` (size() times output's elements).
  // op: SUM, AVG, or PREMUL_SUM with a number (FSDP2's gradient divide factor).
  c10::intrusive_ptr<c10d::Work> reduce_scatter(HopwiseBackend& pg, const at::Tensor& output, const at::Tensor& input,
                                                const c10d::ReduceOp& op);
  // output: every rank's `input` (which may be this rank's block of output), each as its payload decodes.
  c10::intrusive_ptr<c10d::Work> all_gather(HopwiseBackend& pg, const at::Tensor& output, const at::Tensor& input);

  // The state between calls (each refuses while a call is in flight): the codec's steps, the element count of
  // the block the state is bound to (-1 before the first call), and the error-feedback residual of each rank's
  // block (empty for a codec without ef=1, or before its first call).
  std::uint64_t step() const;
  int64_t numel() const;
  std::vector<std::optional<std::vector<float>>> residuals() const;
  void set(std::uint64_t step, int64_t numel, const std::vector<std::optional<std::vector<float>>>& residuals);
  bool busy() const;

 private:
  // Checks the call, binds the state to the block's element count, and marks the state busy.
  void begin(HopwiseBackend& pg, const at::Tensor& output, const at::Tensor& input, int64_t block, const char* what);
  using Call = std::function<comm::Work(const float* in, float* out)>;  // the engine's call on the staged buffers
  c10::intrusive_ptr<c10d::Work> launch(HopwiseBackend& pg, const at::Tensor& output, const at::Tensor& input,
                                        int64_t block, const char* what, c10d::OpType type, const char* title,
                                        const Call& call, double factor = 1);
  void check_idle(const char* what) const;  // holds mutex_
  std::unique_ptr<compression::Codec> codec_;
  int rank_, size_;
  mutable std::mutex mutex_;
  std::vector<compression::CodecState> states_;  // one per rank's block; the communicator writes them in a call
  int64_t numel_ = -1;
  int busy_ = 0;
};

}  // namespace hopwise::torch_backend
