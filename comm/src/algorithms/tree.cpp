// Pipelined tree reduce and broadcast. Data moves in chunks: a node reduces chunk k from its children and
// sends it up while its children already work on chunk k+1; the root sends chunks down as they complete.
// With two trees (double binary tree) each carries half of the data, and their chunks are interleaved so that
// a rank that is a leaf in one tree does the interior work of the other at the same time.

#include "../plan_state.h"
#include "algorithms.h"
#include "hopwise/comm/cost_model.h"
#include "hopwise/common/reduce.h"

namespace hopwise::comm::algo {

namespace {

constexpr std::size_t kWindow = 4;  // receives posted ahead per child

struct Job {
  const topology::TreeShape* tree;
  std::size_t lo, n;  // element range of the data this tree carries
  int tree_index;
};

std::size_t chunks_of(std::size_t n, std::size_t ce) { return (n + ce - 1) / ce; }

// Reduce every job's range up its tree into `acc` (the result lands at each root's acc).
void reduce_phase(const Context& c, const char* in, char* acc, DataType dt, ReduceOp op, double scale,
                  const std::vector<Job>& jobs) {
  Transport& t = c.transport;
  const int me = t.rank();
  const std::size_t es = dtype_size(dt);
  const std::size_t ce = std::max<std::size_t>(1, c.chunk_bytes / es);
  std::size_t slots = 0;
  for (const Job& j : jobs) slots += j.tree->children[static_cast<std::size_t>(me)].size() * kWindow;
  char* temp = static_cast<char*>(c.workspace.get(Scratch::kTree, slots * ce * es + 64));

  struct State {
    std::size_t chunks, slot_base;
    Requests recvs;  // [child * kWindow + k % kWindow]
  };
  std::vector<State> st;
  for (std::size_t ji = 0; ji < jobs.size(); ++ji) st.push_back({0, 0, Requests(t)});
  std::size_t slot = 0, max_chunks = 0;
  auto post = [&](std::size_t ji, std::size_t ci, std::size_t k) {
    const Job& j = jobs[ji];
    const std::size_t n = std::min(ce, j.n - k * ce);
    const int child = j.tree->children[static_cast<std::size_t>(me)][ci];
    const std::size_t s = st[ji].slot_base + ci * kWindow + k % kWindow;
    st[ji].recvs[ci * kWindow + k % kWindow] =
        t.irecv(temp + s * ce * es, n * es, child, kTagTreeReduce + j.tree_index);
  };
  for (std::size_t ji = 0; ji < jobs.size(); ++ji) {
    const auto& kids = jobs[ji].tree->children[static_cast<std::size_t>(me)];
    st[ji].chunks = chunks_of(jobs[ji].n, ce);
    st[ji].slot_base = slot;
    st[ji].recvs.resize(kids.size() * kWindow);
    slot += kids.size() * kWindow;
    max_chunks = std::max(max_chunks, st[ji].chunks);
    for (std::size_t ci = 0; ci < kids.size(); ++ci)
      for (std::size_t k = 0; k < std::min(kWindow, st[ji].chunks); ++k) post(ji, ci, k);
  }
  Requests sends(t);
  // A leaf's chunks depend on nothing: they go out up to kWindow ahead of the loop. Sent in turn with the other
  // tree's chunks, a rank that waits there held them back, and on two hosts the links' two directions took turns.
  std::vector<std::size_t> leaf_sent(jobs.size(), 0);
  auto send_leaf_chunks = [&](std::size_t upto) {
    for (std::size_t ji = 0; ji < jobs.size(); ++ji) {
      const Job& j = jobs[ji];
      const int parent = j.tree->parent[static_cast<std::size_t>(me)];
      if (parent < 0 || !j.tree->children[static_cast<std::size_t>(me)].empty()) continue;
      for (std::size_t& k = leaf_sent[ji]; k < std::min(upto, st[ji].chunks); ++k)
        sends.push_back(
            t.isend(in + (j.lo + k * ce) * es, std::min(ce, j.n - k * ce) * es, parent, kTagTreeReduce + j.tree_index));
    }
  };
  for (std::size_t k = 0; k < max_chunks; ++k) {
    send_leaf_chunks(k + kWindow);
    for (std::size_t ji = 0; ji < jobs.size(); ++ji) {
      const Job& j = jobs[ji];
      if (k >= st[ji].chunks) continue;
      const auto& kids = j.tree->children[static_cast<std::size_t>(me)];
      const int parent = j.tree->parent[static_cast<std::size_t>(me)];
      if (kids.empty() && parent >= 0) continue;  // a leaf's chunk went out above
      const std::size_t off = (j.lo + k * ce) * es, n = std::min(ce, j.n - k * ce);
      const char* result = in + off;
      for (std::size_t ci = 0; ci < kids.size(); ++ci) {
        Request& r = st[ji].recvs[ci * kWindow + k % kWindow];
        t.wait(r);
        const std::size_t s = st[ji].slot_base + ci * kWindow + k % kWindow;
        reduce_into(dt, op, acc + off, result, temp + s * ce * es, n);
        result = acc + off;
        if (k + kWindow < st[ji].chunks) post(ji, ci, k + kWindow);
      }
      if (parent >= 0) {
        sends.push_back(t.isend(result, n * es, parent, kTagTreeReduce + j.tree_index));
      } else {
        if (result != acc + off) copy_bytes(acc + off, result, n * es);
        if (scale != 1.0) scale_by(dt, acc + off, n, scale);
      }
    }
  }
  t.wait_all(sends);
}

// Broadcast every job's range down its tree, in place in buf.
void broadcast_phase(const Context& c, char* buf, DataType dt, const std::vector<Job>& jobs) {
  Transport& t = c.transport;
  const int me = t.rank();
  const std::size_t es = dtype_size(dt);
  const std::size_t ce = std::max<std::size_t>(1, c.chunk_bytes / es);
  std::vector<Requests> recvs;
  for (std::size_t ji = 0; ji < jobs.size(); ++ji) recvs.emplace_back(t);
  std::size_t max_chunks = 0;
  for (std::size_t ji = 0; ji < jobs.size(); ++ji) {
    const Job& j = jobs[ji];
    const std::size_t chunks = chunks_of(j.n, ce);
    max_chunks = std::max(max_chunks, chunks);
    const int parent = j.tree->parent[static_cast<std::size_t>(me)];
    if (parent < 0) continue;
    for (std::size_t k = 0; k < chunks; ++k)
      recvs[ji].push_back(t.irecv(buf + (j.lo + k * ce) * es, std::min(ce, j.n - k * ce) * es, parent,
                                  kTagTreeBroadcast + j.tree_index));
  }
  Requests sends(t);
  // A root's chunks depend on nothing: up to kWindow ahead, as a leaf's in reduce_phase.
  std::vector<std::size_t> root_sent(jobs.size(), 0);
  auto send_root_chunks = [&](std::size_t upto) {
    for (std::size_t ji = 0; ji < jobs.size(); ++ji) {
      const Job& j = jobs[ji];
      if (j.tree->parent[static_cast<std::size_t>(me)] >= 0) continue;
      for (std::size_t& k = root_sent[ji]; k < std::min(upto, chunks_of(j.n, ce)); ++k)
        for (int child : j.tree->children[static_cast<std::size_t>(me)])
          sends.push_back(t.isend(buf + (j.lo + k * ce) * es, std::min(ce, j.n - k * ce) * es, child,
                                  kTagTreeBroadcast + j.tree_index));
    }
  };
  for (std::size_t k = 0; k < max_chunks; ++k) {
    send_root_chunks(k + kWindow);
    for (std::size_t ji = 0; ji < jobs.size(); ++ji) {
      const Job& j = jobs[ji];
      if (k >= chunks_of(j.n, ce)) continue;
      if (recvs[ji].empty()) continue;  // the root's chunk went out above
      t.wait(recvs[ji][k]);
      for (int child : j.tree->children[static_cast<std::size_t>(me)])
        sends.push_back(t.isend(buf + (j.lo + k * ce) * es, std::min(ce, j.n - k * ce) * es, child,
                                kTagTreeBroadcast + j.tree_index));
    }
  }
  t.wait_all(sends);
}

std::vector<Job> split_jobs(std::size_t count, const std::vector<const topology::TreeShape*>& trees) {
  std::vector<Job> jobs;
  const Blocks b = Blocks::even(count, static_cast<int>(trees.size()));
  for (std::size_t i = 0; i < trees.size(); ++i)
    jobs.push_back({trees[i], b.off(static_cast<int>(i)), b.len(static_cast<int>(i)), static_cast<int>(i)});
  return jobs;
}

}  // namespace

void tree_allreduce(const Context& c, const void* in, void* out, std::size_t count, DataType dt, ReduceOp op,
                    double scale, const std::vector<const topology::TreeShape*>& trees) {
  const auto jobs = split_jobs(count, trees);
  reduce_phase(c, static_cast<const char*>(in), static_cast<char*>(out), dt, op, scale, jobs);
  broadcast_phase(c, static_cast<char*>(out), dt, jobs);
}

void tree_reduce(const Context& c, const void* in, void* out, std::size_t count, DataType dt, ReduceOp op, double scale,
                 const topology::TreeShape& tree) {
  const auto jobs = split_jobs(count, {&tree});
  // Interior ranks other than the root need somewhere for their partial sums: the caller's out is not theirs.
  char* acc = c.transport.rank() == tree.root
                  ? static_cast<char*>(out)
                  : static_cast<char*>(c.workspace.get(Scratch::kWork, count * dtype_size(dt) + 64));
  reduce_phase(c, static_cast<const char*>(in), acc, dt, op, scale, jobs);
}

void tree_broadcast(const Context& c, void* buf, std::size_t count, DataType dt, const topology::TreeShape& tree) {
  broadcast_phase(c, static_cast<char*>(buf), dt, split_jobs(count, {&tree}));
}

AlgorithmInfo tree_row() {
  AlgorithmInfo r;
  r.name = "tree";
  r.pipelined = true;
  r.aliases = {"double-tree"};
  r.collectives = {Collective::kAllreduce, Collective::kReduce, Collective::kBroadcast};
  r.summary = "double binary tree (each tree half the data), chunks pipelined up and down";
  r.estimate = [](const CostQuery& q) {
    const CostParams& m = *q.params;
    const double n = static_cast<double>(q.bytes), P = q.ranks, d = std::max(1, q.tree_depth);
    const double be = beta_for(m, n / P);
    switch (q.collective) {
      // Each half climbs and descends its tree; interior ranks move ~1.5x their half.
      case Collective::kAllreduce:
        return 2 * (d + 1) * alpha_for(m, std::min(kModelChunk, n / 2)) + 3 * n * be + n * m.gamma;
      case Collective::kBroadcast: return (d + 1) * m.alpha + 2 * n * be;
      case Collective::kReduce: return (d + 1) * m.alpha + 2 * n * be + n * m.gamma;
      default: return static_cast<double>(INFINITY);
    }
  };
  r.run = [](AlgorithmContext& a, const CollectiveCall& c) {
    const Context ctx = context_of(a);
    detail::PlanState& plan = *a.plan;
    switch (c.kind) {
      case Collective::kAllreduce: {
        std::vector<const topology::TreeShape*> trees{&plan.tree_a};
        if (plan.two_trees && c.count >= 2) trees.push_back(&plan.tree_b);
        return tree_allreduce(ctx, c.in, c.out, c.count, c.dt, c.op, c.scale, trees);
      }
      case Collective::kReduce:
        return tree_reduce(ctx, c.in, c.out, c.count, c.dt, c.op, c.scale, plan.rooted_tree(c.root));
      default: return tree_broadcast(ctx, c.out, c.count, c.dt, plan.rooted_tree(c.root));
    }
  };
  return r;
}

}  // namespace hopwise::comm::algo
