#include "hopwise/comm/transports/ucx_transport.h"

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <sched.h>
#include <sys/stat.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "../../algorithms/algorithms.h"
#include "../posix_slots.h"
#include "hopwise/common/error.h"
#include "single_copy.h"

namespace hopwise::comm {

namespace {

constexpr std::size_t kSlotBytes = 1 << 20;  // as MpiTransport's window
constexpr ucp_tag_t kFullMask = ~ucp_tag_t{0};

// The sender's rank and the caller's tag: a receive names both (single_copy.h has the layout).
ucp_tag_t make_tag(int src, int tag) { return ucx::make_tag(src, static_cast<std::uint32_t>(tag)); }

void check_ucs(ucs_status_t s, const char* what) {
  if (s != UCS_OK) throw TransportError(fmt::format("{} failed: {}", what, ucs_status_string(s)));
}

// One UCX context and worker: "near" (peers on this host; UCX picks shared memory and CMA) or "far" (peers on
// other hosts; TCP only).
struct Engine {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  std::string address;

  Engine(int ranks, bool tcp_only) {
    ucp_config_t* config = nullptr;
    check_ucs(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read");
    // Between hosts, only what a network offers: no shared memory, CMA or other same-kernel shortcut.
    if (tcp_only) ucp_config_modify(config, "TLS", "tcp");
    // Within a host, shared memory alone (unless the user chose): with CMA (UCX's default for large messages) or
    // TCP over loopback, ring and halving-doubling allreduces of 4 ranks up to 64 MiB stalled here (8 runs of 8
    // with CMA); through posix shared memory none did. Large messages take single_copy.h's path instead.
    if (!tcp_only && !std::getenv("UCX_TLS")) ucp_config_modify(config, "TLS", "posix,sysv,self");
    // Over TCP, UCX's rendezvous (a handshake per fragment) reached 0.64 of a shaped 1 Gbit/s link where eager
    // sends reach 0.95: eager at every size, unless the user chose otherwise.
    if (tcp_only && !std::getenv("UCX_RNDV_THRESH")) ucp_config_modify(config, "RNDV_THRESH", "inf");
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS;
    params.features = UCP_FEATURE_TAG;
    params.estimated_num_eps = static_cast<std::size_t>(ranks);
    const ucs_status_t s = ucp_init(&params, config, &context);
    ucp_config_release(config);
    check_ucs(s, tcp_only ? "ucp_init (TCP between hosts; is a network interface up?)" : "ucp_init");
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_MULTI;  // the caller's thread builds the plan, the progress thread runs calls
    if (ucp_worker_create(context, &wp, &worker) != UCS_OK) {
      ucp_cleanup(context);
      throw TransportError("ucp_worker_create failed");
    }
    ucp_address_t* a = nullptr;
    std::size_t len = 0;
    check_ucs(ucp_worker_get_address(worker, &a, &len), "ucp_worker_get_address");
    address.assign(reinterpret_cast<const char*>(a), len);
    ucp_worker_release_address(worker, a);
  }
  ~Engine() {
    if (worker) drop_unexpected();
    if (worker) ucp_worker_destroy(worker);
    if (context) ucp_cleanup(context);
  }
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Messages that came for receives never posted (a failed collective's, once a peer was lost and the survivors
  // gave up) are received and dropped, so that the worker does not go with them unmatched (UCX warns of each).
  // Within 100 ms at most: a message whose sender is gone may never arrive whole, and a job that failed should
  // say so and end without waiting on it.
  void drop_unexpected() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
    std::vector<char> scratch;
    for (int n = 0; n < 4096 && std::chrono::steady_clock::now() < deadline; ++n) {
      ucp_tag_recv_info_t info{};
      ucp_tag_message_h msg = ucp_tag_probe_nb(worker, 0, 0, 1, &info);
      if (msg == nullptr) return;
      scratch.resize(std::max<std::size_t>(1, info.length));
      ucp_request_param_t param{};
      ucs_status_ptr_t r = ucp_tag_msg_recv_nbx(worker, scratch.data(), info.length, msg, &param);
      if (!UCS_PTR_IS_PTR(r)) continue;  // done at once, or failed: either way nothing is left of it
      while (ucp_request_check_status(r) == UCS_INPROGRESS && std::chrono::steady_clock::now() < deadline)
        ucp_worker_progress(worker);
      if (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_request_cancel(worker, r);
      ucp_request_free(r);
    }
  }
};

std::string read_first_line(const char* path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

// The two addresses of one rank, length-prefixed.
std::string pack(const std::string& near, const std::string& far) {
  const auto n = static_cast<std::uint32_t>(near.size());
  std::string out(reinterpret_cast<const char*>(&n), sizeof n);
  return out + near + far;
}
std::pair<std::string, std::string> unpack(const std::string& packed, int rank) {
  std::uint32_t n = 0;
  if (packed.size() < sizeof n) throw TransportError(fmt::format("rank {}'s UCX address record is truncated", rank));
  std::memcpy(&n, packed.data(), sizeof n);
  if (packed.size() < sizeof n + n)
    throw TransportError(fmt::format("rank {}'s UCX address record is truncated", rank));
  return {packed.substr(sizeof n, n), packed.substr(sizeof n + n)};
}

}  // namespace

std::string host_identity() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  struct stat ns {};
  const unsigned long long netns =
      ::stat("/proc/self/ns/net", &ns) == 0 ? static_cast<unsigned long long>(ns.st_ino) : 0;
  return fmt::format("{}/net:{}/boot:{}", name, netns, read_first_line("/proc/sys/kernel/random/boot_id"));
}

struct Peer {
  int rank = -1;
  ucp_ep_h ep = nullptr;
  ucp_worker_h worker = nullptr;  // the worker this peer's messages come and go through
  bool same_host = false;
  long pid = 0;                               // on this host: the peer's process, watched while waiting for it
  bool gave_up = false;                       // the peer abandoned this job (it lost a peer of its own)
  bool send_one_copy = false;                 // large sends to it go in one copy (it can read this process)
  bool recv_one_copy = false;                 // large receives from it may come in one copy (this one reads it)
  std::atomic<ucs_status_t> failure{UCS_OK};  // set by UCX's error callback
};

struct UcxTransport::State {
  std::shared_ptr<Store> store;
  std::string name;  // this transport's keys in the store
  std::unique_ptr<Engine> near, far;
  std::unique_ptr<ucx::SingleCopy> single;  // after the engines: goes before them
  std::vector<std::unique_ptr<Peer>> peers;
  std::unique_ptr<PosixSlots> slots;
  bool oversubscribed = false;
  bool abandoned = false;
  // abandon()'s notes, left in flight (a note to a peer that is gone never completes): the destructor frees them.
  std::vector<std::pair<ucp_worker_h, void*>> notes;

  void progress() {
    while (ucp_worker_progress(near->worker) != 0) {
    }
    single->reap();
    if (far)
      while (ucp_worker_progress(far->worker) != 0) {
      }
  }
};

namespace {

void on_endpoint_error(void* arg, ucp_ep_h, ucs_status_t status) { static_cast<Peer*>(arg)->failure = status; }

// Whether process `pid` (on this host) has exited: gone, or a zombie its launcher has not reaped yet.
bool exited(long pid) {
  std::ifstream f(fmt::format("/proc/{}/stat", pid));
  if (!f) return true;
  std::string stat;
  std::getline(f, stat);
  const auto close = stat.rfind(')');  // "pid (comm) S ...": the name may hold spaces and parentheses
  return close == std::string::npos || close + 2 >= stat.size() || stat[close + 2] == 'Z' || stat[close + 2] == 'X';
}

std::string overflow_text(int rank, int peer) {
  return fmt::format(
      "rank {}: a message from rank {} overflows the receive posted for it; post receives at least "
      "as large as the sends",
      rank, peer);
}

std::string failure_text(int rank, const Peer& p, ucs_status_t s) {
  if (p.gave_up) return fmt::format("rank {}: rank {} gave up on this job (it lost a peer of its own)", rank, p.rank);
  if (p.pid > 0) return fmt::format("rank {}: rank {} (pid {} on this host) has exited", rank, p.rank, p.pid);
  return fmt::format("rank {}: the connection to rank {} failed ({}); that rank died, or its host is unreachable", rank,
                     p.rank, ucs_status_string(s));
}

}  // namespace

UcxTransport::UcxTransport(std::shared_ptr<Store> store, int rank, int size, std::string name,
                           std::chrono::duration<double> timeout)
    : rank_(rank), size_(size), s_(std::make_unique<State>()) {
  if (!store) throw InvalidArgument("UcxTransport needs a store to meet its peers through");
  if (size < 1 || rank < 0 || rank >= size)
    throw InvalidArgument(fmt::format("UcxTransport: rank {} of {} ranks; the rank must be in [0, size)", rank, size));
  timeout_ = timeout;
  s_->store = std::move(store);
  s_->name = name;
  Store& st = *s_->store;
  // A name used twice on one store would read the earlier transport's addresses.
  if (st.add(name + "/members", 1) > size)
    throw InvalidArgument(
        fmt::format("UcxTransport: the store already holds a transport named '{}'; give each "
                    "transport of a job a name of its own",
                    name));

  try {
    meet(st, name, timeout);
  } catch (const TimeoutError& e) {
    // Rank 0 may be the store's server (TCP): leaving at once would cut the other ranks off before they too can
    // name the missing ranks. It stays until every rank that arrived has given up as well (at most 5 s).
    try {
      st.add(name + "/gave-up", 1);
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      const auto present = static_cast<std::int64_t>(size) - static_cast<std::int64_t>(e.pending_ranks().size());
      while (rank == 0 && st.add(name + "/gave-up", 0) < present && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } catch (const Error&) {
    }
    throw;
  }
}

// Host identities first (which peers share this host decides the engines), then the engines' addresses, the
// endpoints, the shared slots on one host, and a last step that every rank has connected.
void UcxTransport::meet(Store& st, const std::string& name, std::chrono::duration<double> timeout) {
  const int rank = rank_, size = size_;
  // "host\npid\nprobe address": the host, and what a peer on it needs to watch and to read this process.
  std::vector<std::string> hosts =
      store_allgather(st, name + "/hosts", rank, size,
                      fmt::format("{}\n{}\n{}", host_identity(), ::getpid(), ucx::probe_address()), timeout);
  std::vector<long> pids;
  std::vector<std::uint64_t> probes;
  for (auto& h : hosts) {
    const auto second = h.rfind('\n');
    const auto first = second == std::string::npos || second == 0 ? std::string::npos : h.rfind('\n', second - 1);
    if (first == std::string::npos) throw TransportError("a rank's host record in the store is malformed");
    pids.push_back(std::atol(h.c_str() + first + 1));
    probes.push_back(std::strtoull(h.c_str() + second + 1, nullptr, 10));
    h.resize(first);
  }
  std::map<std::string, int> ids;
  local_size_ = 0;
  for (int r = 0; r < size; ++r) {
    const auto& h = hosts[static_cast<std::size_t>(r)];
    ids.emplace(h, static_cast<int>(ids.size()));
    host_ids_.push_back(ids[h]);
    if (h == hosts[static_cast<std::size_t>(rank)]) {
      if (r < rank) ++local_rank_;
      ++local_size_;
    }
  }
  s_->oversubscribed = local_size_ > static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  s_->near = std::make_unique<Engine>(size, false);
  s_->single = std::make_unique<ucx::SingleCopy>(rank);
  if (local_size_ < size) s_->far = std::make_unique<Engine>(size, true);
  const std::vector<std::string> addresses = store_allgather(
      st, name + "/addresses", rank, size, pack(s_->near->address, s_->far ? s_->far->address : ""), timeout);

  for (int r = 0; r < size; ++r) {
    auto p = std::make_unique<Peer>();
    p->rank = r;
    const bool same_host = host_ids_[static_cast<std::size_t>(r)] == host_id();
    Engine& e = same_host ? *s_->near : *s_->far;
    const auto [near, far] = unpack(addresses[static_cast<std::size_t>(r)], r);
    const std::string& remote = same_host ? near : far;
    if (remote.empty()) throw TransportError(fmt::format("rank {} published no UCX address for other hosts", r));
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    ep.address = reinterpret_cast<const ucp_address_t*>(remote.data());
    if (!same_host) {
      // A dead peer fails its requests instead of hanging them. Not on this host: UCX 1.13 has no peer failure
      // handling for shared memory and would fall back to TCP over loopback; a peer here is watched by its pid.
      ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
      ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      ep.err_handler.cb = on_endpoint_error;
      ep.err_handler.arg = p.get();
    }
    check_ucs(ucp_ep_create(e.worker, &ep, &p->ep), "ucp_ep_create");
    p->worker = e.worker;
    p->same_host = same_host;
    p->pid = same_host ? pids[static_cast<std::size_t>(r)] : 0;
    s_->peers.push_back(std::move(p));
  }
  // One copy for large messages where the kernel lets the receiver read the sender (same host, same user).
  std::string pulls(static_cast<std::size_t>(size), '0');
  const bool one_copy =
      std::getenv("HOPWISE_UCX_SINGLE_COPY") == nullptr || std::string(std::getenv("HOPWISE_UCX_SINGLE_COPY")) != "0";
  for (int q = 0; q < size; ++q) {
    const auto i = static_cast<std::size_t>(q);
    if (one_copy && q != rank && s_->peers[i]->same_host && ucx::can_pull_from(pids[i], probes[i])) pulls[i] = '1';
  }
  const std::vector<std::string> all_pulls = store_allgather(st, name + "/pulls", rank, size, pulls, timeout);
  for (int q = 0; q < size; ++q) {
    const auto i = static_cast<std::size_t>(q);
    s_->peers[i]->recv_one_copy = pulls[i] == '1';
    s_->peers[i]->send_one_copy =
        all_pulls[i].size() == static_cast<std::size_t>(size) && all_pulls[i][static_cast<std::size_t>(rank)] == '1';
  }
  // Every endpoint connected now, not at its first message: UCX connects lazily, and a connection first made
  // while a job fails (the notes of explain_timeout) would go nowhere.
  {
    constexpr int kTagConnect = -2;  // no algorithm uses negative tags
    std::vector<char> sink(static_cast<std::size_t>(size));
    Requests reqs(*this);
    for (int q = 0; q < size; ++q) {
      reqs.push_back(irecv(&sink[static_cast<std::size_t>(q)], 1, q, kTagConnect));
      reqs.push_back(isend(&sink[static_cast<std::size_t>(rank)], 1, q, kTagConnect));
    }
    wait_all(reqs);
  }
  if (local_size_ == size && size > 1)
    s_->slots = std::make_unique<PosixSlots>(st, name + "/slots", rank, size, kSlotBytes, timeout);
  store_allgather(st, name + "/ready", rank, size, "", timeout);
}

UcxTransport::~UcxTransport() {
  // Flush what this rank sent (a send completes when its buffer is free, not when the peer has it), then close.
  // An abandoned transport closes at once: its peers may be gone.
  std::vector<ucs_status_ptr_t> closing;
  for (auto& p : s_->peers) {
    // A peer on this host may be gone and its queue full: its endpoint goes with the worker.
    if (s_->abandoned && p->same_host) continue;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = s_->abandoned || p->failure != UCS_OK ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    ucs_status_ptr_t r = ucp_ep_close_nbx(p->ep, &param);
    if (UCS_PTR_IS_PTR(r)) closing.push_back(r);
  }
  const auto deadline =
      std::chrono::steady_clock::now() + std::min<std::chrono::duration<double>>(timeout_, std::chrono::seconds(10));
  while (!closing.empty() && std::chrono::steady_clock::now() < deadline) {
    s_->progress();
    closing.erase(std::remove_if(closing.begin(), closing.end(),
                                 [](ucs_status_ptr_t r) {
                                   if (ucp_request_check_status(r) == UCS_INPROGRESS) return false;
                                   ucp_request_free(r);
                                   return true;
                                 }),
                  closing.end());
  }
  for (auto r : closing) ucp_request_free(r);
  // abandon()'s notes: cancelled, given until the deadline to finish, and freed, so that UCX takes each back into its
  // pool (one still in flight when its endpoint goes with the worker). Never freed, each was a "not returned to
  // mpool ucp_requests" warning at ucp_worker_destroy on every survivor of a lost peer.
  for (auto [worker, r] : s_->notes) ucp_request_cancel(worker, r);
  const auto notes_deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  for (auto [worker, r] : s_->notes) {
    while (ucp_request_check_status(r) == UCS_INPROGRESS && std::chrono::steady_clock::now() < notes_deadline)
      s_->progress();
    ucp_request_free(r);
  }
  s_->notes.clear();
  s_->single.reset();
  s_->slots.reset();
  s_->peers.clear();
  s_->far.reset();
  s_->near.reset();
}

void UcxTransport::progress() { s_->progress(); }

SharedSlots* UcxTransport::shared_slots() { return s_->slots ? &s_->slots->slots() : nullptr; }

// Says so in the store, so that ranks still waiting for this one fail now rather than at their timeout (and then
// ask who else gave up, finding the rank at fault).
void UcxTransport::abandon() {
  if (s_->abandoned) return;
  s_->abandoned = true;
  s_->store->peer_lost();
  try {
    s_->store->set(fmt::format("{}/gave-up/{}", s_->name, rank_), "1");
  } catch (const std::exception&) {
    // the store's server (rank 0) may be the rank that is gone
  }
  // And to every peer, a note never received (first_to_give_up() probes for it): a store read in every long wait
  // would block for the job's timeout where the store's server is the rank that died (MpiStore).
  static const char note = 0;  // sends to a dead peer may still read it
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    try {
      const Request r = isend(&note, 1, q, algo::kTagGaveUp);  // not waited on: this transport is done
      if (r.active)
        s_->notes.emplace_back(s_->peers[static_cast<std::size_t>(q)]->worker, reinterpret_cast<void*>(r.handle));
    } catch (const std::exception&) {
    }
  }
}

// A rank that gave up makes no more calls on this transport, so no collective of it completes: a rank waiting on
// others (not on it) fails now too, rather than at its own timeout, which may have started seconds later (a
// survivor that gave up last could miss the survivors' agreement, HOPWISE_ELASTIC=shrink). -1: none did.
int UcxTransport::first_to_give_up() {
  const auto from = probe_any(algo::kTagGaveUp);
  return from && *from != rank_ ? *from : -1;
}

// The mark abandon() leaves, left for the peer: whoever waits on it sees it gone (peer_gone()).
void UcxTransport::declare_lost(int peer) {
  try {
    s_->store->set(fmt::format("{}/gave-up/{}", s_->name, peer), "1");
  } catch (const std::exception&) {
  }
}

// Reads the marks abandon() leaves in the store. It stops listening once every peer has either marked or is
// known gone (its process exited, its endpoint broke): those that never marked are the ones at fault. If the
// store's server goes meanwhile (rank 0 left), the last full read stands; nullopt only if none succeeded. Rank 0
// may be that server: it stays until every rank that marked has read too (within `listen` more), so that none
// of them finds the store gone and loses the names of the ranks that gave up with it.
std::optional<std::vector<int>> UcxTransport::ranks_that_gave_up(std::chrono::duration<double> listen) {
  const auto until = std::chrono::steady_clock::now() + listen;
  const std::string marks = s_->name + "/gave-up/";
  std::optional<std::vector<int>> last;
  for (;;) {
    std::vector<int> gave_up;
    bool settled = true;
    try {
      for (int r = 0; r < size_; ++r) {
        if (r == rank_ || s_->store->check({marks + std::to_string(r)})) {
          gave_up.push_back(r);
          continue;
        }
        const Peer& p = *s_->peers[static_cast<std::size_t>(r)];
        if (p.failure == UCS_OK && !(p.pid > 0 && exited(p.pid))) settled = false;
      }
    } catch (const std::exception&) {
      break;
    }
    last = std::move(gave_up);
    if (settled || std::chrono::steady_clock::now() >= until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!last) return last;
  try {
    s_->store->add(s_->name + "/gave-up-read", 1);
    const auto stay = std::chrono::steady_clock::now() + listen;
    while (rank_ == 0 && s_->store->add(s_->name + "/gave-up-read", 0) < static_cast<std::int64_t>(last->size()) &&
           std::chrono::steady_clock::now() < stay)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } catch (const std::exception&) {
  }
  return last;
}

bool UcxTransport::peer_gone(int peer) const {
  if (peer < 0 || peer >= size_ || peer == rank_) return false;
  Peer& p = *s_->peers[static_cast<std::size_t>(peer)];
  if (p.failure != UCS_OK) return true;
  if (p.pid > 0 && exited(p.pid)) {
    p.failure = UCS_ERR_ENDPOINT_TIMEOUT;
  } else {
    try {
      if (s_->store->check({fmt::format("{}/gave-up/{}", s_->name, peer)})) {
        p.gave_up = true;
        p.failure = UCS_ERR_CANCELED;
      }
    } catch (const std::exception&) {
    }
  }
  return p.failure != UCS_OK;
}

Request UcxTransport::isend(const void* buf, std::size_t bytes, int peer, int tag) {
  if (peer < 0 || peer >= size_) throw InvalidArgument(fmt::format("isend to rank {} of {}", peer, size_));
  Peer& p = *s_->peers[static_cast<std::size_t>(peer)];
  // A broken endpoint cannot send; a peer that exited or gave up still gets what is sent (the note a rank that
  // gives up sends every other, so that each learns who is at fault).
  if (p.failure != UCS_OK && p.pid == 0 && !p.gave_up) throw TransportError(failure_text(rank_, p, p.failure), {peer});
  count_sent(peer, bytes);
  if (p.send_one_copy && bytes >= ucx::kSingleCopyMin) {
    try {
      return Request{s_->single->send(p.ep, peer, buf, bytes, tag), peer, false, true};
    } catch (const std::runtime_error& e) {
      throw TransportError(fmt::format("rank {}: {}", rank_, e.what()), {peer});
    }
  }
  ucp_request_param_t param{};
  ucs_status_ptr_t r = ucp_tag_send_nbx(p.ep, buf, bytes, make_tag(rank_, tag), &param);
  if (r == nullptr) return Request{0, peer, false, false};  // sent at once
  if (UCS_PTR_IS_ERR(r)) throw TransportError(failure_text(rank_, p, UCS_PTR_STATUS(r)), {peer});
  return Request{reinterpret_cast<std::uint64_t>(r), peer, false, true};
}

Request UcxTransport::irecv(void* buf, std::size_t bytes, int peer, int tag) {
  if (peer < 0 || peer >= size_) throw InvalidArgument(fmt::format("irecv from rank {} of {}", peer, size_));
  Peer& p = *s_->peers[static_cast<std::size_t>(peer)];
  if (p.recv_one_copy && bytes >= ucx::kSingleCopyMin) {
    try {
      return Request{s_->single->recv(p.worker, p.ep, p.pid, peer, buf, bytes, tag), peer, true, true};
    } catch (const std::runtime_error& e) {
      throw TransportError(fmt::format("rank {}: {}", rank_, e.what()));
    }
  }
  ucp_request_param_t param{};
  ucs_status_ptr_t r = ucp_tag_recv_nbx(p.worker, buf, bytes, make_tag(peer, tag), kFullMask, &param);
  if (UCS_PTR_IS_ERR(r))
    throw TransportError(fmt::format("rank {}: posting a receive from rank {} failed: {}", rank_, peer,
                                     ucs_status_string(UCS_PTR_STATUS(r))));
  if (r == nullptr) return Request{0, peer, true, false};
  return Request{reinterpret_cast<std::uint64_t>(r), peer, true, true};
}

// The status of an active request, freeing it once it is final; `error` may then say more than the status.
int UcxTransport::settle(Request& r, std::string& error) {
  if (ucx::SingleCopy::is_op(r.handle)) {
    const ucs_status_t s = s_->single->settle(r.handle, error);
    if (s != UCS_INPROGRESS) r.active = false;
    return s;
  }
  void* req = reinterpret_cast<void*>(r.handle);
  const ucs_status_t s = ucp_request_check_status(req);
  if (s == UCS_INPROGRESS) return s;
  ucp_request_free(req);
  r.active = false;
  return s;
}

// Withdraws an active request: a receive is cancelled and progressed until UCX lets it go (so it never writes
// later); a send is released to finish in the background (it only reads the caller's buffer). A receive already
// matched to a message that a dead peer was sending cannot be cancelled, and UCX never completes it: it is let go
// at once (nothing more can come from that peer; UCX frees it if it ever completes). Waiting for it held a rank
// for its whole timeout, long after UCX had reported the peer's endpoint failed, so that a peer's restarted
// attempt (torchrun's agent on its host) came to this rank's store too early.
void UcxTransport::cancel(Request& r) {
  if (!r.active) return;
  if (ucx::SingleCopy::is_op(r.handle)) {
    s_->single->cancel(s_->peers[static_cast<std::size_t>(r.peer)]->worker, r.handle, [this] { s_->progress(); });
    r.active = false;
    return;
  }
  void* req = reinterpret_cast<void*>(r.handle);
  if (r.is_recv) {
    Peer& p = *s_->peers[static_cast<std::size_t>(r.peer)];
    ucp_request_cancel(p.worker, req);
    // Dead: its endpoint failed or its process exited (a peer that only gave up may still be sending).
    const bool dead = p.failure != UCS_OK && !p.gave_up;
    const auto deadline = std::chrono::steady_clock::now() +
                          (dead ? std::chrono::steady_clock::duration(std::chrono::milliseconds(100))
                                : std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout_));
    while (ucp_request_check_status(req) == UCS_INPROGRESS && std::chrono::steady_clock::now() < deadline)
      s_->progress();
  }
  ucp_request_free(req);
  r.active = false;
}

// Messages wait in a worker's unexpected queue until a receive matches them; the probe reads the sender from the
// tag (bits 32-55, whatever the kind bit above), matching only the low 32 bits, which hold `tag`.
std::optional<int> UcxTransport::probe_any(int tag) {
  s_->progress();
  for (Engine* e : {s_->near.get(), s_->far.get()}) {
    if (!e) continue;
    ucp_tag_recv_info_t info{};
    if (ucp_tag_probe_nb(e->worker, static_cast<std::uint32_t>(tag), ucp_tag_t{0xFFFFFFFF}, 0, &info) != nullptr)
      return static_cast<int>((info.sender_tag >> 32) & 0xFFFFFF);
  }
  return std::nullopt;
}

bool UcxTransport::test(Request& r) {
  if (!r.active) return true;
  s_->progress();
  const int peer = r.peer;
  std::string error;
  const auto s = static_cast<ucs_status_t>(settle(r, error));
  if (s == UCS_INPROGRESS) return false;
  if (!error.empty()) throw TransportError(fmt::format("rank {}: {}", rank_, error), {peer});
  if (s == UCS_ERR_MESSAGE_TRUNCATED) throw TransportError(overflow_text(rank_, peer));
  if (s != UCS_OK) throw TransportError(failure_text(rank_, *s_->peers[static_cast<std::size_t>(peer)], s), {peer});
  return true;
}

// Polls like MpiTransport::wait_all: spins while a transfer is in flight, yields when ranks outnumber cores, and
// sleeps between polls once a wait is long (the peer is computing), so that the rank's own compute gets the core.
void UcxTransport::wait_all(std::span<Request> reqs) {
  const auto start = std::chrono::steady_clock::now();
  auto looked = start;
  const int yield_every = s_->oversubscribed ? 1 : 64;
  std::string error;
  std::vector<int> failed;
  for (long spins = 1;; ++spins) {
    s_->progress();
    bool pending = false;
    for (Request& r : reqs) {
      if (!r.active) continue;
      const int peer = r.peer;
      std::string said;
      const auto s = static_cast<ucs_status_t>(settle(r, said));
      if (!said.empty()) {
        failed.push_back(peer);
        if (error.empty()) error = fmt::format("rank {}: {}", rank_, said);
      } else if (s == UCS_INPROGRESS) {
        // A receive is not tied to an endpoint: a failed peer's receive would wait forever.
        const ucs_status_t f = s_->peers[static_cast<std::size_t>(peer)]->failure;
        if (f != UCS_OK) {
          cancel(r);
          failed.push_back(peer);
          if (error.empty()) error = failure_text(rank_, *s_->peers[static_cast<std::size_t>(peer)], f);
        } else {
          pending = true;
        }
      } else if (s == UCS_ERR_MESSAGE_TRUNCATED) {
        if (error.empty()) error = overflow_text(rank_, peer);
      } else if (s != UCS_OK) {
        failed.push_back(peer);
        if (error.empty()) error = failure_text(rank_, *s_->peers[static_cast<std::size_t>(peer)], s);
      }
    }
    if (!pending) break;
    if (!error.empty()) {
      for (Request& r : reqs) cancel(r);
      break;
    }
    if (spins % yield_every == 0) sched_yield();
    // By the clock, not by spins: on a loaded machine each yield may wait out other processes' time slices (beside
    // stress-ng --cpu 6, 2048 spins took 79 ms at the median and up to 10 s, past a 3 s timeout).
    const auto now = std::chrono::steady_clock::now();
    if (spins % 64 == 0 && now - start > std::chrono::microseconds(300))
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    // Shared memory has no peer failure events: a long wait looks at the pending peers' processes, and for a note
    // that some rank gave up, 10 times a second.
    if (now - start > std::chrono::milliseconds(100) && now - looked >= std::chrono::milliseconds(100)) {
      looked = now;
      for (Request& r : reqs)
        if (r.active) peer_gone(r.peer);
      if (const int q = first_to_give_up(); q >= 0) {
        for (Request& r : reqs) cancel(r);
        throw TransportError(fmt::format("rank {}: rank {} gave up on this job (it lost a peer of its own), so this "
                                         "call cannot complete",
                                         rank_, q),
                             {q});
      }
    }
    if (now - start > timeout_) {
      std::vector<int> peers;
      for (Request& r : reqs)
        if (r.active) {
          peers.push_back(r.peer);
          cancel(r);
        }
      std::sort(peers.begin(), peers.end());
      peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
      throw TimeoutError(fmt::format("rank {} timed out after {:.1f} s waiting for rank(s) {}; a peer died, stalled or "
                                     "skipped this call (raise HOPWISE_TIMEOUT_S if it is only slow)",
                                     rank_, timeout_.count(), fmt::join(peers, ",")),
                         peers);
    }
  }
  if (error.empty()) return;
  std::sort(failed.begin(), failed.end());
  failed.erase(std::unique(failed.begin(), failed.end()), failed.end());
  throw TransportError(error, failed);
}

std::string UcxTransport::lanes(int peer) const {
  if (peer < 0 || peer >= size_) throw InvalidArgument(fmt::format("lanes of rank {} of {}", peer, size_));
  char* text = nullptr;
  std::size_t len = 0;
  FILE* f = ::open_memstream(&text, &len);
  if (!f) return "";
  ucp_ep_print_info(s_->peers[static_cast<std::size_t>(peer)]->ep, f);
  std::fclose(f);
  std::istringstream in(std::string(text, len));
  std::free(text);
  std::string line, out;
  while (std::getline(in, line))
    if (line.find("lane[") != std::string::npos) out += line + "\n";
  return out;
}

}  // namespace hopwise::comm
