// Real processes under mpirun: point-to-point over MPI_Isend/MPI_Irecv, and MPI's own collectives as "native".
#pragma once

#include <mpi.h>

#include <memory>
#include <span>
#include <string_view>

#include "hopwise/comm/transport.h"

namespace hopwise::comm {

// Initializes MPI with MPI_THREAD_MULTIPLE when the caller has not (and finalizes it at exit); when the caller
// has, checks that the thread level allows a progress thread. Throws Error otherwise.
void ensure_mpi_initialized();

// A peer is lost (stopped, gone): at exit, no MPI_Finalize, which would wait for it forever.
void mpi_peer_lost();

// Throws TransportError with MPI's own error string when rc is not MPI_SUCCESS.
void check_mpi(int rc, const char* what);

class MpiTransport final : public Transport {
 public:
  // Duplicates `comm` (so hopwise traffic never matches the caller's) and sets MPI_ERRORS_RETURN on the copy.
  explicit MpiTransport(MPI_Comm comm = MPI_COMM_WORLD);
  // A group of MPI_COMM_WORLD's ranks (`members`, in group-rank order), collective over the members only
  // (MPI_Comm_create_group); `key`, alike on the members, tells it from other groups made at the same time.
  static std::unique_ptr<MpiTransport> of_members(std::span<const int> members, std::string_view key);
  ~MpiTransport() override;
  MpiTransport(const MpiTransport&) = delete;
  MpiTransport& operator=(const MpiTransport&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }
  Request isend(const void* buf, std::size_t bytes, int peer, int tag) override;
  Request irecv(void* buf, std::size_t bytes, int peer, int tag) override;
  void wait_all(std::span<Request> reqs) override;
  bool test(Request& r) override;
  void cancel(Request& r) override;
  std::optional<int> probe_any(int tag) override;
  bool has_probe() const override { return true; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  int host_id() const override { return host_id_; }
  NativeCollectives* native() override { return native_.get(); }
  void progress() override;
  SharedSlots* shared_slots() override { return slots_.base.empty() ? nullptr : &slots_; }
  void abandon() override;

  MPI_Comm mpi_comm() const { return comm_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1, host_id_ = 0;
  bool oversubscribed_ = false;
  bool abandoned_ = false;
  std::unique_ptr<NativeCollectives> native_;
  MPI_Win window_ = MPI_WIN_NULL;  // the shared slots, when all ranks share this host
  SharedSlots slots_;
};

// The MPI datatype and op hopwise uses for (dt, op); float16/bfloat16 get committed types and user ops.
MPI_Datatype mpi_datatype(DataType dt);
MPI_Op mpi_op(DataType dt, ReduceOp op);

}  // namespace hopwise::comm
