// The point-to-point contract every algorithm is written against (ring, halving-doubling, tree, barrier), for
// host memory. Implementations, one folder each under comm/src/transports/: MpiTransport (real processes),
// InProcessTransport (ranks as threads), GroupTransport (a subset of another transport's ranks). The contract is
// checked over each of them by tests/test_transport_contract.cpp.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "hopwise/common/dtype.h"

namespace hopwise::comm {

// A pending isend/irecv. `handle` belongs to the transport that made it.
struct Request {
  std::uint64_t handle = 0;
  int peer = -1;
  bool is_recv = false;
  bool active = false;
};

// Optional collectives the transport library does itself ("native": MPI_Allreduce, ncclAllReduce).
class NativeCollectives {
 public:
  virtual ~NativeCollectives() = default;
  virtual void allreduce(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op) = 0;
  virtual void reduce_scatter(const void* in, void* out, std::size_t recvcount, DataType dt, ReduceOp op) = 0;
  // `in` may be this rank's block of `out` (in place).
  virtual void allgather(const void* in, void* out, std::size_t sendcount, DataType dt) = 0;
  virtual void broadcast(void* buf, std::size_t count, DataType dt, int root) = 0;
  virtual void reduce(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op, int root) = 0;
  virtual void barrier() = 0;
};

class Transport;

// What a rank's current collective call is, as the ranks compare it by default (comm/src/call_stamps.h): the call
// number and its part (a call may run several collectives), the fields a mismatch is named by, and the algorithm.
// 48 bytes: one travels beside the first message to each peer; a shared slot's header holds a hash of one.
struct CallStamp {
  std::uint64_t seq = 0;       // the call's number on this communicator
  std::uint32_t part = 0;      // which of the call's collectives (a compressed allreduce runs several)
  std::int32_t algorithm = 0;  // what runs this part: ranks differing here is a tuner fault, not the caller's
  std::int32_t collective = 0, dtype = 0, op = 0, root = 0;
  std::uint64_t count = 0, codec_hash = 0;
};
static_assert(sizeof(CallStamp) == 48);

// Per-rank slots in memory every rank of the transport can read (one host): what a small allreduce needs to
// skip messages altogether. Rank r's slot starts with a 128-byte header holding its sequence flags and the call
// stamps of its last two calls (algorithms/shared_flags.h), then two buffers of slot_bytes (alternate calls use
// alternate buffers).
struct SharedSlots {
  std::size_t slot_bytes = 0;
  std::vector<char*> base;                 // base[r]: rank r's slot
  std::uint64_t seq = 0;                   // this rank's count of calls that used the slots
  std::atomic<std::uint64_t> bytes_in{0};  // bytes this rank copied into its slot (the monitor's host-link bytes)
  static constexpr std::size_t kHeader = 128;
  static std::size_t slot_size(std::size_t slot_bytes) { return kHeader + 2 * slot_bytes; }
};

// The requests of one algorithm step. Any still active when it goes out of scope (an error unwound the
// algorithm) are cancelled, so that no late message lands in the caller's buffer after the call has failed.
class Requests {
 public:
  explicit Requests(Transport& t) : t_(&t) {}
  Requests(Requests&&) = default;
  Requests& operator=(Requests&&) = default;
  ~Requests();
  void push_back(const Request& r) { v_.push_back(r); }
  Request& operator[](std::size_t i) { return v_[i]; }
  std::size_t size() const { return v_.size(); }
  bool empty() const { return v_.empty(); }
  void resize(std::size_t n) { v_.resize(n); }
  void clear();  // the requests must be complete
  operator std::span<Request>() { return v_; }

 private:
  Transport* t_;
  std::vector<Request> v_;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;

  // Messages between one pair with one tag arrive in the order they were sent (MPI's non-overtaking rule).
  // A receive must be at least as large as the matching send.
  virtual Request isend(const void* buf, std::size_t bytes, int peer, int tag) = 0;
  virtual Request irecv(void* buf, std::size_t bytes, int peer, int tag) = 0;

  // Blocks until every active request in `reqs` is complete, or throws TimeoutError naming the peers that are
  // still pending once the timeout passes. Completed requests become inactive.
  virtual void wait_all(std::span<Request> reqs) = 0;
  void wait(Request& r) { wait_all(std::span<Request>(&r, 1)); }
  // True when `r` is complete (it then becomes inactive). Never blocks.
  virtual bool test(Request& r) = 0;
  // Withdraws an active request that will not be waited for (after an error): a cancelled receive never writes
  // into its buffer later. `r` becomes inactive.
  virtual void cancel(Request& r) = 0;
  // A rank whose message with `tag` has arrived and waits, not yet received (a receive from that rank then gets
  // it), else nullopt: receiving from any source without posting receives that might have to be withdrawn.
  // nullopt from transports that cannot look (see has_probe).
  virtual std::optional<int> probe_any(int /*tag*/) { return std::nullopt; }
  virtual bool has_probe() const { return false; }

  // Local rank / host: ranks with the same host_id share memory.
  virtual int local_rank() const { return rank(); }
  virtual int local_size() const { return size(); }
  virtual int host_id() const { return 0; }

  // Shared-memory slots when every rank is on this host, else nullptr.
  virtual SharedSlots* shared_slots() { return nullptr; }

  // The library's own collectives, or nullptr where there are none.
  virtual NativeCollectives* native() { return nullptr; }

  // The call being run, where this is the engine's stamping view of a transport (comm/src/call_stamps.h), else
  // nullptr: an algorithm that moves no messages (the shared slots) compares the ranks' stamps itself.
  virtual const CallStamp* call_stamp() const { return nullptr; }

  // Whether the transport knows that `peer` has failed (its process exited, its connection broke): waits that
  // do not go through wait_all (the shared slots' flags) ask it now and then, so as to fail before the timeout.
  virtual bool peer_gone(int /*peer*/) const { return false; }
  // Lets the library move the messages in flight (rendezvous hand-shakes, acknowledgements). A wait that spins
  // outside the transport (the shared-slot flags) calls it now and then: a peer's large send may need this rank's
  // library to answer before it completes, and a rank that only watched flags would never let it.
  virtual void progress() {}

  // After a failed call: the ranks that have abandoned this transport (this one included), waiting up to `listen`
  // for all to do so; nullopt where the transport keeps no such count (then the ranks exchange notes).
  virtual std::optional<std::vector<int>> ranks_that_gave_up(std::chrono::duration<double> /*listen*/) {
    return std::nullopt;
  }

  // A wait timed out or the transport failed, so a peer may be stopped or gone: from now on this transport must
  // never wait for it again, not even in its destructor (MpiTransport then frees nothing collectively, and leaves
  // MPI unfinalized at exit, since MPI_Finalize waits for every process).
  virtual void abandon() {}
  // Says that `peer` is lost to the job (an elastic job's survivors agree on who is left): ranks still waiting on
  // it fail now rather than at their timeout, so that every survivor reaches the agreement in time.
  virtual void declare_lost(int /*peer*/) {}

  void set_timeout(std::chrono::duration<double> t) { timeout_ = t; }
  std::chrono::duration<double> timeout() const { return timeout_; }

  // Bytes this rank has handed to isend for `peer` since the transport began: what the monitor splits into link
  // classes (within the host, between hosts). A subgroup's transport counts its own sends (its parent counts them too).
  virtual std::uint64_t sent_to(int peer) const;

 protected:
  // Every isend counts its bytes here (cheap: one relaxed atomic add).
  void count_sent(int peer, std::size_t bytes);
  std::chrono::duration<double> timeout_{300.0};

 private:
  mutable std::once_flag sent_once_;
  mutable std::unique_ptr<std::atomic<std::uint64_t>[]> sent_;
  std::atomic<std::uint64_t>* sent_counters() const;
};

}  // namespace hopwise::comm
