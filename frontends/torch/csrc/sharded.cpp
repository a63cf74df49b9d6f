#include "sharded.h"

#include <c10/util/Exception.h>

#include <algorithm>

#include "tensors.h"
#include "translate.h"

namespace hopwise::torch_backend {

namespace {

std::vector<compression::CodecState> block_states(std::uint64_t seed, int rank, int size) {
  std::vector<compression::CodecState> s;
  for (int b = 0; b < size; ++b)  // block b's seed alike on every rank (randomk's indices)
    s.push_back(translated([&] { return compression::CodecState(seed + static_cast<std::uint64_t>(b), rank, size); }));
  return s;
}

}  // namespace

ShardedCodecState::ShardedCodecState(const std::string& spec, int rank, int size, std::uint64_t seed)
    : codec_(translated([&] {
        TORCH_CHECK_VALUE(spec.rfind("network:", 0) != 0, "hopwise.torch.fsdp: codec '", spec,
                          "': a sharded collective sends every block to its own rank, so there is no host-only "
                          "stage to compress; name the codec alone (e.g. int8:ef=1)");
        return compression::make_codec(spec);
      })),
      rank_(rank),
      size_(size),
      states_(block_states(seed, rank, size)) {}

void ShardedCodecState::check_idle(const char* what) const {
  TORCH_CHECK(busy_ == 0, "hopwise.torch.fsdp: ", what, ": a collective on this state is still in flight; wait() ",
              "for it first");
}

void ShardedCodecState::begin(HopwiseBackend& pg, const at::Tensor& output, const at::Tensor& input, int64_t block,
                              const char* what) {
  check_tensor(input, what);
  check_tensor(output, what);
  for (const at::Tensor* t : {&input, &output})
    TORCH_CHECK_VALUE(t->scalar_type() == at::kFloat || t->scalar_type() == at::kBFloat16, "hopwise.torch.fsdp: ", what,
                      ": codecs compress float32 and bfloat16 buffers; this one is ", c10::toString(t->scalar_type()),
                      " (leave this module uncompressed)");
  TORCH_CHECK_VALUE(input.scalar_type() == output.scalar_type(), "hopwise.torch.fsdp: ", what,
                    ": input and output dtypes differ");
  auto& c = pg.communicator();
  TORCH_CHECK_VALUE(c.rank() == rank_ && c.size() == size_, "hopwise.torch.fsdp: this state was made for rank ", rank_,
                    " of ", size_, ", not for this group's rank ", c.rank(), " of ", c.size());
  std::lock_guard lock(mutex_);
  TORCH_CHECK_VALUE(numel_ < 0 || numel_ == block, "hopwise.torch.fsdp: ", what, ": this state belongs to blocks of ",
                    numel_, " elements; this call's have ", block, " (one state per module and direction)");
  numel_ = block;
  ++busy_;
}

// The path both calls share: stage the buffers (bfloat16 widened to float32), start the engine's call through the
// sequencer, and on completion mark the state idle, scale by `factor` and write the output back.
c10::intrusive_ptr<c10d::Work> ShardedCodecState::launch(HopwiseBackend& pg, const at::Tensor& output,
                                                         const at::Tensor& input, int64_t block, const char* what,
                                                         c10d::OpType type, const char* title, const Call& call,
                                                         double factor) {
  begin(pg, output, input, block, what);
  auto self = shared_from_this();  // the state outlives the call, even when Python drops it first
  auto idle = [self] {
    std::lock_guard lock(self->mutex_);
    --self->busy_;
  };
  Staged in, out;
  try {
    in = stage(input, at::kFloat);
    out = stage(output, at::kFloat, false);
  } catch (...) {
    idle();
    throw;
  }
  auto work = pg.make_work(type, title, as_list(output));
  auto start = [&pg, in, out, call, idle] {
    try {
      auto w = translated([&] { return call(static_cast<const float*>(in.data()), static_cast<float*>(out.data())); });
      pg.count_compressed_call(static_cast<std::uint64_t>(std::min(in.count(), out.count())) * sizeof(float));
      return std::vector{w};
    } catch (...) {
      idle();  // the completion step never runs for a call that did not start
      throw;
    }
  };
  // `in` rides along to the completion: a widened copy must outlive the call that reads it.
  pg.sequencer().launch(work, start, [idle, in, out, factor](std::exception_ptr e) {
    idle();
    if (e) return;
    if (factor != 1) out.buf.mul_(factor);
    out.finish();
  });
  return work;
}

c10::intrusive_ptr<c10d::Work> ShardedCodecState::reduce_scatter(HopwiseBackend& pg, const at::Tensor& output,
                                                                 const at::Tensor& input, const c10d::ReduceOp& op) {
  TORCH_CHECK_VALUE(input.numel() == output.numel() * size_, "hopwise.torch.fsdp: reduce_scatter needs an input of ",
                    size_, " times the output's elements (", output.numel(), "), not ", input.numel());
  ReduceOp reduce = ReduceOp::kSum;
  double factor = 1;  // PREMUL_SUM's: sum(f * x) is f * sum(x), applied to the owner's result
  switch (op.op_) {
    case c10d::ReduceOp::SUM: break;
    case c10d::ReduceOp::AVG: reduce = ReduceOp::kAvg; break;
    case c10d::ReduceOp::PREMUL_SUM: {
      auto s = c10::dynamic_intrusive_pointer_cast<c10d::PreMulSumSupplement>(op.supplement_);
      TORCH_CHECK_VALUE(s && !s->tensor_factor.defined(), "hopwise.torch.fsdp: reduce_scatter takes PREMUL_SUM with a ",
                        "number, not a tensor factor");
      factor = s->double_factor;
      break;
    }
    default:
      TORCH_CHECK_VALUE(false, "hopwise.torch.fsdp: codecs sum or average; reduce_scatter cannot apply op ",
                        static_cast<int>(op.op_));
  }
  const auto n = static_cast<std::size_t>(output.numel());
  return launch(
      pg, output, input, output.numel(), "reduce_scatter", c10d::OpType::_REDUCE_SCATTER_BASE,
      "hopwise:compressed_reduce_scatter",
      [this, &pg, n, reduce](const float* in, float* out) {
        return pg.communicator().reduce_scatter_compressed_async(in, out, n, *codec_, states_, reduce);
      },
      factor);
}

c10::intrusive_ptr<c10d::Work> ShardedCodecState::all_gather(HopwiseBackend& pg, const at::Tensor& output,
                                                             const at::Tensor& input) {
  TORCH_CHECK_VALUE(output.numel() == input.numel() * size_, "hopwise.torch.fsdp: all_gather needs an output of ",
                    size_, " times the input's elements (", input.numel(), "), not ", output.numel());
  const auto n = static_cast<std::size_t>(input.numel());
  return launch(pg, output, input, input.numel(), "all_gather", c10d::OpType::_ALLGATHER_BASE,
                "hopwise:compressed_all_gather", [this, &pg, n](const float* in, float* out) {
                  return pg.communicator().allgather_compressed_async(in, out, n, *codec_, states_[0]);
                });
}

std::uint64_t ShardedCodecState::step() const {
  std::lock_guard lock(mutex_);
  check_idle("step");
  return states_[0].step;
}

int64_t ShardedCodecState::numel() const {
  std::lock_guard lock(mutex_);
  return numel_;
}

bool ShardedCodecState::busy() const {
  std::lock_guard lock(mutex_);
  return busy_ > 0;
}

std::vector<std::optional<std::vector<float>>> ShardedCodecState::residuals() const {
  std::lock_guard lock(mutex_);
  check_idle("state_dict");
  std::vector<std::optional<std::vector<float>>> r;
  for (const auto& s : states_)
    r.push_back(s.residual.empty() ? std::nullopt : std::optional<std::vector<float>>(s.residual));
  return r;
}

void ShardedCodecState::set(std::uint64_t step, int64_t numel,
                            const std::vector<std::optional<std::vector<float>>>& residuals) {
  std::lock_guard lock(mutex_);
  check_idle("load_state_dict");
  TORCH_CHECK_VALUE(residuals.size() == states_.size(), "hopwise.torch.fsdp: load_state_dict: the saved state has ",
                    residuals.size(), " blocks' residuals; this group has ", states_.size(),
                    " ranks (load the state "
                    "saved by the same rank of a job of the same size)");
  TORCH_CHECK_VALUE(numel >= -1, "hopwise.torch.fsdp: load_state_dict: numel ", numel, " is invalid");
  TORCH_CHECK_VALUE(numel_ < 0 || numel < 0 || numel_ == numel, "hopwise.torch.fsdp: load_state_dict: the saved ",
                    "state belongs to blocks of ", numel, " elements, this one to blocks of ", numel_);
  for (const auto& r : residuals)
    TORCH_CHECK_VALUE(!r || static_cast<int64_t>(r->size()) == numel, "hopwise.torch.fsdp: load_state_dict: a ",
                      "residual of ", r ? r->size() : 0, " elements for blocks of ", numel);
  for (std::size_t b = 0; b < states_.size(); ++b) {
    states_[b].step = step;
    states_[b].residual = residuals[b] ? *residuals[b] : std::vector<float>{};
  }
  if (numel >= 0) numel_ = numel;
}

}  // namespace hopwise::torch_backend
