#include "averaging.h"

#include <c10/util/Exception.h>

#include "tensors.h"
#include "translate.h"

namespace hopwise::torch_backend {

namespace {

void check_float(const at::Tensor& t, const char* what) {
  check_tensor(t, what);
  TORCH_CHECK_VALUE(t.scalar_type() == at::kFloat && t.is_contiguous(), "hopwise: ", what,
                    " averages contiguous float32 tensors; this one is ", c10::toString(t.scalar_type()),
                    t.is_contiguous() ? "" : " (not contiguous)");
}

class CallStaging final : public comm::ParameterStaging {
 public:
  CallStaging(StagingCall fetch, StagingCall publish) : fetch_(std::move(fetch)), publish_(std::move(publish)) {}
  void fetch(std::size_t b, std::size_t e) override { fetch_(b, e); }
  void publish(std::size_t b, std::size_t e) override { publish_(b, e); }

 private:
  StagingCall fetch_, publish_;
};

}  // namespace

TorchAverager::TorchAverager(c10::intrusive_ptr<c10d::ProcessGroup> keep, HopwiseBackend& pg, const std::string& spec,
                             at::Tensor flat, StagingCall fetch, StagingCall publish, bool joining)
    : keep_(std::move(keep)), pg_(&pg), flat_(std::move(flat)) {
  check_float(flat_, "ModelAverager");
  TORCH_CHECK_VALUE(!fetch == !publish, "hopwise: ModelAverager's staging needs both fetch and publish");
  if (fetch) staging_ = std::make_unique<CallStaging>(std::move(fetch), std::move(publish));
  averager_ = translated([&] {
    return std::make_unique<comm::ModelAverager>(pg_->communicator(), comm::AveragingSpec::parse(spec),
                                                 flat_.data_ptr<float>(), static_cast<std::size_t>(flat_.numel()),
                                                 staging_.get(), joining);
  });
}

std::string TorchAverager::regroup(c10::intrusive_ptr<c10d::ProcessGroup> keep, HopwiseBackend& pg) {
  const std::string said = translated([&] { return averager_->regroup(pg.communicator()); });
  keep_ = std::move(keep);  // the old group may go now: nothing of the averager refers to it
  pg_ = &pg;
  return said;
}

std::string TorchAverager::save() const {
  return translated([&] { return averager_->save(); });
}

at::Tensor TorchAverager::mean_model() {
  at::Tensor out = at::empty_like(flat_);
  translated([&] { averager_->average_into(out.data_ptr<float>()); });
  return out;
}

c10::intrusive_ptr<c10d::Work> TorchAverager::average_bucket(const at::Tensor& buffer) {
  check_float(buffer, "ModelAverager's comm hook");
  auto work = pg_->make_work(c10d::OpType::ALLREDUCE, "hopwise:averager_bucket", {buffer});
  auto& c = pg_->communicator();
  const comm::GradientScope scope = averager_->gradient_scope();
  float* data = buffer.data_ptr<float>();
  const std::size_t n = static_cast<std::size_t>(buffer.numel());
  pg_->sequencer().launch(work, [&c, scope, data, n] {
    return translated([&] {
      std::vector<comm::Work> w;
      if (auto started = comm::average_in_scope_async(c, scope, data, n)) w.push_back(std::move(*started));
      return w;  // none: a local step, the bucket stays as backward left it
    });
  });
  return work;
}

void TorchAverager::average_gradients(const std::vector<at::Tensor>& grads) {
  const comm::GradientScope scope = averager_->gradient_scope();
  if (scope == comm::GradientScope::kNone) return;
  auto& c = pg_->communicator();
  for (const auto& g : grads) {
    check_float(g, "ModelAverager.average_gradients");
    float* d = g.data_ptr<float>();
    const auto n = static_cast<std::size_t>(g.numel());
    translated([&] { comm::average_in_scope_async(c, scope, d, n)->wait(); });
  }
}

}  // namespace hopwise::torch_backend
