// MpiStore: rank 0 keeps the keys; every call (rank 0's own too) is a request message to its server thread and a
// reply, so that every rank sees one order of sets and adds. Gets and waits for keys not yet set are parked on
// the server and answered by the set that completes them. Replies are nonblocking sends, so a client that gave up
// never stalls the server.
#include "hopwise/comm/transports/mpi_store.h"

#include <fmt/core.h>

#include <chrono>
#include <deque>
#include <vector>

#include "../../stores/store_protocol.h"
#include "hopwise/comm/transports/mpi_transport.h"
#include "hopwise/common/error.h"
#include "hopwise/common/log.h"

namespace hopwise::comm {

namespace {

using StoreRequest = store_protocol::Request;
// Each request names the tag of its reply (a rotating sequence), so that the late reply to a request that timed
// out is never taken for the answer to a later one.
constexpr int kRequestTag = 1, kFirstReplyTag = 2, kReplyTags = 16384;

}  // namespace

struct MpiStore::Server {
  MPI_Comm comm;
  std::atomic<bool> stop{false};
  store_protocol::Table table;
  std::deque<std::pair<MPI_Request, std::string>> replies;  // sends in flight, with their buffers
  std::thread thread;

  // [u8 status: 0 ok, 1 refused][value or reason]
  void reply(int to, const StoreRequest& r, bool ok, const store_protocol::Value& value) {
    std::string bytes(1, ok ? '\0' : '\1');
    if (value) bytes += *value;
    replies.emplace_back(MPI_REQUEST_NULL, std::move(bytes));
    auto& [req, buf] = replies.back();
    check_mpi(MPI_Isend(buf.data(), static_cast<int>(buf.size()), MPI_BYTE, to, r.id, comm, &req),
              "MPI_Isend (store reply)");
  }

  void loop() {
    auto idle = std::chrono::microseconds(20);
    while (!stop.load()) {
      int flag = 0;
      MPI_Message msg;
      MPI_Status st;
      MPI_Improbe(MPI_ANY_SOURCE, kRequestTag, comm, &flag, &msg, &st);
      while (!replies.empty()) {  // release finished replies, oldest first
        int done = 0;
        MPI_Test(&replies.front().first, &done, MPI_STATUS_IGNORE);
        if (!done) break;
        replies.pop_front();
      }
      if (!flag) {
        std::this_thread::sleep_for(idle);
        idle = std::min<std::chrono::microseconds>(idle * 2, std::chrono::milliseconds(1));
        continue;
      }
      idle = std::chrono::microseconds(20);
      int n = 0;
      MPI_Get_count(&st, MPI_BYTE, &n);
      std::string buf(static_cast<std::size_t>(n), '\0');
      MPI_Mrecv(buf.data(), n, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
      try {
        table.handle(
            st.MPI_SOURCE, store_protocol::unpack(buf),
            [this](int to, const StoreRequest& r, bool ok, const store_protocol::Value& v) { reply(to, r, ok, v); });
      } catch (const std::exception& e) {  // a malformed request: its sender waits into its timeout, the server stays
        log::warn("store (MPI): dropped a request from rank {}: {}", st.MPI_SOURCE, e.what());
      }
    }
  }
};

MpiStore::MpiStore(MPI_Comm comm, Seconds reply_timeout) : reply_timeout_(reply_timeout) {
  ensure_mpi_initialized();
  check_mpi(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  if (rank_ == 0) {
    server_ = std::make_unique<Server>();
    server_->comm = comm_;
    server_->thread = std::thread([s = server_.get()] { s->loop(); });
  }
}

MpiStore::~MpiStore() {
  if (server_) {
    server_->stop = true;
    server_->thread.join();
    for (auto& [req, buf] : server_->replies)
      if (req != MPI_REQUEST_NULL) MPI_Request_free(&req);
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::string MpiStore::call(int op, const std::vector<std::string>& keys, const std::string& value, std::int64_t delta,
                           Seconds timeout) {
  // set, check and add are answered at once by a live server; get and wait may rightly wait for a key.
  const bool immediate = op == store_protocol::kSet || op == store_protocol::kCheck || op == store_protocol::kAdd;
  if (silent_)
    throw TransportError(fmt::format("store (rank {} of {}): rank 0, which serves the store, left an earlier call "
                                     "unanswered: it is gone",
                                     rank_, size_),
                         {0});
  if (immediate && lost_) timeout = std::min(timeout, kReplyAfterLoss);
  const int reply_tag = kFirstReplyTag + static_cast<int>(seq_++ % kReplyTags);
  const std::string req = store_protocol::pack({op, reply_tag, delta, keys, value});
  MPI_Request send = MPI_REQUEST_NULL;
  check_mpi(MPI_Isend(req.data(), static_cast<int>(req.size()), MPI_BYTE, 0, kRequestTag, comm_, &send),
            "MPI_Isend (store request)");
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::nanoseconds>(timeout);
  auto idle = std::chrono::microseconds(10);
  for (;;) {
    int flag = 0;
    MPI_Message msg;
    MPI_Status st;
    check_mpi(MPI_Improbe(0, reply_tag, comm_, &flag, &msg, &st), "MPI_Improbe (store reply)");
    if (flag) {
      int n = 0;
      MPI_Get_count(&st, MPI_BYTE, &n);
      std::string out(static_cast<std::size_t>(n), '\0');
      check_mpi(MPI_Mrecv(out.data(), n, MPI_BYTE, &msg, MPI_STATUS_IGNORE), "MPI_Mrecv (store reply)");
      check_mpi(MPI_Wait(&send, MPI_STATUS_IGNORE), "MPI_Wait (store request)");
      if (out.empty()) throw TransportError("store (MPI): an empty reply from rank 0");
      if (out[0] != 0) throw Error(fmt::format("store (MPI): {}", out.substr(1)));
      return out.substr(1);
    }
    if (std::chrono::steady_clock::now() > deadline) {
      MPI_Request_free(&send);
      if (immediate) silent_ = true;
      std::string list;
      for (const auto& k : keys) list += (list.empty() ? "'" : ", '") + k + "'";
      throw TimeoutError(fmt::format("store (rank {} of {}): no answer for {} within {:.1f} s: the key is not set, "
                                     "or rank 0 is gone (raise HOPWISE_TIMEOUT_S if it is only slow)",
                                     rank_, size_, list, timeout.count()),
                         {0});
    }
    std::this_thread::sleep_for(idle);
    idle = std::min<std::chrono::microseconds>(idle * 2, std::chrono::microseconds(500));
  }
}

void MpiStore::set(const std::string& key, const std::string& value) {
  call(store_protocol::kSet, {key}, value, 0, reply_timeout_);
}
std::string MpiStore::get(const std::string& key, Seconds timeout) {
  return call(store_protocol::kGet, {key}, {}, 0, timeout);
}
void MpiStore::wait(const std::vector<std::string>& keys, Seconds timeout) {
  call(store_protocol::kWait, keys, {}, 0, timeout);
}
bool MpiStore::check(const std::vector<std::string>& keys) {
  return call(store_protocol::kCheck, keys, {}, 0, reply_timeout_) == "1";
}
std::int64_t MpiStore::add(const std::string& key, std::int64_t delta) {
  const std::string reply = call(store_protocol::kAdd, {key}, {}, delta, reply_timeout_);
  if (const auto v = store_protocol::parse_integer(reply)) return *v;
  throw TransportError(fmt::format("store (MPI): add on '{}' returned '{}', not an integer", key, reply.substr(0, 40)));
}

}  // namespace hopwise::comm
