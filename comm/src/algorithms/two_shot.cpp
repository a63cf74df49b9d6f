// Two-shot allreduce ("two_shot", formerly "shm") through the shared slots of ranks on one host, with no messages:
// chunk by chunk, every rank copies its input into its slot and raises its ready flag; rank j reduces block j of the
// chunk across all slots (in rank order) and leaves the result in block j of its own slot, then raises its done flag;
// every rank copies the p result blocks out. Each rank moves about 3n bytes (copy in, reduce its n/p over p inputs,
// copy out) against the ring's 2(p-1) message copies, and waits on two flags per chunk instead of 2(p-1) message
// rounds. Two buffers per slot alternate between chunks, so the next chunk's copy-in overlaps the others' reading.
#include <cstring>

#include <cmath>
#include "algorithms.h"
#include "hopwise/comm/cost_model.h"
#include "hopwise/common/reduce.h"
#include "shared_flags.h"

namespace hopwise::comm::algo {

bool two_shot_allreduce(const Context& c, const void* in_v, void* out_v, std::size_t count, DataType dt, ReduceOp op,
                        double scale) {
  Transport& t = c.transport;
  SharedSlots* sh = t.shared_slots();
  if (sh == nullptr) return false;
  const int p = t.size(), me = t.rank();
  const std::size_t es = dtype_size(dt);
  const std::size_t chunk = std::max<std::size_t>(1, sh->slot_bytes / es);
  const char* in = static_cast<const char*>(in_v);
  char* out = static_cast<char*>(out_v);
  char* mine = sh->base[static_cast<std::size_t>(me)];
  for (std::size_t lo = 0; lo < count; lo += chunk) {
    const std::size_t n = std::min(chunk, count - lo);
    const Blocks blocks = Blocks::even(n, p);
    const std::uint64_t seq = ++sh->seq;
    const std::size_t which = SharedSlots::kHeader + (seq % 2) * sh->slot_bytes;
    wait_for_flags(t, *sh, seq - 1);  // everyone is done reading this buffer from chunk seq-2
    std::memcpy(mine + which, in + lo * es, n * es);
    sh->bytes_in.fetch_add(n * es, std::memory_order_relaxed);
    publish_stamp(t, mine, seq);
    flag_of(mine, 0).store(seq, std::memory_order_release);
    wait_for_flags(t, *sh, seq, 0);
    if (lo == 0) compare_stamps(t, *sh, seq);  // the first chunk tells; a count that differs changes the chunks
    // My block: reduce across every slot, in rank order, into my own slot (only I read block `me` anywhere).
    const std::size_t off = blocks.off(me) * es, len = blocks.len(me);
    char* dst = mine + which + off;
    if (len != 0) {
      auto slot = [&](int r) { return sh->base[static_cast<std::size_t>(r)] + which + off; };
      if (p > 1) {
        // dst aliases slot(me): reduce in rank order without overwriting my input before its turn.
        if (me == 0) {
          reduce_into(dt, op, dst, slot(0), slot(1), len);
          for (int r = 2; r < p; ++r) reduce_into(dt, op, dst, dst, slot(r), len);
        } else {
          char* acc = out + lo * es + off;  // my block of out is free until the copy-out below
          reduce_into(dt, op, acc, slot(0), slot(1), len);
          for (int r = 2; r < p; ++r) reduce_into(dt, op, acc, acc, slot(r), len);
          std::memcpy(dst, acc, len * es);
        }
      }
      if (scale != 1.0) scale_by(dt, dst, len, scale);
    }
    flag_of(mine, 1).store(seq, std::memory_order_release);
    wait_for_flags(t, *sh, seq, 1);
    for (int r = 0; r < p; ++r) {
      const std::size_t roff = blocks.off(r) * es;
      std::memcpy(out + lo * es + roff, sh->base[static_cast<std::size_t>(r)] + which + roff, blocks.len(r) * es);
    }
  }
  return true;
}

AlgorithmInfo two_shot_row() {
  AlgorithmInfo r;
  r.name = "two_shot";
  r.aliases = {"two-shot", "shm", "shared-memory", "twoshot"};
  r.collectives = {Collective::kAllreduce};
  r.summary = "two-shot through the shared slots: reduce-scatter then allgather, no messages (one host)";
  r.estimate = [](const CostQuery& q) {
    const CostParams& m = *q.params;
    if (m.alpha_shared <= 0) return static_cast<double>(INFINITY);
    // Copy in, reduce my n/p over p slots, copy out; two flag waits per slot-sized chunk.
    const double n = static_cast<double>(q.bytes);
    return std::ceil(n / m.shared_slot_bytes) * 2 * m.alpha_shared + n * m.beta_shared;
  };
  r.run = [](AlgorithmContext& a, const CollectiveCall& c) {
    // Where the transport has no shared slots (ranks on several hosts), the planned ring does the work.
    if (!two_shot_allreduce(context_of(a), c.in, c.out, c.count, c.dt, c.op, c.scale)) planned_ring_allreduce(a, c);
  };
  return r;
}

}  // namespace hopwise::comm::algo
