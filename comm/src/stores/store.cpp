// InProcessStore (a map under a mutex) and the bootstrap steps every store shares.
#include "hopwise/comm/store.h"

#include <fmt/core.h>

#include <condition_variable>
#include <map>
#include <mutex>

#include "hopwise/common/error.h"
#include "store_protocol.h"

namespace hopwise::comm {

struct InProcessStore::State {
  std::mutex mutex;
  std::condition_variable cv;
  std::map<std::string, std::string> values;
};

InProcessStore::InProcessStore() : s_(std::make_unique<State>()) {}
InProcessStore::~InProcessStore() = default;

void InProcessStore::set(const std::string& key, const std::string& value) {
  {
    std::lock_guard lock(s_->mutex);
    s_->values[key] = value;
  }
  s_->cv.notify_all();
}

std::string InProcessStore::get(const std::string& key, Seconds timeout) {
  wait({key}, timeout);
  std::lock_guard lock(s_->mutex);
  return s_->values.at(key);
}

void InProcessStore::wait(const std::vector<std::string>& keys, Seconds timeout) {
  std::unique_lock lock(s_->mutex);
  auto missing = [&] {
    std::vector<std::string> m;
    for (const auto& k : keys)
      if (!s_->values.count(k)) m.push_back(k);
    return m;
  };
  const bool ok = s_->cv.wait_for(lock, timeout, [&] { return missing().empty(); });
  if (!ok) {
    const auto m = missing();
    throw TimeoutError(fmt::format("store: {} key(s) not set within {:.1f} s, first '{}'; a rank that should set "
                                   "them has not arrived (raise HOPWISE_TIMEOUT_S if it is only slow)",
                                   m.size(), timeout.count(), m.front()),
                       {});
  }
}

std::int64_t InProcessStore::add(const std::string& key, std::int64_t delta) {
  std::int64_t v = 0;
  {
    std::lock_guard lock(s_->mutex);
    const auto it = s_->values.find(key);
    v = store_protocol::checked_add(key, it == s_->values.end() ? nullptr : &it->second, delta);
    s_->values[key] = std::to_string(v);
  }
  s_->cv.notify_all();
  return v;
}

bool InProcessStore::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(s_->mutex);
  for (const auto& k : keys)
    if (!s_->values.count(k)) return false;
  return true;
}

std::vector<std::string> store_allgather(Store& store, const std::string& name, int rank, int size,
                                         const std::string& mine, Store::Seconds timeout) {
  store.set(fmt::format("{}/{}", name, rank), mine);
  std::vector<std::string> keys, out;
  for (int r = 0; r < size; ++r) keys.push_back(fmt::format("{}/{}", name, r));
  try {
    store.wait(keys, timeout);
  } catch (const TimeoutError&) {
    std::vector<int> missing;  // name the ranks, not only the first key
    for (int r = 0; r < size; ++r)
      if (!store.check({keys[static_cast<std::size_t>(r)]})) missing.push_back(r);
    std::string list;
    for (int r : missing) list += (list.empty() ? "" : ", ") + std::to_string(r);
    throw TimeoutError(fmt::format("rank {}: '{}': rank(s) {} did not arrive within {:.1f} s (not started, stopped, "
                                   "or not making this call; raise HOPWISE_TIMEOUT_S if they are only slow)",
                                   rank, name, list, timeout.count()),
                       missing);
  }
  for (const auto& k : keys) out.push_back(store.get(k, timeout));
  return out;
}

std::string store_broadcast(Store& store, const std::string& name, int rank, int root, const std::string& value,
                            Store::Seconds timeout) {
  const std::string key = fmt::format("{}/{}", name, root);
  if (rank == root) {
    store.set(key, value);
    return value;
  }
  return store.get(key, timeout);
}

}  // namespace hopwise::comm
