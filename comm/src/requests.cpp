#include "hopwise/comm/transport.h"

#include "hopwise/common/error.h"

namespace hopwise::comm {

Requests::~Requests() {
  if (t_ == nullptr) return;
  for (Request& r : v_)
    if (r.active) t_->cancel(r);
}

void Requests::clear() {
  for (Request& r : v_)
    if (r.active) throw Error("internal: clearing a request list with requests still in flight");
  v_.clear();
}

}  // namespace hopwise::comm
