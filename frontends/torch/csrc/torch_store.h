// torch's c10d::Store (the one init_process_group made: TCP, file or the launcher's) as hopwise's Store, so that
// UCX ranks meet where torch's ranks met, with no second server or port.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "hopwise/comm/store.h"

namespace hopwise::torch_backend {

class TorchStore final : public comm::Store {
 public:
  explicit TorchStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, Seconds timeout) override;
  void wait(const std::vector<std::string>& keys, Seconds timeout) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace hopwise::torch_backend
