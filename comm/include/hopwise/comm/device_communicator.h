// The communicator for device memory: collectives and point-to-point on one GPU per rank (over NCCL), with the
// names of the host Communicator (communicator.h). Every call is enqueued on the communicator's own CUDA stream
// after the caller's `stream` (the producer of the data: cudaStream_t as void*, nullptr = the legacy default
// stream), so async calls overlap the caller's compute; sync calls block the host until the result is there.
//
// Nothing hangs forever: waits poll the CUDA event of the work and NCCL's asynchronous error, and after
// HOPWISE_TIMEOUT_S (or on an NCCL error) the NCCL communicator is aborted and the call throws an error naming this
// rank, the collective and its size; every later call then throws as well (create a new DeviceCommunicator).
// Initialization is nonblocking too (ncclCommInitRankConfig with blocking = 0), so a missing peer times out there.
//
// Ranks meet through a Store (store.h): the MPI constructor makes an MpiStore of its own, the other takes the
// launcher's. Not thread-safe: call one communicator from one thread at a time (like NCCL itself); a DeviceWork
// callback that calls the communicator counts as that thread.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "hopwise/comm/communicator.h"  // Options, CollectiveStats
#include "hopwise/comm/store.h"
#include "hopwise/common/dtype.h"

namespace hopwise::compression {
class DeviceCodec;
struct DeviceCodecState;
}  // namespace hopwise::compression

namespace hopwise::comm {

namespace detail {
struct DeviceCommunicatorImpl;  // comm/src/nccl/device_impl.h
}  // namespace detail

// How allreduce runs: NCCL's own collective (default), or a ring of grouped ncclSend/ncclRecv along
// ring_order() (reduce-scatter then allgather, reductions by hopwise::cuda::reduce_into): the planner's ring.
enum class DeviceAlgorithm : std::uint8_t { kNative, kRing };
std::string_view to_string(DeviceAlgorithm a);
// "native" (or "nccl") or "ring"; throws InvalidArgument listing the choices.
DeviceAlgorithm parse_device_algorithm(std::string_view name);

struct DeviceOptions {
  double timeout_s = 300;                                // HOPWISE_TIMEOUT_S (Options::timeout_from_env)
  DeviceAlgorithm algorithm = DeviceAlgorithm::kNative;  // HOPWISE_NCCL_ALGO=native|ring (allreduce only)
  int device = -1;                                       // -1: local rank (on its host) modulo the visible GPUs
  std::size_t ring_chunk_bytes = 8 << 20;                // largest message of the ring allreduce (bounds its workspace)
  static DeviceOptions from_env();
};

// The handle of an async call. The buffers must stay valid (and unmodified) until the work is complete.
class DeviceWork {
 public:
  struct State;
  DeviceWork() = default;
  explicit DeviceWork(std::shared_ptr<State> s) : state_(std::move(s)) {}

  // Blocks the host until the work is done; gives up after HOPWISE_TIMEOUT_S (from the moment wait() starts):
  // aborts the communicator and throws TimeoutError. Throws TransportError on an NCCL or CUDA error.
  void wait();
  // True once done; never blocks (throws on an NCCL/CUDA error, like wait()).
  bool test();
  // Makes `stream` wait for the work without blocking the host (cudaStreamWaitEvent).
  void wait_on_stream(void* stream);
  // Runs `fn` exactly once after the work's CUDA event has fired (its result in place), with its error (null on
  // success): at once on this thread if the work is already complete, else on the communicator's completion
  // thread, in completion order, never while a hopwise lock is held. `fn` may issue calls on the same
  // communicator and wait for them. Work nobody waits for is watched with the communicator's timeout, counted
  // from this call (then the communicator is aborted, as by wait()); work the communicator's destruction leaves
  // unfinished calls back with an error. An exception thrown by `fn` is logged and dropped.
  void on_complete(std::function<void(std::exception_ptr)> fn);
  bool valid() const { return state_ != nullptr; }
  // Milliseconds the work spent on the communicator's stream (from when its inputs were ready). Needs a complete
  // work (wait() or test() == true).
  double elapsed_ms() const;
  // "allreduce of 1000 float32", as errors name it.
  const std::string& description() const;

 private:
  std::shared_ptr<State> state_;
};

class DeviceCommunicator {
 public:
  // Collective over `comm` (duplicated; MPI is initialized if the caller has not, and must provide
  // MPI_THREAD_MULTIPLE: rank 0's store serves from a thread): picks and sets the device, creates the NCCL
  // communicator (rank 0's ncclUniqueId, shared through an MpiStore on the duplicate) and a nonblocking stream.
  explicit DeviceCommunicator(MPI_Comm comm = MPI_COMM_WORLD, DeviceOptions options = DeviceOptions::from_env());
  // The same without MPI: `size` ranks meet through `store` (every rank passes the same store, its own `rank`
  // and its rank among the ranks of its host, `local_rank`). Ranks that create several communicators on one
  // store create them in the same order.
  DeviceCommunicator(std::shared_ptr<Store> store, int rank, int size, int local_rank,
                     DeviceOptions options = DeviceOptions::from_env());
  // Waits (up to the timeout) for the enqueued work, runs the callbacks still due, then finalizes the NCCL
  // communicator (aborts it on failure).
  ~DeviceCommunicator();
  DeviceCommunicator(const DeviceCommunicator&) = delete;
  DeviceCommunicator& operator=(const DeviceCommunicator&) = delete;

  int rank() const;
  int size() const;
  int local_rank() const;  // rank among the ranks of this host
  int device() const;      // the CUDA device this rank uses
  void* stream() const;    // the communicator's cudaStream_t
  double timeout_s() const;
  bool aborted() const;

  // ---- small host-side agreements, through the store the ranks met in (collective, in call order) ----
  Store& store();
  // Every rank's `mine`, in rank order. `what` names the step in keys and errors.
  std::vector<std::string> host_allgather(std::string_view what, const std::string& mine);
  // `root`'s `value` on every rank (read at the root only).
  std::string host_broadcast(std::string_view what, const std::string& value, int root = 0);

  // ---- collectives (sync: the host returns when the result is in place); device or managed memory ----
  // `in` may equal `out`. `stream`: the stream that produced the inputs (its earlier work runs first).
  void allreduce(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op = ReduceOp::kSum,
                 void* stream = nullptr);
  // in: size() * recvcount elements; out: recvcount (this rank's block).
  void reduce_scatter(const void* in, void* out, std::size_t recvcount, DataType dt, ReduceOp op = ReduceOp::kSum,
                      void* stream = nullptr);
  // in: sendcount elements; out: size() * sendcount, rank-major.
  void allgather(const void* in, void* out, std::size_t sendcount, DataType dt, void* stream = nullptr);
  void broadcast(void* buf, std::size_t count, DataType dt, int root, void* stream = nullptr);
  // out is written at root only (and may be null elsewhere).
  void reduce(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op, int root, void* stream = nullptr);
  void barrier();
  // Point-to-point (NCCL matches sends and receives between two ranks in call order; there are no tags).
  void send(const void* buf, std::size_t count, DataType dt, int peer, void* stream = nullptr);
  void recv(void* buf, std::size_t count, DataType dt, int peer, void* stream = nullptr);
  // A send and a receive in one NCCL group (so that rings and exchanges with oneself do not deadlock).
  void send_recv(const void* sendbuf, std::size_t sendcount, int dst, void* recvbuf, std::size_t recvcount, int src,
                 DataType dt, void* stream = nullptr);

  // ---- async ----
  DeviceWork allreduce_async(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op = ReduceOp::kSum,
                             void* stream = nullptr);
  DeviceWork reduce_scatter_async(const void* in, void* out, std::size_t recvcount, DataType dt,
                                  ReduceOp op = ReduceOp::kSum, void* stream = nullptr);
  DeviceWork allgather_async(const void* in, void* out, std::size_t sendcount, DataType dt, void* stream = nullptr);
  DeviceWork broadcast_async(void* buf, std::size_t count, DataType dt, int root, void* stream = nullptr);
  DeviceWork reduce_async(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op, int root,
                          void* stream = nullptr);
  DeviceWork barrier_async();
  DeviceWork send_async(const void* buf, std::size_t count, DataType dt, int peer, void* stream = nullptr);
  DeviceWork recv_async(void* buf, std::size_t count, DataType dt, int peer, void* stream = nullptr);
  DeviceWork send_recv_async(const void* sendbuf, std::size_t sendcount, int dst, void* recvbuf, std::size_t recvcount,
                             int src, DataType dt, void* stream = nullptr);

  // ---- compressed allreduce (float32), as Communicator::allreduce_compressed: aggregatable codecs all-reduce
  // their payloads (after a max-allreduce of the agreed scales where the codec needs them), gather codecs
  // all-gather them and every rank decodes each. op: sum or avg. `in` may equal `out`; codec and state must
  // outlive the work. ----
  void allreduce_compressed(const float* in, float* out, std::size_t count, const compression::DeviceCodec& codec,
                            compression::DeviceCodecState& state, ReduceOp op = ReduceOp::kSum, void* stream = nullptr);
  DeviceWork allreduce_compressed_async(const float* in, float* out, std::size_t count,
                                        const compression::DeviceCodec& codec, compression::DeviceCodecState& state,
                                        ReduceOp op = ReduceOp::kSum, void* stream = nullptr);

  // ---- plan and algorithm ----
  // The ring the kRing allreduce follows (a permutation of 0..size()-1; rank order by default). Every rank must
  // set the same order.
  void set_ring_order(std::vector<int> order);
  const std::vector<int>& ring_order() const;
  void set_algorithm(DeviceAlgorithm a);
  DeviceAlgorithm algorithm() const;
  CollectiveStats stats() const;

 private:
  std::shared_ptr<detail::DeviceCommunicatorImpl> impl_;  // shared with the DeviceWork handles (they may outlive it)
};

}  // namespace hopwise::comm
