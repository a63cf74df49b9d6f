// Inside the DeviceCommunicator: its state (the NCCL communicator, the stream, the workspaces, the store the ranks
// met in, the completion thread) and the state of one DeviceWork. Split by concern: device_errors.cpp (aborts,
// failures, polling, workspaces), device_ring.cpp (the ring of grouped send/recv), device_compressed.cpp (the
// compressed allreduce on the shared recipe), device_collectives.cpp (the public calls), device_work.cpp (the
// handle and its callbacks), device_communicator.cpp (setup, rendezvous, teardown).
#pragma once

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "../completion_thread.h"
#include "hopwise/comm/device_communicator.h"
#include "hopwise/common/cuda_check.h"
#include "hopwise/common/device_buffer.h"

namespace hopwise::comm {

using DeviceClock = std::chrono::steady_clock;

ncclDataType_t nccl_dtype(DataType dt);
// NCCL's op for `op` over `ranks` ranks. avg over one rank is sent as sum (both a copy there): NCCL before 2.29.7
// leaves the last count % 32 elements of a one-rank avg unwritten (its oneRankReduce; seen on an H200 with float64).
ncclRedOp_t nccl_op(ReduceOp op, int ranks);
std::string nccl_text(ncclResult_t r);
// Spin briefly (latency of small collectives), then sleep in short steps (do not burn a core for long waits).
void backoff(int& spins);

struct DeviceWork::State {
  std::shared_ptr<detail::DeviceCommunicatorImpl> impl;
  cudaEvent_t start = nullptr, done = nullptr;
  std::string what;

  std::mutex mutex;  // the outcome and the callbacks (the caller's thread and the completion thread)
  bool settled = false;
  std::exception_ptr error;  // settled without an error: complete
  std::vector<std::function<void(std::exception_ptr)>> callbacks;
  bool watched = false;  // the completion thread polls it

  ~State();
  bool complete();
  // Records the outcome once (later outcomes change nothing) and hands the callbacks to the completion thread.
  void settle(std::exception_ptr e);
  // One look at the event, settling the outcome when the work completed or failed (or `deadline` passed: the
  // communicator is aborted); true once settled. `give_way`: false at once while another thread holds the
  // communicator's lock.
  bool poll_once(bool give_way, DeviceClock::time_point deadline);
  // The settled error rethrown; nothing on success.
  void rethrow();
};

struct detail::DeviceCommunicatorImpl : std::enable_shared_from_this<detail::DeviceCommunicatorImpl> {
  MPI_Comm mpi = MPI_COMM_NULL;  // the MPI constructor's duplicate (its MpiStore's communicator)
  std::shared_ptr<Store> store;
  bool owns_store = false;      // an MpiStore of our own: rank 0 serves it, so its steps end in a handshake
  std::string key_prefix;       // "hopwise/device<n>": this communicator's keys in the store
  std::uint64_t next_step = 0;  // numbers the store steps (key names never repeat)
  int rank = 0, size = 1, local_rank = 0, device = 0;
  DeviceOptions options;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr;  // recorded on the caller's stream; the communicator's stream waits on it
  cudaEvent_t drained = nullptr;
  std::atomic<bool> aborted{false};
  bool closed = false;
  std::string abort_reason;
  std::vector<int> ring;
  DeviceAlgorithm algorithm = DeviceAlgorithm::kNative;
  CollectiveStats stats;
  // Workspaces (grown, never shrunk; growing first drains the stream, whose queued work may still use them).
  DeviceBuffer ring_tmp, stage, barrier_buf, payload, gathered, scales;
  // One thread at a time in NCCL and in the error state: the caller's thread and the completion thread's polls
  // (recursive: an enqueue that grows a workspace drains the stream under it).
  std::recursive_mutex mutex;
  // Runs DeviceWork callbacks, so that a callback may issue and wait for a new call on this communicator.
  std::shared_ptr<CompletionThread> completions = std::make_shared<CompletionThread>();

  ~DeviceCommunicatorImpl() { close(); }

  // ---- device_errors.cpp: errors, aborts, polling, workspaces ----
  void abort(const std::string& reason);
  void check_usable(const std::string& what) const;
  [[noreturn]] void fail_nccl(ncclResult_t r, const std::string& what);
  [[noreturn]] void fail_timeout(const std::string& what);
  // Throws when NCCL reported an asynchronous error (aborting the communicator).
  void check_async(const std::string& what);
  // The result of an NCCL call on this (nonblocking) communicator: ncclInProgress means the call is still being
  // set up (connections, init); polls until it settles, giving up after the timeout.
  void settle(ncclResult_t r, const std::string& what);
  // True once `ev` completed; throws on CUDA/NCCL errors and after an abort. Under `mutex`.
  bool query(cudaEvent_t ev, const std::string& what);
  void poll(cudaEvent_t ev, const std::string& what);
  // Host waits until everything enqueued on the stream so far is done.
  void drain(const std::string& what);
  void* grow(DeviceBuffer& b, std::size_t bytes, const std::string& what);

  // ---- device_ring.cpp ----
  // A send and a receive in one group (either may be empty). Both ranks of a pair compute the same counts.
  void group_send_recv(const void* sbuf, std::size_t scount, int dst, void* rbuf, std::size_t rcount, int src,
                       DataType dt, const std::string& what);
  void ring_allreduce(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op, const std::string& what);

  // ---- device_collectives.cpp ----
  // x[0..n) *= 1/size on the stream.
  void scale_down(DataType dt, void* x, std::size_t n);
  void native_allreduce(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op,
                        const std::string& what);
  void reduce_scatter(const void* in, void* out, std::size_t recvcount, DataType dt, ReduceOp op,
                      const std::string& what);
  void allgather(const void* in, void* out, std::size_t sendcount, DataType dt, const std::string& what);
  void check_ptr(const void* p, std::size_t count, std::string_view what, std::string_view arg) const;
  void check_peer(int r, std::string_view what, std::string_view arg) const;
  // count * size elements of dt, checked for overflow.
  std::size_t times_size(std::size_t count, DataType dt, std::string_view what) const;

  // ---- device_compressed.cpp ----
  void compressed(const float* in, float* out, std::size_t n, const compression::DeviceCodec& codec,
                  compression::DeviceCodecState& st, ReduceOp op, const std::string& what);

  // ---- device_communicator.cpp: setup, rendezvous, teardown ----
  void init();
  std::vector<std::string> host_allgather(std::string_view what, const std::string& mine);
  std::string host_broadcast(std::string_view what, const std::string& value, int root);
  // Waits for the enqueued work (aborting on a timeout); never throws.
  void drain_for_close() noexcept;
  // Finalizes NCCL and frees everything (idempotent; never throws).
  void close() noexcept;

  // Runs `enqueue` on the communicator's stream after the producer's stream; returns the work's handle.
  template <class F>
  DeviceWork run(std::string what, void* producer, std::size_t bytes, F&& enqueue) {
    std::lock_guard lock(mutex);
    check_usable(what);
    cuda::CurrentGuard guard(device);
    auto st = std::make_shared<DeviceWork::State>();
    st->impl = shared_from_this();
    st->what = std::move(what);
    cuda::check(cudaEventCreate(&st->start), "cudaEventCreate", rank);
    cuda::check(cudaEventCreate(&st->done), "cudaEventCreate", rank);
    auto ps = static_cast<cudaStream_t>(producer);
    if (ps != stream) {
      cuda::check(cudaEventRecord(ready, ps),
                  "cudaEventRecord on the caller's stream (is it a valid stream of this rank's device?)", rank);
      cuda::check(cudaStreamWaitEvent(stream, ready, 0), "cudaStreamWaitEvent", rank);
    }
    cuda::check(cudaEventRecord(st->start, stream), "cudaEventRecord", rank);
    enqueue(st->what);
    cuda::check(cudaEventRecord(st->done, stream), "cudaEventRecord", rank);
    ++stats.calls;
    stats.bytes += bytes;
    return DeviceWork(std::move(st));
  }

 private:
  std::string step_name(std::string_view what);
  // Ends a store step of an owned MpiStore: rank 0 returns once every other rank's calls of the step are over
  // (a rank still waiting on rank 0's store when it goes would wait out its timeout); `absent`: ranks that
  // never came.
  void end_step(const std::string& name, const std::vector<int>& absent) noexcept;
  template <class F>
  auto store_step(const std::string& name, F&& f) -> decltype(f());
};

}  // namespace hopwise::comm
