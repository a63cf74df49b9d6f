// ElasticHeartbeat (elastic.h): a thread that bumps this member's counter in the store every period, so that the
// survivors' agreement can tell a slow member (its counter moves) from a lost one (it stands still).
#include <fmt/core.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "hopwise/common/error.h"
#include "hopwise/common/log.h"
#include "hopwise/training/elastic.h"

namespace hopwise::comm {

std::string elastic_beat_key(int id) { return fmt::format("hopwise/elastic/beat/{}", id); }

struct ElasticHeartbeat::State {
  std::mutex mutex;
  std::condition_variable wake;
  bool stop = false;
  std::thread thread;
};

ElasticHeartbeat::ElasticHeartbeat(std::shared_ptr<Store> store, int id, Store::Seconds period)
    : s_(std::make_unique<State>()) {
  if (!(period.count() > 0)) throw InvalidArgument(fmt::format("ElasticHeartbeat: period {} s", period.count()));
  s_->thread = std::thread([state = s_.get(), store = std::move(store), id, period] {
    const std::string key = elastic_beat_key(id);
    std::unique_lock lock(state->mutex);
    for (std::int64_t beat = 1; !state->stop; ++beat) {
      lock.unlock();
      try {
        store->set(key, std::to_string(beat));
      } catch (const std::exception& e) {
        // The store is gone (a TCP store's serving rank died): the agreement, which needs it too, names that.
        log::warn("elastic: member {} stops beating: the store failed ({})", id, e.what());
        return;
      }
      lock.lock();
      state->wake.wait_for(lock, period, [state] { return state->stop; });
    }
  });
}

ElasticHeartbeat::~ElasticHeartbeat() {
  {
    std::lock_guard lock(s_->mutex);
    s_->stop = true;
  }
  s_->wake.notify_all();
  s_->thread.join();
}

}  // namespace hopwise::comm
