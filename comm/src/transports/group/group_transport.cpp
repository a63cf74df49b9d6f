#include "group_transport.h"

#include <fmt/core.h>

#include <algorithm>

#include "hopwise/common/error.h"

namespace hopwise::comm {

GroupTransport::GroupTransport(Transport& parent, std::vector<int> members)
    : parent_(parent), members_(std::move(members)) {
  const auto it = std::find(members_.begin(), members_.end(), parent_.rank());
  if (it == members_.end())
    throw Error(fmt::format("internal: rank {} is not a member of its own group", parent_.rank()));
  rank_ = static_cast<int>(it - members_.begin());
  set_timeout(parent_.timeout());
}

// Requests keep the parent's peer number, so that a timeout names the rank as the user knows it.
Request GroupTransport::isend(const void* buf, std::size_t bytes, int peer, int tag) {
  const Request r = parent_.isend(buf, bytes, members_.at(static_cast<std::size_t>(peer)), tag);
  count_sent(peer, bytes);
  return r;
}

Request GroupTransport::irecv(void* buf, std::size_t bytes, int peer, int tag) {
  return parent_.irecv(buf, bytes, members_.at(static_cast<std::size_t>(peer)), tag);
}

void GroupTransport::wait_all(std::span<Request> reqs) { parent_.wait_all(reqs); }

}  // namespace hopwise::comm
