#include "torch_store.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "hopwise/common/error.h"

namespace hopwise::torch_backend {

namespace {

std::chrono::milliseconds millis(comm::Store::Seconds s) {
  return std::chrono::milliseconds(std::max<std::int64_t>(1, static_cast<std::int64_t>(s.count() * 1000)));
}

// torch's stores say "timeout" in several ways; hopwise's callers need a TimeoutError naming the keys.
[[noreturn]] void rethrow(const std::exception& e, const std::vector<std::string>& keys, comm::Store::Seconds t) {
  const std::string what = e.what();
  if (what.find("imeout") != std::string::npos || what.find("imed out") != std::string::npos)
    throw TimeoutError(fmt::format("store (torch's): key(s) {} not set within {:.1f} s: {}", fmt::join(keys, ", "),
                                   t.count(), what.substr(0, what.find('\n'))),
                       {});
  throw Error(fmt::format("store (torch's): {}", what.substr(0, what.find('\n'))));
}

}  // namespace

void TorchStore::set(const std::string& key, const std::string& value) {
  try {
    store_->set(key, std::vector<std::uint8_t>(value.begin(), value.end()));
  } catch (const std::exception& e) {
    rethrow(e, {key}, Seconds(0));
  }
}

std::string TorchStore::get(const std::string& key, Seconds timeout) {
  try {
    store_->wait({key}, millis(timeout));
    const auto v = store_->get(key);
    return std::string(v.begin(), v.end());
  } catch (const std::exception& e) {
    rethrow(e, {key}, timeout);
  }
}

void TorchStore::wait(const std::vector<std::string>& keys, Seconds timeout) {
  try {
    store_->wait(keys, millis(timeout));
  } catch (const std::exception& e) {
    rethrow(e, keys, timeout);
  }
}

std::int64_t TorchStore::add(const std::string& key, std::int64_t delta) {
  try {
    return store_->add(key, delta);
  } catch (const std::exception& e) {
    rethrow(e, {key}, Seconds(0));
  }
}

bool TorchStore::check(const std::vector<std::string>& keys) {
  try {
    return store_->check(keys);
  } catch (const std::exception& e) {
    rethrow(e, keys, Seconds(0));
  }
}

}  // namespace hopwise::torch_backend
