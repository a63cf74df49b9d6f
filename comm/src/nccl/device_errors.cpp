// The DeviceCommunicator's error side: NCCL results and asynchronous errors turned into hopwise errors, aborts
// (after which every call throws, saying why), the bounded polls of CUDA events that every wait goes through, and
// the workspaces, which drain the stream before they grow. Every wait gives up after HOPWISE_TIMEOUT_S.
#include <fmt/core.h>

#include <algorithm>
#include <thread>

#include "device_impl.h"
#include "hopwise/common/error.h"

namespace hopwise::comm {

using Impl = detail::DeviceCommunicatorImpl;

ncclDataType_t nccl_dtype(DataType dt) {
  switch (dt) {
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat64: return ncclFloat64;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kBFloat16: return ncclBfloat16;
    case DataType::kInt32: return ncclInt32;
    case DataType::kInt64: return ncclInt64;
    case DataType::kUInt8: return ncclUint8;
  }
  throw InvalidArgument("unknown DataType for NCCL");
}

ncclRedOp_t nccl_op(ReduceOp op, int ranks) {
  if (op == ReduceOp::kAvg && ranks == 1) return ncclSum;
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kProd: return ncclProd;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kAvg: return ncclAvg;
  }
  throw InvalidArgument("unknown ReduceOp for NCCL");
}

std::string nccl_text(ncclResult_t r) {
  return fmt::format("{} (ncclResult_t {})", ncclGetErrorString(r), static_cast<int>(r));
}

void backoff(int& spins) {
  if (++spins < 200)
    std::this_thread::yield();
  else
    std::this_thread::sleep_for(std::chrono::microseconds(50));
}

void Impl::abort(const std::string& reason) {
  std::lock_guard lock(mutex);
  if (comm != nullptr) ncclCommAbort(comm);  // also ends the NCCL kernels still waiting on peers
  comm = nullptr;
  abort_reason = reason;
  aborted = true;
}

void Impl::check_usable(const std::string& what) const {
  if (closed) throw Error(fmt::format("rank {}: cannot run NCCL {}: the communicator was destroyed", rank, what));
  if (aborted)
    throw Error(
        fmt::format("rank {}: cannot run NCCL {}: this NCCL communicator was aborted earlier ({}); create a "
                    "new DeviceCommunicator on every rank to go on",
                    rank, what, abort_reason));
}

void Impl::fail_nccl(ncclResult_t r, const std::string& what) {
  const char* detail = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  const std::string text = fmt::format("{}{}", nccl_text(r), detail && *detail ? fmt::format(": {}", detail) : "");
  if (r == ncclInvalidArgument || r == ncclInvalidUsage)
    throw InvalidArgument(fmt::format("rank {}: NCCL {} rejected its arguments: {}", rank, what, text));
  const std::string msg = fmt::format(
      "rank {}: NCCL {} failed: {}; communicator aborted (a peer rank may have "
      "failed, or the network or NVLink reported an error); check every rank's "
      "log (NCCL_DEBUG=WARN tells more)",
      rank, what, text);
  abort(msg);
  throw TransportError(msg);
}

void Impl::fail_timeout(const std::string& what) {
  const std::string msg = fmt::format(
      "rank {}: NCCL {} did not complete within {:g} s; communicator aborted (a "
      "peer rank is late or dead, or ranks called different collectives). Raise "
      "HOPWISE_TIMEOUT_S if a peer is just slow.",
      rank, what, options.timeout_s);
  abort(msg);
  throw TimeoutError(msg, {});
}

void Impl::check_async(const std::string& what) {
  if (comm == nullptr) return;
  ncclResult_t a = ncclSuccess;
  const ncclResult_t r = ncclCommGetAsyncError(comm, &a);
  if (r != ncclSuccess) fail_nccl(r, what);
  if (a != ncclSuccess && a != ncclInProgress) fail_nccl(a, what);
}

void Impl::settle(ncclResult_t r, const std::string& what) {
  if (r == ncclInProgress && comm != nullptr) {
    const auto deadline = DeviceClock::now() + std::chrono::duration<double>(options.timeout_s);
    int spins = 0;
    for (;;) {
      ncclResult_t a = ncclSuccess;
      const ncclResult_t q = ncclCommGetAsyncError(comm, &a);
      if (q != ncclSuccess) {
        r = q;
        break;
      }
      if (a != ncclInProgress) {
        r = a;
        break;
      }
      if (DeviceClock::now() > deadline) fail_timeout(what);
      backoff(spins);
    }
  }
  if (r != ncclSuccess) fail_nccl(r, what);
}

bool Impl::query(cudaEvent_t ev, const std::string& what) {
  // First: an abort ends NCCL's kernels, so the events of work queued before it fire without the work done.
  if (aborted)
    throw Error(
        fmt::format("rank {}: NCCL {} cannot complete: the communicator was aborted ({})", rank, what, abort_reason));
  cuda::CurrentGuard guard(device);
  const cudaError_t e = cudaEventQuery(ev);
  if (e == cudaSuccess) return true;
  if (e != cudaErrorNotReady) {
    cudaGetLastError();
    const std::string msg = fmt::format("rank {}: CUDA error while running NCCL {}: {}; communicator aborted", rank,
                                        what, cuda::error_text(e));
    abort(msg);
    throw TransportError(msg);
  }
  check_async(what);
  return false;
}

void Impl::poll(cudaEvent_t ev, const std::string& what) {
  const auto deadline = DeviceClock::now() + std::chrono::duration<double>(options.timeout_s);
  int spins = 0;
  for (;;) {
    {
      std::lock_guard lock(mutex);  // per look, so that the completion thread's polls get their turn
      if (query(ev, what)) return;
      if (DeviceClock::now() > deadline) fail_timeout(what);
    }
    backoff(spins);
  }
}

void Impl::drain(const std::string& what) {
  std::lock_guard lock(mutex);
  cuda::check(cudaEventRecord(drained, stream), "cudaEventRecord (drain)", rank);
  poll(drained, what);
}

void* Impl::grow(DeviceBuffer& b, std::size_t bytes, const std::string& what) {
  if (b.data() != nullptr && b.bytes() >= bytes) return b.data();
  if (b.data() != nullptr) drain(what + " (waiting for queued work before growing a workspace)");
  b.reserve(std::max<std::size_t>(bytes, 1));
  return b.data();
}

}  // namespace hopwise::comm
