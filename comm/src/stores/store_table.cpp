// store_protocol::Table: the served stores' keys, and the gets and waits parked until sets and adds complete them.
// Each parked request is listed under every key it still misses; a set or add takes its key's list and counts down
// each listed request, answering those it completes in the order they were parked. Nothing a set or add does
// depends on how many other requests are parked, or on how many keys they name.
#include <fmt/core.h>

#include "hopwise/common/error.h"
#include "store_protocol.h"

namespace hopwise::comm::store_protocol {

namespace {

Value make_value(std::string s) { return std::make_shared<const std::string>(std::move(s)); }

std::string too_many_parked() {
  return fmt::format(
      "this client had {} gets and waits parked, the most one client may have (kMaxParkedPerClient): its oldest, "
      "this one, was dropped to park a newer one (a TcpStore client asks one thing at a time, so its older requests "
      "had timed out); wait for fewer things at once",
      kMaxParkedPerClient);
}

}  // namespace

bool Table::ready(const Request& r) const {
  for (const auto& k : r.keys)
    if (!values_.count(k)) return false;
  return true;
}

void Table::answer(int client, const Request& r, const Reply& reply) const {
  reply(client, r, true, r.op == kGet ? values_.at(r.keys.front()) : Value());
}

void Table::handle(int client, Request r, const Reply& reply) {
  switch (r.op) {
    case kSet: {
      const std::string key = r.keys.front();
      values_[key] = make_value(std::move(r.value));
      reply(client, r, true, {});
      wake(key, reply);
      return;
    }
    case kAdd: {
      const std::string& key = r.keys.front();
      const auto it = values_.find(key);
      std::int64_t sum = 0;
      try {
        sum = checked_add(key, it == values_.end() ? nullptr : it->second.get(), r.delta);
      } catch (const InvalidArgument& e) {
        reply(client, r, false, make_value(e.what()));
        return;
      }
      Value v = make_value(std::to_string(sum));
      values_[key] = v;
      reply(client, r, true, v);
      wake(key, reply);
      return;
    }
    case kCheck: reply(client, r, true, make_value(ready(r) ? "1" : "0")); return;
    case kHello: reply(client, r, true, {}); return;
    default: get_or_wait(client, std::move(r), reply); return;
  }
}

// Answers at once when every key is set; otherwise parks the request, within the limits on what one client may park.
void Table::get_or_wait(int client, Request r, const Reply& reply) {
  if (r.op == kWait && r.keys.size() > kMaxWaitKeys) {  // a client that skipped check_limits
    reply(client, r, false, make_value(too_many_wait_keys(r.keys.size())));
    return;
  }
  if (ready(r)) {
    answer(client, r, reply);
    return;
  }
  // Past the cap the oldest goes, not the newest: a client that timed out many times (each leaving a request
  // parked) must still be answered for the one thing it waits for now, and a hostile one cannot hold more.
  const auto mine = parked_by_client_.find(client);
  if (mine != parked_by_client_.end() && mine->second.size() >= kMaxParkedPerClient) {
    const std::uint64_t oldest = *mine->second.begin();
    const Parked& p = parked_.at(oldest);
    reply(p.client, p.request, false, make_value(too_many_parked()));
    unpark(oldest);
  }
  park(client, std::move(r));
}

// Lists the request under each key it misses, counting each such key once however often the request names it.
void Table::park(int client, Request r) {
  const std::uint64_t id = next_parked_++;
  std::size_t missing = 0;
  for (const auto& k : r.keys)
    if (!values_.count(k)) missing += waiters_[k].insert(id).second ? 1 : 0;
  parked_by_client_[client].insert(id);
  parked_.emplace(id, Parked{client, std::move(r), missing});
}

// `key` was just set: every request listed under it misses one key fewer; those that miss none are answered.
void Table::wake(const std::string& key, const Reply& reply) {
  const auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  const std::set<std::uint64_t> listed = std::move(it->second);
  waiters_.erase(it);  // the key stays set: nothing parks under it again
  for (const std::uint64_t id : listed) {
    ++parked_visits_;
    Parked& p = parked_.at(id);
    if (--p.missing > 0) continue;
    answer(p.client, p.request, reply);
    unpark(id);
  }
}

// Forgets a parked request: from the lists of the keys it still misses, its client's, and the table.
void Table::unpark(std::uint64_t id) {
  const auto it = parked_.find(id);
  for (const auto& k : it->second.request.keys) {
    const auto listed = waiters_.find(k);
    if (listed == waiters_.end()) continue;
    listed->second.erase(id);
    if (listed->second.empty()) waiters_.erase(listed);
  }
  const auto mine = parked_by_client_.find(it->second.client);
  mine->second.erase(id);
  if (mine->second.empty()) parked_by_client_.erase(mine);
  parked_.erase(it);
}

void Table::drop(int client) {
  const auto mine = parked_by_client_.find(client);
  if (mine == parked_by_client_.end()) return;
  const std::set<std::uint64_t> ids = mine->second;  // unpark erases from the original
  for (const std::uint64_t id : ids) unpark(id);
}

}  // namespace hopwise::comm::store_protocol
