// What the DDP comm hooks of hopwise.torch call: one compressed allreduce per bucket with any hopwise codec, or
// PowerSGD over the bucket's gradients as matrices (all P factors in one allreduce, all Q in a second). The
// codec state lives here, kept per parameter (its key: the order in which the hook first saw it), not per bucket: DDP
// regroups its buckets after the first step, and a run resumed from a checkpoint starts again from one bucket.
// The state saves to bytes for the trainer's checkpoint.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend.h"
#include "hopwise/compression/codec.h"
#include "hopwise/compression/powersgd.h"

namespace hopwise::torch_backend {

class CodecHookState {
 public:
  // spec: a codec's, or network:CODEC to compress only between hosts (comm::split_compression_scope).
  CodecHookState(const std::string& spec, int rank, int size);
  std::string spec() const { return prefix() + codec_->name(); }
  // Average of `buffer` (float32, contiguous: DDP's flat bucket, whose parameters' gradients are `gradients`,
  // keyed `keys`) over the group, in place, in one compressed call.
  c10::intrusive_ptr<c10d::Work> allreduce(HopwiseBackend& pg, const at::Tensor& buffer,
                                           const std::vector<at::Tensor>& gradients, const std::vector<int64_t>& keys,
                                           int64_t bucket);
  std::string save() const;
  void load(const std::string& bytes);

 private:
  std::string prefix() const { return scope_ == comm::CompressionScope::kNetwork ? "network:" : ""; }
  comm::CompressionScope scope_;
  std::unique_ptr<compression::Codec> codec_;
  int rank_, size_;
  mutable std::mutex mutex_;
  std::map<int64_t, compression::CodecState> buckets_;  // node-stable: a call in flight keeps a reference
  std::map<int64_t, std::vector<float>> residuals_;     // error feedback, per parameter key
  std::uint64_t step_ = 0;                              // codec steps so far (every bucket takes one per step)
};

class PowerSgdHookState {
 public:
  explicit PowerSgdHookState(const std::string& spec);  // powersgd:... or network:powersgd:...
  std::string spec() const { return prefix() + ps_.name(); }
  // Average of the bucket's gradients (views of its buffer) over the group, in place.
  c10::intrusive_ptr<c10d::Work> allreduce(HopwiseBackend& pg, const at::Tensor& buffer,
                                           const std::vector<at::Tensor>& gradients, const std::vector<int64_t>& keys);
  std::string save() const;
  void load(const std::string& bytes);

 private:
  std::string prefix() const { return scope_ == comm::CompressionScope::kNetwork ? "network:" : ""; }
  comm::CompressionScope scope_;
  compression::PowerSgd ps_;
  mutable std::mutex mutex_;
  std::map<int64_t, compression::PowerSgdState> states_;  // per parameter key; node-stable
};

}  // namespace hopwise::torch_backend
