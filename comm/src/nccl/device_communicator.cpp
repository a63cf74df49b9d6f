// The DeviceCommunicator's life: options, the two ways ranks meet (an MpiStore made from a duplicate of the
// caller's MPI communicator, or the launcher's Store), the rendezvous through the store (every rank got its GPU,
// rank 0's NCCL unique id), the nonblocking NCCL setup, the small host-side agreements later calls make through
// the same store, and the teardown (its own waits, then the callbacks still due, then NCCL's finalize).
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "../call_checks.h"
#include "device_impl.h"
#include "hopwise/comm/transports/mpi_store.h"
#include "hopwise/comm/transports/mpi_transport.h"
#include "hopwise/common/cuda_reduce.h"
#include "hopwise/common/env.h"
#include "hopwise/common/error.h"

namespace hopwise::comm {

using Impl = detail::DeviceCommunicatorImpl;

std::string_view to_string(DeviceAlgorithm a) { return a == DeviceAlgorithm::kRing ? "ring" : "native"; }

DeviceAlgorithm parse_device_algorithm(std::string_view name) {
  if (name == "native" || name == "nccl") return DeviceAlgorithm::kNative;
  if (name == "ring") return DeviceAlgorithm::kRing;
  throw InvalidArgument(
      fmt::format("unknown device algorithm '{}'; choose native (NCCL's own collectives) or ring "
                  "(the planned ring over ncclSend/ncclRecv)",
                  name));
}

DeviceOptions DeviceOptions::from_env() {
  DeviceOptions o;
  o.timeout_s = Options::timeout_from_env();  // not the whole host Options: a bad HOPWISE_ALGO is not ours
  const std::string algo = env::get_or("HOPWISE_NCCL_ALGO", "native");
  try {
    o.algorithm = parse_device_algorithm(algo);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("HOPWISE_NCCL_ALGO: {}", e.what()));
  }
  return o;
}

// ---- the store steps ----
std::string Impl::step_name(std::string_view what) { return fmt::format("{}/{}/{}", key_prefix, next_step++, what); }

void Impl::end_step(const std::string& name, const std::vector<int>& absent) noexcept {
  auto came = [&](int r) { return std::find(absent.begin(), absent.end(), r) == absent.end(); };
  auto done_key = [&](int r) { return fmt::format("{}/done/{}", name, r); };
  try {
    if (rank != 0) {
      if (came(0)) store->set(done_key(rank), "");
      return;
    }
    std::vector<std::string> keys;
    for (int r = 1; r < size; ++r)
      if (came(r)) keys.push_back(done_key(r));
    if (!keys.empty()) store->wait(keys, Store::Seconds(options.timeout_s));
  } catch (...) {  // the step itself reports what went wrong
  }
}

template <class F>
auto Impl::store_step(const std::string& name, F&& f) -> decltype(f()) {
  if (!owns_store) return f();
  std::exception_ptr error;
  std::vector<int> absent;
  decltype(f()) out{};
  try {
    out = f();
  } catch (const TimeoutError& e) {
    error = std::current_exception();
    absent = e.pending_ranks();
  } catch (...) {
    error = std::current_exception();
  }
  end_step(name, absent);
  if (error) std::rethrow_exception(error);
  return out;
}

std::vector<std::string> Impl::host_allgather(std::string_view what, const std::string& mine) {
  const std::string name = step_name(what);
  return store_step(name, [&] {
    return hopwise::comm::store_allgather(*store, name, rank, size, mine, Store::Seconds(options.timeout_s));
  });
}

std::string Impl::host_broadcast(std::string_view what, const std::string& value, int root) {
  const std::string name = step_name(what);
  return store_step(name, [&] {
    return hopwise::comm::store_broadcast(*store, name, rank, root, value, Store::Seconds(options.timeout_s));
  });
}

// ---- setup ----
void Impl::init() {
  ring.resize(static_cast<std::size_t>(size));
  std::iota(ring.begin(), ring.end(), 0);
  algorithm = options.algorithm;
  // This communicator's keys: the how-many-th on this store, counted per rank (ranks create them in one order).
  key_prefix = fmt::format("hopwise/device{}", store->add(fmt::format("hopwise/device_communicators/{}", rank), 1));

  // This rank's GPU. Every rank learns whether all succeeded before the id exchange, so that a rank without a
  // GPU does not leave the others waiting for the id.
  std::exception_ptr local_error;
  std::string mine = "1";
  try {
    std::string why;
    const int n = cuda::device_count(&why);
    if (n == 0)
      throw TransportError(
          fmt::format("rank {}: no CUDA device is visible ({}); DeviceCommunicator needs a GPU per "
                      "rank: check nvidia-smi and CUDA_VISIBLE_DEVICES, or use "
                      "hopwise::comm::Communicator for host memory",
                      rank, why));
    if (options.device >= n)
      throw InvalidArgument(
          fmt::format("rank {}: DeviceOptions::device is {} but only {} CUDA device(s) are "
                      "visible; pick 0..{} or -1 (local rank modulo the devices)",
                      rank, options.device, n, n - 1));
    device = options.device >= 0 ? options.device : local_rank % n;
    cuda::check(cudaSetDevice(device), fmt::format("cudaSetDevice({})", device), rank);
    cuda::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", rank);
    cuda::check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate", rank);
    cuda::check(cudaEventCreateWithFlags(&drained, cudaEventDisableTiming), "cudaEventCreate", rank);
  } catch (const std::exception& e) {
    local_error = std::current_exception();
    mine = std::string("0") + e.what();
  } catch (...) {
    local_error = std::current_exception();
    mine = "0an unknown error";
  }
  const std::vector<std::string> gpus = host_allgather("gpu", mine);
  if (local_error) std::rethrow_exception(local_error);
  std::vector<int> failed;
  for (int r = 0; r < size; ++r)
    if (gpus[static_cast<std::size_t>(r)].rfind('1', 0) != 0) failed.push_back(r);
  if (!failed.empty())
    throw TransportError(
        fmt::format("rank {}: another rank ({}) could not set up its GPU ({}); DeviceCommunicator "
                    "needs a GPU on every rank",
                    rank, fmt::join(failed, ", "), gpus[static_cast<std::size_t>(failed.front())].substr(1)));

  // Rank 0's unique id, with whether it could make one: "1" + the id, or "0" + NCCL's error.
  ncclUniqueId id{};
  std::string offer;
  if (rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    offer.push_back(r == ncclSuccess ? '1' : '0');
    if (r == ncclSuccess)
      offer.append(reinterpret_cast<const char*>(&id), sizeof(id));
    else
      offer.append(nccl_text(r));
  }
  const std::string got = host_broadcast("nccl_id", offer, 0);
  if (got.size() != 1 + sizeof(id) || got[0] != '1')
    throw TransportError(
        fmt::format("rank {}: rank 0 could not create the NCCL unique id ({}); check NCCL's network "
                    "setup (NCCL_SOCKET_IFNAME, NCCL_DEBUG=WARN)",
                    rank, got.empty() ? "no answer" : got.substr(1)));
  std::memcpy(&id, got.data() + 1, sizeof(id));

  // Nonblocking, so that a rank that never arrives makes init time out instead of hang.
  std::lock_guard lock(mutex);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (comm != nullptr) ncclCommAbort(comm);
    comm = nullptr;
    throw TransportError(
        fmt::format("rank {}: ncclCommInitRankConfig over {} ranks on device {} failed: {}; check "
                    "NCCL_DEBUG=WARN output",
                    rank, size, device, nccl_text(r)));
  }
  settle(r, fmt::format("communicator setup (ncclCommInitRankConfig over {} ranks, device {})", size, device));
}

// ---- teardown (never throws) ----
void Impl::drain_for_close() noexcept {
  std::lock_guard lock(mutex);
  if (closed || stream == nullptr || comm == nullptr || aborted) return;
  cuda::CurrentGuard guard(device);
  try {
    drain("work still queued when the communicator was destroyed");
  } catch (...) {  // timed out or failed: drain() aborted the communicator
  }
}

void Impl::close() noexcept {
  drain_for_close();
  std::lock_guard lock(mutex);
  if (closed) return;
  if (stream != nullptr) {
    cuda::CurrentGuard guard(device);
    if (comm != nullptr) {
      // ncclCommFinalize flushes and may wait on peers: bounded by the timeout, else abort.
      ncclResult_t r = ncclCommFinalize(comm);
      const auto deadline = DeviceClock::now() + std::chrono::duration<double>(options.timeout_s);
      int spins = 0;
      while (r == ncclInProgress && DeviceClock::now() < deadline) {
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
  store.reset();  // an MpiStore of our own: every step ended in a handshake, so no rank still waits on it
  if (mpi != MPI_COMM_NULL) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&mpi);
    mpi = MPI_COMM_NULL;
  }
  closed = true;
}

// ---- DeviceCommunicator ----
namespace {

void check_options(const DeviceOptions& o) {
  if (!(o.timeout_s > 0))
    throw InvalidArgument("DeviceOptions::timeout_s must be a positive number of seconds (HOPWISE_TIMEOUT_S)");
  if (o.ring_chunk_bytes < 16) throw InvalidArgument("DeviceOptions::ring_chunk_bytes must be at least 16 bytes");
}

}  // namespace

DeviceCommunicator::DeviceCommunicator(MPI_Comm comm, DeviceOptions options) : impl_(std::make_shared<Impl>()) {
  check_options(options);
  Impl& m = *impl_;
  m.options = options;
  try {
    ensure_mpi_initialized();  // with MPI_THREAD_MULTIPLE: rank 0's store serves from a thread of its own
    check_mpi(MPI_Comm_dup(comm, &m.mpi), "MPI_Comm_dup");
    check_mpi(MPI_Comm_set_errhandler(m.mpi, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check_mpi(MPI_Comm_rank(m.mpi, &m.rank), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(m.mpi, &m.size), "MPI_Comm_size");
    MPI_Comm node = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split_type(m.mpi, MPI_COMM_TYPE_SHARED, m.rank, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
    check_mpi(MPI_Comm_rank(node, &m.local_rank), "MPI_Comm_rank");
    MPI_Comm_free(&node);
    m.store = std::make_shared<MpiStore>(m.mpi, Store::Seconds(m.options.timeout_s));
    m.owns_store = true;
    m.init();
  } catch (...) {
    m.close();
    throw;
  }
}

DeviceCommunicator::DeviceCommunicator(std::shared_ptr<Store> store, int rank, int size, int local_rank,
                                       DeviceOptions options)
    : impl_(std::make_shared<Impl>()) {
  check_options(options);
  if (!store) throw InvalidArgument("DeviceCommunicator: the store is null; pass the store every rank meets in");
  if (size < 1 || rank < 0 || rank >= size || local_rank < 0)
    throw InvalidArgument(
        fmt::format("DeviceCommunicator: rank {} of {} ranks (local rank {}) is not a rank; pass "
                    "0 <= rank < size and local_rank >= 0",
                    rank, size, local_rank));
  Impl& m = *impl_;
  m.options = options;
  m.store = std::move(store);
  m.rank = rank;
  m.size = size;
  m.local_rank = local_rank;
  try {
    m.init();
  } catch (...) {
    m.close();
    throw;
  }
}

DeviceCommunicator::~DeviceCommunicator() {
  impl_->drain_for_close();
  // Every enqueued call has finished: run the callbacks still due (they may still call this communicator).
  if (!impl_->completions->on_this_thread()) impl_->completions->shutdown();
  impl_->close();
}

int DeviceCommunicator::rank() const { return impl_->rank; }
int DeviceCommunicator::size() const { return impl_->size; }
int DeviceCommunicator::local_rank() const { return impl_->local_rank; }
int DeviceCommunicator::device() const { return impl_->device; }
void* DeviceCommunicator::stream() const { return impl_->stream; }
double DeviceCommunicator::timeout_s() const { return impl_->options.timeout_s; }
bool DeviceCommunicator::aborted() const { return impl_->aborted; }
Store& DeviceCommunicator::store() { return *impl_->store; }

std::vector<std::string> DeviceCommunicator::host_allgather(std::string_view what, const std::string& mine) {
  return impl_->host_allgather(what, mine);
}

std::string DeviceCommunicator::host_broadcast(std::string_view what, const std::string& value, int root) {
  checks::root(fmt::format("rank {}: host_broadcast('{}')", impl_->rank, what), root, impl_->size);
  return impl_->host_broadcast(what, value, root);
}

void DeviceCommunicator::set_ring_order(std::vector<int> order) {
  const int n = impl_->size;
  std::vector<int> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  bool ok = static_cast<int>(order.size()) == n;
  for (int i = 0; ok && i < n; ++i) ok = sorted[static_cast<std::size_t>(i)] == i;
  if (!ok)
    throw InvalidArgument(
        fmt::format("rank {}: set_ring_order: the ring must list every rank 0..{} exactly once "
                    "(got {} entries)",
                    impl_->rank, n - 1, order.size()));
  std::lock_guard lock(impl_->mutex);
  impl_->ring = std::move(order);
}

const std::vector<int>& DeviceCommunicator::ring_order() const { return impl_->ring; }
void DeviceCommunicator::set_algorithm(DeviceAlgorithm a) { impl_->algorithm = a; }
DeviceAlgorithm DeviceCommunicator::algorithm() const { return impl_->algorithm; }

CollectiveStats DeviceCommunicator::stats() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->stats;
}

}  // namespace hopwise::comm
