#include "single_copy.h"

#include <fmt/core.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace hopwise::comm::ucx {

namespace {

constexpr std::uint64_t kProbeValue = 0x686f7077697365ULL;  // "hopwise"
const volatile std::uint64_t g_probe = kProbeValue;

constexpr ucp_tag_t kFullMask = ~ucp_tag_t{0};

// What the sender posts where the data would go: where to read, and the word to write when done.
struct Descriptor {
  std::uint64_t pid, address, bytes, ack_address;
};
constexpr std::uint64_t kAckDone = 1;  // else kAckFailed + errno
constexpr std::uint64_t kAckFailed = 2;

// Reads all of [address, address + bytes) of process `pid` into dst; the kernel may return less per call.
bool pull(long pid, std::uint64_t address, void* dst, std::size_t bytes, int& err) {
  std::size_t done = 0;
  while (done < bytes) {
    iovec local{static_cast<char*>(dst) + done, bytes - done};
    iovec remote{reinterpret_cast<void*>(address + done), bytes - done};
    const ssize_t n = ::process_vm_readv(static_cast<pid_t>(pid), &local, 1, &remote, 1, 0);
    if (n <= 0) {
      err = n < 0 ? errno : EIO;
      return false;
    }
    done += static_cast<std::size_t>(n);
  }
  return true;
}

void* request_or_null(ucs_status_ptr_t r) { return UCS_PTR_IS_PTR(r) ? r : nullptr; }

}  // namespace

std::uint64_t probe_address() { return reinterpret_cast<std::uint64_t>(&g_probe); }

bool can_pull_from(long pid, std::uint64_t probe) {
  std::uint64_t v = 0;
  int err = 0;
  return pid > 0 && pull(pid, probe, &v, sizeof v, err) && v == kProbeValue;
}

struct SingleCopy::Op {
  bool is_send = false;
  int peer = -1;
  // send: the descriptor going out, and the word the receiver writes when it has read the data.
  Descriptor desc{};
  void* out = nullptr;  // the descriptor's send (send), the message's receive (recv)
  std::uint64_t ack_value = 0;
  // recv: where the data goes, and how to reach the sender
  void* buf = nullptr;
  std::size_t bytes = 0;
  ucp_ep_h ep = nullptr;
  long pid = 0;
};

namespace {

// Sends withdrawn while their receiver may still write the ack word into them: kept for the process's life (a few
// words per failure; an elastic job lives on past many), and reachable, so that a leak checker sees them kept.
void keep_for_good(void* op) {
  static std::mutex mutex;
  static auto* kept = new std::vector<void*>;
  std::lock_guard lock(mutex);
  kept->push_back(op);
}

}  // namespace

SingleCopy::~SingleCopy() {
  // Called with the workers still up: what is left is released, not waited for.
  for (Op* op : retired_) {
    if (op->out) ucp_request_free(op->out);
    delete op;
  }
}

std::uint64_t SingleCopy::send(ucp_ep_h ep, int peer, const void* buf, std::size_t bytes, int tag) {
  auto* op = new Op;
  op->is_send = true;
  op->peer = peer;
  op->desc = {static_cast<std::uint64_t>(::getpid()), reinterpret_cast<std::uint64_t>(buf), bytes,
              reinterpret_cast<std::uint64_t>(&op->ack_value)};
  ucp_request_param_t param{};
  ucs_status_ptr_t d = ucp_tag_send_nbx(ep, &op->desc, sizeof op->desc,
                                        make_tag(rank_, static_cast<std::uint32_t>(tag), kDescriptorBit), &param);
  if (UCS_PTR_IS_ERR(d)) {
    delete op;
    throw std::runtime_error(
        fmt::format("posting a one-copy send to rank {} failed: {}", peer, ucs_status_string(UCS_PTR_STATUS(d))));
  }
  op->out = request_or_null(d);
  return reinterpret_cast<std::uint64_t>(op) | 1;
}

std::uint64_t SingleCopy::recv(ucp_worker_h worker, ucp_ep_h ep, long pid, int peer, void* buf, std::size_t bytes,
                               int tag) {
  auto* op = new Op;
  op->peer = peer;
  op->buf = buf;
  op->bytes = bytes;
  op->ep = ep;
  op->pid = pid;
  ucp_request_param_t param{};
  // Always a request, whose test says what came: UCX 1.13 left recv_info empty for a receive completed at once.
  param.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  // Data or a descriptor from `peer` with this tag (never an ack): every bit but the descriptor bit must match.
  ucs_status_ptr_t r = ucp_tag_recv_nbx(worker, buf, bytes, make_tag(peer, static_cast<std::uint32_t>(tag)),
                                        kFullMask & ~kDescriptorBit, &param);
  if (UCS_PTR_IS_ERR(r)) {
    delete op;
    throw std::runtime_error(
        fmt::format("posting a receive from rank {} failed: {}", peer, ucs_status_string(UCS_PTR_STATUS(r))));
  }
  op->out = request_or_null(r);
  return reinterpret_cast<std::uint64_t>(op) | 1;
}

ucs_status_t SingleCopy::settle(std::uint64_t handle, std::string& error) {
  Op* op = reinterpret_cast<Op*>(handle & ~std::uint64_t{1});
  if (op->is_send) {
    if (op->out) {
      const ucs_status_t s = ucp_request_check_status(op->out);
      if (s == UCS_INPROGRESS) return s;
      ucp_request_free(op->out);
      op->out = nullptr;
      if (s != UCS_OK) {
        withdraw(op);
        return s;
      }
    }
    // The receiver writes the ack word straight into this process when it has read the data.
    const std::uint64_t ack = __atomic_load_n(&op->ack_value, __ATOMIC_ACQUIRE);
    if (ack == 0) return UCS_INPROGRESS;
    const int peer = op->peer;
    delete op;
    if (ack == kAckDone) return UCS_OK;
    error = fmt::format(
        "rank {} could not read this rank's buffer (process_vm_readv: {}); set "
        "HOPWISE_UCX_SINGLE_COPY=0 to send through shared memory instead",
        peer, std::strerror(static_cast<int>(ack - kAckFailed)));
    return UCS_ERR_IO_ERROR;
  }
  ucp_tag_recv_info_t info{};
  const ucs_status_t s = ucp_tag_recv_request_test(op->out, &info);
  if (s == UCS_INPROGRESS) return s;
  ucp_request_free(op->out);
  op->out = nullptr;
  if (s != UCS_OK || !(info.sender_tag & kDescriptorBit)) {
    delete op;  // plain data, already in place (or an error UCX names)
    return s;
  }
  Descriptor d{};
  std::memcpy(&d, op->buf, sizeof d);
  int err = 0;
  ucs_status_t result = UCS_OK;
  if (d.bytes > op->bytes) {
    err = EMSGSIZE;
    result = UCS_ERR_MESSAGE_TRUNCATED;
  } else if (!pull(op->pid, d.address, op->buf, d.bytes, err)) {
    error = fmt::format(
        "this rank could not read rank {}'s buffer (process_vm_readv: {}); set "
        "HOPWISE_UCX_SINGLE_COPY=0 to send through shared memory instead",
        op->peer, std::strerror(err));
    result = UCS_ERR_IO_ERROR;
  }
  // The ack completes the sender's send: written into its memory, so that it needs no message (an ack sent as a
  // message back could wait behind a full shared-memory queue while the sender waits for it).
  std::uint64_t value = err == 0 ? kAckDone : kAckFailed + static_cast<std::uint64_t>(err);
  iovec local{&value, sizeof value};
  iovec remote{reinterpret_cast<void*>(d.ack_address), sizeof value};
  if (::process_vm_writev(static_cast<pid_t>(op->pid), &local, 1, &remote, 1, 0) != sizeof value && result == UCS_OK) {
    error = fmt::format("this rank could not tell rank {} that it read its buffer (process_vm_writev: {})", op->peer,
                        std::strerror(errno));
    result = UCS_ERR_IO_ERROR;
  }
  delete op;
  return result;
}

void SingleCopy::cancel(ucp_worker_h worker, std::uint64_t handle, const std::function<void()>& progress) {
  Op* op = reinterpret_cast<Op*>(handle & ~std::uint64_t{1});
  if (op->is_send) {
    // A receiver may still read the buffer and write the ack word: the op stays allocated for good, its
    // descriptor send released.
    if (op->out) ucp_request_free(op->out);
    op->out = nullptr;
    keep_for_good(op);
    return;
  }
  if (op->out) {
    ucp_request_cancel(worker, op->out);
    for (int spins = 0; ucp_request_check_status(op->out) == UCS_INPROGRESS && spins < 1000000; ++spins) progress();
  }
  withdraw(op);
}

void SingleCopy::withdraw(Op* op) {
  if (op->out && ucp_request_check_status(op->out) != UCS_INPROGRESS) {
    ucp_request_free(op->out);
    op->out = nullptr;
  }
  if (op->out)
    retired_.push_back(op);  // its receive is still in UCX's hands
  else
    delete op;
}

void SingleCopy::reap() {
  if (retired_.empty()) return;
  retired_.erase(std::remove_if(retired_.begin(), retired_.end(),
                                [](Op* op) {
                                  if (ucp_request_check_status(op->out) == UCS_INPROGRESS) return false;
                                  ucp_request_free(op->out);
                                  delete op;
                                  return true;
                                }),
                 retired_.end());
}

}  // namespace hopwise::comm::ucx
