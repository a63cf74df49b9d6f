// Large messages between ranks of one host in one copy, as Open MPI's vader does with CMA: the sender posts a
// descriptor (its pid, the buffer's address and length) where the data would go; the receiver reads the data
// straight out of the sender's memory with process_vm_readv and writes an ack word into it with
// process_vm_writev; the send completes when that word is set.
// UCX's own CMA path stalled here (ucx_transport.cpp), and its shared-memory path copies twice.
#pragma once

#include <ucp/api/ucp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace hopwise::comm::ucx {

// Tags: the caller's tag in the low 32 bits, the sender's rank above, then whether it is a descriptor.
inline constexpr ucp_tag_t kDescriptorBit = ucp_tag_t{1} << 56;
inline ucp_tag_t make_tag(int src, std::uint32_t low, ucp_tag_t kind = 0) {
  return kind | (static_cast<ucp_tag_t>(static_cast<std::uint32_t>(src) & 0xFFFFFF) << 32) | low;
}

// Messages of at least this many bytes go in one copy (below it the descriptor and ack cost more than the copy).
inline constexpr std::size_t kSingleCopyMin = 64 << 10;

// Where other processes read a known word to learn whether they may read this process's memory at all.
std::uint64_t probe_address();
bool can_pull_from(long pid, std::uint64_t probe);

// The one-copy sends and receives of one transport. A Request's handle for them is the op's address | 1.
class SingleCopy {
 public:
  explicit SingleCopy(int rank) : rank_(rank) {}
  ~SingleCopy();
  SingleCopy(const SingleCopy&) = delete;
  SingleCopy& operator=(const SingleCopy&) = delete;

  static bool is_op(std::uint64_t handle) { return (handle & 1) != 0; }

  // The peer reads from this process (send); this process reads from the peer (receive).
  std::uint64_t send(ucp_ep_h ep, int peer, const void* buf, std::size_t bytes, int tag);
  std::uint64_t recv(ucp_worker_h worker, ucp_ep_h ep, long pid, int peer, void* buf, std::size_t bytes, int tag);

  // UCS_INPROGRESS, UCS_OK (the op is freed), or an error with `error` saying what failed (the op is freed).
  ucs_status_t settle(std::uint64_t handle, std::string& error);
  // Withdraws an op: its receive is cancelled, `progress` called until UCX lets go of it (so it never writes
  // later); what is still out is kept until it finishes (reap).
  void cancel(ucp_worker_h worker, std::uint64_t handle, const std::function<void()>& progress);
  // Frees what finished in the background (receives withdrawn while UCX still held them).
  void reap();

 private:
  struct Op;
  void withdraw(Op* op);
  int rank_;
  std::vector<Op*> retired_;
};

}  // namespace hopwise::comm::ucx
