// Dissemination barrier: in round k every rank signals rank + 2^k and waits for rank - 2^k; after
// ceil(log2 p) rounds every rank has (transitively) heard from every other.
#include "algorithms.h"

namespace hopwise::comm::algo {

void dissemination_barrier(const Context& c) {
  Transport& t = c.transport;
  const int p = t.size(), r = t.rank();
  char token = 0, sink = 0;
  for (int dist = 1, round = 0; dist < p; dist *= 2, ++round) {
    Request reqs[2] = {t.irecv(&sink, 1, (r - dist + p) % p, kTagBarrier + round),
                       t.isend(&token, 1, (r + dist) % p, kTagBarrier + round)};
    t.wait_all(reqs);
  }
}

}  // namespace hopwise::comm::algo
