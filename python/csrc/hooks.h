// What the DDP comm hooks of hopwise.torch call: one compressed allreduce per bucket with any hopwise codec, or
// PowerSGD over the bucket's gradients as matrices (all P factors in one allreduce, all Q in a second). Per-bucket
// codec state lives here and saves to bytes for the trainer's checkpoint.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "hopwise/compression/codec.h"
#include "hopwise/compression/powersgd.h"
#include "process_group.h"

namespace hopwise::torch_backend {

class CodecHookState {
 public:
  CodecHookState(const std::string& spec, int rank, int size);
  std::string spec() const { return codec_->name(); }
  // Average of `buffer` (float32, contiguous: DDP's flat bucket) over the group, in place.
  c10::intrusive_ptr<c10d::Work> allreduce(ProcessGroupHopwise& pg, const at::Tensor& buffer, int64_t bucket);
  std::string save() const;
  void load(const std::string& bytes);

 private:
  std::unique_ptr<compression::Codec> codec_;
  int rank_, size_;
  mutable std::mutex mutex_;
  std::map<int64_t, compression::CodecState> states_;  // node-stable: a call in flight keeps a reference
};

class PowerSgdHookState {
 public:
  explicit PowerSgdHookState(const std::string& spec);
  std::string spec() const { return ps_.name(); }
  // Average of the bucket's gradients (views of its buffer) over the group, in place.
  c10::intrusive_ptr<c10d::Work> allreduce(ProcessGroupHopwise& pg, const at::Tensor& buffer,
                                           const std::vector<at::Tensor>& gradients, int64_t bucket);
  std::string save() const;
  void load(const std::string& bytes);

 private:
  struct Bucket {
    std::vector<std::pair<std::size_t, std::size_t>> shapes;  // rows x cols of each gradient
    std::vector<compression::PowerSgdState> states;
  };
  compression::PowerSgd ps_;
  mutable std::mutex mutex_;
  std::map<int64_t, Bucket> buckets_;
};

}  // namespace hopwise::torch_backend
