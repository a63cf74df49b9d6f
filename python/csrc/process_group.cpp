#include "process_group.h"

#include <fmt/core.h>
#include <mpi.h>
#include <pybind11/pybind11.h>

#include <cstdlib>
#include <numeric>
#include <thread>

#include <c10/util/Exception.h>

#include "hopwise/comm/launch.h"
#include "hopwise/comm/transports/mpi_transport.h"
#include "hopwise/comm/transports/ucx_transport.h"
#include "hopwise/common/error.h"
#include "tensors.h"
#include "torch_store.h"

namespace hopwise::torch_backend {

namespace {

constexpr int kGatherTag = kFirstBackendTag, kScatterTag = kFirstBackendTag + 1, kAlltoallTag = kFirstBackendTag + 2;

// hopwise's errors as torch's: bad arguments become ValueError, the rest RuntimeError, each with hopwise's text.
template <class F>
auto translated(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const InvalidArgument& e) {
    TORCH_CHECK_VALUE(false, e.what());
  } catch (const Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

bool use_mpi() {
  const char* forced = std::getenv("HOPWISE_TRANSPORT");
  if (forced && *forced) {
    const std::string f = forced;
    TORCH_CHECK_VALUE(f == "mpi" || f == "ucx", "hopwise: HOPWISE_TRANSPORT=", f, " is not known; use mpi or ucx");
    return f == "mpi";
  }
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr;  // under mpirun
}

// The world group (empty `global_ranks`, or all of them in order) or a subgroup of it.
bool is_world(const std::vector<int64_t>& global_ranks, int size) {
  if (global_ranks.empty()) return true;
  for (int i = 0; i < static_cast<int>(global_ranks.size()); ++i)
    if (global_ranks[static_cast<std::size_t>(i)] != i) return false;
  return static_cast<int>(global_ranks.size()) == size && std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr &&
         std::atoi(std::getenv("OMPI_COMM_WORLD_SIZE")) == size;
}

std::unique_ptr<comm::Transport> make_transport(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                                double timeout_s, const std::string& group_id,
                                                const std::vector<int64_t>& global_ranks) {
  if (use_mpi()) {
    if (is_world(global_ranks, size)) {
      const comm::Launch launch = translated([] { return comm::detect_launch(); });
      TORCH_CHECK_VALUE(launch.rank == rank && launch.size == size, "hopwise: torch says this is rank ", rank, " of ",
                        size, " but ", launch.launcher, " started rank ", launch.rank, " of ", launch.size,
                        "; pass init_process_group the launcher's RANK and WORLD_SIZE (or none: env:// reads them)");
      return translated([&] { return comm::make_world_transport(launch, comm::Store::Seconds(timeout_s)); });
    }
    // A subgroup: collective over its members only (the other ranks never call torch's creator).
    int initialized = 0;
    MPI_Initialized(&initialized);
    TORCH_CHECK(initialized, "hopwise: a subgroup over MPI needs the world group first (init_process_group)");
    MPI_Group world_group, group;
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    std::vector<int> members(global_ranks.begin(), global_ranks.end());
    MPI_Group_incl(world_group, static_cast<int>(members.size()), members.data(), &group);
    MPI_Comm sub = MPI_COMM_NULL;
    // torch names groups by a counter that is the same on every rank: a tag no other group's creation uses.
    const int tag = static_cast<int>(std::hash<std::string>{}(group_id) % 30000);
    const int rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &sub);
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
    TORCH_CHECK(rc == MPI_SUCCESS && sub != MPI_COMM_NULL, "hopwise: MPI_Comm_create_group failed for group ",
                group_id);
    auto t = translated([&] { return std::make_unique<comm::MpiTransport>(sub); });
    MPI_Comm_free(&sub);  // the transport keeps a duplicate
    return t;
  }
  return translated([&]() -> std::unique_ptr<comm::Transport> {
    return std::make_unique<comm::UcxTransport>(std::make_shared<TorchStore>(std::move(store)), rank, size,
                                                "hopwise/group/" + group_id, comm::Store::Seconds(timeout_s));
  });
}

std::vector<at::Tensor> as_list(const at::Tensor& t) { return {t}; }

}  // namespace

ProcessGroupHopwise::ProcessGroupHopwise(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                         std::chrono::duration<float> timeout, std::string group_id,
                                         std::vector<int64_t> global_ranks)
    : c10d::ProcessGroup(rank, size) {
  comm::Options options = translated([] { return comm::Options::from_env(); });
  if (!std::getenv("HOPWISE_TIMEOUT_S")) options.timeout_s = timeout.count();  // torch's, unless hopwise's is set
  auto transport = make_transport(std::move(store), rank, size, options.timeout_s, group_id, global_ranks);
  comm_ = translated([&] { return std::make_unique<comm::Communicator>(std::move(transport), options); });
}

ProcessGroupHopwise::~ProcessGroupHopwise() {
  // Python may drop the group holding the GIL while a completion callback (a hook) waits for it.
  if (Py_IsInitialized() && PyGILState_Check()) {
    pybind11::gil_scoped_release release;
    comm_.reset();
  } else {
    comm_.reset();
  }
}

c10::intrusive_ptr<HopwiseWork> ProcessGroupHopwise::make_work(c10d::OpType type, const char* title,
                                                                std::vector<at::Tensor> outputs) {
  return c10::make_intrusive<HopwiseWork>(getRank(), type, title, std::move(outputs));
}

int ProcessGroupHopwise::user_tag(int tag, const char* what) const {
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

std::function<void(std::exception_ptr)> on_success(std::function<void()> f) {
  return [f = std::move(f)](std::exception_ptr e) {
    if (!e && f) f();
  };
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupHopwise::allreduce(std::vector<at::Tensor>& tensors,
                                                              const c10d::AllreduceOptions& opts) {
  const at::Tensor& t = single(tensors, "allreduce");
  const ReducePlan plan = plan_reduce(t.scalar_type(), opts.reduceOp, "allreduce");
  const Staged s = stage(t, plan.wide);
  auto work = make_work(c10d::OpType::ALLREDUCE, "hopwise:all_reduce", tensors);
  std::function<void()> after;
  auto works = translated([&] { return start_allreduce(*comm_, s, plan, after); });
  complete_after(std::move(works), work, on_success(after));
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHopwise::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                        const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK_VALUE(!tensors.empty(), "hopwise: allreduce_coalesced needs at least one tensor");
  std::vector<at::Tensor> flat;
  for (const auto& t : tensors) {
    check_same(tensors[0], t, "allreduce_coalesced");
    flat.push_back(t.reshape({-1}));
  }
  (void)tensors[0].numel();
  const ReducePlan plan = plan_reduce(tensors[0].scalar_type(), opts.reduceOp, "allreduce_coalesced");
  at::Tensor joined = at::cat(flat);
  if (plan.wide != at::ScalarType::Undefined) joined = joined.to(plan.wide);
  const Staged s{joined, joined};
  auto work = make_work(c10d::OpType::ALLREDUCE_COALESCED, "hopwise:all_reduce_coalesced", tensors);
  std::function<void()> after;
  auto works = translated([&] { return start_allreduce(*comm_, s, plan, after); });
  complete_after(std::move(works), work, on_success([after, joined, tensors] {
                   after();
                   int64_t offset = 0;
                   for (const auto& t : tensors) {
                     at::Tensor dst = t;
                     dst.copy_(joined.narrow(0, offset, t.numel()).view(t.sizes()));
                     offset += t.numel();
                   }
                 }));
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHopwise::broadcast(std::vector<at::Tensor>& tensors,
                                                              const c10d::BroadcastOptions& opts) {
  const at::Tensor& t = single(tensors, "broadcast");
  const int root = static_cast<int>(opts.rootRank);
  const Staged s = stage(t, at::ScalarType::Undefined, getRank() == root);
  auto work = make_work(c10d::OpType::BROADCAST, "hopwise:broadcast", tensors);
  auto w = translated([&] { return comm_->broadcast_async(s.data(), s.bytes(), DataType::kUInt8, root); });
  complete_after({w}, work, on_success([s] { s.finish(); }));
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHopwise::reduce(std::vector<at::Tensor>& tensors,
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
  comm::Work w;
  std::function<void()> after;
  if (plan.way == ReducePlan::Way::kGatherFold) {
    auto gathered = at::empty({comm_->size(), in.buf.numel()}, in.buf.options());
    w = translated([&] { return comm_->allgather_async(in.data(), gathered.data_ptr(), in.bytes(), DataType::kUInt8); });
    after = [=] {
      if (!is_root) return;
      at::Tensor o = out;
      fold_bitwise(gathered, plan.torch_op, o);
      at::Tensor u = t;
      u.copy_(o);
    };
  } else {
    w = translated([&] { return comm_->reduce_async(in.data(), out.data_ptr(), in.count(), plan.dtype, plan.op, root); });
    after = [=] {
      if (!is_root) return;
      at::Tensor u = t;
      u.copy_(out);
    };
  }
  complete_after({w}, work, on_success([after, in] { after(); }));
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHopwise::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                              std::vector<at::Tensor>& inputs,
                                                              const c10d::AllgatherOptions&) {
  const at::Tensor& in = single(inputs, "allgather");
  TORCH_CHECK_VALUE(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
                    "hopwise: allgather needs one list of ", getSize(), " output tensors (one per rank)");
  for (const auto& o : outputs[0]) check_same(in, o, "allgather");
  const Staged s = stage(in);
  auto gathered = at::empty({getSize(), in.numel()}, in.options());
  auto work = make_work(c10d::OpType::ALLGATHER, "hopwise:all_gather", outputs[0]);
  auto w = translated([&] { return comm_->allgather_async(s.data(), gathered.data_ptr(), s.bytes(), DataType::kUInt8); });
  complete_after({w}, work, on_success([s, gathered, outs = outputs[0]] {
                   for (std::size_t r = 0; r < outs.size(); ++r) {
                     at::Tensor o = outs[r];
                     o.copy_(gathered[static_cast<int64_t>(r)].view(o.sizes()));
                   }
                 }));
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHopwise::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                    const c10d::AllgatherOptions&) {
  check_tensor(input, "_allgather_base");
  check_tensor(output, "_allgather_base");
  TORCH_CHECK_VALUE(output.scalar_type() == input.scalar_type() && output.numel() == input.numel() * getSize(),
                    "hopwise: _allgather_base needs an output of the input's dtype and ", getSize(),
                    " times its elements");
  const Staged in = stage(input), out = stage(output, at::ScalarType::Undefined, false);
  auto work = make_work(c10d::OpType::_ALLGATHER_BASE, "hopwise:_all_gather_base", as_list(output));
  auto w = translated([&] { return comm_->allgather_async(in.data(), out.data(), in.bytes(), DataType::kUInt8); });
  complete_after({w}, work, on_success([in, out] { out.finish(); }));
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHopwise::reduce_scatter(std::vector<at::Tensor>& outputs,
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

c10::intrusive_ptr<c10d::Work> ProcessGroupHopwise::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                         const c10d::ReduceScatterOptions& opts) {
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
    std::function<void()> after;
    auto works = translated([&] { return start_allreduce(*comm_, all, plan, after); });
    const int64_t n = output.numel(), me = getRank();
    complete_after(std::move(works), work, on_success([after, all, out, n, me] {
                     after();
                     out.buf.copy_(all.buf.reshape({-1}).narrow(0, me * n, n).view(out.buf.sizes()));
                     out.finish();
                   }));
    return work;
  }
  auto w = translated(
      [&] { return comm_->reduce_scatter_async(in.data(), out.data(), out.count(), plan.dtype, plan.op); });
  complete_after({w}, work, on_success([in, out] { out.finish(); }));
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHopwise::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::GatherOptions& opts) {
  const at::Tensor& in = single(inputs, "gather");
  const int root = static_cast<int>(opts.rootRank), me = getRank();
  std::vector<comm::Work> works;
  std::vector<Staged> outs;
  if (me == root) {
    TORCH_CHECK_VALUE(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
                      "hopwise: gather needs, on the root, one list of ", getSize(), " output tensors");
    for (const auto& o : outputs[0]) {
      check_same(in, o, "gather");
      outs.push_back(stage(o, at::ScalarType::Undefined, false));
    }
    outs[static_cast<std::size_t>(me)].buf.copy_(in);
  } else {
    TORCH_CHECK_VALUE(outputs.empty() || outputs[0].empty(), "hopwise: gather takes output tensors on the root only");
  }
  const Staged s = stage(in);
  translated([&] {
    if (me != root) {
      works.push_back(comm_->send_async(s.data(), s.bytes(), DataType::kUInt8, root, kGatherTag));
      return 0;
    }
    for (int q = 0; q < getSize(); ++q)
      if (q != me)
        works.push_back(comm_->recv_async(outs[static_cast<std::size_t>(q)].data(), s.bytes(), DataType::kUInt8, q,
                                          kGatherTag));
    return 0;
  });
  auto work = make_work(c10d::OpType::GATHER, "hopwise:gather", me == root ? outputs[0] : std::vector<at::Tensor>{});
  complete_after(std::move(works), work, on_success([s, outs] {
                   for (const auto& o : outs) o.finish();
                 }));
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHopwise::scatter(std::vector<at::Tensor>& outputs,
                                                            std::vector<std::vector<at::Tensor>>& inputs,
                                                            const c10d::ScatterOptions& opts) {
  const at::Tensor& out = single(outputs, "scatter");
  const int root = static_cast<int>(opts.rootRank), me = getRank();
  std::vector<Staged> ins;
  if (me == root) {
    TORCH_CHECK_VALUE(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
                      "hopwise: scatter needs, on the root, one list of ", getSize(), " input tensors");
    for (const auto& i : inputs[0]) {
      check_same(out, i, "scatter");
      ins.push_back(stage(i));
    }
  } else {
    TORCH_CHECK_VALUE(inputs.empty() || inputs[0].empty(), "hopwise: scatter takes input tensors on the root only");
  }
  const Staged o = stage(out, at::ScalarType::Undefined, false);
  std::vector<comm::Work> works;
  translated([&] {
    if (me != root) {
      works.push_back(comm_->recv_async(o.data(), o.bytes(), DataType::kUInt8, root, kScatterTag));
      return 0;
    }
    o.buf.copy_(ins[static_cast<std::size_t>(me)].buf);
    for (int q = 0; q < getSize(); ++q)
      if (q != me)
        works.push_back(comm_->send_async(ins[static_cast<std::size_t>(q)].data(), o.bytes(), DataType::kUInt8, q,
                                          kScatterTag));
    return 0;
  });
  auto work = make_work(c10d::OpType::SCATTER, "hopwise:scatter", outputs);
  complete_after(std::move(works), work, on_success([o, ins] { o.finish(); }));
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHopwise::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                  std::vector<int64_t>& output_splits,
                                                                  std::vector<int64_t>& input_splits,
                                                                  const c10d::AllToAllOptions&) {
  check_tensor(input, "alltoall_base");
  check_tensor(output, "alltoall_base");
  const int p = getSize(), me = getRank();
  TORCH_CHECK_VALUE(input.scalar_type() == output.scalar_type(), "hopwise: alltoall_base: input and output dtypes differ");
  // Splits count rows (the first dimension); none given: equal parts.
  auto rows_of = [&](const at::Tensor& t, std::vector<int64_t> splits, const char* which) {
    const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    if (splits.empty()) {
      TORCH_CHECK_VALUE(rows % p == 0, "hopwise: alltoall_base: the ", which, " has ", rows, " rows, not a multiple of ",
                        p, "; pass split sizes");
      splits.assign(static_cast<std::size_t>(p), rows / p);
    }
    TORCH_CHECK_VALUE(static_cast<int>(splits.size()) == p, "hopwise: alltoall_base: ", splits.size(), " ", which,
                      " split sizes for ", p, " ranks");
    TORCH_CHECK_VALUE(std::accumulate(splits.begin(), splits.end(), int64_t{0}) == rows,
                      "hopwise: alltoall_base: the ", which, " split sizes do not add up to its ", rows, " rows");
    return splits;
  };
  const auto in_rows = rows_of(input, input_splits, "input"), out_rows = rows_of(output, output_splits, "output");
  const int64_t row_bytes_in = input.dim() == 0 ? input.element_size() : input.numel() / std::max<int64_t>(1, input.size(0)) * input.element_size();
  const int64_t row_bytes_out = output.dim() == 0 ? output.element_size() : output.numel() / std::max<int64_t>(1, output.size(0)) * output.element_size();
  TORCH_CHECK_VALUE(row_bytes_in == row_bytes_out, "hopwise: alltoall_base: input and output rows differ in size");
  const Staged in = stage(input), out = stage(output, at::ScalarType::Undefined, false);
  auto* src = static_cast<char*>(in.data());
  auto* dst = static_cast<char*>(out.data());
  std::vector<int64_t> in_off(static_cast<std::size_t>(p) + 1, 0), out_off(static_cast<std::size_t>(p) + 1, 0);
  for (int q = 0; q < p; ++q) {
    in_off[static_cast<std::size_t>(q) + 1] = in_off[static_cast<std::size_t>(q)] + in_rows[static_cast<std::size_t>(q)];
    out_off[static_cast<std::size_t>(q) + 1] = out_off[static_cast<std::size_t>(q)] + out_rows[static_cast<std::size_t>(q)];
  }
  std::vector<comm::Work> works;
  translated([&] {
    for (int d = 1; d < p; ++d) {
      const int to = (me + d) % p, from = (me - d + p) % p;
      works.push_back(comm_->recv_async(dst + out_off[static_cast<std::size_t>(from)] * row_bytes_out,
                                        static_cast<std::size_t>(out_rows[static_cast<std::size_t>(from)] * row_bytes_out),
                                        DataType::kUInt8, from, kAlltoallTag));
      works.push_back(comm_->send_async(src + in_off[static_cast<std::size_t>(to)] * row_bytes_in,
                                        static_cast<std::size_t>(in_rows[static_cast<std::size_t>(to)] * row_bytes_in),
                                        DataType::kUInt8, to, kAlltoallTag));
    }
    return 0;
  });
  TORCH_CHECK_VALUE(in_rows[static_cast<std::size_t>(me)] == out_rows[static_cast<std::size_t>(me)],
                    "hopwise: alltoall_base: this rank sends itself ", in_rows[static_cast<std::size_t>(me)],
                    " rows but expects ", out_rows[static_cast<std::size_t>(me)]);
  std::memcpy(dst + out_off[static_cast<std::size_t>(me)] * row_bytes_out, src + in_off[static_cast<std::size_t>(me)] * row_bytes_in,
              static_cast<std::size_t>(in_rows[static_cast<std::size_t>(me)] * row_bytes_in));
  auto work = make_work(c10d::OpType::ALLTOALL_BASE, "hopwise:all_to_all", as_list(output));
  complete_after(std::move(works), work, on_success([in, out] { out.finish(); }));
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHopwise::alltoall(std::vector<at::Tensor>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllToAllOptions&) {
  const int p = getSize(), me = getRank();
  TORCH_CHECK_VALUE(static_cast<int>(inputs.size()) == p && static_cast<int>(outputs.size()) == p,
                    "hopwise: alltoall needs ", p, " input and ", p, " output tensors (one per rank)");
  std::vector<Staged> ins, outs;
  for (int q = 0; q < p; ++q) {
    check_tensor(inputs[static_cast<std::size_t>(q)], "alltoall");
    check_tensor(outputs[static_cast<std::size_t>(q)], "alltoall");
    TORCH_CHECK_VALUE(inputs[static_cast<std::size_t>(q)].scalar_type() == outputs[static_cast<std::size_t>(q)].scalar_type(),
                      "hopwise: alltoall: input and output dtypes differ");
    ins.push_back(stage(inputs[static_cast<std::size_t>(q)]));
    outs.push_back(stage(outputs[static_cast<std::size_t>(q)], at::ScalarType::Undefined, false));
  }
  TORCH_CHECK_VALUE(ins[static_cast<std::size_t>(me)].bytes() == outs[static_cast<std::size_t>(me)].bytes(),
                    "hopwise: alltoall: this rank's own input and output differ in size");
  outs[static_cast<std::size_t>(me)].buf.copy_(ins[static_cast<std::size_t>(me)].buf.view(outs[static_cast<std::size_t>(me)].buf.sizes()));
  std::vector<comm::Work> works;
  translated([&] {
    for (int d = 1; d < p; ++d) {
      const int to = (me + d) % p, from = (me - d + p) % p;
      const auto& o = outs[static_cast<std::size_t>(from)];
      const auto& i = ins[static_cast<std::size_t>(to)];
      works.push_back(comm_->recv_async(o.data(), o.bytes(), DataType::kUInt8, from, kAlltoallTag));
      works.push_back(comm_->send_async(i.data(), i.bytes(), DataType::kUInt8, to, kAlltoallTag));
    }
    return 0;
  });
  auto work = make_work(c10d::OpType::ALLTOALL, "hopwise:all_to_all", outputs);
  complete_after(std::move(works), work, on_success([ins, outs] {
                   for (const auto& o : outs) o.finish();
                 }));
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHopwise::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  const at::Tensor& t = single(tensors, "send");
  const Staged s = stage(t);
  auto work = make_work(c10d::OpType::SEND, "hopwise:send", tensors);
  auto w = translated([&] { return comm_->send_async(s.data(), s.bytes(), DataType::kUInt8, dst, user_tag(tag, "send")); });
  complete_after({w}, work, on_success([s] {}));
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHopwise::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  const at::Tensor& t = single(tensors, "recv");
  user_tag(tag, "recv");
  auto work = make_work(c10d::OpType::RECV, "hopwise:recv", tensors);
  work->set_source_rank(src);
  {
    std::lock_guard lock(stash_mutex_);
    auto it = stash_.find({src, tag});
    if (it != stash_.end() && !it->second.empty()) {  // a recvAnysource took it earlier
      at::Tensor payload = it->second.front();
      it->second.pop_front();
      TORCH_CHECK_VALUE(payload.numel() == t.numel() * static_cast<int64_t>(t.element_size()),
                        "hopwise: recv: the message from rank ", src, " has ", payload.numel(), " bytes, the tensor ",
                        t.numel() * t.element_size());
      at::Tensor u = t;
      u.copy_(payload.view(t.scalar_type()).view(t.sizes()));
      complete_after({}, work);
      return work;
    }
  }
  const Staged s = stage(t, at::ScalarType::Undefined, false);
  auto w = translated([&] { return comm_->recv_async(s.data(), s.bytes(), DataType::kUInt8, src, tag); });
  complete_after({w}, work, on_success([s] { s.finish(); }));
  return work;
}

// Receives from whichever rank sends first: a receive from every peer, polled; the first to complete wins and the
// others are withdrawn; one that completed meanwhile is kept for the next receive from its rank.
c10::intrusive_ptr<c10d::Work> ProcessGroupHopwise::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  const at::Tensor& t = single(tensors, "recvAnysource");
  user_tag(tag, "recvAnysource");
  auto work = make_work(c10d::OpType::RECVANYSOURCE, "hopwise:recv_anysource", tensors);
  const std::size_t bytes = static_cast<std::size_t>(t.numel()) * t.element_size();
  {
    std::lock_guard lock(stash_mutex_);
    for (auto& [key, q] : stash_)
      if (key.second == tag && !q.empty()) {
        at::Tensor u = t;
        u.copy_(q.front().view(t.scalar_type()).view(t.sizes()));
        q.pop_front();
        work->set_source_rank(key.first);
        complete_after({}, work);
        return work;
      }
  }
  const Staged s = stage(t, at::ScalarType::Undefined, false);
  comm::Transport& tr = comm_->transport();
  const int p = getSize(), me = getRank();
  auto bufs = std::make_shared<std::vector<at::Tensor>>();
  auto reqs = std::make_shared<std::vector<comm::Request>>(static_cast<std::size_t>(p));
  translated([&] {
    for (int q = 0; q < p; ++q) {
      bufs->push_back(at::empty({static_cast<int64_t>(bytes)}, t.options().dtype(at::kByte)));
      if (q != me) (*reqs)[static_cast<std::size_t>(q)] = tr.irecv(bufs->back().data_ptr(), bytes, q, tag);
    }
    return 0;
  });
  const double timeout_s = tr.timeout().count();
  run_detached([this, &tr, s, work, bufs, reqs, p, me, tag, timeout_s] {
    std::exception_ptr error;
    try {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
      int from = -1;
      while (from < 0) {
        for (int q = 0; q < p && from < 0; ++q)
          if (q != me && tr.test((*reqs)[static_cast<std::size_t>(q)])) from = q;
        if (from >= 0) break;
        if (std::chrono::steady_clock::now() > deadline)
          throw TimeoutError(fmt::format("hopwise: rank {}: recvAnysource(tag={}) got nothing within {:.0f} s", me, tag,
                                         timeout_s),
                             {});
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      for (int q = 0; q < p; ++q) {
        auto& r = (*reqs)[static_cast<std::size_t>(q)];
        if (q == me || q == from || !r.active) continue;
        if (tr.test(r)) {
          std::lock_guard lock(stash_mutex_);
          stash_[{q, tag}].push_back((*bufs)[static_cast<std::size_t>(q)]);
        } else {
          tr.cancel(r);
        }
      }
      s.buf.view(at::kByte).reshape({-1}).copy_((*bufs)[static_cast<std::size_t>(from)]);
      s.finish();
      work->set_source_rank(from);
    } catch (...) {
      error = std::current_exception();
    }
    work->complete(error);
  });
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHopwise::barrier(const c10d::BarrierOptions&) {
  auto work = make_work(c10d::OpType::BARRIER, "hopwise:barrier", {});
  auto w = translated([&] { return comm_->barrier_async(); });
  complete_after({w}, work);
  return work;
}

}  // namespace hopwise::torch_backend
