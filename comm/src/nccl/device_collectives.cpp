// The DeviceCommunicator's calls: each checks its arguments (call_checks.h where the host checks the same thing;
// device pointers with cuda::check_device_pointer), then enqueues its NCCL call, or the ring, on the stream
// through Impl::run. Sync calls are the async call plus a host wait.
#include <fmt/core.h>

#include <algorithm>
#include <cstdint>

#include "../call_checks.h"
#include "device_impl.h"
#include "hopwise/common/cuda_reduce.h"
#include "hopwise/common/error.h"

namespace hopwise::comm {

using Impl = detail::DeviceCommunicatorImpl;

namespace {

std::string describe(std::string_view name, std::size_t count, DataType dt) {
  return fmt::format("{} of {} {}", name, count, to_string(dt));
}

}  // namespace

// ---- what the calls enqueue (count 0: nothing to do on any rank) ----
void Impl::scale_down(DataType dt, void* x, std::size_t n) {
  if (size > 1) cuda::scale(dt, x, 1.0 / size, n, stream);
}

void Impl::native_allreduce(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op,
                            const std::string& what) {
  if (count == 0) return;
  settle(ncclAllReduce(in, out, count, nccl_dtype(dt), nccl_op(op, size), comm, stream), what);
}

void Impl::reduce_scatter(const void* in, void* out, std::size_t recvcount, DataType dt, ReduceOp op,
                          const std::string& what) {
  if (recvcount == 0) return;
  const std::size_t bytes = recvcount * dtype_size(dt), total = bytes * static_cast<std::size_t>(size);
  const auto i = reinterpret_cast<std::uintptr_t>(in), o = reinterpret_cast<std::uintptr_t>(out);
  const bool nccl_in_place = o == i + static_cast<std::size_t>(rank) * bytes;
  const bool overlap = o < i + total && i < o + bytes;
  if (overlap && !nccl_in_place) {  // e.g. out == in: reduce into a staging buffer, then copy
    void* tmp = grow(stage, bytes, what);
    settle(ncclReduceScatter(in, tmp, recvcount, nccl_dtype(dt), nccl_op(op, size), comm, stream), what);
    cuda::check(cudaMemcpyAsync(out, tmp, bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync", rank);
  } else {
    settle(ncclReduceScatter(in, out, recvcount, nccl_dtype(dt), nccl_op(op, size), comm, stream), what);
  }
}

void Impl::allgather(const void* in, void* out, std::size_t sendcount, DataType dt, const std::string& what) {
  if (sendcount == 0) return;
  const std::size_t bytes = sendcount * dtype_size(dt), total = bytes * static_cast<std::size_t>(size);
  const auto i = reinterpret_cast<std::uintptr_t>(in), o = reinterpret_cast<std::uintptr_t>(out);
  const bool nccl_in_place = i == o + static_cast<std::size_t>(rank) * bytes;
  const bool overlap = i < o + total && o < i + bytes;
  if (overlap && !nccl_in_place) {  // stage the input where the output would overwrite it
    void* tmp = grow(stage, bytes, what);
    cuda::check(cudaMemcpyAsync(tmp, in, bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync", rank);
    in = tmp;
  }
  settle(ncclAllGather(in, out, sendcount, nccl_dtype(dt), comm, stream), what);
}

// ---- argument checks ----
void Impl::check_ptr(const void* p, std::size_t count, std::string_view what, std::string_view arg) const {
  cuda::check_device_pointer(p, count, fmt::format("rank {}: {}", rank, what), arg, device,
                             "hopwise::comm::Communicator");
}

void Impl::check_peer(int r, std::string_view what, std::string_view arg) const {
  if (r < 0 || r >= size)
    throw InvalidArgument(
        fmt::format("rank {}: {}: {} {} is out of range; use a rank in 0..{}", rank, what, arg, r, size - 1));
}

std::size_t Impl::times_size(std::size_t count, DataType dt, std::string_view what) const {
  const std::size_t total = checks::times_ranks(what, count, size, rank);
  checked_bytes(total, dt, what);
  return total;
}

// ---- the calls ----
DeviceWork DeviceCommunicator::allreduce_async(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op,
                                               void* stream) {
  Impl& m = *impl_;
  check_op_supported(dt, op);
  const std::size_t bytes = checked_bytes(count, dt, "allreduce");
  m.check_ptr(in, count, "allreduce", "input buffer");
  m.check_ptr(out, count, "allreduce", "output buffer");
  // In place (in == out) is fine; partly overlapping buffers have no defined result in NCCL or the ring's copies.
  const auto* a = static_cast<const char*>(in);
  const auto* b = static_cast<const char*>(out);
  if (in != out && bytes > 0 && a < b + bytes && b < a + bytes)
    throw InvalidArgument(
        fmt::format("rank {}: allreduce input and output overlap without being the same buffer; "
                    "pass in == out for in place, or separate buffers",
                    m.rank));
  const DeviceAlgorithm algo = m.algorithm;
  return m.run(fmt::format("{} ({})", describe("allreduce", count, dt), to_string(algo)), stream, bytes,
               [&](const std::string& what) {
                 if (algo == DeviceAlgorithm::kRing)
                   m.ring_allreduce(in, out, count, dt, op, what);
                 else
                   m.native_allreduce(in, out, count, dt, op, what);
               });
}

DeviceWork DeviceCommunicator::reduce_scatter_async(const void* in, void* out, std::size_t recvcount, DataType dt,
                                                    ReduceOp op, void* stream) {
  Impl& m = *impl_;
  check_op_supported(dt, op);
  const std::size_t total = m.times_size(recvcount, dt, "reduce_scatter");
  m.check_ptr(in, total, "reduce_scatter", "input buffer");
  m.check_ptr(out, recvcount, "reduce_scatter", "output buffer");
  return m.run(describe("reduce_scatter", recvcount, dt) + " per rank", stream, total * dtype_size(dt),
               [&](const std::string& what) { m.reduce_scatter(in, out, recvcount, dt, op, what); });
}

DeviceWork DeviceCommunicator::allgather_async(const void* in, void* out, std::size_t sendcount, DataType dt,
                                               void* stream) {
  Impl& m = *impl_;
  const std::size_t total = m.times_size(sendcount, dt, "allgather");
  m.check_ptr(in, sendcount, "allgather", "input buffer");
  m.check_ptr(out, total, "allgather", "output buffer");
  return m.run(describe("allgather", sendcount, dt) + " per rank", stream, total * dtype_size(dt),
               [&](const std::string& what) { m.allgather(in, out, sendcount, dt, what); });
}

DeviceWork DeviceCommunicator::broadcast_async(void* buf, std::size_t count, DataType dt, int root, void* stream) {
  Impl& m = *impl_;
  checks::root(fmt::format("rank {}: broadcast", m.rank), root, m.size);
  const std::size_t bytes = checked_bytes(count, dt, "broadcast");
  m.check_ptr(buf, count, "broadcast", "buffer");
  return m.run(fmt::format("{} from root {}", describe("broadcast", count, dt), root), stream, bytes,
               [&](const std::string& what) {
                 if (count > 0) m.settle(ncclBroadcast(buf, buf, count, nccl_dtype(dt), root, m.comm, m.stream), what);
               });
}

DeviceWork DeviceCommunicator::reduce_async(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op,
                                            int root, void* stream) {
  Impl& m = *impl_;
  check_op_supported(dt, op);
  checks::root(fmt::format("rank {}: reduce", m.rank), root, m.size);
  const std::size_t bytes = checked_bytes(count, dt, "reduce");
  m.check_ptr(in, count, "reduce", "input buffer");
  if (m.rank == root) m.check_ptr(out, count, "reduce", "output buffer (at the root)");
  return m.run(
      fmt::format("{} to root {}", describe("reduce", count, dt), root), stream, bytes, [&](const std::string& what) {
        if (count > 0)  // NCCL reads recvbuff at the root only
          m.settle(ncclReduce(in, out, count, nccl_dtype(dt), nccl_op(op, m.size), root, m.comm, m.stream), what);
      });
}

DeviceWork DeviceCommunicator::barrier_async() {
  Impl& m = *impl_;
  // A one-element allreduce that depends on nothing but the communicator's own stream.
  return m.run("barrier", m.stream, 0, [&](const std::string& what) {
    void* b = m.grow(m.barrier_buf, sizeof(std::int32_t), what);
    m.settle(ncclAllReduce(b, b, 1, ncclInt32, ncclSum, m.comm, m.stream), what);
  });
}

DeviceWork DeviceCommunicator::send_async(const void* buf, std::size_t count, DataType dt, int peer, void* stream) {
  Impl& m = *impl_;
  m.check_peer(peer, "send", "peer");
  if (peer == m.rank && count > 0)
    throw InvalidArgument(
        fmt::format("rank {}: send to itself is never matched by a separate recv under NCCL; use "
                    "send_recv() to exchange with yourself",
                    m.rank));
  const std::size_t bytes = checked_bytes(count, dt, "send");
  m.check_ptr(buf, count, "send", "buffer");
  return m.run(fmt::format("{} to rank {}", describe("send", count, dt), peer), stream, bytes,
               [&](const std::string& what) {
                 if (count > 0) m.settle(ncclSend(buf, count, nccl_dtype(dt), peer, m.comm, m.stream), what);
               });
}

DeviceWork DeviceCommunicator::recv_async(void* buf, std::size_t count, DataType dt, int peer, void* stream) {
  Impl& m = *impl_;
  m.check_peer(peer, "recv", "peer");
  if (peer == m.rank && count > 0)
    throw InvalidArgument(
        fmt::format("rank {}: recv from itself is never matched by a separate send under NCCL; use "
                    "send_recv() to exchange with yourself",
                    m.rank));
  const std::size_t bytes = checked_bytes(count, dt, "recv");
  m.check_ptr(buf, count, "recv", "buffer");
  return m.run(fmt::format("{} from rank {}", describe("recv", count, dt), peer), stream, bytes,
               [&](const std::string& what) {
                 if (count > 0) m.settle(ncclRecv(buf, count, nccl_dtype(dt), peer, m.comm, m.stream), what);
               });
}

DeviceWork DeviceCommunicator::send_recv_async(const void* sendbuf, std::size_t sendcount, int dst, void* recvbuf,
                                               std::size_t recvcount, int src, DataType dt, void* stream) {
  Impl& m = *impl_;
  m.check_peer(dst, "send_recv", "destination rank");
  m.check_peer(src, "send_recv", "source rank");
  const std::size_t bytes = checked_bytes(sendcount, dt, "send_recv") + checked_bytes(recvcount, dt, "send_recv");
  m.check_ptr(sendbuf, sendcount, "send_recv", "send buffer");
  m.check_ptr(recvbuf, recvcount, "send_recv", "receive buffer");
  return m.run(
      fmt::format("send_recv ({} {} to rank {}, {} from rank {})", sendcount, to_string(dt), dst, recvcount, src),
      stream, bytes,
      [&](const std::string& what) { m.group_send_recv(sendbuf, sendcount, dst, recvbuf, recvcount, src, dt, what); });
}

// The sync calls: the async call, then the host waits.
void DeviceCommunicator::allreduce(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op,
                                   void* stream) {
  allreduce_async(in, out, count, dt, op, stream).wait();
}
void DeviceCommunicator::reduce_scatter(const void* in, void* out, std::size_t recvcount, DataType dt, ReduceOp op,
                                        void* stream) {
  reduce_scatter_async(in, out, recvcount, dt, op, stream).wait();
}
void DeviceCommunicator::allgather(const void* in, void* out, std::size_t sendcount, DataType dt, void* stream) {
  allgather_async(in, out, sendcount, dt, stream).wait();
}
void DeviceCommunicator::broadcast(void* buf, std::size_t count, DataType dt, int root, void* stream) {
  broadcast_async(buf, count, dt, root, stream).wait();
}
void DeviceCommunicator::reduce(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op, int root,
                                void* stream) {
  reduce_async(in, out, count, dt, op, root, stream).wait();
}
void DeviceCommunicator::barrier() { barrier_async().wait(); }
void DeviceCommunicator::send(const void* buf, std::size_t count, DataType dt, int peer, void* stream) {
  send_async(buf, count, dt, peer, stream).wait();
}
void DeviceCommunicator::recv(void* buf, std::size_t count, DataType dt, int peer, void* stream) {
  recv_async(buf, count, dt, peer, stream).wait();
}
void DeviceCommunicator::send_recv(const void* sendbuf, std::size_t sendcount, int dst, void* recvbuf,
                                   std::size_t recvcount, int src, DataType dt, void* stream) {
  send_recv_async(sendbuf, sendcount, dst, recvbuf, recvcount, src, dt, stream).wait();
}

}  // namespace hopwise::comm
