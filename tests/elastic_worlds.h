// What the elastic tests share: one in-process world per generation's key (ranks as threads meet there as UCX's
// meet through the store), and fast elastic options.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "hopwise/comm/transports/inproc_transport.h"
#include "hopwise/training/elastic.h"

namespace hwtest {

// One in-process world per generation's key, made by the first of its members to ask.
struct Worlds {
  std::mutex mutex;
  std::map<std::string, std::shared_ptr<hopwise::comm::InProcessWorld>> by_key;
  hopwise::comm::ElasticGroup::TransportFactory factory() {
    return [this](std::shared_ptr<hopwise::comm::Store>, int rank, int size, const std::string& key,
                  hopwise::comm::Store::Seconds) {
      std::lock_guard lock(mutex);
      auto& w = by_key[key];
      if (!w) w = hopwise::comm::make_inprocess_world(size);
      return std::make_unique<hopwise::comm::InProcessTransport>(w, rank);
    };
  }
};

inline hopwise::comm::ElasticOptions elastic_options(bool grow = false) {
  hopwise::comm::ElasticOptions o;
  o.shrink = true;
  o.grow = grow;
  o.settle_s = 0.5;
  return o;
}

}  // namespace hwtest
