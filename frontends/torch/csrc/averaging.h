// hopwise.torch.ModelAverager's C++ side: the comm/ ModelAverager (averaging.h) over one flat float32 tensor that
// the model's parameters are views of, on a hopwise group's communicator, and the gradient averaging its scope
// asks for (DDP's comm hook, or a plain model's gradients).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

#include "backend.h"
#include "hopwise/training/averaging.h"

namespace hopwise::torch_backend {

// A model on a GPU or in bfloat16/float16: the averager works on a float32 host copy, and hopwise.torch's staging
// (averaging.py) copies ranges between it and the model when the averager says (comm::ParameterStaging).
using StagingCall = std::function<void(std::size_t, std::size_t)>;

class TorchAverager {
 public:
  // `flat`: contiguous float32 CPU tensor holding every parameter, or their host copy where `fetch` and `publish`
  // are given (kept alive here). Collective over the group.
  // `joining`: an elastic newcomer (no first broadcast; regroup() with the members gives it their state).
  TorchAverager(c10::intrusive_ptr<c10d::ProcessGroup> keep, HopwiseBackend& pg, const std::string& spec,
                at::Tensor flat, StagingCall fetch = {}, StagingCall publish = {}, bool joining = false);
  std::string spec() const { return averager_->spec().to_string(); }
  std::string gradient_scope() const { return comm::to_string(averager_->gradient_scope()); }
  void before_step() { averager_->before_step(); }
  void after_step() { averager_->after_step(); }
  void full_average() { averager_->full_average(); }
  void settle() { averager_->settle(); }
  at::Tensor mean_model();  // the world's mean model, a new tensor; every rank's own untouched
  int64_t steps() const { return averager_->steps(); }
  const comm::AveragingStats& stats() const { return averager_->stats(); }
  std::string choice() const { return averager_->choice(); }  // diloco:auto's last decision and why
  std::string pick() const { return averager_->pick(); }      // diloco:auto's pick and why, once measured
  std::string save() const;
  void load(const std::string& s) { averager_->load(s); }
  // Elastic membership (comm::ModelAverager::regroups, detach, regroup): after a collective failed, detach(); once
  // the new group is formed, regroup() over it (collective), which keeps the new group alive instead of the old.
  bool regroups() const { return averager_->regroups(); }
  void detach() { averager_->detach(); }
  std::string regroup(c10::intrusive_ptr<c10d::ProcessGroup> keep, HopwiseBackend& pg);
  // DDP's bucket averaged over the step's scope (world, host), or left as it is (none): a torch Work.
  c10::intrusive_ptr<c10d::Work> average_bucket(const at::Tensor& buffer);
  // A plain model's gradients averaged over the step's scope, in place, before optimizer.step().
  void average_gradients(const std::vector<at::Tensor>& grads);

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> keep_;  // the group outlives the averager
  HopwiseBackend* pg_;
  at::Tensor flat_;
  std::unique_ptr<comm::ParameterStaging> staging_;  // null: flat_ is the model itself
  std::unique_ptr<comm::ModelAverager> averager_;
};

}  // namespace hopwise::torch_backend
