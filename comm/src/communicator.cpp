#include "hopwise/comm/communicator.h"

#include <fmt/core.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "algorithms/algorithm.h"
#include "hopwise/comm/mpi_transport.h"
#include "hopwise/comm/topology_exchange.h"
#include "hopwise/compression/codec.h"
#include "hopwise/compression/powersgd.h"
#include "hopwise/topology/formats.h"
#include "hopwise/topology/planner.h"
#include "hopwise/common/env.h"
#include "hopwise/common/error.h"
#include "hopwise/common/log.h"
#include "hopwise/common/reduce.h"
#include "collective_check.h"
#include "group_transport.h"
#include "workspace.h"

namespace hopwise::comm {

Options Options::from_env() {
  Options o;
  o.algorithm = parse_algorithm(env::get_or("HOPWISE_ALGO", "auto"));
  o.timeout_s = env::get_double("HOPWISE_TIMEOUT_S", o.timeout_s);
  if (!(o.timeout_s > 0)) throw InvalidArgument("HOPWISE_TIMEOUT_S must be a positive number of seconds");
  if (auto v = env::get("HOPWISE_CHUNK_BYTES")) o.chunk_bytes = env::parse_size(*v, "HOPWISE_CHUNK_BYTES");
  if (o.chunk_bytes < 64 || o.chunk_bytes > (1u << 30))
    throw InvalidArgument("HOPWISE_CHUNK_BYTES must be between 64 and 1G");
  o.calibrate = env::get_int("HOPWISE_CALIBRATE", 1) != 0;
  o.check = env::list_contains("HOPWISE_DEBUG", "CHECK");
  o.emulate_gbps = env::get_double("HOPWISE_EMULATE_GBPS", 0);
  o.discover_topology = env::get_int("HOPWISE_TOPO_DISCOVERY", 1) != 0;
  if (o.emulate_gbps < 0) throw InvalidArgument("HOPWISE_EMULATE_GBPS must be a link speed in Gbit/s (0 = off)");
  return o;
}

namespace {

// One call, as queued: its arguments and the Work it completes.
struct Task {
  Collective kind;
  const void* in = nullptr;
  void* out = nullptr;
  std::size_t count = 0;
  DataType dt = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  std::shared_ptr<Work::State> state;
  // A compressed allreduce: the codec and its per-tensor state (kind is kAllreduce, dt float32).
  const compression::Codec* codec = nullptr;
  compression::CodecState* codec_state = nullptr;
  // A PowerSGD allreduce over several matrices (kind kAllreduce, dt float32, count = all their elements).
  const compression::PowerSgd* powersgd = nullptr;
  std::vector<PowerSgdTensor> matrices;
};

}  // namespace

struct Communicator::Impl {
  std::unique_ptr<Transport> transport;
  Options options;
  Workspace workspace;
  CostModel cost;
  std::vector<int> ring;
  std::string plan_text;                     // the planner's description of the plan in use; empty for rank order
  std::optional<topology::Cluster> cluster;  // what discovery found
  std::vector<int> host_of;                  // per rank, from the plan (empty: all on one host)
  // Rings run side by side by a large allreduce (channels[0] is `ring`), and a workspace for each extra one.
  std::vector<std::vector<int>> channels;
  std::vector<std::unique_ptr<Workspace>> channel_workspaces;
  // Hierarchical allreduce: this rank's host group (ring order) and, on each host's first rank, the leaders.
  std::unique_ptr<GroupTransport> host_group, leader_group;
  topology::TreeShape host_tree;  // binary tree over host_group's ranks, rooted at the leader
  topology::TreeShape tree_a, tree_b;
  bool two_trees = true;
  int tree_depth = 1;  // of tree_a, cached for the cost model
  std::atomic<Algorithm> forced{Algorithm::kAuto};
  CollectiveCheck check;  // options.check: every rank's call compared before it runs

  std::mutex mutex;
  std::condition_variable cv;
  std::deque<Task> queue;
  bool busy = false, stopping = false;
  std::string broken;  // the first error: later calls fail fast instead of joining a half-finished exchange
  CollectiveStats stats;
  std::thread progress;

  int p() const { return transport->size(); }
  algo::Context context() { return {*transport, workspace, options.chunk_bytes}; }

  std::string describe(const Task& t, Algorithm a) const {
    std::string s = fmt::format("{}(count={}, dtype={}", to_string(t.kind), t.count, to_string(t.dt));
    if (t.kind == Collective::kAllreduce || t.kind == Collective::kReduceScatter || t.kind == Collective::kReduce)
      s += fmt::format(", op={}", to_string(t.op));
    if (t.kind == Collective::kBroadcast || t.kind == Collective::kReduce) s += fmt::format(", root={}", t.root);
    if (t.codec != nullptr) s += fmt::format(", codec={}", t.codec->name());
    if (t.powersgd != nullptr) s += fmt::format(", codec={}, matrices={}", t.powersgd->name(), t.matrices.size());
    s += fmt::format(", algo={}", to_string(a));
    return s + fmt::format(", ranks={})", p());
  }

  // Seconds the bytes each rank sends in `t` would take on the emulated link (bandwidth-optimal algorithms).
  double wire_seconds(const Task& t) const {
    const double n = static_cast<double>(t.count * dtype_size(t.dt)), P = p();
    double bytes = 0;
    switch (t.kind) {
      case Collective::kAllreduce: bytes = 2 * (P - 1) / P * n; break;
      case Collective::kReduceScatter:
      case Collective::kAllgather: bytes = (P - 1) * n; break;
      case Collective::kBroadcast:
      case Collective::kReduce: bytes = n; break;
      default: break;
    }
    return bytes * 8 / (options.emulate_gbps * 1e9);
  }

  Algorithm choose(Collective c, std::size_t bytes) const {
    const Algorithm f = forced.load();
    const bool has_native = transport->native() != nullptr;
    if (f != Algorithm::kAuto && implements(f, c) && (f != Algorithm::kNative || has_native)) return f;
    return cost.choose(c, bytes, p(), tree_depth, has_native);
  }

  // Runs one task; returns its error (naming rank, collective, sizes and algorithm), or null.
  std::exception_ptr execute(Task& t) {
    const Algorithm a = choose(t.kind, t.count * dtype_size(t.dt));
    try {
      if (!broken.empty())
        throw Error(fmt::format("communicator is unusable after an earlier error ({}); create a new one", broken));
      if (options.check) {
        // The compression is part of the call: a PowerSGD allreduce against a plain one of the same count differs.
        const std::string compression = t.codec ? t.codec->name() : t.powersgd ? t.powersgd->name() : std::string();
        check.verify(*transport, {t.kind, t.count, t.dt, t.op, t.root, a, compression});
      }
      const auto start = std::chrono::steady_clock::now();
      run(t, a);
      if (options.emulate_gbps > 0)
        std::this_thread::sleep_until(start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                  std::chrono::duration<double>(wire_seconds(t))));
      return nullptr;
    } catch (const std::exception& e) {
      const std::string text = fmt::format("hopwise: rank {}: {} failed: {}", transport->rank(), describe(t, a), e.what());
      if (broken.empty()) broken = e.what();
      // Past a failure inside an exchange a peer may be stopped or gone: never wait for it again, teardown included.
      if (!dynamic_cast<const InvalidArgument*>(&e)) transport->abandon();
      if (auto* te = dynamic_cast<const TimeoutError*>(&e)) {
        // Name the rank at fault, not only the neighbour this rank waited for: ask who else gave up.
        const double listen = std::min(1.0, options.timeout_s / 4);
        return std::make_exception_ptr(
            TimeoutError(text + explain_timeout(*transport, std::chrono::duration<double>(listen)), te->pending_ranks()));
      }
      if (dynamic_cast<const InvalidArgument*>(&e)) return std::make_exception_ptr(InvalidArgument(text));
      return std::make_exception_ptr(Error(text));
    }
  }

  static std::string what_of(const std::exception_ptr& e) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      return x.what();
    }
  }

  // Runs a plain collective right here (on the thread already executing a task: no queue).
  void run_nested(Collective kind, const void* in, void* out, std::size_t count, DataType dt, ReduceOp op) {
    Task n{kind, in, out, count, dt, op};
    run(n, choose(kind, count * dtype_size(dt)));
  }

  // Allreduce through a codec: agree on scales where the codec needs them, encode, move the payloads (allreduce
  // for aggregatable codecs, allgather for the rest), decode.
  void run_compressed(Task& t) {
    const compression::Codec& c = *t.codec;
    compression::CodecState& st = *t.codec_state;
    const std::size_t n = t.count;
    std::vector<float>& scales = scratch_scales;
    scales.assign(c.scale_count(n), 0.0f);
    if (!scales.empty()) {
      c.local_scales(static_cast<const float*>(t.in), n, scales.data(), st);
      run_nested(Collective::kAllreduce, scales.data(), scales.data(), scales.size(), DataType::kFloat32, ReduceOp::kMax);
      add_wire_bytes(scales.size() * sizeof(float));
    }
    const std::size_t bytes = c.payload_bytes(n);
    auto* payload = static_cast<std::byte*>(workspace.get(Scratch::kPayload, bytes + 64));
    c.encode(static_cast<const float*>(t.in), n, payload, st, scales.empty() ? nullptr : scales.data());
    float* out = static_cast<float*>(t.out);
    if (c.pattern() == compression::Pattern::kAggregatable) {
      run_nested(Collective::kAllreduce, payload, payload, c.payload_count(n), c.payload_dtype(), ReduceOp::kSum);
      c.decode(payload, n, out, st, scales.empty() ? nullptr : scales.data());
    } else {
      auto* all = static_cast<std::byte*>(workspace.get(Scratch::kGathered, bytes * static_cast<std::size_t>(p()) + 64));
      run_nested(Collective::kAllgather, payload, all, bytes, DataType::kUInt8, ReduceOp::kSum);
      std::fill(out, out + n, 0.0f);
      for (int r = 0; r < p(); ++r)
        c.decode_add(all + static_cast<std::size_t>(r) * bytes, n, out, st, scales.empty() ? nullptr : scales.data());
    }
    add_wire_bytes(bytes);
    if (t.op == ReduceOp::kAvg) scale_by(DataType::kFloat32, out, n, 1.0 / p());
  }
  std::vector<float> scratch_scales;
  void add_wire_bytes(std::size_t b) {
    std::lock_guard lock(mutex);
    stats.wire_bytes += b;
  }

  // PowerSGD: P = M Q for every compressed matrix into one buffer, allreduce; Q = M^T P^ likewise; decompress.
  // The rest (warm-up, 1-D, too small) packed into a third buffer and all-reduced as it is.
  void run_powersgd(Task& t) {
    const compression::PowerSgd& ps = *t.powersgd;
    // Decided once: skip() below moves a matrix out of its warm-up, which must not change this step's buffers.
    std::vector<const PowerSgdTensor*> comp, plain;
    std::size_t p_total = 0, q_total = 0, plain_total = 0;
    for (const auto& m : t.matrices) {
      if (ps.compressed_step(m.rows, m.cols, *m.state)) {
        comp.push_back(&m);
        p_total += ps.p_count(m.rows, m.cols);
        q_total += ps.q_count(m.rows, m.cols);
      } else {
        plain.push_back(&m);
        plain_total += m.rows * m.cols;
      }
    }
    if (plain_total > 0) {
      auto* buf = static_cast<float*>(workspace.get(Scratch::kGathered, plain_total * sizeof(float)));
      std::size_t at = 0;
      for (const auto* m : plain) {
        if (m->rows * m->cols > 0)  // an empty matrix's data() may be null: memcpy from null is undefined
          std::memcpy(buf + at, m->in, m->rows * m->cols * sizeof(float));
        at += m->rows * m->cols;
      }
      run_nested(Collective::kAllreduce, buf, buf, plain_total, DataType::kFloat32, ReduceOp::kSum);
      at = 0;
      for (const auto* m : plain) {
        if (m->rows * m->cols > 0) std::memcpy(m->out, buf + at, m->rows * m->cols * sizeof(float));
        at += m->rows * m->cols;
      }
      add_wire_bytes(plain_total * sizeof(float));
    }
    for (const auto* m : plain)
      if (ps.compresses(m->rows, m->cols)) ps.skip(*m->state);  // a warm-up step
    if (p_total > 0) {
      auto* pq = static_cast<float*>(workspace.get(Scratch::kPayload, (p_total + q_total) * sizeof(float)));
      float* pbuf = pq;
      float* qbuf = pq + p_total;
      std::size_t at = 0;
      for (const auto* m : comp) {
        ps.compute_p(m->in, m->rows, m->cols, pbuf + at, *m->state);
        at += ps.p_count(m->rows, m->cols);
      }
      run_nested(Collective::kAllreduce, pbuf, pbuf, p_total, DataType::kFloat32, ReduceOp::kSum);
      std::size_t pat = 0, qat = 0;
      for (const auto* m : comp) {
        ps.compute_q(pbuf + pat, m->rows, m->cols, qbuf + qat, *m->state);
        pat += ps.p_count(m->rows, m->cols);
        qat += ps.q_count(m->rows, m->cols);
      }
      run_nested(Collective::kAllreduce, qbuf, qbuf, q_total, DataType::kFloat32, ReduceOp::kSum);
      qat = 0;
      for (const auto* m : comp) {
        ps.decompress(qbuf + qat, m->rows, m->cols, m->out, *m->state);
        qat += ps.q_count(m->rows, m->cols);
      }
      add_wire_bytes((p_total + q_total) * sizeof(float));
    }
    if (t.op == ReduceOp::kAvg)
      for (const auto& m : t.matrices) scale_by(DataType::kFloat32, m.out, m.rows * m.cols, 1.0 / p());
  }

  void run(Task& t, Algorithm a) {
    if (t.codec != nullptr) return run_compressed(t);
    if (t.powersgd != nullptr) return run_powersgd(t);
    const int n = p();
    const std::size_t es = dtype_size(t.dt);
    const ReduceOp op = t.op == ReduceOp::kAvg ? ReduceOp::kSum : t.op;
    const double scale = t.op == ReduceOp::kAvg ? 1.0 / n : 1.0;
    const algo::Context ctx = context();
    NativeCollectives* nat = transport->native();
    auto copy = [](void* dst, const void* src, std::size_t bytes) {
      if (dst != src && bytes != 0) std::memmove(dst, src, bytes);
    };
    switch (t.kind) {
      case Collective::kAllreduce:
        if (n == 1 || t.count == 0) {
          copy(t.out, t.in, t.count * es);
          if (scale != 1.0) scale_by(t.dt, t.out, t.count, scale);
        } else if (a == Algorithm::kNative) {
          nat->allreduce(t.in, t.out, t.count, t.dt, op);
          if (scale != 1.0) scale_by(t.dt, t.out, t.count, scale);
        } else if (a == Algorithm::kSharedMemory &&
                   algo::shared_memory_allreduce(ctx, t.in, t.out, t.count, t.dt, op, scale)) {
          // done through the shared slots (ranks on other hosts fall through to the ring below)
        } else if (a == Algorithm::kHierarchical) {
          make_groups();
          const algo::Context local{*host_group, workspace, options.chunk_bytes};
          if (leader_group) {
            const algo::Context leaders{*leader_group, workspace, options.chunk_bytes};
            algo::hierarchical_allreduce(local, &leaders, host_tree, t.in, t.out, t.count, t.dt, op, scale);
          } else {
            algo::hierarchical_allreduce(local, nullptr, host_tree, t.in, t.out, t.count, t.dt, op, scale);
          }
        } else if (a == Algorithm::kDirect) {
          algo::direct_allreduce(ctx, t.in, t.out, t.count, t.dt, op, scale);
        } else if (a == Algorithm::kHalvingDoubling) {
          algo::halving_doubling_allreduce(ctx, t.in, t.out, t.count, t.dt, op, scale, ring);
        } else if (a == Algorithm::kTree) {
          std::vector<const topology::TreeShape*> trees{&tree_a};
          if (two_trees && t.count >= 2) trees.push_back(&tree_b);
          algo::tree_allreduce(ctx, t.in, t.out, t.count, t.dt, op, scale, trees);
        } else if (channels.size() > 1) {
          std::vector<Workspace*> extra;
          for (auto& w : channel_workspaces) extra.push_back(w.get());
          algo::ring_allreduce_channels(ctx, extra, t.in, t.out, t.count, t.dt, op, scale, channels);
        } else {
          algo::ring_allreduce(ctx, t.in, t.out, t.count, t.dt, op, scale, ring);
        }
        break;
      case Collective::kReduceScatter:
        if (n == 1 || t.count == 0) {
          copy(t.out, t.in, t.count * es);
          if (scale != 1.0) scale_by(t.dt, t.out, t.count, scale);
        } else if (a == Algorithm::kNative) {
          nat->reduce_scatter(t.in, t.out, t.count, t.dt, op);
          if (scale != 1.0) scale_by(t.dt, t.out, t.count, scale);
        } else {
          algo::ring_reduce_scatter(ctx, t.in, t.out, t.count, t.dt, op, scale, ring);
        }
        break;
      case Collective::kAllgather:
        if (n == 1 || t.count == 0) {
          copy(t.out, t.in, t.count * es);
        } else if (a == Algorithm::kNative) {
          const char* mine = static_cast<char*>(t.out) + static_cast<std::size_t>(transport->rank()) * t.count * es;
          nat->allgather(t.in == mine ? static_cast<const void*>(MPI_IN_PLACE) : t.in, t.out, t.count, t.dt);
        } else {
          algo::ring_allgather(ctx, t.in, t.out, t.count, t.dt, ring);
        }
        break;
      case Collective::kBroadcast:
        if (n == 1 || t.count == 0) break;
        if (a == Algorithm::kNative) nat->broadcast(t.out, t.count, t.dt, t.root);
        else algo::tree_broadcast(ctx, t.out, t.count, t.dt, rooted_tree(t.root));
        break;
      case Collective::kReduce:
        if (n == 1 || t.count == 0) {
          if (transport->rank() == t.root) {
            copy(t.out, t.in, t.count * es);
            if (scale != 1.0) scale_by(t.dt, t.out, t.count, scale);
          }
        } else if (a == Algorithm::kNative) {
          // MPI needs a receive buffer only at the root.
          nat->reduce(t.in, t.out, t.count, t.dt, op, t.root);
          if (scale != 1.0 && transport->rank() == t.root) scale_by(t.dt, t.out, t.count, scale);
        } else {
          algo::tree_reduce(ctx, t.in, t.out, t.count, t.dt, op, scale, rooted_tree(t.root));
        }
        break;
      case Collective::kBarrier:
        if (n == 1) break;
        if (a == Algorithm::kNative) nat->barrier();
        else algo::dissemination_barrier(ctx);
        break;
      default: throw Error("internal: point-to-point task on the collective path");
    }
  }

  // Groups for the hierarchical allreduce: the ranks of each host in ring order (the first is the host's leader),
  // and the leaders in ring order. Made on first use after the plan or the ring changed.
  void make_groups() {
    if (host_group) return;
    std::vector<int> mine, leaders;
    std::vector<int> seen_hosts;
    const int me = transport->rank();
    auto host = [&](int r) { return host_of.empty() ? 0 : host_of[static_cast<std::size_t>(r)]; };
    for (int r : ring) {
      if (host(r) == host(me)) mine.push_back(r);
      if (std::find(seen_hosts.begin(), seen_hosts.end(), host(r)) == seen_hosts.end()) {
        seen_hosts.push_back(host(r));
        leaders.push_back(r);
      }
    }
    host_group = std::make_unique<GroupTransport>(*transport, mine);
    host_tree = topology::binary_tree(topology::identity_ring(static_cast<int>(mine.size())));
    if (mine.front() == me) leader_group = std::make_unique<GroupTransport>(*transport, leaders);
  }

  // The planned tree when its root is `root`, else a binary tree over the ring order rotated to start there.
  topology::TreeShape rooted_tree_cache;
  const topology::TreeShape& rooted_tree(int root) {
    if (tree_a.root == root) return tree_a;
    if (rooted_tree_cache.root != root || rooted_tree_cache.parent.size() != static_cast<std::size_t>(p())) {
      std::vector<int> order(ring);
      std::rotate(order.begin(), order.begin() + algo::position_of(order, root), order.end());
      rooted_tree_cache = topology::binary_tree(order);
    }
    return rooted_tree_cache;
  }

  void progress_loop() {
    std::unique_lock lock(mutex);
    for (;;) {
      cv.wait(lock, [&] { return stopping || (!queue.empty() && !busy); });
      if (queue.empty()) return;  // stopping with nothing left
      Task t = std::move(queue.front());
      queue.pop_front();
      busy = true;
      lock.unlock();
      t.state->started = std::chrono::steady_clock::now();
      std::exception_ptr err = execute(t);
      lock.lock();
      busy = false;  // before finish(): whoever wait()s on this work may change the plan right away
      lock.unlock();
      t.state->finish(err, err ? what_of(err) : std::string());
      lock.lock();
      cv.notify_all();
    }
  }

  Work submit(Task t) {
    t.state = std::make_shared<Work::State>();
    Work w(t.state);
    std::lock_guard lock(mutex);
    ++stats.calls;
    stats.bytes += t.count * dtype_size(t.dt);
    queue.push_back(std::move(t));
    cv.notify_all();
    return w;
  }

  // A sync call: runs right here when nothing is queued (no hand-off to the progress thread, no allocation),
  // else queues behind the earlier async calls and waits.
  void run_sync(Task t) {
    std::unique_lock lock(mutex);
    if (!queue.empty() || busy) {
      lock.unlock();
      submit(std::move(t)).wait();
      return;
    }
    ++stats.calls;
    stats.bytes += t.count * dtype_size(t.dt);
    busy = true;
    lock.unlock();
    std::exception_ptr err = execute(t);
    lock.lock();
    busy = false;
    // Wake the progress thread only when it has something to do: a needless wake-up costs a context switch
    // (microseconds) on every small call.
    if (!queue.empty()) cv.notify_all();
    lock.unlock();
    if (err) std::rethrow_exception(err);
  }
};

namespace {

void require(bool ok, const std::string& what) {
  if (!ok) throw InvalidArgument(what);
}

}  // namespace

Communicator::Communicator(MPI_Comm comm, Options options)
    : Communicator([&] {
        ensure_mpi_initialized();
        return std::unique_ptr<Transport>(std::make_unique<MpiTransport>(comm));
      }(),
                   options) {}

Communicator::Communicator(std::unique_ptr<Transport> transport, Options options) : impl_(std::make_unique<Impl>()) {
  require(transport != nullptr, "Communicator needs a transport; pass MpiTransport or InProcessTransport");
  impl_->transport = std::move(transport);
  impl_->options = options;
  impl_->transport->set_timeout(std::chrono::duration<double>(options.timeout_s));
  impl_->forced = options.algorithm;
  set_ring_order(topology::identity_ring(size()));
  plan_topology(options);
  if (options.calibrate) impl_->cost = CostModel(calibrate(*impl_->transport, impl_->workspace));
  log::info("rank {}: {} ranks over {}, cost model {} (alpha {:.2f} us, {:.2f} GB/s, reduce {:.2f} GB/s)", rank(),
            size(), impl_->transport->name(), impl_->cost.params().source, impl_->cost.params().alpha * 1e6,
            1e-9 / impl_->cost.params().beta, 1e-9 / impl_->cost.params().gamma);
  impl_->progress = std::thread([this] { impl_->progress_loop(); });
}

Communicator::~Communicator() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  if (impl_->progress.joinable()) impl_->progress.join();
}

int Communicator::rank() const { return impl_->transport->rank(); }
int Communicator::size() const { return impl_->transport->size(); }
int Communicator::local_rank() const { return impl_->transport->local_rank(); }
int Communicator::local_size() const { return impl_->transport->local_size(); }
int Communicator::host_id() const { return impl_->transport->host_id(); }
Transport& Communicator::transport() { return *impl_->transport; }
const std::vector<int>& Communicator::ring_order() const { return impl_->ring; }
const std::string& Communicator::plan_description() const { return impl_->plan_text; }
const topology::Cluster* Communicator::cluster() const { return impl_->cluster ? &*impl_->cluster : nullptr; }

// HOPWISE_TOPO_FILE stands in for discovery: plan on the machine that file describes (ranks round-robin on its
// devices). Otherwise, with discovery on, plan on the job's cluster as every rank saw it. HOPWISE_TOPO_DUMP_FILE
// (rank 0) writes the topology the plan was made on.
void Communicator::plan_topology(const Options& options) {
  topology::Topology topo;
  topology::Plan plan;
  std::string from;
  if (auto path = env::get("HOPWISE_TOPO_FILE")) {
    topo = topology::load_topology(*path);
    plan = topology::plan_collectives(topo, topology::place_ranks(topo, size()));
    from = "HOPWISE_TOPO_FILE=" + *path;
  } else if (options.discover_topology) {
    impl_->cluster = gather_cluster(*this);
    plan = topology::plan_collectives(impl_->cluster->topology, impl_->cluster->placement);
    from = fmt::format("discovery ({})", impl_->cluster->topology.source_name);
  } else {
    return;
  }
  if (plan.channels.size() > 1)
    set_ring_channels(plan.channels);  // channels[0] is plan.ring
  else
    set_ring_order(plan.ring);
  if (size() > 1) set_trees(plan.trees.first, plan.trees.second);
  impl_->host_of.clear();
  for (const auto& r : plan.placement) impl_->host_of.push_back(r.host);
  impl_->plan_text = fmt::format("from {}\n{}", from, plan.describe());
  // Uncalibrated across hosts, the built-in figures (measured within one machine) are far too fast for the
  // network: the plan's bottleneck bandwidth and worst latency bound them.
  if (!options.calibrate && plan.hosts > 1 && plan.ring_score.bottleneck_gbps > 0) {
    CostParams p = CostParams::defaults();
    p.alpha = std::max(p.alpha, plan.ring_score.max_latency_us * 1e-6);
    p.beta = std::max(p.beta, 1e-9 / plan.ring_score.bottleneck_gbps);
    p.source = "defaults bounded by the plan";
    impl_->cost = CostModel(p);
  }
  if (auto dump = env::get("HOPWISE_TOPO_DUMP_FILE"); dump && rank() == 0)
    dump_topology(impl_->cluster ? impl_->cluster->topology : topo, *dump);
}
const CostModel& Communicator::cost_model() const { return impl_->cost; }
void Communicator::set_algorithm(Algorithm a) { impl_->forced = a; }

CollectiveStats Communicator::stats() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->stats;
}

Algorithm Communicator::algorithm_for(Collective c, std::size_t bytes) const { return impl_->choose(c, bytes); }

void Communicator::set_ring_order(std::vector<int> order) {
  topology::validate_ring(order, size());
  std::lock_guard lock(impl_->mutex);
  require(impl_->queue.empty() && !impl_->busy, "set_ring_order while collectives are in flight; wait for them first");
  impl_->ring = std::move(order);
  impl_->channels.clear();    // one ring until set_ring_channels
  impl_->host_group.reset();  // the hierarchical groups follow the ring
  impl_->leader_group.reset();
  const auto trees = topology::double_binary_tree(impl_->ring);
  impl_->tree_a = trees.first;
  impl_->tree_b = trees.second;
  impl_->tree_depth = impl_->tree_a.depth();
  impl_->two_trees = true;
}

void Communicator::set_ring_channels(std::vector<std::vector<int>> rings) {
  require(!rings.empty(), "set_ring_channels needs at least one ring; pass {ring} for one channel");
  for (const auto& r : rings) topology::validate_ring(r, size());
  set_ring_order(rings.front());
  std::lock_guard lock(impl_->mutex);
  if (rings.size() > 1) {
    impl_->channels = std::move(rings);
    while (impl_->channel_workspaces.size() + 1 < impl_->channels.size())
      impl_->channel_workspaces.push_back(std::make_unique<Workspace>());
  }
}

const std::vector<std::vector<int>>& Communicator::ring_channels() const { return impl_->channels; }

void Communicator::set_trees(topology::TreeShape first, std::optional<topology::TreeShape> second) {
  topology::validate_tree(first, size());
  if (second) {
    topology::validate_tree(*second, size());
    require(second->root != first.root || size() == 1,
            "the two trees of a double tree need different roots, or the root does all the work twice");
  }
  std::lock_guard lock(impl_->mutex);
  require(impl_->queue.empty() && !impl_->busy, "set_trees while collectives are in flight; wait for them first");
  impl_->tree_a = std::move(first);
  impl_->tree_depth = impl_->tree_a.depth();
  impl_->two_trees = second.has_value();
  if (second) impl_->tree_b = std::move(*second);
}

// ---- argument checks, shared by sync and async calls ----
namespace {

void check_buffers(const char* what, const void* in, std::size_t in_count, const void* out, std::size_t out_count,
                   DataType dt, int rank) {
  checked_bytes(std::max(in_count, out_count), dt, what);
  if (in_count > 0 && in == nullptr)
    throw InvalidArgument(fmt::format("{} on rank {}: input buffer is null but count is {}; pass a buffer of {} "
                                      "elements of {}",
                                      what, rank, in_count, in_count, to_string(dt)));
  if (out_count > 0 && out == nullptr)
    throw InvalidArgument(fmt::format("{} on rank {}: output buffer is null but count is {}; pass a buffer of {} "
                                      "elements of {}",
                                      what, rank, out_count, out_count, to_string(dt)));
}

void check_root(const char* what, int root, int size) {
  if (root < 0 || root >= size)
    throw InvalidArgument(fmt::format("{}: root {} is out of range; use a rank in 0..{}", what, root, size - 1));
}

}  // namespace

static Task allreduce_task(int rank, int size, const void* in, void* out, std::size_t count, DataType dt, ReduceOp op) {
  check_op_supported(dt, op);
  check_buffers("allreduce", in, count, out, count, dt, rank);
  return Task{Collective::kAllreduce, in, out, count, dt, op};
}

static Task reduce_scatter_task(int rank, int size, const void* in, void* out, std::size_t recvcount, DataType dt, ReduceOp op) {
  check_op_supported(dt, op);
  if (recvcount > 0 && recvcount > std::numeric_limits<std::size_t>::max() / 16 / static_cast<std::size_t>(size))
    throw InvalidArgument(fmt::format("reduce_scatter: recvcount {} times {} ranks overflows", recvcount, size));
  check_buffers("reduce_scatter", in, recvcount * static_cast<std::size_t>(size), out, recvcount, dt, rank);
  return Task{Collective::kReduceScatter, in, out, recvcount, dt, op};
}

static Task allgather_task(int rank, int size, const void* in, void* out, std::size_t sendcount, DataType dt) {
  if (sendcount > 0 && sendcount > std::numeric_limits<std::size_t>::max() / 16 / static_cast<std::size_t>(size))
    throw InvalidArgument(fmt::format("allgather: sendcount {} times {} ranks overflows", sendcount, size));
  check_buffers("allgather", in, sendcount, out, sendcount * static_cast<std::size_t>(size), dt, rank);
  return Task{Collective::kAllgather, in, out, sendcount, dt};
}

static Task broadcast_task(int rank, int size, void* buf, std::size_t count, DataType dt, int root) {
  check_root("broadcast", root, size);
  check_buffers("broadcast", buf, count, buf, count, dt, rank);
  Task t{Collective::kBroadcast, buf, buf, count, dt};
  t.root = root;
  return t;
}

static Task reduce_task(int rank, int size, const void* in, void* out, std::size_t count, DataType dt, ReduceOp op, int root) {
  check_op_supported(dt, op);
  check_root("reduce", root, size);
  check_buffers("reduce", in, count, out, rank == root ? count : 0, dt, rank);
  Task t{Collective::kReduce, in, out, count, dt, op};
  t.root = root;
  return t;
}


Work Communicator::allreduce_async(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op) {
  return impl_->submit(allreduce_task(rank(), size(), in, out, count, dt, op));
}
Work Communicator::reduce_scatter_async(const void* in, void* out, std::size_t recvcount, DataType dt, ReduceOp op) {
  return impl_->submit(reduce_scatter_task(rank(), size(), in, out, recvcount, dt, op));
}
Work Communicator::allgather_async(const void* in, void* out, std::size_t sendcount, DataType dt) {
  return impl_->submit(allgather_task(rank(), size(), in, out, sendcount, dt));
}
Work Communicator::broadcast_async(void* buf, std::size_t count, DataType dt, int root) {
  return impl_->submit(broadcast_task(rank(), size(), buf, count, dt, root));
}
Work Communicator::reduce_async(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op, int root) {
  return impl_->submit(reduce_task(rank(), size(), in, out, count, dt, op, root));
}

static Task compressed_task(int rank, const float* in, float* out, std::size_t count,
                            const compression::Codec& codec, compression::CodecState& state, ReduceOp op) {
  if (op != ReduceOp::kSum && op != ReduceOp::kAvg)
    throw InvalidArgument(fmt::format("allreduce_compressed: op {} is not available; codecs sum (use sum or avg)",
                                      to_string(op)));
  check_buffers("allreduce_compressed", in, count, out, count, DataType::kFloat32, rank);
  Task t{Collective::kAllreduce, in, out, count, DataType::kFloat32, op};
  t.codec = &codec;
  t.codec_state = &state;
  return t;
}

Work Communicator::allreduce_compressed_async(const float* in, float* out, std::size_t count,
                                              const compression::Codec& codec, compression::CodecState& state,
                                              ReduceOp op) {
  return impl_->submit(compressed_task(rank(), in, out, count, codec, state, op));
}

void Communicator::allreduce_compressed(const float* in, float* out, std::size_t count,
                                        const compression::Codec& codec, compression::CodecState& state, ReduceOp op) {
  impl_->run_sync(compressed_task(rank(), in, out, count, codec, state, op));
}

static Task powersgd_task(int rank, std::span<const PowerSgdTensor> tensors, const compression::PowerSgd& ps,
                          ReduceOp op) {
  if (op != ReduceOp::kSum && op != ReduceOp::kAvg)
    throw InvalidArgument(fmt::format("allreduce_powersgd: op {} is not available; PowerSGD sums (use sum or avg)",
                                      to_string(op)));
  Task t{Collective::kAllreduce, nullptr, nullptr, 0, DataType::kFloat32, op};
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const PowerSgdTensor& m = tensors[i];
    const std::size_t n = m.rows * m.cols;
    if (m.state == nullptr)
      throw InvalidArgument(fmt::format("allreduce_powersgd: matrix {} ({} x {}) on rank {} has no state; keep one "
                                        "compression::PowerSgdState per matrix across steps",
                                        i, m.rows, m.cols, rank));
    check_buffers(fmt::format("allreduce_powersgd (matrix {})", i).c_str(), m.in, n, m.out, n, DataType::kFloat32,
                  rank);
    t.count += n;
  }
  t.powersgd = &ps;
  t.matrices.assign(tensors.begin(), tensors.end());
  return t;
}

Work Communicator::allreduce_powersgd_async(std::span<const PowerSgdTensor> tensors, const compression::PowerSgd& ps,
                                            ReduceOp op) {
  return impl_->submit(powersgd_task(rank(), tensors, ps, op));
}

void Communicator::allreduce_powersgd(std::span<const PowerSgdTensor> tensors, const compression::PowerSgd& ps,
                                      ReduceOp op) {
  impl_->run_sync(powersgd_task(rank(), tensors, ps, op));
}

Work Communicator::barrier_async() { return impl_->submit({Collective::kBarrier}); }

// Point-to-point goes straight to the transport (no queue), so that a send and a receive posted back to back on
// two ranks can never wait on each other through the progress threads.
namespace {

Work post_p2p(Transport& t, Request r, std::string what) {
  auto state = std::make_shared<Work::State>();
  auto req = std::make_shared<Request>(r);
  state->drive = [&t, req, weak = std::weak_ptr<Work::State>(state), what](bool block) {
    auto s = weak.lock();
    if (!s) return true;
    {
      std::lock_guard lock(s->mutex);
      if (s->done) return true;
    }
    try {
      if (block) t.wait(*req);
      else if (!t.test(*req)) return false;
      s->finish(nullptr, {});
    } catch (const std::exception& e) {
      if (!dynamic_cast<const InvalidArgument*>(&e)) t.abandon();
      s->finish(std::make_exception_ptr(Error(fmt::format("hopwise: rank {}: {} failed: {}", t.rank(), what, e.what()))),
                e.what());
    }
    return true;
  };
  return Work(state);
}

void check_peer(const char* what, int peer, int tag, int size) {
  if (peer < 0 || peer >= size)
    throw InvalidArgument(fmt::format("{}: peer {} is out of range; use a rank in 0..{}", what, peer, size - 1));
  if (tag < 0 || tag >= algo::kFirstInternalTag)
    throw InvalidArgument(fmt::format("{}: tag {} is out of range; use 0..{} (higher tags are hopwise's own)", what,
                                      tag, algo::kFirstInternalTag - 1));
}

}  // namespace

Work Communicator::send_async(const void* buf, std::size_t count, DataType dt, int peer, int tag) {
  check_peer("send", peer, tag, size());
  check_buffers("send", buf, count, buf, 0, dt, rank());
  const std::size_t bytes = count * dtype_size(dt);
  return post_p2p(*impl_->transport, impl_->transport->isend(buf, bytes, peer, tag),
                  fmt::format("send(count={}, dtype={}, peer={}, tag={})", count, to_string(dt), peer, tag));
}

Work Communicator::recv_async(void* buf, std::size_t count, DataType dt, int peer, int tag) {
  check_peer("recv", peer, tag, size());
  check_buffers("recv", buf, 0, buf, count, dt, rank());
  const std::size_t bytes = count * dtype_size(dt);
  return post_p2p(*impl_->transport, impl_->transport->irecv(buf, bytes, peer, tag),
                  fmt::format("recv(count={}, dtype={}, peer={}, tag={})", count, to_string(dt), peer, tag));
}

// ---- sync forms: the same checks, run inline when the queue is idle ----
void Communicator::allreduce(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op) {
  impl_->run_sync(allreduce_task(rank(), size(), in, out, count, dt, op));
}
void Communicator::reduce_scatter(const void* in, void* out, std::size_t recvcount, DataType dt, ReduceOp op) {
  impl_->run_sync(reduce_scatter_task(rank(), size(), in, out, recvcount, dt, op));
}
void Communicator::allgather(const void* in, void* out, std::size_t sendcount, DataType dt) {
  impl_->run_sync(allgather_task(rank(), size(), in, out, sendcount, dt));
}
void Communicator::broadcast(void* buf, std::size_t count, DataType dt, int root) {
  impl_->run_sync(broadcast_task(rank(), size(), buf, count, dt, root));
}
void Communicator::reduce(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op, int root) {
  impl_->run_sync(reduce_task(rank(), size(), in, out, count, dt, op, root));
}
void Communicator::barrier() { impl_->run_sync({Collective::kBarrier}); }
void Communicator::send(const void* buf, std::size_t count, DataType dt, int peer, int tag) {
  send_async(buf, count, dt, peer, tag).wait();
}
void Communicator::recv(void* buf, std::size_t count, DataType dt, int peer, int tag) {
  recv_async(buf, count, dt, peer, tag).wait();
}

}  // namespace hopwise::comm
