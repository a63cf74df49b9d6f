// The "hopwise" c10d backend (torch 2.x's c10d::Backend): torch's collectives on a hopwise Communicator (MPI under
// mpirun, else UCX meeting through torch's own store), so that DDP and every torch.distributed call run on
// hopwise's algorithms and plan. torch's ProcessGroup holds it and dispatches to it by the tensors' device.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "hopwise/comm/communicator.h"
#include "work.h"

namespace hopwise::torch_backend {

// Tags 0..kFirstBackendTag-1 are the caller's (send/recv); the ones above carry gather, scatter and alltoall.
inline constexpr int kFirstBackendTag = 9000;

class HopwiseBackend final : public c10d::Backend {
 public:
  // Collective over the group's ranks. `global_ranks`: the group's members as ranks of the world (empty: the
  // world), as torch's extended creator API passes them.
  // `world_rank`, `world_size`: this process in the job as init_process_group was told (-1: not known); outside
  // mpirun they win over RANK/WORLD_SIZE.
  HopwiseBackend(c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::chrono::duration<float> timeout,
                 std::string group_id, std::vector<int64_t> global_ranks, int world_rank = -1, int world_size = -1);
  ~HopwiseBackend() override;

  const std::string getBackendName() const override { return "hopwise"; }
  comm::Communicator& communicator() { return *comm_; }
  // Where every collective call starts (see Sequencer): the codec hooks' calls too.
  Sequencer& sequencer() { return seq_; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits, std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  // Every rank's call arrives within the timeout (opts.timeout, else the group's) or each rank that came fails
  // naming the ranks that did not; works issued before it complete first.
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = {}) override;
  // gloo's: rank 0 hears from every rank; the first missing rank (all of them with wait_all_ranks) named.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks = false) override;

  // Coalescing (torch's _coalescing_manager, batch_isend_irecv): the calls between start and end complete as one.
  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  // Sequence numbers of the group's collectives, the same on every rank that called the same ones.
  uint64_t getSequenceNumberForGroup() override { return sequence_; }

  // A work that completes once `works` have (after `then`); what the codec hooks return too.
  c10::intrusive_ptr<HopwiseWork> make_work(c10d::OpType type, const char* title, std::vector<at::Tensor> outputs,
                                            std::vector<c10::Device> devices = {});
  // The hooks' compressed calls: the user bytes they passed (which the communicator's stats count as a plain
  // call's), so that stats() can put their payloads in place of them.
  void count_compressed_call(std::uint64_t user_bytes) { compressed_user_bytes_ += user_bytes; }
  std::uint64_t compressed_user_bytes() const { return compressed_user_bytes_.load(); }

 private:
  int user_tag(int tag, const char* what) const;
  // The barrier protocol (barrier.cpp): every rank reports to rank 0, which answers each with who came.
  void run_barrier(std::chrono::milliseconds timeout, bool wait_all_ranks, const char* what);
  std::chrono::milliseconds timeout_of(std::chrono::milliseconds asked) const;

  // CUDA tensors (backend_cuda.cpp, where built with CUDA): the NCCL device communicator, made at the group's
  // first CUDA call, and the calls that use it. Each returns null for a CPU tensor (the host path then runs).
  // A build without CUDA refuses them by name.
  struct DeviceSide;
  DeviceSide& device_side(const at::Tensor& t);  // made at the first call, on that tensor's device
  c10::intrusive_ptr<c10d::Work> cuda_allreduce(const at::Tensor& t, const c10d::AllreduceOptions& opts);
  c10::intrusive_ptr<c10d::Work> cuda_broadcast(const at::Tensor& t, const c10d::BroadcastOptions& opts);
  c10::intrusive_ptr<c10d::Work> cuda_allgather(std::vector<at::Tensor>& outputs, const at::Tensor& input);
  c10::intrusive_ptr<c10d::Work> cuda_allgather_base(const at::Tensor& output, const at::Tensor& input);
  c10::intrusive_ptr<c10d::Work> cuda_reduce_scatter_base(const at::Tensor& output, const at::Tensor& input,
                                                          const c10d::ReduceScatterOptions& opts);

  c10::intrusive_ptr<c10d::Store> store_;  // torch's, for the device communicator's rendezvous
  std::shared_ptr<DeviceSide> device_;     // shared: the type is complete only where CUDA is built
  std::unique_ptr<comm::Communicator> comm_;
  std::chrono::milliseconds timeout_;
  std::mutex works_mutex_;
  std::vector<c10::intrusive_ptr<HopwiseWork>> recent_;  // collectives launched, not yet seen complete: what a
                                                         // barrier waits for (not point-to-point, as in gloo)
  bool coalescing_ = false;
  std::vector<c10::intrusive_ptr<HopwiseWork>> coalesced_;  // issued since startCoalescing
  uint64_t sequence_ = 0;
  uint64_t barriers_ = 0;
  std::atomic<std::uint64_t> compressed_user_bytes_{0};
  Sequencer seq_;
  std::mutex anysource_mutex_;
};

}  // namespace hopwise::torch_backend
