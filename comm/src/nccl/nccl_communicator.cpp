#include "hopwise/comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <fmt/core.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <numeric>
#include <thread>

#include "hopwise/comm/transports/mpi_transport.h"
#include "hopwise/common/cuda_reduce.h"
#include "hopwise/common/device_buffer.h"
#include "hopwise/common/env.h"
#include "hopwise/common/error.h"
#include "hopwise/compression/device_codec.h"
#include "nccl_util.h"

namespace hopwise::comm {

using nccl_detail::check_cuda;
using nccl_detail::check_device_pointer;
using nccl_detail::cuda_text;
using nccl_detail::DeviceGuard;
using Clock = std::chrono::steady_clock;

std::string_view to_string(NcclAlgorithm a) { return a == NcclAlgorithm::kRing ? "ring" : "native"; }

NcclAlgorithm parse_nccl_algorithm(std::string_view name) {
  if (name == "native" || name == "nccl") return NcclAlgorithm::kNative;
  if (name == "ring") return NcclAlgorithm::kRing;
  throw InvalidArgument(fmt::format("unknown NCCL algorithm '{}'; choose native (NCCL's own collectives) or ring "
                                    "(the planned ring over ncclSend/ncclRecv)",
                                    name));
}

NcclOptions NcclOptions::from_env() {
  NcclOptions o;
  o.timeout_s = Options::from_env().timeout_s;
  const std::string algo = env::get_or("HOPWISE_NCCL_ALGO", "native");
  try {
    o.algorithm = parse_nccl_algorithm(algo);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("HOPWISE_NCCL_ALGO: {}", e.what()));
  }
  return o;
}

namespace {

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

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kProd: return ncclProd;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kAvg: return ncclAvg;
  }
  throw InvalidArgument("unknown ReduceOp for NCCL");
}

std::string nccl_text(ncclResult_t r) { return fmt::format("{} (ncclResult_t {})", ncclGetErrorString(r), static_cast<int>(r)); }

// Spin briefly (latency of small collectives), then sleep in short steps (do not burn a core for long waits).
void backoff(int& spins) {
  if (++spins < 200)
    std::this_thread::yield();
  else
    std::this_thread::sleep_for(std::chrono::microseconds(50));
}

std::string describe(std::string_view name, std::size_t count, DataType dt) {
  return fmt::format("{} of {} {}", name, count, to_string(dt));
}

}  // namespace

struct DeviceWork::State {
  std::shared_ptr<NcclCommunicator::Impl> impl;
  cudaEvent_t start = nullptr, done = nullptr;
  std::string what;
  bool complete = false;
  std::exception_ptr error;
  ~State() {
    if (start) cudaEventDestroy(start);
    if (done) cudaEventDestroy(done);
  }
};

struct NcclCommunicator::Impl : std::enable_shared_from_this<NcclCommunicator::Impl> {
  MPI_Comm mpi = MPI_COMM_NULL;
  int rank = 0, size = 1, local_rank = 0, device = 0;
  NcclOptions options;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr;  // recorded on the caller's stream; the communicator's stream waits on it
  cudaEvent_t drained = nullptr;
  bool aborted = false, closed = false;
  std::string abort_reason;
  std::vector<int> ring;
  NcclAlgorithm algorithm = NcclAlgorithm::kNative;
  CollectiveStats stats;
  // Workspaces (grown, never shrunk; growing first drains the stream, whose queued work may still use them).
  cuda::DeviceBuffer ring_tmp, stage, barrier_buf, payload, gathered, scales;

  // ---- errors, aborts, polling ----
  void abort(const std::string& reason) {
    if (comm != nullptr) ncclCommAbort(comm);  // also ends the NCCL kernels still waiting on peers
    comm = nullptr;
    aborted = true;
    abort_reason = reason;
  }

  void check_usable(const std::string& what) const {
    if (closed)
      throw Error(fmt::format("rank {}: cannot run NCCL {}: the communicator was destroyed", rank, what));
    if (aborted)
      throw Error(fmt::format("rank {}: cannot run NCCL {}: this NCCL communicator was aborted earlier ({}); create "
                              "a new NcclCommunicator on every rank to go on",
                              rank, what, abort_reason));
  }

  [[noreturn]] void fail_nccl(ncclResult_t r, const std::string& what) {
    const char* detail = comm != nullptr ? ncclGetLastError(comm) : nullptr;
    const std::string text = fmt::format("{}{}", nccl_text(r), detail && *detail ? fmt::format(": {}", detail) : "");
    if (r == ncclInvalidArgument || r == ncclInvalidUsage)
      throw InvalidArgument(fmt::format("rank {}: NCCL {} rejected its arguments: {}", rank, what, text));
    const std::string msg = fmt::format("rank {}: NCCL {} failed: {}; communicator aborted (a peer rank may have "
                                        "failed, or the network or NVLink reported an error); check every rank's "
                                        "log (NCCL_DEBUG=WARN tells more)",
                                        rank, what, text);
    abort(msg);
    throw TransportError(msg);
  }

  [[noreturn]] void fail_timeout(const std::string& what) {
    const std::string msg = fmt::format("rank {}: NCCL {} did not complete within {:g} s; communicator aborted (a "
                                        "peer rank is late or dead, or ranks called different collectives). Raise "
                                        "HOPWISE_TIMEOUT_S if a peer is just slow.",
                                        rank, what, options.timeout_s);
    abort(msg);
    throw TimeoutError(msg, {});
  }

  // Throws when NCCL reported an asynchronous error (aborting the communicator).
  void check_async(const std::string& what) {
    if (comm == nullptr) return;
    ncclResult_t a = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &a);
    if (r != ncclSuccess) fail_nccl(r, what);
    if (a != ncclSuccess && a != ncclInProgress) fail_nccl(a, what);
  }

  // The result of an NCCL call on this (nonblocking) communicator: ncclInProgress means the call is still being
  // set up (connections, init); poll until it settles, giving up after the timeout.
  void settle(ncclResult_t r, const std::string& what) {
    if (r == ncclInProgress && comm != nullptr) {
      const auto deadline = Clock::now() + std::chrono::duration<double>(options.timeout_s);
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
        if (Clock::now() > deadline) fail_timeout(what);
        backoff(spins);
      }
    }
    if (r != ncclSuccess) fail_nccl(r, what);
  }

  // True once `ev` completed; throws on CUDA/NCCL errors and after an abort.
  bool query(cudaEvent_t ev, const std::string& what) {
    // First: an abort ends NCCL's kernels, so the events of work queued before it fire without the work done.
    if (aborted)
      throw Error(fmt::format("rank {}: NCCL {} cannot complete: the communicator was aborted ({})", rank, what,
                              abort_reason));
    DeviceGuard guard(device);
    const cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) {
      cudaGetLastError();
      const std::string msg = fmt::format("rank {}: CUDA error while running NCCL {}: {}; communicator aborted", rank,
                                          what, cuda_text(e));
      abort(msg);
      throw TransportError(msg);
    }
    check_async(what);
    return false;
  }

  void poll(cudaEvent_t ev, const std::string& what) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(options.timeout_s);
    int spins = 0;
    while (!query(ev, what)) {
      if (Clock::now() > deadline) fail_timeout(what);
      backoff(spins);
    }
  }

  // Host waits until everything enqueued on the stream so far is done.
  void drain(const std::string& what) {
    check_cuda(cudaEventRecord(drained, stream), "cudaEventRecord (drain)", rank);
    poll(drained, what);
  }

  void* grow(cuda::DeviceBuffer& b, std::size_t bytes, const std::string& what) {
    if (b.data() != nullptr && b.bytes() >= bytes) return b.data();
    if (b.data() != nullptr) drain(what + " (waiting for queued work before growing a workspace)");
    b.reserve(std::max<std::size_t>(bytes, 1));
    return b.data();
  }

  // ---- enqueueing ----
  // Runs `enqueue` on the communicator's stream after the producer's stream; returns the work's handle.
  template <class F>
  DeviceWork run(std::string what, void* producer, std::size_t bytes, F&& enqueue) {
    check_usable(what);
    DeviceGuard guard(device);
    auto st = std::make_shared<DeviceWork::State>();
    st->impl = shared_from_this();
    st->what = std::move(what);
    check_cuda(cudaEventCreate(&st->start), "cudaEventCreate", rank);
    check_cuda(cudaEventCreate(&st->done), "cudaEventCreate", rank);
    auto ps = static_cast<cudaStream_t>(producer);
    if (ps != stream) {
      check_cuda(cudaEventRecord(ready, ps), "cudaEventRecord on the caller's stream (is it a valid stream of this "
                                             "rank's device?)",
                 rank);
      check_cuda(cudaStreamWaitEvent(stream, ready, 0), "cudaStreamWaitEvent", rank);
    }
    check_cuda(cudaEventRecord(st->start, stream), "cudaEventRecord", rank);
    enqueue(st->what);
    check_cuda(cudaEventRecord(st->done, stream), "cudaEventRecord", rank);
    ++stats.calls;
    stats.bytes += bytes;
    return DeviceWork(std::move(st));
  }

  // A send and a receive in one group (either may be empty). Both ranks of a pair compute the same counts.
  void group_send_recv(const void* sbuf, std::size_t scount, int dst, void* rbuf, std::size_t rcount, int src,
                       DataType dt, const std::string& what) {
    if (scount == 0 && rcount == 0) return;
    const ncclResult_t g = ncclGroupStart();
    if (g != ncclSuccess) fail_nccl(g, what);
    ncclResult_t r = ncclSuccess;
    if (scount > 0) r = ncclSend(sbuf, scount, nccl_dtype(dt), dst, comm, stream);
    if (rcount > 0 && (r == ncclSuccess || r == ncclInProgress))
      r = ncclRecv(rbuf, rcount, nccl_dtype(dt), src, comm, stream);
    const ncclResult_t e = ncclGroupEnd();  // always close the group, even after an error inside it
    if (r != ncclSuccess && r != ncclInProgress) fail_nccl(r, what);
    settle(e, what);
  }

  // x[0..n) *= 1/size on the stream.
  void scale_down(DataType dt, void* x, std::size_t n) {
    if (size > 1) cuda::scale(dt, x, 1.0 / size, n, stream);
  }

  // ---- the collectives, enqueued on the stream (count 0: nothing to do on any rank) ----
  void native_allreduce(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op,
                        const std::string& what) {
    if (count == 0) return;
    settle(ncclAllReduce(in, out, count, nccl_dtype(dt), nccl_op(op), comm, stream), what);
  }

  // Reduce-scatter then allgather along `ring`, each step a grouped send to the next rank and receive from the
  // previous one, in chunks of at most ring_chunk_bytes; received chunks are combined by reduce_into.
  void ring_allreduce(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op,
                      const std::string& what) {
    if (count == 0) return;
    const std::size_t es = dtype_size(dt);
    auto* o = static_cast<char*>(out);
    if (in != out)
      check_cuda(cudaMemcpyAsync(out, in, count * es, cudaMemcpyDeviceToDevice, stream),
                 "cudaMemcpyAsync (ring allreduce input)", rank);
    const int n = size;
    if (n == 1) return;  // one rank: sum, min, max, prod and avg are the input itself
    const int pos = static_cast<int>(std::find(ring.begin(), ring.end(), rank) - ring.begin());
    const int next = ring[static_cast<std::size_t>((pos + 1) % n)];
    const int prev = ring[static_cast<std::size_t>((pos + n - 1) % n)];
    const std::size_t base = count / static_cast<std::size_t>(n), rem = count % static_cast<std::size_t>(n);
    auto mod = [n](int x) { return ((x % n) + n) % n; };
    auto start = [&](int b) { return static_cast<std::size_t>(b) * base + std::min<std::size_t>(static_cast<std::size_t>(b), rem); };
    auto len = [&](int b) { return base + (static_cast<std::size_t>(b) < rem ? 1 : 0); };
    const std::size_t chunk = std::max<std::size_t>(1, options.ring_chunk_bytes / es);
    const std::size_t max_block = base + (rem > 0 ? 1 : 0);
    // Workspaces first: growing one drains the stream, which must not happen halfway through the ring.
    char* tmp = static_cast<char*>(grow(ring_tmp, std::min(max_block, chunk) * es, what));
    const ReduceOp combine = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
    // One step: send block sb to next while receiving block rb from prev (chunk by chunk, so that both ends of a
    // link cut a block the same way); `reduce`: combine what arrives into rb, else overwrite rb.
    auto step = [&](int sb, int rb, bool reduce) {
      const std::size_t slen = len(sb), rlen = len(rb);
      char* sbuf = o + start(sb) * es;
      char* rbuf = o + start(rb) * es;
      for (std::size_t off = 0; off < std::max(slen, rlen); off += chunk) {
        const std::size_t sl = off < slen ? std::min(chunk, slen - off) : 0;
        const std::size_t rl = off < rlen ? std::min(chunk, rlen - off) : 0;
        group_send_recv(sbuf + off * es, sl, next, reduce ? tmp : rbuf + off * es, rl, prev, dt, what);
        if (reduce && rl > 0) cuda::reduce_into(dt, combine, rbuf + off * es, rbuf + off * es, tmp, rl, stream);
      }
    };
    for (int s = 0; s < n - 1; ++s) step(mod(pos - s), mod(pos - s - 1), true);
    // This rank now holds the complete block pos + 1.
    if (op == ReduceOp::kAvg) {
      const int own = mod(pos + 1);
      scale_down(dt, o + start(own) * es, len(own));
    }
    for (int s = 0; s < n - 1; ++s) step(mod(pos + 1 - s), mod(pos - s), false);
  }

  void reduce_scatter(const void* in, void* out, std::size_t recvcount, DataType dt, ReduceOp op,
                      const std::string& what) {
    if (recvcount == 0) return;
    const std::size_t bytes = recvcount * dtype_size(dt), total = bytes * static_cast<std::size_t>(size);
    const auto i = reinterpret_cast<std::uintptr_t>(in), o = reinterpret_cast<std::uintptr_t>(out);
    const bool nccl_in_place = o == i + static_cast<std::size_t>(rank) * bytes;
    const bool overlap = o < i + total && i < o + bytes;
    if (overlap && !nccl_in_place) {  // e.g. out == in: reduce into a staging buffer, then copy
      void* tmp = grow(stage, bytes, what);
      settle(ncclReduceScatter(in, tmp, recvcount, nccl_dtype(dt), nccl_op(op), comm, stream), what);
      check_cuda(cudaMemcpyAsync(out, tmp, bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync", rank);
    } else {
      settle(ncclReduceScatter(in, out, recvcount, nccl_dtype(dt), nccl_op(op), comm, stream), what);
    }
  }

  void allgather(const void* in, void* out, std::size_t sendcount, DataType dt, const std::string& what) {
    if (sendcount == 0) return;
    const std::size_t bytes = sendcount * dtype_size(dt), total = bytes * static_cast<std::size_t>(size);
    const auto i = reinterpret_cast<std::uintptr_t>(in), o = reinterpret_cast<std::uintptr_t>(out);
    const bool nccl_in_place = i == o + static_cast<std::size_t>(rank) * bytes;
    const bool overlap = i < o + total && o < i + bytes;
    if (overlap && !nccl_in_place) {  // stage the input where the output would overwrite it
      void* tmp = grow(stage, bytes, what);
      check_cuda(cudaMemcpyAsync(tmp, in, bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync", rank);
      in = tmp;
    }
    settle(ncclAllGather(in, out, sendcount, nccl_dtype(dt), comm, stream), what);
  }

  void compressed(const float* in, float* out, std::size_t n, const compression::cuda::DeviceCodec& codec,
                  compression::cuda::DeviceCodecState& st, ReduceOp op, const std::string& what) {
    if (n == 0) return;
    const compression::Codec& c = codec.host();
    void* s = stream;
    const std::size_t sc = c.scale_count(n);
    const std::size_t bytes = c.payload_bytes(n);
    const bool gather = c.pattern() == compression::Pattern::kGather;
    // Each gathered payload padded to 256 bytes, so that every one starts aligned for the decoder.
    const std::size_t stride = (bytes + 255) / 256 * 256;
    // Workspaces first (growing drains the stream).
    auto* p = static_cast<std::byte*>(grow(payload, stride, what));
    auto* all = gather ? static_cast<std::byte*>(grow(gathered, stride * static_cast<std::size_t>(size), what)) : nullptr;
    float* agreed = sc > 0 ? static_cast<float*>(grow(scales, sc * sizeof(float), what)) : nullptr;
    std::size_t wire = 0;
    if (sc > 0) {
      codec.local_scales(in, n, agreed, st, s);
      settle(ncclAllReduce(agreed, agreed, sc, ncclFloat32, ncclMax, comm, stream), what + " (agreeing on scales)");
      wire += sc * sizeof(float);
    }
    if (!gather) {
      codec.encode(in, n, p, st, agreed, s);
      // Payloads add up element-wise in the payload dtype (uint8 wraps: int8 codes sum as two's complement).
      settle(ncclAllReduce(p, p, c.payload_count(n), nccl_dtype(c.payload_dtype()), ncclSum, comm, stream), what);
      codec.decode(p, n, out, st, agreed, s);
    } else {
      codec.encode(in, n, p, st, agreed, s);
      settle(ncclAllGather(p, all, stride, ncclUint8, comm, stream), what);
      // A decode that synchronizes its stream (no timeout) waits here first, with one, so that a dead peer is a
      // TimeoutError rather than a hang.
      if (codec.decode_synchronizes()) drain(what);
      codec.decode(all, n, out, st, agreed, s);  // the first payload overwrites out (which may alias in)
      for (int r = 1; r < size; ++r) codec.decode_add(all + static_cast<std::size_t>(r) * stride, n, out, st, agreed, s);
    }
    wire += bytes;
    stats.wire_bytes += wire;
    if (op == ReduceOp::kAvg) scale_down(DataType::kFloat32, out, n);
  }

  // ---- argument checks ----
  void check_ptr(const void* p, std::size_t count, std::string_view what, std::string_view arg) const {
    check_device_pointer(p, count, what, arg, rank, device);
  }
  void check_rank_arg(int r, std::string_view what, std::string_view arg) const {
    if (r < 0 || r >= size)
      throw InvalidArgument(fmt::format("rank {}: {}: {} {} is out of range; use a rank in 0..{}", rank, what, arg, r,
                                        size - 1));
  }
  std::size_t times_size(std::size_t count, DataType dt, std::string_view what) const {
    if (count > 0 && count > std::numeric_limits<std::size_t>::max() / 16 / static_cast<std::size_t>(size))
      throw InvalidArgument(fmt::format("rank {}: {}: count {} times {} ranks overflows", rank, what, count, size));
    checked_bytes(count * static_cast<std::size_t>(size), dt, what);
    return count * static_cast<std::size_t>(size);
  }

  // ---- teardown (idempotent; never throws) ----
  void close() noexcept {
    if (closed) return;
    if (stream != nullptr) {
      DeviceGuard guard(device);
      if (comm != nullptr && !aborted) {
        try {
          drain("work still queued when the communicator was destroyed");
        } catch (...) {  // timed out or failed: drain() aborted the communicator
        }
      }
      if (comm != nullptr) {
        // ncclCommFinalize flushes and may wait on peers: bounded by the timeout, else abort.
        ncclResult_t r = ncclCommFinalize(comm);
        const auto deadline = Clock::now() + std::chrono::duration<double>(options.timeout_s);
        int spins = 0;
        while (r == ncclInProgress && Clock::now() < deadline) {
          ncclResult_t a = ncclSuccess;
          if (ncclCommGetAsyncError(comm, &a) != ncclSuccess) break;
          r = a;
          if (r == ncclInProgress) backoff(spins);
        }
        if (r == ncclSuccess)
          ncclCommDestroy(comm);
        else
          ncclCommAbort(comm);
        comm = nullptr;
      }
      ring_tmp = {};
      stage = {};
      barrier_buf = {};
      payload = {};
      gathered = {};
      scales = {};
      if (ready) cudaEventDestroy(ready);
      if (drained) cudaEventDestroy(drained);
      ready = drained = nullptr;
      cudaStreamDestroy(stream);  // returns at once; the stream's resources go when its work is done
      stream = nullptr;
    } else if (comm != nullptr) {
      ncclCommAbort(comm);
      comm = nullptr;
    }
    if (mpi != MPI_COMM_NULL) {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Comm_free(&mpi);
      mpi = MPI_COMM_NULL;
    }
    closed = true;
  }

  void init(MPI_Comm parent) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (finalized) throw Error("MPI is already finalized; create the NcclCommunicator before MPI_Finalize");
    if (!initialized) ensure_mpi_initialized();  // else any thread level will do: MPI is called from this thread only
    check_mpi(MPI_Comm_dup(parent, &mpi), "MPI_Comm_dup");
    check_mpi(MPI_Comm_set_errhandler(mpi, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check_mpi(MPI_Comm_rank(mpi, &rank), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(mpi, &size), "MPI_Comm_size");
    MPI_Comm node = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split_type(mpi, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
    check_mpi(MPI_Comm_rank(node, &local_rank), "MPI_Comm_rank");
    MPI_Comm_free(&node);
    ring.resize(static_cast<std::size_t>(size));
    std::iota(ring.begin(), ring.end(), 0);
    algorithm = options.algorithm;

    // This rank's GPU. Every rank learns whether all succeeded before the id exchange, so that a rank without a
    // GPU does not leave the others waiting in MPI_Bcast.
    std::exception_ptr local_error;
    try {
      std::string why;
      const int n = cuda::device_count(&why);
      if (n == 0)
        throw TransportError(fmt::format("rank {}: no CUDA device is visible ({}); NcclCommunicator needs a GPU per "
                                         "rank: check nvidia-smi and CUDA_VISIBLE_DEVICES, or use "
                                         "hopwise::comm::Communicator for host memory",
                                         rank, why));
      if (options.device >= n)
        throw InvalidArgument(fmt::format("rank {}: NcclOptions::device is {} but only {} CUDA device(s) are visible; "
                                          "pick 0..{} or -1 (local rank modulo the devices)",
                                          rank, options.device, n, n - 1));
      device = options.device >= 0 ? options.device : local_rank % n;
      check_cuda(cudaSetDevice(device), fmt::format("cudaSetDevice({})", device), rank);
      check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", rank);
      check_cuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate", rank);
      check_cuda(cudaEventCreateWithFlags(&drained, cudaEventDisableTiming), "cudaEventCreate", rank);
    } catch (...) {
      local_error = std::current_exception();
    }
    int ok = local_error ? 0 : 1, all_ok = 0;
    check_mpi(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, mpi), "MPI_Allreduce");
    if (local_error) std::rethrow_exception(local_error);
    if (!all_ok)
      throw TransportError(fmt::format("rank {}: another rank could not set up its GPU (see its error); "
                                       "NcclCommunicator needs a GPU on every rank",
                                       rank));

    // Rank 0's unique id, with whether it could make one.
    ncclUniqueId id{};
    int id_ok = 1;
    std::string id_error;
    if (rank == 0) {
      const ncclResult_t r = ncclGetUniqueId(&id);
      if (r != ncclSuccess) id_ok = 0;
      id_error = nccl_text(r);
    }
    unsigned char msg[sizeof(int) + sizeof(ncclUniqueId)];
    std::memcpy(msg, &id_ok, sizeof(int));
    std::memcpy(msg + sizeof(int), &id, sizeof(id));
    check_mpi(MPI_Bcast(msg, static_cast<int>(sizeof(msg)), MPI_BYTE, 0, mpi), "MPI_Bcast (NCCL unique id)");
    std::memcpy(&id_ok, msg, sizeof(int));
    std::memcpy(&id, msg + sizeof(int), sizeof(id));
    if (!id_ok)
      throw TransportError(fmt::format("rank {}: rank 0 could not create the NCCL unique id{}; check NCCL's network "
                                       "setup (NCCL_SOCKET_IFNAME, NCCL_DEBUG=WARN)",
                                       rank, rank == 0 ? ": " + id_error : std::string()));

    // Nonblocking, so that a rank that never arrives makes init time out instead of hang.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      if (comm != nullptr) ncclCommAbort(comm);
      comm = nullptr;
      throw TransportError(fmt::format("rank {}: ncclCommInitRankConfig over {} ranks on device {} failed: {}; check "
                                       "NCCL_DEBUG=WARN output",
                                       rank, size, device, nccl_text(r)));
    }
    settle(r, fmt::format("communicator setup (ncclCommInitRankConfig over {} ranks, device {})", size, device));
  }
};

// ---- DeviceWork ----
void DeviceWork::wait() {
  if (!state_) throw InvalidArgument("DeviceWork::wait() on an empty handle (default-constructed)");
  State& s = *state_;
  if (s.error) std::rethrow_exception(s.error);
  if (s.complete) return;
  try {
    s.impl->poll(s.done, s.what);
    s.complete = true;
  } catch (...) {
    s.error = std::current_exception();
    throw;
  }
}

bool DeviceWork::test() {
  if (!state_) throw InvalidArgument("DeviceWork::test() on an empty handle (default-constructed)");
  State& s = *state_;
  if (s.error) std::rethrow_exception(s.error);
  if (s.complete) return true;
  try {
    s.complete = s.impl->query(s.done, s.what);
  } catch (...) {
    s.error = std::current_exception();
    throw;
  }
  return s.complete;
}

void DeviceWork::wait_on_stream(void* stream) {
  if (!state_) throw InvalidArgument("DeviceWork::wait_on_stream() on an empty handle (default-constructed)");
  DeviceGuard guard(state_->impl->device);
  check_cuda(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), state_->done, 0),
             fmt::format("cudaStreamWaitEvent (a stream waiting for NCCL {})", state_->what), state_->impl->rank);
}

double DeviceWork::elapsed_ms() const {
  if (!state_ || !state_->complete)
    throw InvalidArgument("DeviceWork::elapsed_ms() before the work completed; call wait() first");
  float ms = 0;
  check_cuda(cudaEventElapsedTime(&ms, state_->start, state_->done), "cudaEventElapsedTime", state_->impl->rank);
  return ms;
}

const std::string& DeviceWork::description() const {
  static const std::string empty;
  return state_ ? state_->what : empty;
}

// ---- NcclCommunicator ----
NcclCommunicator::NcclCommunicator(MPI_Comm comm, NcclOptions options) : impl_(std::make_shared<Impl>()) {
  if (!(options.timeout_s > 0))
    throw InvalidArgument("NcclOptions::timeout_s must be a positive number of seconds (HOPWISE_TIMEOUT_S)");
  if (options.ring_chunk_bytes < 16)
    throw InvalidArgument("NcclOptions::ring_chunk_bytes must be at least 16 bytes");
  impl_->options = options;
  try {
    impl_->init(comm);
  } catch (...) {
    impl_->close();
    throw;
  }
}

NcclCommunicator::~NcclCommunicator() { impl_->close(); }

int NcclCommunicator::rank() const { return impl_->rank; }
int NcclCommunicator::size() const { return impl_->size; }
int NcclCommunicator::local_rank() const { return impl_->local_rank; }
int NcclCommunicator::device() const { return impl_->device; }
void* NcclCommunicator::stream() const { return impl_->stream; }
MPI_Comm NcclCommunicator::mpi_comm() const { return impl_->mpi; }
double NcclCommunicator::timeout_s() const { return impl_->options.timeout_s; }
bool NcclCommunicator::aborted() const { return impl_->aborted; }

DeviceWork NcclCommunicator::allreduce_async(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op,
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
    throw InvalidArgument(fmt::format("rank {}: allreduce input and output overlap without being the same buffer; "
                                      "pass in == out for in place, or separate buffers",
                                      m.rank));
  const NcclAlgorithm algo = m.algorithm;
  return m.run(fmt::format("{} ({})", describe("allreduce", count, dt), to_string(algo)), stream, bytes,
               [&](const std::string& what) {
                 if (algo == NcclAlgorithm::kRing)
                   m.ring_allreduce(in, out, count, dt, op, what);
                 else
                   m.native_allreduce(in, out, count, dt, op, what);
               });
}

DeviceWork NcclCommunicator::reduce_scatter_async(const void* in, void* out, std::size_t recvcount, DataType dt,
                                                  ReduceOp op, void* stream) {
  Impl& m = *impl_;
  check_op_supported(dt, op);
  const std::size_t total = m.times_size(recvcount, dt, "reduce_scatter");
  m.check_ptr(in, total, "reduce_scatter", "input buffer");
  m.check_ptr(out, recvcount, "reduce_scatter", "output buffer");
  return m.run(describe("reduce_scatter", recvcount, dt) + " per rank", stream, total * dtype_size(dt),
               [&](const std::string& what) { m.reduce_scatter(in, out, recvcount, dt, op, what); });
}

DeviceWork NcclCommunicator::allgather_async(const void* in, void* out, std::size_t sendcount, DataType dt,
                                             void* stream) {
  Impl& m = *impl_;
  const std::size_t total = m.times_size(sendcount, dt, "allgather");
  m.check_ptr(in, sendcount, "allgather", "input buffer");
  m.check_ptr(out, total, "allgather", "output buffer");
  return m.run(describe("allgather", sendcount, dt) + " per rank", stream, total * dtype_size(dt),
               [&](const std::string& what) { m.allgather(in, out, sendcount, dt, what); });
}

DeviceWork NcclCommunicator::broadcast_async(void* buf, std::size_t count, DataType dt, int root, void* stream) {
  Impl& m = *impl_;
  m.check_rank_arg(root, "broadcast", "root");
  const std::size_t bytes = checked_bytes(count, dt, "broadcast");
  m.check_ptr(buf, count, "broadcast", "buffer");
  return m.run(fmt::format("{} from root {}", describe("broadcast", count, dt), root), stream, bytes,
               [&](const std::string& what) {
                 if (count > 0)
                   m.settle(ncclBroadcast(buf, buf, count, nccl_dtype(dt), root, m.comm, m.stream), what);
               });
}

DeviceWork NcclCommunicator::reduce_async(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op,
                                          int root, void* stream) {
  Impl& m = *impl_;
  check_op_supported(dt, op);
  m.check_rank_arg(root, "reduce", "root");
  const std::size_t bytes = checked_bytes(count, dt, "reduce");
  m.check_ptr(in, count, "reduce", "input buffer");
  if (m.rank == root) m.check_ptr(out, count, "reduce", "output buffer (at the root)");
  return m.run(fmt::format("{} to root {}", describe("reduce", count, dt), root), stream, bytes,
               [&](const std::string& what) {
                 if (count > 0)  // NCCL reads recvbuff at the root only
                   m.settle(ncclReduce(in, out, count, nccl_dtype(dt), nccl_op(op), root, m.comm, m.stream), what);
               });
}

DeviceWork NcclCommunicator::barrier_async() {
  Impl& m = *impl_;
  // A one-element allreduce that depends on nothing but the communicator's own stream.
  return m.run("barrier", m.stream, 0, [&](const std::string& what) {
    void* b = m.grow(m.barrier_buf, sizeof(std::int32_t), what);
    m.settle(ncclAllReduce(b, b, 1, ncclInt32, ncclSum, m.comm, m.stream), what);
  });
}

DeviceWork NcclCommunicator::send_async(const void* buf, std::size_t count, DataType dt, int peer, void* stream) {
  Impl& m = *impl_;
  m.check_rank_arg(peer, "send", "peer");
  if (peer == m.rank && count > 0)
    throw InvalidArgument(fmt::format("rank {}: send to itself is never matched by a separate recv under NCCL; use "
                                      "send_recv() to exchange with yourself",
                                      m.rank));
  const std::size_t bytes = checked_bytes(count, dt, "send");
  m.check_ptr(buf, count, "send", "buffer");
  return m.run(fmt::format("{} to rank {}", describe("send", count, dt), peer), stream, bytes,
               [&](const std::string& what) {
                 if (count > 0) m.settle(ncclSend(buf, count, nccl_dtype(dt), peer, m.comm, m.stream), what);
               });
}

DeviceWork NcclCommunicator::recv_async(void* buf, std::size_t count, DataType dt, int peer, void* stream) {
  Impl& m = *impl_;
  m.check_rank_arg(peer, "recv", "peer");
  if (peer == m.rank && count > 0)
    throw InvalidArgument(fmt::format("rank {}: recv from itself is never matched by a separate send under NCCL; use "
                                      "send_recv() to exchange with yourself",
                                      m.rank));
  const std::size_t bytes = checked_bytes(count, dt, "recv");
  m.check_ptr(buf, count, "recv", "buffer");
  return m.run(fmt::format("{} from rank {}", describe("recv", count, dt), peer), stream, bytes,
               [&](const std::string& what) {
                 if (count > 0) m.settle(ncclRecv(buf, count, nccl_dtype(dt), peer, m.comm, m.stream), what);
               });
}

DeviceWork NcclCommunicator::send_recv_async(const void* sendbuf, std::size_t sendcount, int dst, void* recvbuf,
                                             std::size_t recvcount, int src, DataType dt, void* stream) {
  Impl& m = *impl_;
  m.check_rank_arg(dst, "send_recv", "destination rank");
  m.check_rank_arg(src, "send_recv", "source rank");
  const std::size_t bytes = checked_bytes(sendcount, dt, "send_recv") + checked_bytes(recvcount, dt, "send_recv");
  m.check_ptr(sendbuf, sendcount, "send_recv", "send buffer");
  m.check_ptr(recvbuf, recvcount, "send_recv", "receive buffer");
  return m.run(fmt::format("send_recv ({} {} to rank {}, {} from rank {})", sendcount, to_string(dt), dst, recvcount,
                           src),
               stream, bytes, [&](const std::string& what) {
                 m.group_send_recv(sendbuf, sendcount, dst, recvbuf, recvcount, src, dt, what);
               });
}

DeviceWork NcclCommunicator::allreduce_compressed_async(const float* in, float* out, std::size_t count,
                                                        const compression::cuda::DeviceCodec& codec,
                                                        compression::cuda::DeviceCodecState& state, ReduceOp op,
                                                        void* stream) {
  Impl& m = *impl_;
  if (op != ReduceOp::kSum && op != ReduceOp::kAvg)
    throw InvalidArgument(fmt::format("allreduce_compressed: op {} is not available; codecs sum (use sum or avg)",
                                      to_string(op)));
  const std::size_t bytes = checked_bytes(count, DataType::kFloat32, "allreduce_compressed");
  m.check_ptr(in, count, "allreduce_compressed", "input buffer");
  m.check_ptr(out, count, "allreduce_compressed", "output buffer");
  return m.run(fmt::format("{} (codec {})", describe("compressed allreduce", count, DataType::kFloat32), codec.name()),
               stream, bytes,
               [&](const std::string& what) { m.compressed(in, out, count, codec, state, op, what); });
}

// The sync calls: the async call, then the host waits.
void NcclCommunicator::allreduce(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op,
                                 void* stream) {
  allreduce_async(in, out, count, dt, op, stream).wait();
}
void NcclCommunicator::reduce_scatter(const void* in, void* out, std::size_t recvcount, DataType dt, ReduceOp op,
                                      void* stream) {
  reduce_scatter_async(in, out, recvcount, dt, op, stream).wait();
}
void NcclCommunicator::allgather(const void* in, void* out, std::size_t sendcount, DataType dt, void* stream) {
  allgather_async(in, out, sendcount, dt, stream).wait();
}
void NcclCommunicator::broadcast(void* buf, std::size_t count, DataType dt, int root, void* stream) {
  broadcast_async(buf, count, dt, root, stream).wait();
}
void NcclCommunicator::reduce(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op, int root,
                              void* stream) {
  reduce_async(in, out, count, dt, op, root, stream).wait();
}
void NcclCommunicator::barrier() { barrier_async().wait(); }
void NcclCommunicator::send(const void* buf, std::size_t count, DataType dt, int peer, void* stream) {
  send_async(buf, count, dt, peer, stream).wait();
}
void NcclCommunicator::recv(void* buf, std::size_t count, DataType dt, int peer, void* stream) {
  recv_async(buf, count, dt, peer, stream).wait();
}
void NcclCommunicator::send_recv(const void* sendbuf, std::size_t sendcount, int dst, void* recvbuf,
                                 std::size_t recvcount, int src, DataType dt, void* stream) {
  send_recv_async(sendbuf, sendcount, dst, recvbuf, recvcount, src, dt, stream).wait();
}
void NcclCommunicator::allreduce_compressed(const float* in, float* out, std::size_t count,
                                            const compression::cuda::DeviceCodec& codec,
                                            compression::cuda::DeviceCodecState& state, ReduceOp op, void* stream) {
  allreduce_compressed_async(in, out, count, codec, state, op, stream).wait();
}

void NcclCommunicator::set_ring_order(std::vector<int> order) {
  const int n = impl_->size;
  std::vector<int> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  bool ok = static_cast<int>(order.size()) == n;
  for (int i = 0; ok && i < n; ++i) ok = sorted[static_cast<std::size_t>(i)] == i;
  if (!ok)
    throw InvalidArgument(fmt::format("rank {}: set_ring_order: the ring must list every rank 0..{} exactly once "
                                      "(got {} entries)",
                                      impl_->rank, n - 1, order.size()));
  impl_->ring = std::move(order);
}

const std::vector<int>& NcclCommunicator::ring_order() const { return impl_->ring; }
void NcclCommunicator::set_algorithm(NcclAlgorithm a) { impl_->algorithm = a; }
NcclAlgorithm NcclCommunicator::algorithm() const { return impl_->algorithm; }
CollectiveStats NcclCommunicator::stats() const { return impl_->stats; }

}  // namespace hopwise::comm
