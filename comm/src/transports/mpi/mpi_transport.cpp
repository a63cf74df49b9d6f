#include "hopwise/comm/transports/mpi_transport.h"

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "hopwise/common/error.h"
#include "hopwise/common/reduce.h"

namespace hopwise::comm {

static_assert(sizeof(MPI_Request) <= sizeof(std::uint64_t), "MPI_Request must fit a Request handle");

namespace {

MPI_Request to_mpi(std::uint64_t h) {
  MPI_Request r;
  std::memcpy(&r, &h, sizeof r);
  return r;
}
std::uint64_t from_mpi(MPI_Request r) {
  std::uint64_t h = 0;
  std::memcpy(&h, &r, sizeof r);
  return h;
}

int to_int_count(std::size_t n, const char* what) {
  if (n > static_cast<std::size_t>(INT_MAX))
    throw InvalidArgument(
        fmt::format("{}: {} elements exceed MPI's int count limit; split the call or choose a "
                    "hopwise algorithm (ring, hd, tree), which sends in chunks",
                    what, n));
  return static_cast<int>(n);
}

// float16 and bfloat16 have no MPI type: they travel as 2-byte types with user-defined reduction ops. The same
// ops (hopwise's kernels) serve uint8 sum and prod: Open MPI 4.1's vectorized MPI_SUM saturates 8-bit
// integers at 255 instead of wrapping, so MPI_SUM on MPI_UINT8_T gives wrong results there.
struct HalfTypes {
  MPI_Datatype fp16 = MPI_DATATYPE_NULL, bf16 = MPI_DATATYPE_NULL;
  MPI_Op ops[5] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
};

template <ReduceOp Op>
void half_op(void* in, void* inout, int* len, MPI_Datatype* type);

HalfTypes& half_types() {
  static HalfTypes t = [] {
    HalfTypes h;
    check_mpi(MPI_Type_contiguous(2, MPI_BYTE, &h.fp16), "MPI_Type_contiguous");
    check_mpi(MPI_Type_commit(&h.fp16), "MPI_Type_commit");
    check_mpi(MPI_Type_contiguous(2, MPI_BYTE, &h.bf16), "MPI_Type_contiguous");
    check_mpi(MPI_Type_commit(&h.bf16), "MPI_Type_commit");
    check_mpi(MPI_Op_create(&half_op<ReduceOp::kSum>, 1, &h.ops[0]), "MPI_Op_create");
    check_mpi(MPI_Op_create(&half_op<ReduceOp::kSum>, 1, &h.ops[1]), "MPI_Op_create");
    check_mpi(MPI_Op_create(&half_op<ReduceOp::kMin>, 1, &h.ops[2]), "MPI_Op_create");
    check_mpi(MPI_Op_create(&half_op<ReduceOp::kMax>, 1, &h.ops[3]), "MPI_Op_create");
    check_mpi(MPI_Op_create(&half_op<ReduceOp::kProd>, 1, &h.ops[4]), "MPI_Op_create");
    return h;
  }();
  return t;
}

template <ReduceOp Op>
void half_op(void* in, void* inout, int* len, MPI_Datatype* type) {
  const DataType dt = *type == half_types().fp16   ? DataType::kFloat16
                      : *type == half_types().bf16 ? DataType::kBFloat16
                                                   : DataType::kUInt8;
  reduce_into(dt, Op, inout, inout, in, static_cast<std::size_t>(*len));
}

bool g_we_initialized = false;
std::atomic<bool> g_abandoned{false};  // a transport gave up on a peer: MPI_Finalize would wait for it forever

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (g_abandoned) {
    // No MPI_Finalize (it would wait for the lost peer); mpirun ends the job when this process exits. The other
    // ranks that lost the same peer time out at about the same moment: a second lets them report it too.
    std::this_thread::sleep_for(std::chrono::seconds(1));
    return;
  }
  MPI_Finalize();
}

// Polls `done` (true once MPI's requests completed) as every MPI wait here does: spinning, yielding every spin where
// the host is oversubscribed, and after 300 us polling every 50 us (a long wait means the peer is busy elsewhere:
// stop burning the core this rank's own compute needs; short waits, a transfer in flight, still spin). False once
// `timeout` has passed.
template <class Done>
bool poll_until(Done done, bool oversubscribed, std::chrono::duration<double> timeout) {
  const auto start = std::chrono::steady_clock::now();
  const int yield_every = oversubscribed ? 1 : 64;
  for (long spins = 1;; ++spins) {
    if (done()) return true;
    if (spins % yield_every == 0) sched_yield();
    const auto now = std::chrono::steady_clock::now();  // every spin: under load a yield may take milliseconds
    if (spins % 64 == 0 && now - start > std::chrono::microseconds(300))
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    if (now - start > timeout) return false;
  }
}

// MPI's collectives, in their nonblocking form and waited for with the transport's timeout: a blocking
// MPI_Allreduce has no deadline, so a peer stopped inside it (after the neighbours' exchange that precedes a native
// call) would hang this rank for ever. MPI cannot cancel a collective: a timed-out request is left behind with the
// communicator, which is unusable from then on (the progress thread abandons the transport).
// MPI does not say what its collectives sent, to whom: each call counts what a bandwidth-optimal algorithm sends
// from this rank (allreduce 2(n-1)/n of the data, reduce-scatter and allgather (n-1) blocks, the root's data for a
// broadcast, every other rank's for a reduce), to the next rank (the root for a reduce), so that the monitor's link
// bytes do not fall to zero when the tuner picks MPI.
class MpiNative final : public NativeCollectives {
 public:
  using Count = std::function<void(int peer, std::size_t bytes)>;
  MpiNative(MPI_Comm comm, const Transport& owner, bool oversubscribed, Count count)
      : comm_(comm),
        owner_(owner),
        rank_(owner.rank()),
        size_(owner.size()),
        oversubscribed_(oversubscribed),
        count_(std::move(count)) {}
  void allreduce(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op) override {
    MPI_Request r;
    check_mpi(MPI_Iallreduce(in == out ? MPI_IN_PLACE : in, out, to_int_count(count, "MPI_Iallreduce"),
                             mpi_datatype(dt), mpi_op(dt, op), comm_, &r),
              "MPI_Iallreduce");
    finish(r, "MPI_Iallreduce");
    to_next(2 * (count * dtype_size(dt) / static_cast<std::size_t>(size_)) * static_cast<std::size_t>(size_ - 1));
  }
  void reduce_scatter(const void* in, void* out, std::size_t recvcount, DataType dt, ReduceOp op) override {
    MPI_Request r;
    check_mpi(MPI_Ireduce_scatter_block(in, out, to_int_count(recvcount, "MPI_Ireduce_scatter_block"), mpi_datatype(dt),
                                        mpi_op(dt, op), comm_, &r),
              "MPI_Ireduce_scatter_block");
    finish(r, "MPI_Ireduce_scatter_block");
    to_next(recvcount * dtype_size(dt) * static_cast<std::size_t>(size_ - 1));
  }
  // `in` at this rank's block of `out` is the in-place form, which MPI spells MPI_IN_PLACE.
  void allgather(const void* in, void* out, std::size_t sendcount, DataType dt) override {
    const char* mine = static_cast<const char*>(out) + static_cast<std::size_t>(rank_) * sendcount * dtype_size(dt);
    if (in == mine) in = MPI_IN_PLACE;
    MPI_Request r;
    check_mpi(MPI_Iallgather(in, to_int_count(sendcount, "MPI_Iallgather"), mpi_datatype(dt), out,
                             static_cast<int>(sendcount), mpi_datatype(dt), comm_, &r),
              "MPI_Iallgather");
    finish(r, "MPI_Iallgather");
    to_next(sendcount * dtype_size(dt) * static_cast<std::size_t>(size_ - 1));
  }
  void broadcast(void* buf, std::size_t count, DataType dt, int root) override {
    MPI_Request r;
    check_mpi(MPI_Ibcast(buf, to_int_count(count, "MPI_Ibcast"), mpi_datatype(dt), root, comm_, &r), "MPI_Ibcast");
    finish(r, "MPI_Ibcast");
    if (rank_ == root) to_next(count * dtype_size(dt));
  }
  void reduce(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op, int root) override {
    const void* send = (rank_ == root && in == out) ? MPI_IN_PLACE : in;
    MPI_Request r;
    check_mpi(
        MPI_Ireduce(send, out, to_int_count(count, "MPI_Ireduce"), mpi_datatype(dt), mpi_op(dt, op), root, comm_, &r),
        "MPI_Ireduce");
    finish(r, "MPI_Ireduce");
    if (rank_ != root) count_(root, count * dtype_size(dt));
  }
  void barrier() override {
    MPI_Request r;
    check_mpi(MPI_Ibarrier(comm_, &r), "MPI_Ibarrier");
    finish(r, "MPI_Ibarrier");
  }

 private:
  // Waits as wait_all does, with the transport's timeout. MPI does not say which peer its collective waits for: the
  // TimeoutError names none, and the communicator then asks who else gave up (explain_timeout), which names the rank.
  void finish(MPI_Request& r, const char* what) {
    const auto done = [&] {
      int flag = 0;
      check_mpi(MPI_Test(&r, &flag, MPI_STATUS_IGNORE), what);
      return flag != 0;
    };
    if (!poll_until(done, oversubscribed_, owner_.timeout()))
      throw TimeoutError(fmt::format("rank {} timed out after {:.1f} s in {} (MPI's own collective, which does not "
                                     "say whom it waits for); a peer died, stalled or skipped this call (raise "
                                     "HOPWISE_TIMEOUT_S if it is only slow)",
                                     rank_, owner_.timeout().count(), what),
                         {});
  }
  void to_next(std::size_t bytes) {
    if (size_ > 1) count_((rank_ + 1) % size_, bytes);
  }
  MPI_Comm comm_;
  const Transport& owner_;  // its timeout, read at each call (set_timeout may change it)
  int rank_, size_;
  bool oversubscribed_;
  Count count_;
};

}  // namespace

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw TransportError(
      fmt::format("{} failed: {} (MPI error {})", what, std::string_view(text, static_cast<std::size_t>(len)), rc));
}

void ensure_mpi_initialized() {
  static std::mutex m;
  std::lock_guard lock(m);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) throw Error("MPI is already finalized; create hopwise communicators before MPI_Finalize");
  int provided = 0;
  if (!initialized) {
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
      throw Error("MPI_Init_thread failed; launch with mpirun (or as a single process with MPI installed)");
    g_we_initialized = true;
    std::atexit(finalize_at_exit);
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_MULTIPLE)
    throw Error(
        fmt::format("MPI provides thread level {} but hopwise's progress thread needs MPI_THREAD_MULTIPLE ({}); "
                    "initialize MPI with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) or let hopwise do it",
                    provided, MPI_THREAD_MULTIPLE));
}

MPI_Datatype mpi_datatype(DataType dt) {
  switch (dt) {
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
    case DataType::kInt32: return MPI_INT32_T;
    case DataType::kInt64: return MPI_INT64_T;
    case DataType::kUInt8: return MPI_UINT8_T;
    case DataType::kFloat16: return half_types().fp16;
    case DataType::kBFloat16: return half_types().bf16;
  }
  throw InvalidArgument("unknown dtype for MPI");
}

MPI_Op mpi_op(DataType dt, ReduceOp op) {
  if (dt == DataType::kFloat16 || dt == DataType::kBFloat16) return half_types().ops[static_cast<int>(op)];
  if (dt == DataType::kUInt8 && (op == ReduceOp::kSum || op == ReduceOp::kProd))
    return half_types().ops[static_cast<int>(op)];
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return MPI_SUM;
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kProd: return MPI_PROD;
  }
  throw InvalidArgument("unknown reduce op for MPI");
}

std::unique_ptr<MpiTransport> MpiTransport::of_members(std::span<const int> members, std::string_view key) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) throw InvalidArgument("a group over MPI needs the job's world first (its world transport)");
  MPI_Group world_group, group;
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  const int rc_incl = MPI_Group_incl(world_group, static_cast<int>(members.size()), members.data(), &group);
  MPI_Group_free(&world_group);
  check_mpi(rc_incl, "MPI_Group_incl (the group's members)");
  MPI_Comm sub = MPI_COMM_NULL;
  // A tag from the key: no other group's creation at the same time uses it.
  const int tag = static_cast<int>(std::hash<std::string_view>{}(key) % 30000);
  const int rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &sub);
  MPI_Group_free(&group);
  check_mpi(rc, "MPI_Comm_create_group");
  if (sub == MPI_COMM_NULL) throw InvalidArgument("MPI_Comm_create_group: this rank is not one of the group's members");
  std::unique_ptr<MpiTransport> t;
  try {
    t = std::make_unique<MpiTransport>(sub);
  } catch (...) {
    MPI_Comm_free(&sub);
    throw;
  }
  MPI_Comm_free(&sub);  // the transport keeps a duplicate
  return t;
}

MpiTransport::MpiTransport(MPI_Comm comm) {
  ensure_mpi_initialized();
  check_mpi(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);

  MPI_Comm local = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local), "MPI_Comm_split_type");
  MPI_Comm_rank(local, &local_rank_);
  MPI_Comm_size(local, &local_size_);
  MPI_Comm_free(&local);

  // Hosts are numbered by the first rank on each, so host ids follow rank order.
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  std::vector<char> all(static_cast<std::size_t>(size_) * MPI_MAX_PROCESSOR_NAME);
  check_mpi(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, comm_),
            "MPI_Allgather(host names)");
  std::map<std::string, int> ids;
  for (int r = 0; r < size_; ++r) {
    std::string h(&all[static_cast<std::size_t>(r) * MPI_MAX_PROCESSOR_NAME]);
    ids.emplace(h, static_cast<int>(ids.size()));
    if (r == rank_) host_id_ = ids[h];
  }
  oversubscribed_ = local_size_ > static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  native_ = std::make_unique<MpiNative>(comm_, *this, oversubscribed_,
                                        [this](int peer, std::size_t bytes) { count_sent(peer, bytes); });

  // One host: a shared window of per-rank slots lets small allreduces skip MPI's message path.
  if (local_size_ == size_ && size_ > 1) {
    constexpr std::size_t kSlotBytes = 1 << 20;
    char* mine = nullptr;
    const MPI_Aint bytes = static_cast<MPI_Aint>(SharedSlots::slot_size(kSlotBytes));
    if (MPI_Win_allocate_shared(bytes, 1, MPI_INFO_NULL, comm_, &mine, &window_) == MPI_SUCCESS) {
      std::memset(mine, 0, static_cast<std::size_t>(bytes));  // flags start at 0; pages touched now
      slots_.slot_bytes = kSlotBytes;
      for (int r = 0; r < size_; ++r) {
        MPI_Aint size = 0;
        int disp = 0;
        char* base = nullptr;
        check_mpi(MPI_Win_shared_query(window_, r, &size, &disp, &base), "MPI_Win_shared_query");
        slots_.base.push_back(base);
      }
    }
    check_mpi(MPI_Barrier(comm_), "MPI_Barrier(shared slots)");
  }
}

MpiTransport::~MpiTransport() {
  if (abandoned_) return;  // MPI_Win_free is collective: it would wait for the peer that is gone
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && window_ != MPI_WIN_NULL) MPI_Win_free(&window_);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

Request MpiTransport::isend(const void* buf, std::size_t bytes, int peer, int tag) {
  MPI_Request r;
  check_mpi(MPI_Isend(buf, to_int_count(bytes, "MPI_Isend"), MPI_BYTE, peer, tag, comm_, &r), "MPI_Isend");
  count_sent(peer, bytes);
  return Request{from_mpi(r), peer, false, true};
}

Request MpiTransport::irecv(void* buf, std::size_t bytes, int peer, int tag) {
  MPI_Request r;
  check_mpi(MPI_Irecv(buf, to_int_count(bytes, "MPI_Irecv"), MPI_BYTE, peer, tag, comm_, &r), "MPI_Irecv");
  return Request{from_mpi(r), peer, true, true};
}

// Polls rather than blocks in MPI_Waitall so that the timeout holds; yields now and then so that
// oversubscribed ranks (more ranks than cores) let their peers run.
void MpiTransport::wait_all(std::span<Request> reqs) {
  thread_local std::vector<MPI_Request> mpi;
  thread_local std::vector<std::size_t> index;
  mpi.clear();
  index.clear();
  for (std::size_t i = 0; i < reqs.size(); ++i)
    if (reqs[i].active) {
      mpi.push_back(to_mpi(reqs[i].handle));
      index.push_back(i);
    }
  if (mpi.empty()) return;
  const auto done = [&] {
    int flag = 0;
    check_mpi(MPI_Testall(static_cast<int>(mpi.size()), mpi.data(), &flag, MPI_STATUSES_IGNORE), "MPI_Testall");
    return flag != 0;
  };
  if (!poll_until(done, oversubscribed_, timeout_)) {
    std::vector<int> pending;
    for (std::size_t k = 0; k < mpi.size(); ++k) {
      int flag = 0;
      MPI_Test(&mpi[k], &flag, MPI_STATUS_IGNORE);
      if (!flag) {
        pending.push_back(reqs[index[k]].peer);
        if (reqs[index[k]].is_recv) MPI_Cancel(&mpi[k]);
      }
      reqs[index[k]].active = false;
    }
    std::sort(pending.begin(), pending.end());
    pending.erase(std::unique(pending.begin(), pending.end()), pending.end());
    throw TimeoutError(fmt::format("rank {} timed out after {:.1f} s waiting for rank(s) {}; a peer died, stalled or "
                                   "skipped this call (raise HOPWISE_TIMEOUT_S if it is only slow)",
                                   rank_, timeout_.count(), fmt::join(pending, ",")),
                       pending);
  }
  for (std::size_t i : index) reqs[i].active = false;
}

void mpi_peer_lost() { g_abandoned = true; }

void MpiTransport::abandon() {
  abandoned_ = true;
  g_abandoned = true;
}

void MpiTransport::cancel(Request& r) {
  if (!r.active) return;
  MPI_Request m = to_mpi(r.handle);
  if (r.is_recv) MPI_Cancel(&m);  // a send cannot be recalled reliably; it only reads the caller's buffer
  MPI_Request_free(&m);
  r.active = false;
}

std::optional<int> MpiTransport::probe_any(int tag) {
  int flag = 0;
  MPI_Status status;
  check_mpi(MPI_Iprobe(MPI_ANY_SOURCE, tag, comm_, &flag, &status), "MPI_Iprobe");
  return flag ? std::optional<int>(status.MPI_SOURCE) : std::nullopt;
}

// Any MPI call drives Open MPI's progress engine; a probe that matches nothing consumes nothing.
void MpiTransport::progress() {
  int flag = 0;
  MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, MPI_STATUS_IGNORE);
}

bool MpiTransport::test(Request& r) {
  if (!r.active) return true;
  MPI_Request m = to_mpi(r.handle);
  int flag = 0;
  check_mpi(MPI_Test(&m, &flag, MPI_STATUS_IGNORE), "MPI_Test");
  if (flag) r.active = false;
  return flag != 0;
}

}  // namespace hopwise::comm
