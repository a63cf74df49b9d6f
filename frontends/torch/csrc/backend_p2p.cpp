// The backend's point-to-point calls, and the collectives torch has that hopwise builds from them (gather,
// scatter, alltoall).
#include <fmt/core.h>

#include <cstring>
#include <numeric>
#include <thread>

#include <c10/util/Exception.h>

#include "backend.h"
#include "hopwise/common/error.h"
#include "tensors.h"
#include "translate.h"

namespace hopwise::torch_backend {

namespace {

constexpr int kGatherTag = kFirstBackendTag, kScatterTag = kFirstBackendTag + 1, kAlltoallTag = kFirstBackendTag + 2;

}  // namespace

c10::intrusive_ptr<c10d::Work> HopwiseBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
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
        works.push_back(
            comm_->recv_async(outs[static_cast<std::size_t>(q)].data(), s.bytes(), DataType::kUInt8, q, kGatherTag));
    return 0;
  });
  auto work = make_work(c10d::OpType::GATHER, "hopwise:gather", me == root ? outputs[0] : std::vector<at::Tensor>{});
  complete_after(std::move(works), work, on_success([s, outs] {
                   for (const auto& o : outs) o.finish();
                 }));
  return work;
}

c10::intrusive_ptr<c10d::Work> HopwiseBackend::scatter(std::vector<at::Tensor>& outputs,
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
        works.push_back(
            comm_->send_async(ins[static_cast<std::size_t>(q)].data(), o.bytes(), DataType::kUInt8, q, kScatterTag));
    return 0;
  });
  auto work = make_work(c10d::OpType::SCATTER, "hopwise:scatter", outputs);
  complete_after(std::move(works), work, on_success([o, ins] { o.finish(); }));
  return work;
}

c10::intrusive_ptr<c10d::Work> HopwiseBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                             std::vector<int64_t>& output_splits,
                                                             std::vector<int64_t>& input_splits,
                                                             const c10d::AllToAllOptions&) {
  check_tensor(input, "alltoall_base");
  check_tensor(output, "alltoall_base");
  const int p = getSize(), me = getRank();
  TORCH_CHECK_VALUE(input.scalar_type() == output.scalar_type(),
                    "hopwise: alltoall_base: input and output dtypes differ");
  // Splits count rows (the first dimension); none given: equal parts.
  auto rows_of = [&](const at::Tensor& t, std::vector<int64_t> splits, const char* which) {
    const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    if (splits.empty()) {
      TORCH_CHECK_VALUE(rows % p == 0, "hopwise: alltoall_base: the ", which, " has ", rows,
                        " rows, not a multiple of ", p, "; pass split sizes");
      splits.assign(static_cast<std::size_t>(p), rows / p);
    }
    TORCH_CHECK_VALUE(static_cast<int>(splits.size()) == p, "hopwise: alltoall_base: ", splits.size(), " ", which,
                      " split sizes for ", p, " ranks");
    TORCH_CHECK_VALUE(std::accumulate(splits.begin(), splits.end(), int64_t{0}) == rows, "hopwise: alltoall_base: the ",
                      which, " split sizes do not add up to its ", rows, " rows");
    return splits;
  };
  const auto in_rows = rows_of(input, input_splits, "input"), out_rows = rows_of(output, output_splits, "output");
  const int64_t row_bytes_in = input.dim() == 0
                                   ? input.element_size()
                                   : input.numel() / std::max<int64_t>(1, input.size(0)) * input.element_size();
  const int64_t row_bytes_out = output.dim() == 0
                                    ? output.element_size()
                                    : output.numel() / std::max<int64_t>(1, output.size(0)) * output.element_size();
  TORCH_CHECK_VALUE(row_bytes_in == row_bytes_out, "hopwise: alltoall_base: input and output rows differ in size");
  const Staged in = stage(input), out = stage(output, at::ScalarType::Undefined, false);
  auto* src = static_cast<char*>(in.data());
  auto* dst = static_cast<char*>(out.data());
  std::vector<int64_t> in_off(static_cast<std::size_t>(p) + 1, 0), out_off(static_cast<std::size_t>(p) + 1, 0);
  for (int q = 0; q < p; ++q) {
    in_off[static_cast<std::size_t>(q) + 1] =
        in_off[static_cast<std::size_t>(q)] + in_rows[static_cast<std::size_t>(q)];
    out_off[static_cast<std::size_t>(q) + 1] =
        out_off[static_cast<std::size_t>(q)] + out_rows[static_cast<std::size_t>(q)];
  }
  std::vector<comm::Work> works;
  translated([&] {
    for (int d = 1; d < p; ++d) {
      const int to = (me + d) % p, from = (me - d + p) % p;
      works.push_back(
          comm_->recv_async(dst + out_off[static_cast<std::size_t>(from)] * row_bytes_out,
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
  std::memcpy(dst + out_off[static_cast<std::size_t>(me)] * row_bytes_out,
              src + in_off[static_cast<std::size_t>(me)] * row_bytes_in,
              static_cast<std::size_t>(in_rows[static_cast<std::size_t>(me)] * row_bytes_in));
  auto work = make_work(c10d::OpType::ALLTOALL_BASE, "hopwise:all_to_all", as_list(output));
  complete_after(std::move(works), work, on_success([in, out] { out.finish(); }));
  return work;
}

c10::intrusive_ptr<c10d::Work> HopwiseBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                        std::vector<at::Tensor>& inputs, const c10d::AllToAllOptions&) {
  const int p = getSize(), me = getRank();
  TORCH_CHECK_VALUE(static_cast<int>(inputs.size()) == p && static_cast<int>(outputs.size()) == p,
                    "hopwise: alltoall needs ", p, " input and ", p, " output tensors (one per rank)");
  std::vector<Staged> ins, outs;
  for (int q = 0; q < p; ++q) {
    check_tensor(inputs[static_cast<std::size_t>(q)], "alltoall");
    check_tensor(outputs[static_cast<std::size_t>(q)], "alltoall");
    TORCH_CHECK_VALUE(
        inputs[static_cast<std::size_t>(q)].scalar_type() == outputs[static_cast<std::size_t>(q)].scalar_type(),
        "hopwise: alltoall: input and output dtypes differ");
    ins.push_back(stage(inputs[static_cast<std::size_t>(q)]));
    outs.push_back(stage(outputs[static_cast<std::size_t>(q)], at::ScalarType::Undefined, false));
  }
  TORCH_CHECK_VALUE(ins[static_cast<std::size_t>(me)].bytes() == outs[static_cast<std::size_t>(me)].bytes(),
                    "hopwise: alltoall: this rank's own input and output differ in size");
  outs[static_cast<std::size_t>(me)].buf.copy_(
      ins[static_cast<std::size_t>(me)].buf.view(outs[static_cast<std::size_t>(me)].buf.sizes()));
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

c10::intrusive_ptr<c10d::Work> HopwiseBackend::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  const at::Tensor& t = single(tensors, "send");
  const Staged s = stage(t);
  const int checked_tag = user_tag(tag, "send");
  auto w = translated([&] { return comm_->send_async(s.data(), s.bytes(), DataType::kUInt8, dst, checked_tag); });
  auto work = make_work(c10d::OpType::SEND, "hopwise:send", tensors);
  complete_after({w}, work, on_success([s] {}));
  return work;
}

c10::intrusive_ptr<c10d::Work> HopwiseBackend::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  const at::Tensor& t = single(tensors, "recv");
  user_tag(tag, "recv");
  const Staged s = stage(t, at::ScalarType::Undefined, false);
  auto w = translated([&] { return comm_->recv_async(s.data(), s.bytes(), DataType::kUInt8, src, tag); });
  auto work = make_work(c10d::OpType::RECV, "hopwise:recv", tensors);
  work->set_source_rank(src);
  complete_after({w}, work, on_success([s] { s.finish(); }));
  return work;
}

// Receives from whichever rank sends first: the transport is asked which rank's message with this tag has
// arrived (nothing is received by that), then a receive from that rank takes it. No receive is ever posted and
// withdrawn, which could lose a message it matched meanwhile.
c10::intrusive_ptr<c10d::Work> HopwiseBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  const at::Tensor& t = single(tensors, "recvAnysource");
  user_tag(tag, "recvAnysource");
  TORCH_CHECK_VALUE(getSize() > 1, "hopwise: recvAnysource in a group of one rank would wait forever");
  TORCH_CHECK(comm_->transport().has_probe(), "hopwise: recvAnysource needs a transport that can probe; ",
              comm_->transport().name(), " cannot");
  auto work = make_work(c10d::OpType::RECVANYSOURCE, "hopwise:recv_anysource", tensors);
  const Staged s = stage(t, at::ScalarType::Undefined, false);
  run_detached([this, s, tag, work] {
    std::exception_ptr error;
    try {
      comm::Transport& tr = comm_->transport();
      const auto deadline = std::chrono::steady_clock::now() + tr.timeout();
      comm::Work w;
      {
        // One at a time from probe to posting: two calls must not both take the one message they saw.
        std::lock_guard lock(anysource_mutex_);
        std::optional<int> src;
        while (!(src = tr.probe_any(tag))) {
          if (std::chrono::steady_clock::now() > deadline)
            throw TimeoutError(fmt::format("hopwise: rank {}: recvAnysource(tag={}) got nothing within {:.0f} s",
                                           getRank(), tag, tr.timeout().count()),
                               {});
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
        work->set_source_rank(*src);
        w = comm_->recv_async(s.data(), s.bytes(), DataType::kUInt8, *src, tag);
      }
      w.wait();
      s.finish();
    } catch (...) {
      error = std::current_exception();
    }
    work->complete(error);
  });
  return work;
}

}  // namespace hopwise::torch_backend
