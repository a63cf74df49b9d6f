// A subset of a transport's ranks seen as a transport of its own (ranks 0..members-1), so that the algorithms
// written for a whole communicator run within one host or across one leader per host. Messages go through the
// parent unchanged: phases that use groups run one after another, so their tags never meet.
#pragma once

#include <string>
#include <vector>

#include "hopwise/comm/transport.h"

namespace hopwise::comm {

class GroupTransport final : public Transport {
 public:
  // `members`: parent ranks, in group-rank order; the parent's own rank must be one of them.
  GroupTransport(Transport& parent, std::vector<int> members);
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  std::string name() const override { return parent_.name() + " (group)"; }
  Request isend(const void* buf, std::size_t bytes, int peer, int tag) override;
  Request irecv(void* buf, std::size_t bytes, int peer, int tag) override;
  void wait_all(std::span<Request> reqs) override;
  bool test(Request& r) override { return parent_.test(r); }
  void cancel(Request& r) override { parent_.cancel(r); }
  void abandon() override { parent_.abandon(); }
  const std::vector<int>& members() const { return members_; }

 private:
  Transport& parent_;
  std::vector<int> members_;
  int rank_ = -1;
};

}  // namespace hopwise::comm
