#include "backend.h"

#include <fmt/core.h>
#include <pybind11/pybind11.h>

#include <cstdlib>
#include <numeric>
#include <thread>

#include <c10/util/Exception.h>

#include "hopwise/comm/launch.h"
#include "hopwise/common/error.h"
#include "tensors.h"
#include "torch_store.h"
#include "translate.h"

namespace hopwise::torch_backend {

namespace {

// comm chooses the transport (launch.h): under mpirun MPI (the world's, or a group of its ranks), else one that
// meets through torch's store (UCX).
std::unique_ptr<comm::Transport> make_transport(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                                double timeout_s, const std::string& group_id,
                                                const std::vector<int64_t>& global_ranks, comm::JobRank job) {
  comm::GroupRequest request;
  request.job = job;
  request.rank = rank;
  request.size = size;
  request.members.assign(global_ranks.begin(), global_ranks.end());
  request.store = std::make_shared<TorchStore>(std::move(store));
  request.key = "hopwise/group/" + group_id;
  request.timeout = comm::Store::Seconds(timeout_s);
  return translated([&] { return comm::make_group_transport(request); });
}

}  // namespace

HopwiseBackend::HopwiseBackend(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                               std::chrono::duration<float> timeout, std::string group_id,
                               std::vector<int64_t> global_ranks, int world_rank, int world_size)
    : c10d::Backend(rank, size), store_(store) {
  comm::Options options = translated([] { return comm::Options::from_env(); });
  if (!std::getenv("HOPWISE_TIMEOUT_S")) options.timeout_s = timeout.count();  // torch's, unless hopwise's is set
  timeout_ = std::chrono::milliseconds(static_cast<int64_t>(options.timeout_s * 1000));
  auto transport = make_transport(std::move(store), rank, size, options.timeout_s, group_id, global_ranks,
                                  comm::JobRank{world_rank, world_size});
  comm_ = translated([&] { return std::make_unique<comm::Communicator>(std::move(transport), options); });
  seq_.set_tracker([this](const c10::intrusive_ptr<HopwiseWork>& work) {
    std::lock_guard lock(works_mutex_);
    std::erase_if(recent_, [](const auto& w) { return w->isCompleted() || w->abandoned(); });
    recent_.push_back(work);
  });
}

HopwiseBackend::~HopwiseBackend() {
  // Python may drop the group holding the GIL while a completion callback (a hook) waits for it.
  if (Py_IsInitialized() && PyGILState_Check()) {
    pybind11::gil_scoped_release release;
    comm_.reset();
  } else {
    comm_.reset();
  }
}

c10::intrusive_ptr<HopwiseWork> HopwiseBackend::make_work(c10d::OpType type, const char* title,
                                                          std::vector<at::Tensor> outputs,
                                                          std::vector<c10::Device> devices) {
  auto work = c10::make_intrusive<HopwiseWork>(getRank(), type, title, std::move(outputs), std::move(devices));
  std::lock_guard lock(works_mutex_);
  ++sequence_;
  if (coalescing_) coalesced_.push_back(work);
  return work;
}

int HopwiseBackend::user_tag(int tag, const char* what) const {
  TORCH_CHECK_VALUE(tag >= 0 && tag < kFirstBackendTag, "hopwise: ", what, ": tag ", tag, " is out of range; use 0..",
                    kFirstBackendTag - 1, " (higher tags carry the backend's own gather, scatter and alltoall)");
  return tag;
}

namespace {

// Starts the reduction of `s` (staged in the plan's dtype) into itself; `after` (on a pool thread) completes it.
std::vector<comm::Work> start_allreduce(comm::Communicator& c, const Staged& s, const ReducePlan& plan,
                                        std::function<void()>& after) {
  if (plan.way == ReducePlan::Way::kGatherFold) {
    auto gathered = at::empty({c.size(), s.buf.numel()}, s.buf.options());
    auto w = c.allgather_async(s.data(), gathered.data_ptr(), s.bytes(), DataType::kUInt8);
    after = [s, gathered, op = plan.torch_op] {
      at::Tensor out = s.buf;
      fold_bitwise(gathered, op, out);
      s.finish();
    };
    return {w};
  }
  after = [s] { s.finish(); };
  return {c.allreduce_async(s.data(), s.data(), s.count(), plan.dtype, plan.op)};
}

}  // namespace

c10::intrusive_ptr<c10d::Work> HopwiseBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                         const c10d::AllreduceOptions& opts) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "hopwise: allreduce takes one tensor per rank (one device), got ",
                    tensors.size());
  if (tensors[0].defined() && tensors[0].is_sparse()) return allreduce_sparse(tensors, opts);
  if (tensors[0].defined() && tensors[0].is_cuda()) return cuda_allreduce(tensors[0], opts);
  const at::Tensor& user = single(tensors, "allreduce");
  // Complex numbers sum and average as pairs of reals (as gloo and NCCL do); other ops have no order to use.
  const bool complex = at::isComplexType(user.scalar_type());
  const auto op = opts.reduceOp.op_;
  TORCH_CHECK_VALUE(!complex || op == c10d::ReduceOp::SUM || op == c10d::ReduceOp::AVG,
                    "hopwise: allreduce: ", op_name(op), " of ", c10::toString(user.scalar_type()),
                    " has no meaning (complex numbers are not ordered); use SUM or AVG");
  const at::Tensor t = complex ? at::view_as_real(user.is_contiguous() ? user : user.contiguous()) : user;
  const ReducePlan plan = plan_reduce(t.scalar_type(), opts.reduceOp, "allreduce");
  Staged s = stage(t, plan.wide);
  if (complex) s.user = user;  // a contiguous copy's result goes back to the caller's tensor
  auto work = make_work(c10d::OpType::ALLREDUCE, "hopwise:all_reduce", tensors);
  auto after = std::make_shared<std::function<void()>>();
  seq_.launch(
      work, [this, s, plan, after] { return translated([&] { return start_allreduce(*comm_, s, plan, *after); }); },
      on_success([after] { (*after)(); }));
  return work;
}

c10::intrusive_ptr<c10d::Work> HopwiseBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                   const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK_VALUE(!tensors.empty(), "hopwise: allreduce_coalesced needs at least one tensor");
  std::vector<at::Tensor> flat;
  for (const auto& t : tensors) {
    check_tensor(t, "allreduce_coalesced");
    TORCH_CHECK_VALUE(t.scalar_type() == tensors[0].scalar_type(), "hopwise: allreduce_coalesced: tensors of ",
                      c10::toString(tensors[0].scalar_type()), " and ", c10::toString(t.scalar_type()),
                      " mixed; coalesce tensors of one dtype");
    flat.push_back(t.reshape({-1}));
  }
  const ReducePlan plan = plan_reduce(tensors[0].scalar_type(), opts.reduceOp, "allreduce_coalesced");
  at::Tensor joined = at::cat(flat);
  if (plan.wide != at::ScalarType::Undefined) joined = joined.to(plan.wide);
  const Staged s{joined, joined};
  auto work = make_work(c10d::OpType::ALLREDUCE_COALESCED, "hopwise:all_reduce_coalesced", tensors);
  auto after = std::make_shared<std::function<void()>>();
  seq_.launch(
      work, [this, s, plan, after] { return translated([&] { return start_allreduce(*comm_, s, plan, *after); }); },
      on_success([after, joined, tensors] {
        (*after)();
        int64_t offset = 0;
        for (const auto& t : tensors) {
          at::Tensor dst = t;
          dst.copy_(joined.narrow(0, offset, t.numel()).view(t.sizes()));
          offset += t.numel();
        }
      }));
  return work;
}

c10::intrusive_ptr<c10d::Work> HopwiseBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                         const c10d::BroadcastOptions& opts) {
  if (tensors.size() == 1 && tensors[0].defined() && tensors[0].is_cuda()) return cuda_broadcast(tensors[0], opts);
  const at::Tensor& t = single(tensors, "broadcast");
  const int root = static_cast<int>(opts.rootRank);
  const Staged s = stage(t, at::ScalarType::Undefined, getRank() == root);
  auto work = make_work(c10d::OpType::BROADCAST, "hopwise:broadcast", tensors);
  seq_.launch(
      work,
      [this, s, root] {
        return std::vector{
            translated([&] { return comm_->broadcast_async(s.data(), s.bytes(), DataType::kUInt8, root); })};
      },
      on_success([s] { s.finish(); }));
  return work;
}

c10::intrusive_ptr<c10d::Work> HopwiseBackend::reduce(std::vector<at::Tensor>& tensors,
                                                      const c10d::ReduceOptions& opts) {
  const at::Tensor& t = single(tensors, "reduce");
  const int root = static_cast<int>(opts.rootRank);
  const ReducePlan plan = plan_reduce(t.scalar_type(), opts.reduceOp, "reduce");
  auto work = make_work(c10d::OpType::REDUCE, "hopwise:reduce", tensors);
  // The result goes to a buffer of its own: only the root's tensor changes.
  const Staged in = stage(t, plan.wide);
  at::Tensor out = at::empty_like(in.buf);
  const Staged result{t, out};
  const bool is_root = getRank() == root;
  std::function<std::vector<comm::Work>()> start;
  std::function<void()> after;
  if (plan.way == ReducePlan::Way::kGatherFold) {
    auto gathered = at::empty({comm_->size(), in.buf.numel()}, in.buf.options());
    start = [this, in, gathered] {
      return std::vector{translated(
          [&] { return comm_->allgather_async(in.data(), gathered.data_ptr(), in.bytes(), DataType::kUInt8); })};
    };
    after = [=] {
      if (!is_root) return;
      at::Tensor o = out;
      fold_bitwise(gathered, plan.torch_op, o);
      at::Tensor u = t;
      u.copy_(o);
    };
  } else {
    start = [this, in, out, plan, root] {
      return std::vector{translated(
          [&] { return comm_->reduce_async(in.data(), out.data_ptr(), in.count(), plan.dtype, plan.op, root); })};
    };
    after = [=] {
      if (!is_root) return;
      at::Tensor u = t;
      u.copy_(out);
    };
  }
  seq_.launch(work, std::move(start), on_success([after, in] { after(); }));
  return work;
}

c10::intrusive_ptr<c10d::Work> HopwiseBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllgatherOptions&) {
  if (inputs.size() == 1 && outputs.size() == 1 && inputs[0].defined() && inputs[0].is_cuda())
    return cuda_allgather(outputs[0], inputs[0]);
  const at::Tensor& in = single(inputs, "allgather");
  TORCH_CHECK_VALUE(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
                    "hopwise: allgather needs one list of ", getSize(), " output tensors (one per rank)");
  for (const auto& o : outputs[0]) check_same(in, o, "allgather");
  const Staged s = stage(in);
  auto gathered = at::empty({getSize(), in.numel()}, in.options());
  auto work = make_work(c10d::OpType::ALLGATHER, "hopwise:all_gather", outputs[0]);
  seq_.launch(
      work,
      [this, s, gathered] {
        return std::vector{translated(
            [&] { return comm_->allgather_async(s.data(), gathered.data_ptr(), s.bytes(), DataType::kUInt8); })};
      },
      on_success([s, gathered, outs = outputs[0]] {
        for (std::size_t r = 0; r < outs.size(); ++r) {
          at::Tensor o = outs[r];
          o.copy_(gathered[static_cast<int64_t>(r)].view(o.sizes()));
        }
      }));
  return work;
}

c10::intrusive_ptr<c10d::Work> HopwiseBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                               const c10d::AllgatherOptions&) {
  if (input.defined() && input.is_cuda()) return cuda_allgather_base(output, input);
  check_tensor(input, "_allgather_base");
  check_tensor(output, "_allgather_base");
  TORCH_CHECK_VALUE(output.scalar_type() == input.scalar_type() && output.numel() == input.numel() * getSize(),
                    "hopwise: _allgather_base needs an output of the input's dtype and ", getSize(),
                    " times its elements");
  const Staged in = stage(input), out = stage(output, at::ScalarType::Undefined, false);
  auto work = make_work(c10d::OpType::_ALLGATHER_BASE, "hopwise:_all_gather_base", as_list(output));
  seq_.launch(
      work,
      [this, in, out] {
        return std::vector{
            translated([&] { return comm_->allgather_async(in.data(), out.data(), in.bytes(), DataType::kUInt8); })};
      },
      on_success([in, out] { out.finish(); }));
  return work;
}

c10::intrusive_ptr<c10d::Work> HopwiseBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                              std::vector<std::vector<at::Tensor>>& inputs,
                                                              const c10d::ReduceScatterOptions& opts) {
  const at::Tensor& out = single(outputs, "reduce_scatter");
  TORCH_CHECK_VALUE(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
                    "hopwise: reduce_scatter needs one list of ", getSize(), " input tensors (one per rank)");
  std::vector<at::Tensor> flat;
  for (const auto& i : inputs[0]) {
    check_same(out, i, "reduce_scatter");
    flat.push_back(i.reshape({-1}));
  }
  at::Tensor joined = at::cat(flat);
  return _reduce_scatter_base(outputs[0], joined, opts);
}

c10::intrusive_ptr<c10d::Work> HopwiseBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                    const c10d::ReduceScatterOptions& opts) {
  if (input.defined() && input.is_cuda()) return cuda_reduce_scatter_base(output, input, opts);
  check_tensor(input, "reduce_scatter");
  check_tensor(output, "reduce_scatter");
  TORCH_CHECK_VALUE(output.scalar_type() == input.scalar_type() && input.numel() == output.numel() * getSize(),
                    "hopwise: reduce_scatter needs an input of the output's dtype and ", getSize(),
                    " times its elements");
  const ReducePlan plan = plan_reduce(input.scalar_type(), opts.reduceOp, "reduce_scatter");
  auto work = make_work(c10d::OpType::_REDUCE_SCATTER_BASE, "hopwise:reduce_scatter", as_list(output));
  const Staged in = stage(input, plan.wide);
  const Staged out = stage(output, plan.wide, false);
  if (plan.way == ReducePlan::Way::kGatherFold) {
    const Staged all = stage(input);  // every rank's whole input, folded, then this rank's part kept
    auto after = std::make_shared<std::function<void()>>();
    const int64_t n = output.numel(), me = getRank();
    seq_.launch(
        work,
        [this, all, plan, after] { return translated([&] { return start_allreduce(*comm_, all, plan, *after); }); },
        on_success([after, all, out, n, me] {
          (*after)();
          out.buf.copy_(all.buf.reshape({-1}).narrow(0, me * n, n).view(out.buf.sizes()));
          out.finish();
        }));
    return work;
  }
  seq_.launch(
      work,
      [this, in, out, plan] {
        return std::vector{translated(
            [&] { return comm_->reduce_scatter_async(in.data(), out.data(), out.count(), plan.dtype, plan.op); })};
      },
      on_success([in, out] { out.finish(); }));
  return work;
}

}  // namespace hopwise::torch_backend
