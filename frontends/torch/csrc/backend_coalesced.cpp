// The collectives torch 2.x hands a backend several tensors at once (allgather_coalesced, the tensor-coalesced
// allgather and reduce-scatter of FSDP and _coalescing_manager), each one hopwise call over the tensors joined, and
// allreduce of sparse COO tensors (embedding gradients): every rank's indices and values gathered and summed.
#include <fmt/core.h>

#include <c10/util/Exception.h>

#include "backend.h"
#include "tensors.h"
#include "translate.h"

namespace hopwise::torch_backend {

namespace {

// A tensor's bytes as a flat uint8 tensor (a view when it is contiguous, else a copy).
at::Tensor bytes_of(const at::Tensor& t) { return t.contiguous().reshape({-1}).view(at::kByte); }

int64_t byte_count(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// Gathers `inputs` (any dtypes) from every rank in one call: row r of the result holds rank r's inputs' bytes,
// one after another.
struct JoinedGather {
  std::vector<int64_t> offsets;  // of input i within a row
  at::Tensor joined, gathered;
};

JoinedGather join_for_gather(const std::vector<at::Tensor>& inputs, int p) {
  JoinedGather j;
  std::vector<at::Tensor> parts;
  int64_t total = 0;
  for (const auto& in : inputs) {
    j.offsets.push_back(total);
    parts.push_back(bytes_of(in));
    total += byte_count(in);
  }
  j.joined = parts.empty() ? at::empty({0}, at::kByte) : at::cat(parts);
  j.gathered = at::empty({p, total}, at::kByte);
  return j;
}

comm::Work start_gather(comm::Communicator& c, const JoinedGather& j) {
  return c.allgather_async(j.joined.data_ptr(), j.gathered.data_ptr(), static_cast<std::size_t>(j.joined.numel()),
                           DataType::kUInt8);
}

}  // namespace

// torch's layout (dist.all_gather_coalesced): outputs[r][i] receives rank r's input i, one list per rank.
c10::intrusive_ptr<c10d::Work> HopwiseBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                   std::vector<at::Tensor>& inputs,
                                                                   const c10d::AllgatherOptions&) {
  const int p = getSize();
  TORCH_CHECK_VALUE(static_cast<int>(outputs.size()) == p, "hopwise: allgather_coalesced: ", outputs.size(),
                    " output lists for ", p,
                    " ranks; give one list per rank (output_tensor_lists[rank][i] receives "
                    "that rank's input i)");
  for (const auto& in : inputs) check_tensor(in, "allgather_coalesced");
  std::vector<at::Tensor> flat_outputs;
  for (int r = 0; r < p; ++r) {
    const auto& list = outputs[static_cast<std::size_t>(r)];
    TORCH_CHECK_VALUE(list.size() == inputs.size(), "hopwise: allgather_coalesced: output list ", r, " (rank ", r,
                      "'s) has ", list.size(), " tensors for ", inputs.size(), " inputs; give one per input");
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      check_same(inputs[i], list[i], "allgather_coalesced");
      flat_outputs.push_back(list[i]);
    }
  }
  auto j = std::make_shared<JoinedGather>(join_for_gather(inputs, p));
  auto work = make_work(c10d::OpType::ALLGATHER_COALESCED, "hopwise:all_gather_coalesced", flat_outputs);
  seq_.launch(
      work, [this, j] { return std::vector{translated([&] { return start_gather(*comm_, *j); })}; },
      on_success([j, outputs] {
        for (std::size_t r = 0; r < outputs.size(); ++r)
          for (std::size_t i = 0; i < outputs[r].size(); ++i) {
            at::Tensor o = outputs[r][i];
            if (o.numel() == 0) continue;
            const auto part = j->gathered[static_cast<int64_t>(r)].narrow(0, j->offsets[i], byte_count(o));
            o.copy_(part.view(o.scalar_type()).view(o.sizes()));
          }
      }));
  return work;
}

c10::intrusive_ptr<c10d::Work> HopwiseBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                               std::vector<at::Tensor>& inputs,
                                                                               const c10d::AllgatherOptions&) {
  const int p = getSize();
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "hopwise: allgather_into_tensor_coalesced: ", inputs.size(),
                    " inputs but ", outputs.size(), " outputs");
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    check_tensor(inputs[i], "allgather_into_tensor_coalesced");
    check_tensor(outputs[i], "allgather_into_tensor_coalesced");
    TORCH_CHECK_VALUE(
        outputs[i].scalar_type() == inputs[i].scalar_type() && outputs[i].numel() == inputs[i].numel() * p,
        "hopwise: allgather_into_tensor_coalesced: output ", i, " needs input ", i, "'s dtype and ", p,
        " times its elements");
  }
  auto j = std::make_shared<JoinedGather>(join_for_gather(inputs, p));
  auto work = make_work(c10d::OpType::COALESCED, "hopwise:all_gather_into_tensor_coalesced", outputs);
  seq_.launch(
      work, [this, j] { return std::vector{translated([&] { return start_gather(*comm_, *j); })}; },
      on_success([j, outputs, p] {
        for (std::size_t i = 0; i < outputs.size(); ++i) {
          const int64_t n = byte_count(outputs[i]) / p;
          at::Tensor staged = at::empty({p, n}, at::kByte);
          for (int r = 0; r < p; ++r) staged[r].copy_(j->gathered[r].narrow(0, j->offsets[i], n));
          at::Tensor o = outputs[i];
          o.copy_(staged.reshape({-1}).view(o.scalar_type()).view(o.sizes()));
        }
      }));
  return work;
}

c10::intrusive_ptr<c10d::Work> HopwiseBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                               std::vector<at::Tensor>& inputs,
                                                                               const c10d::ReduceScatterOptions& opts) {
  const int p = getSize();
  TORCH_CHECK_VALUE(!inputs.empty() && outputs.size() == inputs.size(),
                    "hopwise: reduce_scatter_tensor_coalesced: ", inputs.size(), " inputs and ", outputs.size(),
                    " outputs; give one output per input (at least one)");
  // Joined rank-major: rank r's block holds its part of every input, so one reduce-scatter gives each rank its
  // parts of all of them.
  std::vector<at::Tensor> blocks;
  int64_t per_rank = 0;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    check_tensor(inputs[i], "reduce_scatter_tensor_coalesced");
    check_tensor(outputs[i], "reduce_scatter_tensor_coalesced");
    TORCH_CHECK_VALUE(
        inputs[i].scalar_type() == inputs[0].scalar_type() && outputs[i].scalar_type() == inputs[0].scalar_type(),
        "hopwise: reduce_scatter_tensor_coalesced: tensors of several dtypes; coalesce one dtype");
    TORCH_CHECK_VALUE(inputs[i].numel() == outputs[i].numel() * p, "hopwise: reduce_scatter_tensor_coalesced: input ",
                      i, " needs ", p, " times output ", i, "'s elements");
    per_rank += outputs[i].numel();
  }
  for (int r = 0; r < p; ++r)
    for (std::size_t i = 0; i < inputs.size(); ++i)
      blocks.push_back(inputs[i].reshape({-1}).narrow(0, r * outputs[i].numel(), outputs[i].numel()));
  at::Tensor joined_in = at::cat(blocks);
  at::Tensor joined_out = at::empty({per_rank}, joined_in.options());
  auto part = _reduce_scatter_base(joined_out, joined_in, opts);
  auto work = make_work(c10d::OpType::COALESCED, "hopwise:reduce_scatter_tensor_coalesced", outputs);
  complete_after(std::vector<c10::intrusive_ptr<c10d::Work>>{part}, work, on_success([joined_out, outputs] {
                   int64_t offset = 0;
                   for (const auto& o : outputs) {
                     at::Tensor dst = o;
                     dst.copy_(joined_out.narrow(0, offset, o.numel()).view(o.sizes()));
                     offset += o.numel();
                   }
                 }));
  return work;
}

c10::intrusive_ptr<c10d::Work> HopwiseBackend::allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                                const c10d::AllreduceOptions& opts) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "hopwise: allreduce takes one tensor per rank, got ", tensors.size());
  const at::Tensor& t = tensors[0];
  TORCH_CHECK_VALUE(t.defined() && t.layout() == at::kSparse, "hopwise: allreduce_sparse takes a sparse COO tensor");
  TORCH_CHECK_VALUE(t.device().is_cpu(), "hopwise: allreduce of a sparse tensor on ", t.device().str(),
                    ": sparse tensors go through hopwise on the CPU only");
  const auto op = opts.reduceOp.op_;
  TORCH_CHECK_VALUE(op == c10d::ReduceOp::SUM || op == c10d::ReduceOp::AVG, "hopwise: allreduce of a sparse tensor ",
                    "with ", op_name(op), ": sparse tensors sum (SUM) or average (AVG); make it dense for other ops");
  TORCH_CHECK_VALUE(op != c10d::ReduceOp::AVG || at::isFloatingType(t.scalar_type()), "hopwise: AVG of a sparse ",
                    c10::toString(t.scalar_type()), " tensor would truncate; use SUM");
  const int p = getSize();
  const at::Tensor local = t.coalesce();
  struct Gathered {
    at::Tensor counts, indices, values;
    at::Tensor sent_indices, sent_values;  // alive until the gathers are done
  };
  auto g = std::make_shared<Gathered>();
  auto work = make_work(c10d::OpType::ALLREDUCE, "hopwise:all_reduce_sparse", tensors);
  // Every rank's count of entries first (a small call waited for here), then indices and values padded to the
  // largest count, in two gathers.
  auto start = [this, g, local, p] {
    return translated([&] {
      const int64_t nnz = local._nnz();
      g->counts = at::empty({p}, at::kLong);
      comm_->allgather_async(&nnz, g->counts.data_ptr(), 1, DataType::kInt64).wait();
      const int64_t most = g->counts.max().item<int64_t>();
      const at::Tensor idx = local.indices(), val = local.values();
      at::Tensor idx_out = at::zeros({idx.size(0), most}, idx.options());
      idx_out.narrow(1, 0, nnz).copy_(idx);
      auto val_shape = val.sizes().vec();
      val_shape[0] = most;
      at::Tensor val_out = at::zeros(val_shape, val.options());
      val_out.narrow(0, 0, nnz).copy_(val);
      auto idx_shape = idx_out.sizes().vec();
      idx_shape.insert(idx_shape.begin(), p);
      val_shape.insert(val_shape.begin(), p);
      g->indices = at::empty(idx_shape, idx.options());
      g->values = at::empty(val_shape, val.options());
      g->sent_indices = idx_out;
      g->sent_values = val_out;
      auto w1 = comm_->allgather_async(idx_out.data_ptr(), g->indices.data_ptr(),
                                       static_cast<std::size_t>(byte_count(idx_out)), DataType::kUInt8);
      auto w2 = comm_->allgather_async(val_out.data_ptr(), g->values.data_ptr(),
                                       static_cast<std::size_t>(byte_count(val_out)), DataType::kUInt8);
      return std::vector{w1, w2};
    });
  };
  seq_.launch(work, start, on_success([g, t, op, p] {
                std::vector<at::Tensor> idx, val;
                for (int r = 0; r < p; ++r) {
                  const int64_t n = g->counts[r].item<int64_t>();
                  idx.push_back(g->indices[r].narrow(1, 0, n));
                  val.push_back(g->values[r].narrow(0, 0, n));
                }
                at::Tensor sum = at::sparse_coo_tensor(at::cat(idx, 1), at::cat(val, 0), t.sizes()).coalesce();
                if (op == c10d::ReduceOp::AVG) sum = sum.div(p);
                at::Tensor u = t;
                u.copy_(sum);
              }));
  return work;
}

}  // namespace hopwise::torch_backend
