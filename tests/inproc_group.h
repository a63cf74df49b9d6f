// A group of in-process ranks: one InProcessTransport world and one Communicator per rank; run() executes a
// function on one thread per rank and collects what each rank threw.
#pragma once

#include <fmt/core.h>

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "hopwise/comm/algorithm.h"
#include "hopwise/comm/communicator.h"
#include "hopwise/comm/transports/inproc_transport.h"

namespace hwtest {

namespace hc = hopwise::comm;

inline hc::Options test_options(hc::Algorithm a = hc::Algorithm::kAuto, std::size_t chunk_bytes = 256 << 10,
                                double timeout_s = 30) {
  hc::Options o;
  o.algorithm = a;
  o.timeout_s = timeout_s;
  o.chunk_bytes = chunk_bytes;
  o.calibrate = false;  // not collective then, so the communicators can be built on one thread
  o.tune = false;       // these tests check the cost model's choices; the tuner's tests turn it on
  return o;
}

// The table's rows that implement `c` with hopwise's own code (not the transport library's: in-process ranks have
// none), in table order: what every in-process test that covers "every algorithm" runs, registered rows included.
inline std::vector<hc::Algorithm> own_algorithms(hc::Collective c = hc::Collective::kAllreduce) {
  std::vector<hc::Algorithm> v;
  for (hc::Algorithm a : hc::all_algorithms())
    if (hc::implements(a, c) && !hc::algorithm_info(a).needs_native) v.push_back(a);
  return v;
}

class Group {
 public:
  Group(int n, const hc::Options& opts) : world_(hc::make_inprocess_world(n)) {
    for (int r = 0; r < n; ++r)
      comms_.push_back(std::make_unique<hc::Communicator>(std::make_unique<hc::InProcessTransport>(world_, r), opts));
  }
  int size() const { return static_cast<int>(comms_.size()); }
  hc::Communicator& comm(int r) { return *comms_[static_cast<std::size_t>(r)]; }

  // Runs fn(rank, communicator) on one thread per rank. Returns "" or every rank's error, one per line.
  std::string run(const std::function<void(int, hc::Communicator&)>& fn) {
    const int n = size();
    std::vector<std::string> errors(static_cast<std::size_t>(n));
    std::vector<std::thread> threads;
    threads.reserve(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        try {
          fn(r, comm(r));
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(r)] = e.what();
        } catch (...) {
          errors[static_cast<std::size_t>(r)] = "unknown exception";
        }
      });
    for (auto& t : threads) t.join();
    std::string all;
    for (int r = 0; r < n; ++r)
      if (!errors[static_cast<std::size_t>(r)].empty())
        all += fmt::format("rank {} threw: {}\n", r, errors[static_cast<std::size_t>(r)]);
    return all;
  }

 private:
  std::shared_ptr<hc::InProcessWorld> world_;
  std::vector<std::unique_ptr<hc::Communicator>> comms_;
};

}  // namespace hwtest
