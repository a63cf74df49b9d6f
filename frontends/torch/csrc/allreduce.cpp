#include "allreduce.h"

#include <c10/util/Exception.h>

#include <algorithm>

#include "tensors.h"
#include "translate.h"

namespace hopwise::torch_backend {

TensorCodecState::TensorCodecState(const std::string& spec, int rank, int size, std::uint64_t seed)
    : scope_(translated([&] { return comm::split_compression_scope(spec).first; })),
      codec_(translated([&] { return compression::make_codec(comm::split_compression_scope(spec).second); })),
      rank_(rank),
      size_(size),
      state_(translated([&] { return compression::CodecState(seed, rank, size); })) {}

std::string TensorCodecState::canonical(const std::string& spec) {
  return translated([&] {
    const auto [scope, codec] = comm::split_compression_scope(spec);
    return (scope == comm::CompressionScope::kNetwork ? "network:" : "") + compression::make_codec(codec)->name();
  });
}

void TensorCodecState::check_idle(const char* what) const {
  TORCH_CHECK(busy_ == 0, "hopwise: CodecState.", what, ": an allreduce on this state is still in flight; wait() ",
              "for its work first");
}

c10::intrusive_ptr<c10d::Work> TensorCodecState::allreduce(HopwiseBackend& pg, const at::Tensor& tensor,
                                                           const std::string& op) {
  check_tensor(tensor, "allreduce");
  TORCH_CHECK_VALUE(tensor.scalar_type() == at::kFloat, "hopwise: allreduce: codecs compress float32 tensors; this ",
                    "one is ", c10::toString(tensor.scalar_type()));
  TORCH_CHECK_VALUE(tensor.is_contiguous(), "hopwise: allreduce: the tensor is not contiguous; pass a contiguous ",
                    "one (.contiguous() makes a copy, which the result then lands in)");
  TORCH_CHECK_VALUE(op == "sum" || op == "avg", "hopwise: allreduce: codec '", spec(), "' sums or averages (op ",
                    "'sum' or 'avg'), not '", op, "'");
  auto& c = pg.communicator();
  TORCH_CHECK_VALUE(c.rank() == rank_ && c.size() == size_, "hopwise: this CodecState was made for rank ", rank_,
                    " of ", size_, ", not for this group's rank ", c.rank(), " of ", c.size());
  const int64_t n = tensor.numel();
  {
    std::lock_guard lock(mutex_);
    TORCH_CHECK_VALUE(numel_ < 0 || numel_ == n, "hopwise: this CodecState belongs to a tensor of ", numel_,
                      " elements; this one has ", n, " (keep one state per tensor, or reset() it)");
    numel_ = n;
    ++busy_;
  }
  auto self = shared_from_this();  // the state outlives the call, even when Python drops it first
  auto idle = [self] {
    std::lock_guard lock(self->mutex_);
    --self->busy_;
  };
  const ReduceOp reduce = op == "sum" ? ReduceOp::kSum : ReduceOp::kAvg;
  auto work = pg.make_work(c10d::OpType::ALLREDUCE, "hopwise:compressed_all_reduce", {tensor});
  auto* data = tensor.data_ptr<float>();
  const auto count = static_cast<std::size_t>(n);
  auto start = [self, &pg, &c, data, count, reduce, tensor, idle] {
    try {
      auto w = translated([&] {
        return c.allreduce_compressed_async(data, data, count, *self->codec_, self->state_, reduce, self->scope_);
      });
      pg.count_compressed_call(count * sizeof(float));
      return std::vector{w};
    } catch (...) {
      idle();  // the completion step never runs for a call that did not start
      throw;
    }
  };
  pg.sequencer().launch(work, start, [idle](std::exception_ptr) { idle(); });
  return work;
}

std::optional<std::vector<float>> TensorCodecState::residual() const {
  std::lock_guard lock(mutex_);
  check_idle("residual");
  if (state_.residual.empty()) return std::nullopt;
  return state_.residual;
}

std::uint64_t TensorCodecState::step() const {
  std::lock_guard lock(mutex_);
  check_idle("step");
  return state_.step;
}

std::uint64_t TensorCodecState::seed() const {
  std::lock_guard lock(mutex_);
  return state_.seed;
}

int64_t TensorCodecState::numel() const {
  std::lock_guard lock(mutex_);
  return numel_;
}

bool TensorCodecState::busy() const {
  std::lock_guard lock(mutex_);
  return busy_ > 0;
}

void TensorCodecState::set(std::uint64_t step, std::uint64_t seed, int64_t numel,
                           std::optional<std::vector<float>> residual) {
  std::lock_guard lock(mutex_);
  check_idle("load_state_dict");
  TORCH_CHECK_VALUE(numel >= -1, "hopwise: CodecState.load_state_dict: numel ", numel, " is invalid");
  TORCH_CHECK_VALUE(!residual || numel < 0 || static_cast<int64_t>(residual->size()) == numel,
                    "hopwise: CodecState.load_state_dict: a residual of ", residual ? residual->size() : 0,
                    " elements for a tensor of ", numel);
  TORCH_CHECK_VALUE(numel_ < 0 || numel < 0 || numel_ == numel, "hopwise: CodecState.load_state_dict: the saved ",
                    "state belongs to a tensor of ", numel, " elements, this one to a tensor of ", numel_);
  state_.step = step;
  state_.seed = seed;
  state_.residual = residual ? std::move(*residual) : std::vector<float>{};
  if (numel >= 0) numel_ = numel;
}

void TensorCodecState::reset() {
  std::lock_guard lock(mutex_);
  check_idle("reset");
  state_ = compression::CodecState(state_.seed, rank_, size_);
  numel_ = -1;
}

}  // namespace hopwise::torch_backend
