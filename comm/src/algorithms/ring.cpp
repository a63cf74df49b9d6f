// Ring reduce-scatter + allgather, chunked and pipelined: as soon as a chunk of step s is received and reduced
// it is sent on for step s+1, so sending, receiving and reducing overlap, and the reduced chunk is still in
// cache when it is sent.
//
// Segments are numbered along the ring: segment k is the block of rank order[k-1], so that after the
// reduce-scatter the rank at ring position i owns segment i+1, which is its own block.
#include <algorithm>
#include <cstring>
#include <exception>
#include <thread>

#include "../plan_state.h"
#include "algorithms.h"
#include "hopwise/comm/cost_model.h"
#include "hopwise/common/reduce.h"

namespace hopwise::comm::algo {

namespace {

struct Ring {
  int p, i, next, prev;
  int mod(int x) const { return ((x % p) + p) % p; }
  // Block index of ring segment k.
  int block(const std::vector<int>& order, int k) const { return order[static_cast<std::size_t>(mod(k - 1))]; }
};

Ring make_ring(const Transport& t, const std::vector<int>& order) {
  const int p = t.size();
  const int i = position_of(order, t.rank());
  return {p, i, order[static_cast<std::size_t>((i + 1) % p)], order[static_cast<std::size_t>((i + p - 1) % p)]};
}

template <class F>
void for_chunks(std::size_t len, std::size_t chunk, F f) {
  for (std::size_t j = 0, k = 0; j < len; j += chunk, ++k) f(k, j, std::min(chunk, len - j));
}

// At most `limit` of a rank's sends in flight (0: any number), the oldest waited for before the next is posted.
struct SendWindow {
  Transport& t;
  Requests& sends;
  std::size_t limit;
  std::size_t oldest = 0;
  void push(const Request& r) {
    if (limit != 0 && sends.size() - oldest >= limit) t.wait(sends[oldest++]);
    sends.push_back(r);
  }
};

// Reduce-scatter phase. Step s sends segment i-s and receives segment i-s-1, reducing it with the local input.
// Partial results go to `work` (indexed like `in`); the last step writes this rank's block to `final_dst`.
void reduce_scatter_phase(const Context& c, const char* in, char* work, char* final_dst, const Blocks& blocks,
                          DataType dt, ReduceOp op, double scale, const std::vector<int>& order) {
  Transport& t = c.transport;
  const Ring r = make_ring(t, order);
  const std::size_t es = dtype_size(dt);
  const std::size_t ce = std::max<std::size_t>(1, c.chunk_bytes / es);
  std::size_t max_seg = 0;
  for (int b = 0; b < r.p; ++b) max_seg = std::max(max_seg, blocks.len(b));
  char* temp[2] = {static_cast<char*>(c.workspace.get(Scratch::kRecvA, max_seg * es + 64)),
                   static_cast<char*>(c.workspace.get(Scratch::kRecvB, max_seg * es + 64))};
  Requests recvs[2] = {Requests(t), Requests(t)}, sends(t);
  SendWindow window{t, sends, c.send_window};
  const int steps = r.p - 1;

  auto post_recvs = [&](int s) {
    const int b = r.block(order, r.i - s - 1);
    auto& rv = recvs[s % 2];
    rv.clear();
    for_chunks(blocks.len(b), ce, [&](std::size_t, std::size_t j, std::size_t n) {
      rv.push_back(t.irecv(temp[s % 2] + j * es, n * es, r.prev, c.tag_offset + kTagRingReduceScatter + s));
    });
  };

  post_recvs(0);
  {
    const int b = r.block(order, r.i);
    for_chunks(blocks.len(b), ce, [&](std::size_t, std::size_t j, std::size_t n) {
      window.push(t.isend(in + (blocks.off(b) + j) * es, n * es, r.next, c.tag_offset + kTagRingReduceScatter));
    });
  }
  for (int s = 0; s < steps; ++s) {
    if (s + 1 < steps) post_recvs(s + 1);
    const int b = r.block(order, r.i - s - 1);
    const bool last = s + 1 == steps;
    char* dst = last ? final_dst : work + blocks.off(b) * es;
    const char* mine = in + blocks.off(b) * es;
    for_chunks(blocks.len(b), ce, [&](std::size_t k, std::size_t j, std::size_t n) {
      t.wait(recvs[s % 2][k]);
      reduce_into(dt, op, dst + j * es, mine + j * es, temp[s % 2] + j * es, n);
      if (last) {
        if (scale != 1.0) scale_by(dt, dst + j * es, n, scale);
      } else {
        window.push(t.isend(dst + j * es, n * es, r.next, c.tag_offset + kTagRingReduceScatter + s + 1));
      }
    });
  }
  t.wait_all(sends);
}

// Allgather phase: this rank's segment i+1 is complete in `buf`; step s forwards segment i+1-s and receives
// segment i-s straight into place. Receives are posted kAllgatherStepsAhead steps ahead, not all p-1 at once: a
// process that hosts every rank (the simulation) held 4096 x 4095 of them at 4096 ranks, some 11 GB.
constexpr int kAllgatherStepsAhead = 2;

void allgather_phase(const Context& c, char* buf, const Blocks& blocks, DataType dt, const std::vector<int>& order) {
  Transport& t = c.transport;
  const Ring r = make_ring(t, order);
  const std::size_t es = dtype_size(dt);
  const std::size_t ce = std::max<std::size_t>(1, c.chunk_bytes / es);
  const int steps = r.p - 1;
  const int ahead = std::min(steps, kAllgatherStepsAhead + 1);
  std::vector<Requests> recvs;  // step s's receives in slot s % ahead
  for (int k = 0; k < ahead; ++k) recvs.emplace_back(t);
  auto post_recvs = [&](int s) {
    const int b = r.block(order, r.i - s);
    auto& rv = recvs[static_cast<std::size_t>(s % ahead)];
    rv.clear();
    for_chunks(blocks.len(b), ce, [&](std::size_t, std::size_t j, std::size_t n) {
      rv.push_back(t.irecv(buf + (blocks.off(b) + j) * es, n * es, r.prev, c.tag_offset + kTagRingAllgather + s));
    });
  };
  Requests sends(t);
  SendWindow window{t, sends, c.send_window};
  for (int s = 0; s < ahead; ++s) post_recvs(s);
  {
    const int b = r.block(order, r.i + 1);
    for_chunks(blocks.len(b), ce, [&](std::size_t, std::size_t j, std::size_t n) {
      window.push(t.isend(buf + (blocks.off(b) + j) * es, n * es, r.next, c.tag_offset + kTagRingAllgather));
    });
  }
  for (int s = 0; s < steps; ++s) {
    const int b = r.block(order, r.i - s);
    for_chunks(blocks.len(b), ce, [&](std::size_t k, std::size_t j, std::size_t n) {
      t.wait(recvs[static_cast<std::size_t>(s % ahead)][k]);
      if (s + 1 < steps)
        window.push(t.isend(buf + (blocks.off(b) + j) * es, n * es, r.next, c.tag_offset + kTagRingAllgather + s + 1));
    });
    if (s + ahead < steps) post_recvs(s + ahead);
  }
  t.wait_all(sends);
}

}  // namespace

void ring_allreduce(const Context& c, const void* in, void* out, std::size_t count, DataType dt, ReduceOp op,
                    double scale, const std::vector<int>& order) {
  const Transport& t = c.transport;
  const Blocks blocks = Blocks::even(count, t.size());
  const std::size_t es = dtype_size(dt);
  char* o = static_cast<char*>(out);
  reduce_scatter_phase(c, static_cast<const char*>(in), o, o + blocks.off(t.rank()) * es, blocks, dt, op, scale, order);
  allgather_phase(c, o, blocks, dt, order);
}

void ring_allreduce_channels(const Context& c, std::vector<Workspace*> extra, const void* in, void* out,
                             std::size_t count, DataType dt, ReduceOp op, double scale,
                             const std::vector<std::vector<int>>& channels) {
  const std::size_t k = std::min(channels.size(), extra.size() + 1);
  const std::size_t p = static_cast<std::size_t>(c.transport.size());
  // Below a few chunks per rank and channel a thread costs more than a second ring can give.
  const std::size_t es = dtype_size(dt);
  if (k <= 1 || count * es < k * p * c.chunk_bytes * 2) {
    ring_allreduce(c, in, out, count, dt, op, scale, channels.front());
    return;
  }
  const Blocks parts = Blocks::even(count, static_cast<int>(k));
  const char* i8 = static_cast<const char*>(in);
  char* o8 = static_cast<char*>(out);
  std::vector<std::exception_ptr> errors(k);
  std::vector<std::thread> threads;
  for (std::size_t ch = 1; ch < k; ++ch)
    threads.emplace_back([&, ch] {
      try {
        const Context cc{c.transport, *extra[ch - 1], c.chunk_bytes,
                         c.tag_offset + static_cast<int>(ch) * kRingChannelTagStride, c.send_window};
        const int b = static_cast<int>(ch);
        ring_allreduce(cc, i8 + parts.off(b) * es, o8 + parts.off(b) * es, parts.len(b), dt, op, scale, channels[ch]);
      } catch (...) {
        errors[ch] = std::current_exception();
      }
    });
  try {
    ring_allreduce(c, i8, o8, parts.len(0), dt, op, scale, channels.front());
  } catch (...) {
    errors[0] = std::current_exception();
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

void ring_reduce_scatter(const Context& c, const void* in, void* out, std::size_t recvcount, DataType dt, ReduceOp op,
                         double scale, const std::vector<int>& order) {
  const Transport& t = c.transport;
  const Blocks blocks = Blocks::uniform(recvcount, t.size());
  const std::size_t es = dtype_size(dt);
  char* work = static_cast<char*>(c.workspace.get(Scratch::kWork, blocks.offsets.back() * es + 64));
  reduce_scatter_phase(c, static_cast<const char*>(in), work, static_cast<char*>(out), blocks, dt, op, scale, order);
}

void ring_allgather(const Context& c, const void* in, void* out, std::size_t sendcount, DataType dt,
                    const std::vector<int>& order) {
  const Transport& t = c.transport;
  const Blocks blocks = Blocks::uniform(sendcount, t.size());
  const std::size_t es = dtype_size(dt);
  char* o = static_cast<char*>(out);
  char* mine = o + blocks.off(t.rank()) * es;
  if (mine != in && sendcount != 0) copy_bytes(mine, in, sendcount * es);
  allgather_phase(c, o, blocks, dt, order);
}

void planned_ring_allreduce(AlgorithmContext& a, const CollectiveCall& c) {
  const Context ctx = context_of(a);
  const auto& channels = a.plan->channels;
  if (channels.size() > 1 && !a.one_channel) {
    std::vector<Workspace*> extra;
    for (auto& w : a.plan->channel_workspaces) extra.push_back(w.get());
    ring_allreduce_channels(ctx, extra, c.in, c.out, c.count, c.dt, c.op, c.scale, channels);
  } else {
    ring_allreduce(ctx, c.in, c.out, c.count, c.dt, c.op, c.scale, a.ring);
  }
}

AlgorithmInfo ring_row() {
  AlgorithmInfo r;
  r.name = "ring";
  r.one_order = true;
  r.pipelined = true;
  r.channels = true;
  r.collectives = {Collective::kAllreduce, Collective::kReduceScatter, Collective::kAllgather, Collective::kBarrier};
  r.summary = "chunked, pipelined reduce-scatter + allgather along the planned ring (channels side by side)";
  r.estimate = [](const CostQuery& q) {
    const CostParams& m = *q.params;
    const double n = static_cast<double>(q.bytes), P = q.ranks, frac = (P - 1) / P;
    switch (q.collective) {
      case Collective::kAllreduce:
        return 2 * (P - 1) * alpha_for(m, std::min(kModelChunk, n / P)) + 2 * frac * n * beta_for(m, n / P) +
               frac * n * m.gamma;
      case Collective::kReduceScatter:
      case Collective::kAllgather: {
        // bytes = the per-rank block; p blocks move around the ring.
        const double reduce = q.collective == Collective::kReduceScatter ? frac * n * P * m.gamma : 0.0;
        return (P - 1) * m.alpha + frac * n * P * beta_for(m, n / P) + reduce;
      }
      case Collective::kBarrier: return log2_ceil(q.ranks) * m.alpha;
      default: return static_cast<double>(INFINITY);
    }
  };
  r.run = [](AlgorithmContext& a, const CollectiveCall& c) {
    const Context ctx = context_of(a);
    switch (c.kind) {
      case Collective::kAllreduce: return planned_ring_allreduce(a, c);
      case Collective::kReduceScatter:
        return ring_reduce_scatter(ctx, c.in, c.out, c.count, c.dt, c.op, c.scale, a.ring);
      case Collective::kAllgather: return ring_allgather(ctx, c.in, c.out, c.count, c.dt, a.ring);
      default: return dissemination_barrier(ctx);
    }
  };
  return r;
}

}  // namespace hopwise::comm::algo
