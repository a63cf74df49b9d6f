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

// Runs fn(r) on one thread per r in 0..n-1; returns what each threw ("" where nothing).
inline std::vector<std::string> on_threads(int n, const std::function<void(int)>& fn) {
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = "unknown exception";
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

// "" or every rank's error, one per line.
inline std::string joined_errors(const std::vector<std::string>& errors) {
  std::string all;
  for (std::size_t r = 0; r < errors.size(); ++r)
    if (!errors[r].empty()) all += fmt::format("rank {} threw: {}\n", r, errors[r]);
  return all;
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
    return joined_errors(on_threads(size(), [&](int r) { fn(r, comm(r)); }));
  }

 private:
  std::shared_ptr<hc::InProcessWorld> world_;
  std::vector<std::unique_ptr<hc::Communicator>> comms_;
};

}  // namespace hwtest
