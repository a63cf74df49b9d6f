#include "store_server.h"

#include <fmt/core.h>

#include <cstring>

#include "hopwise/common/error.h"
#include "hopwise/common/log.h"

namespace hopwise::comm::store_server {

namespace {

using store_protocol::Value;

// Compares in time independent of where they differ, so that a wrong token's timing tells nothing.
bool same_secret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

RateLimitedWarning& RateLimitedWarning::process_wide() {
  static auto* w = new RateLimitedWarning();  // never destroyed: a server thread may warn during exit
  return *w;
}

void RateLimitedWarning::operator()(const std::string& kind, const std::string& message) {
  std::unique_lock lock(mutex_);
  const auto now = Clock::now();
  auto [it, fresh] = seen_.try_emplace(kind);
  Seen& s = it->second;
  if (!fresh && now - s.last < every_) {
    ++s.held;
    return;
  }
  const std::size_t held = s.held;
  s = {now, 0};
  lock.unlock();
  log::warn("{}{}", message, held ? fmt::format(" ({} more like it since the last such warning)", held) : "");
}

Core::Core(std::string job, std::string token, Limits limits)
    : job_(std::move(job)), token_(std::move(token)), limits_(limits), warning_(RateLimitedWarning::process_wide()) {}

void Core::open(int client, std::string peer, Clock::time_point now) {
  Client& c = clients_[client];
  c = Client{};
  c.peer = std::move(peer);
  c.opened = now;
}

const std::string& Core::peer(int client) const { return clients_.at(client).peer; }

void Core::push_reply(Client& c, std::int32_t request_id, bool ok, const Value& value) {
  push_status(c, request_id, ok ? 0 : 1, value);
}

void Core::push_status(Client& c, std::int32_t request_id, char status, const Value& value) {
  const std::size_t body = value ? value->size() : 0;
  std::string head(9, '\0');
  const auto n = static_cast<std::uint32_t>(5 + body);  // a value is capped far below 4 GiB
  std::memcpy(head.data(), &n, 4);
  std::memcpy(head.data() + 4, &request_id, 4);
  head[8] = status;
  c.out.emplace_back(std::make_shared<const std::string>(std::move(head)), 0);
  if (body) c.out.emplace_back(value, 0);
  c.out_bytes += 9 + body;
}

// A client that broke the protocol goes without the replies it was owed (it may never read them).
void Core::abandon(Client& c) {
  c.closing = true;
  c.out.clear();
  c.out_bytes = 0;
}

void Core::refuse(Client& c, std::int32_t request_id, const std::string& why, char status) {
  push_status(c, request_id, status, std::make_shared<const std::string>(why));
  c.closing = true;
}

// A later attempt of this job (its launcher restarted some rank) waits for this attempt's server to go rather than
// failing: every rank of this attempt is about to fail and be restarted too.
void Core::refuse_other_job(Client& c, std::int32_t request_id, const std::string& theirs) {
  const auto [job, attempt] = store_protocol::split_attempt(job_);
  const auto [their_job, their_attempt] = store_protocol::split_attempt(theirs);
  if (their_job != job || their_attempt <= attempt) {
    refuse(c, request_id,
           fmt::format("this store serves job '{}', not '{}' (a port reused by another job?)", job_, theirs));
    return;
  }
  warning_("attempt", fmt::format("store: a rank of attempt {} of job '{}' asked for this store, which serves attempt "
                                  "{}: its launcher restarted it, so this attempt has lost a rank",
                                  their_attempt, job, attempt));
  refuse(c, request_id,
         fmt::format("this store still serves attempt {} of job '{}', and this rank belongs to attempt {}: waiting "
                     "for that attempt's rank 0 to go and the new one to serve",
                     attempt, job, their_attempt),
         kEarlierAttempt);
}

void Core::on_frame(int id, Client& c, std::string_view frame) {
  store_protocol::Request r;
  try {
    r = store_protocol::unpack(frame);
  } catch (const Error& e) {
    warning_("malformed", fmt::format("store: closed the connection from {}: {}", c.peer, e.what()));
    abandon(c);
    return;
  }
  if (!c.introduced) {
    if (r.op != store_protocol::kHello) {
      warning_("stranger", fmt::format("store: closed the connection from {}: it sent a request before introducing "
                                       "itself (not a hopwise store client?)",
                                       c.peer));
      abandon(c);
      return;
    }
    const std::string sent_token = r.keys.empty() ? std::string() : r.keys.front();
    if (!same_secret(sent_token, token_)) {
      warning_("token", fmt::format("store: refused {}: {} token", c.peer, sent_token.empty() ? "no" : "a wrong"));
      refuse(c, r.id,
             token_.empty() ? "this store takes no token, and this rank sent one (is HOPWISE_STORE_TOKEN the same on "
                              "every rank?)"
                            : "this store needs the job's token: HOPWISE_STORE_TOKEN is missing or wrong on this rank");
      return;
    }
    if (r.value != job_) {
      refuse_other_job(c, r.id, r.value);
      return;
    }
    c.introduced = true;
  }
  table_.handle(id, std::move(r), [this](int to, const store_protocol::Request& q, bool ok, Value v) {
    auto it = clients_.find(to);
    if (it != clients_.end() && !it->second.closing) push_reply(it->second, q.id, ok, v);  // none to one going
  });
}

void Core::receive(int client, const char* data, std::size_t n) {
  auto it = clients_.find(client);
  if (it == clients_.end()) return;
  Client& c = it->second;
  if (c.closing) return;
  try {
    c.in.append(data, n);
    while (!c.closing && c.in.size() - c.in_at >= 4) {
      std::uint32_t len = 0;
      std::memcpy(&len, c.in.data() + c.in_at, 4);
      const std::size_t cap = c.introduced ? store_protocol::kMaxRequestBytes : limits_.hello_bytes;
      if (len > cap) {
        warning_(
            c.introduced ? "large" : "stranger",
            fmt::format("store: closed the connection from {}: a frame of {} bytes {} (limit {}; not a hopwise "
                        "store client?)",
                        c.peer, len, c.introduced ? "past the request limit" : "before it introduced itself", cap));
        abandon(c);
        break;
      }
      if (c.in.size() - c.in_at < 4 + std::size_t{len}) break;
      const std::string_view frame = std::string_view(c.in).substr(c.in_at + 4, len);
      c.in_at += 4 + std::size_t{len};
      on_frame(client, c, frame);  // `in` is not touched until it returns
    }
    if (c.closing || c.in_at == c.in.size()) {
      if (c.in.capacity() > (1u << 20))
        std::string().swap(c.in);  // a large request's buffer goes with it
      else
        c.in.clear();
      c.in_at = 0;
    } else if (c.in_at > (64u << 10) && c.in_at > c.in.size() / 2) {  // drop what was taken, rarely
      c.in.erase(0, c.in_at);
      c.in_at = 0;
    }
  } catch (const std::exception& e) {  // bad_alloc, or anything else: this client goes, the server stays
    warning_("failed", fmt::format("store: closed the connection from {}: {}", c.peer, e.what()));
    abandon(c);
  } catch (...) {
    warning_("failed", fmt::format("store: closed the connection from {}: an unknown error", c.peer));
    abandon(c);
  }
  if (c.closing) {
    std::string().swap(c.in);
    c.in_at = 0;
  }
}

std::string_view Core::pending(int client) const {
  auto it = clients_.find(client);
  if (it == clients_.end() || it->second.out.empty()) return {};
  const auto& [chunk, at] = it->second.out.front();
  return std::string_view(*chunk).substr(at);
}

void Core::sent(int client, std::size_t n) {
  auto it = clients_.find(client);
  if (it == clients_.end()) return;
  Client& c = it->second;
  c.out_bytes -= n;
  while (n > 0 && !c.out.empty()) {
    auto& [chunk, at] = c.out.front();
    const std::size_t here = std::min(n, chunk->size() - at);
    at += here;
    n -= here;
    if (at == chunk->size()) c.out.pop_front();
  }
}

bool Core::wants_input(int client) const {
  auto it = clients_.find(client);
  return it != clients_.end() && !it->second.closing && it->second.out_bytes < limits_.pending_output;
}

std::size_t Core::unsent(int client) const {
  auto it = clients_.find(client);
  return it == clients_.end() ? 0 : it->second.out_bytes;
}

bool Core::introduced(int client) const {
  auto it = clients_.find(client);
  return it != clients_.end() && it->second.introduced;
}

bool Core::finished(int client) const {
  auto it = clients_.find(client);
  return it == clients_.end() || (it->second.closing && it->second.out.empty());
}

void Core::close(int client) {
  table_.drop(client);
  clients_.erase(client);
}

std::vector<int> Core::expire(Clock::time_point now) {
  std::vector<int> late;
  const auto wait = std::chrono::duration_cast<Clock::duration>(limits_.hello_timeout);
  for (const auto& [id, c] : clients_)
    if (!c.introduced && now - c.opened >= wait) late.push_back(id);
  for (int id : late) {
    warning_("stranger", fmt::format("store: closed the connection from {}: it did not introduce itself within "
                                     "{:.1f} s",
                                     clients_.at(id).peer, limits_.hello_timeout.count()));
    close(id);
  }
  return late;
}

Clock::time_point Core::next_deadline() const {
  auto next = Clock::time_point::max();
  const auto wait = std::chrono::duration_cast<Clock::duration>(limits_.hello_timeout);
  for (const auto& [id, c] : clients_)
    if (!c.introduced) next = std::min(next, c.opened + wait);
  return next;
}

int Core::oldest_stranger() const {
  int oldest = -1;
  for (const auto& [id, c] : clients_)
    if (!c.introduced && (oldest < 0 || c.opened < clients_.at(oldest).opened)) oldest = id;
  return oldest;
}

std::vector<int> Core::client_ids() const {
  std::vector<int> ids;
  for (const auto& [id, c] : clients_) ids.push_back(id);
  return ids;
}

std::size_t Core::strangers() const {
  std::size_t n = 0;
  for (const auto& [id, c] : clients_) n += !c.introduced;
  return n;
}

}  // namespace hopwise::comm::store_server
