// Each member's step-start state kept by its ring successor (neighbour_copy.h).
#include "hopwise/training/neighbour_copy.h"

#include <utility>

#include "hopwise/common/error.h"

namespace hopwise::comm {

NeighbourCopy::NeighbourCopy(std::size_t count, int tag) : count_(count), tag_(tag), held_(count), incoming_(count) {}

NeighbourCopy::~NeighbourCopy() { abandon(); }

void NeighbourCopy::start(Communicator& comm, const float* mine, std::int64_t step, const std::vector<int>& ids) {
  const int p = comm.size(), r = comm.rank();
  if (static_cast<int>(ids.size()) != p)
    throw InvalidArgument("NeighbourCopy::start: " + std::to_string(ids.size()) + " ids for " + std::to_string(p) +
                          " ranks; give one per rank");
  abandon();  // a start without its settle (the step failed elsewhere): that copy never completes
  if (p < 2) return;
  const int successor = (r + 1) % p, predecessor = (r + p - 1) % p;
  recv_ = comm.recv_async(incoming_.data(), count_, DataType::kFloat32, predecessor, tag_);
  send_ = comm.send_async(mine, count_, DataType::kFloat32, successor, tag_);
  incoming_id_ = ids[static_cast<std::size_t>(predecessor)];
  incoming_step_ = step;
}

void NeighbourCopy::settle() {
  if (!recv_.valid()) return;
  Work recv = std::move(recv_), send = std::move(send_);
  recv_ = Work();
  send_ = Work();
  try {
    recv.wait();
    send.wait();
  } catch (...) {
    // Neither may be left running on buffers this object owns or the caller's `mine`.
    for (Work* w : {&recv, &send}) try {
        if (w->valid()) w->wait();
      } catch (...) {
      }
    throw;
  }
  std::swap(held_, incoming_);
  held_id_ = incoming_id_;
  held_step_ = incoming_step_;
}

void NeighbourCopy::abandon() {
  for (Work* w : {&recv_, &send_}) {
    if (w->valid()) try {
        w->wait();
      } catch (...) {
      }
    *w = Work();
  }
}

}  // namespace hopwise::comm
