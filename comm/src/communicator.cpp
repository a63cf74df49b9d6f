// The host Communicator's public face: construction (transport, options, plan, calibration), the argument checks
// that turn each call into a Task, point-to-point, and the plan setters. The queue is progress.cpp, the dispatch
// dispatch.cpp, the composite calls compressed/.
#include "hopwise/comm/communicator.h"

#include <fmt/core.h>

#include <algorithm>
#include <ctime>
#include <map>
#include <mutex>

#include "algorithms/algorithms.h"
#include "call_checks.h"
#include "communicator_impl.h"
#include "hopwise/comm/launch.h"
#include "hopwise/comm/topology_exchange.h"
#include "hopwise/common/env.h"
#include "hopwise/common/error.h"
#include "hopwise/common/log.h"
#include "hopwise/topology/formats.h"
#include "hopwise/topology/planner.h"

namespace hopwise::comm {

double Options::timeout_from_env() {
  const double t = env::get_double("HOPWISE_TIMEOUT_S", Options{}.timeout_s);
  if (!(t > 0)) throw InvalidArgument("HOPWISE_TIMEOUT_S must be a positive number of seconds");
  return t;
}

Options Options::from_env() {
  Options o;
  o.algorithm = parse_algorithm(env::get_or("HOPWISE_ALGO", "auto"));
  o.timeout_s = timeout_from_env();
  if (auto v = env::get("HOPWISE_CHUNK_BYTES")) o.chunk_bytes = env::parse_size(*v, "HOPWISE_CHUNK_BYTES");
  if (o.chunk_bytes < 64 || o.chunk_bytes > (1u << 30))
    throw InvalidArgument("HOPWISE_CHUNK_BYTES must be between 64 and 1G");
  o.calibrate = env::get_int("HOPWISE_CALIBRATE", 1) != 0;
  o.check = env::list_contains("HOPWISE_DEBUG", "CHECK");
  const long long stamp = env::get_int("HOPWISE_CALL_CHECK", 1);
  if (stamp != 0 && stamp != 1)
    throw InvalidArgument("HOPWISE_CALL_CHECK must be 1 (compare the ranks' calls as they run) or 0 (off)");
  o.stamp_calls = stamp == 1;
  o.emulate_gbps = env::get_double("HOPWISE_EMULATE_GBPS", 0);
  o.discover_topology = env::get_int("HOPWISE_TOPO_DISCOVERY", 1) != 0;
  if (o.emulate_gbps < 0) throw InvalidArgument("HOPWISE_EMULATE_GBPS must be a link speed in Gbit/s (0 = off)");
  const long long tune = env::get_int("HOPWISE_TUNE", 1);
  if (tune != 0 && tune != 1)
    throw InvalidArgument("HOPWISE_TUNE must be 1 (measure the candidates) or 0 (cost model)");
  o.tune = tune == 1;
  o.tune_rounds = static_cast<int>(env::get_int("HOPWISE_TUNE_ROUNDS", o.tune_rounds));
  if (o.tune_rounds < 1 || o.tune_rounds > 100)
    throw InvalidArgument("HOPWISE_TUNE_ROUNDS must be between 1 and 100 (repetitions of each candidate)");
  o.tuning_file = env::get_or("HOPWISE_TUNING_FILE", "");
  o.ring_window = static_cast<int>(env::get_int("HOPWISE_RING_WINDOW", -1));
  if (o.ring_window < -1)
    throw InvalidArgument("HOPWISE_RING_WINDOW must be -1 (by the plan), 0 (no limit) or a count");
  return o;
}

namespace {

void require(bool ok, const std::string& what) {
  if (!ok) throw InvalidArgument(what);
}

}  // namespace

Communicator::Communicator(Options options)
    : Communicator(make_world_transport(detect_launch(), Store::Seconds(options.timeout_s)), options) {}

Communicator::Communicator(std::unique_ptr<Transport> transport, Options options)
    : impl_(std::make_unique<detail::CommunicatorImpl>()) {
  require(transport != nullptr, "Communicator needs a transport; pass MpiTransport or InProcessTransport");
  impl_->transport = std::move(transport);
  impl_->options = options;
  impl_->transport->set_timeout(std::chrono::duration<double>(options.timeout_s));
  impl_->forced = options.algorithm;
  set_ring_order(topology::identity_ring(size()));
  plan_topology(options);
  if (options.calibrate) impl_->cost = CostModel(calibrate(*impl_->transport, impl_->workspace));
  start_tuner(options);
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
  // Every queued call has finished and posted its callbacks: run them before the transport goes.
  if (!impl_->completions->on_this_thread()) impl_->completions->shutdown();
}

int Communicator::rank() const { return impl_->transport->rank(); }
int Communicator::size() const { return impl_->transport->size(); }
int Communicator::local_rank() const { return impl_->transport->local_rank(); }
int Communicator::local_size() const { return impl_->transport->local_size(); }
int Communicator::host_id() const { return impl_->transport->host_id(); }
Transport& Communicator::transport() { return *impl_->transport; }
const std::vector<int>& Communicator::ring_order() const { return impl_->plan.ring; }
const std::string& Communicator::plan_description() const { return impl_->plan.text; }
const topology::Cluster* Communicator::cluster() const { return impl_->plan.cluster ? &*impl_->plan.cluster : nullptr; }

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
    impl_->plan.cluster = gather_cluster(*this);
    plan = topology::plan_collectives(impl_->plan.cluster->topology, impl_->plan.cluster->placement);
    from = fmt::format("discovery ({})", impl_->plan.cluster->topology.source_name);
  } else {
    return;
  }
  if (plan.channels.size() > 1)
    set_ring_channels(plan.channels);  // channels[0] is plan.ring
  else
    set_ring_order(plan.ring);
  if (size() > 1) set_trees(plan.trees.first, plan.trees.second);
  std::vector<int> hosts;
  for (const auto& r : plan.placement) hosts.push_back(r.host);
  impl_->plan.set_hosts(std::move(hosts));
  impl_->plan.text = fmt::format("from {}\n{}", from, plan.describe());
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
    dump_topology(impl_->plan.cluster ? impl_->plan.cluster->topology : topo, *dump);
}

namespace {

// FNV-1a over the entries as text: the ranks compare it at the first call.
std::uint64_t fingerprint(const std::vector<TuningEntry>& entries) {
  std::uint64_t h = 1469598103934665603ull;
  for (const TuningEntry& e : entries)
    for (char ch :
         fmt::format("{}|{}|{}|{};", to_string(e.collective), e.dtype_class, e.size_class, to_string(e.choice))) {
      h ^= static_cast<unsigned char>(ch);
      h *= 1099511628211ull;
    }
  return h & ((std::uint64_t{1} << 48) - 1);
}

}  // namespace

void Communicator::start_tuner(const Options& options) {
  if (!options.tune && options.tuning_file.empty()) return;
  detail::TunerSettings s;
  s.online = options.tune;
  s.rounds = options.tune_rounds;
  impl_->tuner = std::make_unique<detail::Tuner>(s);
  if (options.tuning_file.empty()) return;
  TuningFile f = read_tuning_file(options.tuning_file, true);  // a malformed file is an error
  std::string why = shape_mismatch(f.job, job_shape());
  // Another transport's timings do not carry over (and MPI's native collectives exist only over MPI).
  if (!f.transport.empty() && f.transport != transport().name())
    why += fmt::format("{}transport {} (this job {})", why.empty() ? "" : ", ", f.transport, transport().name());
  if (!why.empty()) {
    if (rank() == 0)
      log::warn(
          "HOPWISE_TUNING_FILE {} was made for {}, this job is {} ({}): ignored; run hopwise-tune "
          "for this shape",
          options.tuning_file, to_string(f.job), to_string(job_shape()), why);
    impl_->tuner->preset({}, 0);
    return;
  }
  f = read_tuning_file(options.tuning_file);  // the entries, now that the file fits this job
  impl_->tuner->preset(f.entries, fingerprint(f.entries));
  log::info("rank {}: {} tuned classes from {} (made {} on {})", rank(), f.entries.size(), options.tuning_file,
            f.created, f.machine);
}

JobShape Communicator::job_shape() const {
  JobShape s;
  s.ranks = size();
  const auto& host_of = impl_->plan.host_of;
  if (!host_of.empty()) {
    s.hosts = impl_->plan.hosts();
    std::map<int, int> per_host;
    for (int h : host_of) ++per_host[h];
    for (const auto& [h, n] : per_host) s.ranks_per_host = std::max(s.ranks_per_host, n);
  } else {
    s.ranks_per_host = std::max(1, local_size());
    s.hosts = (size() + s.ranks_per_host - 1) / s.ranks_per_host;
  }
  return s;
}

TuningFile Communicator::tuning() const {
  TuningFile f;
  f.job = job_shape();
  f.transport = std::string(impl_->transport->name());
  f.version = hopwise_version();
  f.machine = describe_machine();
  const std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  f.created = buf;
  if (impl_->tuner) f.entries = impl_->tuner->entries();
  return f;
}

bool Communicator::tunes_online() const { return impl_->tuner && impl_->tuner->settings().online; }

std::optional<TuningChoice> Communicator::tuned_choice(Collective c, std::size_t bytes, DataType dt) const {
  if (!impl_->tuner) return std::nullopt;
  return impl_->tuner->decided({c, dtype_class_of(dt), size_class_of(bytes)});
}

std::vector<TuningChoice> Communicator::tuning_alternatives(Collective c, std::size_t bytes, DataType dt,
                                                            double within) const {
  std::vector<TuningChoice> out;
  if (!impl_->tuner) return out;
  const detail::TuneKey key{c, dtype_class_of(dt), size_class_of(bytes)};
  const auto tuned = impl_->tuner->decided(key);
  if (!tuned) return out;
  const auto ranked = impl_->tuner->ranked(key);
  double tuned_s = 0;
  for (const auto& [choice, t] : ranked)
    if (choice == *tuned) tuned_s = t;
  const TuningChoice model{impl_->model_choice(c, bytes), 0, 0};
  bool model_measured = false;
  for (const auto& [choice, t] : ranked) {
    model_measured = model_measured || choice == model;
    if (!(choice == *tuned) && (tuned_s == 0 || t <= within * tuned_s)) out.push_back(choice);
  }
  if (!model_measured && !(model == *tuned)) out.push_back(model);
  return out;
}

void Communicator::pin_choice(Collective c, std::size_t bytes, DataType dt, const TuningChoice& choice) {
  if (!impl_->tuner) throw InvalidArgument("pin_choice() needs the tuner (HOPWISE_TUNE=1 or a tuning file)");
  if (!implements(choice.algorithm, c))
    throw InvalidArgument(fmt::format("pin_choice(): {} does not implement {}", to_string(choice), to_string(c)));
  impl_->tuner->pin({c, dtype_class_of(dt), size_class_of(bytes)}, choice);
}

const CostModel& Communicator::cost_model() const { return impl_->cost; }
void Communicator::set_algorithm(Algorithm a) {
  if (a != Algorithm::kAuto) algorithm_info(a);  // throws for an id outside the table
  impl_->forced = a;
}

CollectiveStats Communicator::stats() const {
  CollectiveStats s;
  {
    std::lock_guard lock(impl_->mutex);
    s = impl_->stats;
  }
  if (impl_->tuner) {
    const detail::TunerStats t = impl_->tuner->stats();
    s.tuning_trials = t.trial_calls;
    s.tuning_agreements = t.agreements;
    s.retunes = t.retunes;
    s.tuning_excess_s = t.excess_s;
  }
  return s;
}

Algorithm Communicator::algorithm_for(Collective c, std::size_t bytes, DataType dt) const {
  return impl_->choose(c, bytes, dt);
}

void Communicator::set_ring_order(std::vector<int> order) {
  topology::validate_ring(order, size());
  std::lock_guard lock(impl_->mutex);
  require(impl_->queue.empty() && !impl_->busy, "set_ring_order while collectives are in flight; wait for them first");
  impl_->plan.set_ring(std::move(order));
}

void Communicator::set_ring_channels(std::vector<std::vector<int>> rings) {
  require(!rings.empty(), "set_ring_channels needs at least one ring; pass {ring} for one channel");
  for (const auto& r : rings) topology::validate_ring(r, size());
  set_ring_order(rings.front());
  std::lock_guard lock(impl_->mutex);
  detail::PlanState& plan = impl_->plan;
  if (rings.size() > 1) {
    plan.channels = std::move(rings);
    while (plan.channel_workspaces.size() + 1 < plan.channels.size())
      plan.channel_workspaces.push_back(std::make_unique<Workspace>());
  }
}

const std::vector<std::vector<int>>& Communicator::ring_channels() const { return impl_->plan.channels; }

void Communicator::set_trees(topology::TreeShape first, std::optional<topology::TreeShape> second) {
  topology::validate_tree(first, size());
  if (second) {
    topology::validate_tree(*second, size());
    require(second->root != first.root || size() == 1,
            "the two trees of a double tree need different roots, or the root does all the work twice");
  }
  std::lock_guard lock(impl_->mutex);
  require(impl_->queue.empty() && !impl_->busy, "set_trees while collectives are in flight; wait for them first");
  detail::PlanState& plan = impl_->plan;
  plan.tree_a = std::move(first);
  plan.tree_depth = plan.tree_a.depth();
  plan.two_trees = second.has_value();
  if (second) plan.tree_b = std::move(*second);
}

// ---- the calls as tasks, with their argument checks (shared by the sync and async forms) ----
namespace {

Task allreduce_task(int rank, const void* in, void* out, std::size_t count, DataType dt, ReduceOp op) {
  check_op_supported(dt, op);
  checks::buffers("allreduce", in, count, out, count, dt, rank);
  return Task{Collective::kAllreduce, in, out, count, dt, op};
}

Task reduce_scatter_task(int rank, int size, const void* in, void* out, std::size_t recvcount, DataType dt,
                         ReduceOp op) {
  check_op_supported(dt, op);
  const std::size_t all = checks::times_ranks("reduce_scatter", recvcount, size, rank);
  checks::buffers("reduce_scatter", in, all, out, recvcount, dt, rank);
  return Task{Collective::kReduceScatter, in, out, recvcount, dt, op};
}

Task allgather_task(int rank, int size, const void* in, void* out, std::size_t sendcount, DataType dt) {
  const std::size_t all = checks::times_ranks("allgather", sendcount, size, rank);
  checks::buffers("allgather", in, sendcount, out, all, dt, rank);
  return Task{Collective::kAllgather, in, out, sendcount, dt};
}

Task broadcast_task(int rank, int size, void* buf, std::size_t count, DataType dt, int root) {
  checks::root("broadcast", root, size);
  checks::buffers("broadcast", buf, count, buf, count, dt, rank);
  Task t{Collective::kBroadcast, buf, buf, count, dt};
  t.root = root;
  return t;
}

Task reduce_task(int rank, int size, const void* in, void* out, std::size_t count, DataType dt, ReduceOp op, int root) {
  check_op_supported(dt, op);
  checks::root("reduce", root, size);
  checks::buffers("reduce", in, count, out, rank == root ? count : 0, dt, rank);
  Task t{Collective::kReduce, in, out, count, dt, op};
  t.root = root;
  return t;
}

}  // namespace

Work Communicator::allreduce_async(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op) {
  return impl_->submit(allreduce_task(rank(), in, out, count, dt, op));
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
Work Communicator::barrier_async() { return impl_->submit({Collective::kBarrier}); }

void Communicator::allreduce(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op) {
  impl_->run_sync(allreduce_task(rank(), in, out, count, dt, op));
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

// ---- point-to-point: straight to the transport (no queue), so that a send and a receive posted back to back on
// two ranks can never wait on each other through the progress threads ----
namespace {

Work post_p2p(Transport& t, Request r, std::string what, std::weak_ptr<CompletionThread> completions) {
  auto state = std::make_shared<Work::State>();
  state->completions = std::move(completions);
  auto req = std::make_shared<Request>(r);
  state->drive = [&t, req, weak = std::weak_ptr<Work::State>(state), what](bool block) {
    auto s = weak.lock();
    if (!s) return true;
    // One driver at a time (the caller's wait() and the completion thread's poll): a poll gives way.
    std::unique_lock drive(s->drive_mutex, std::defer_lock);
    if (block)
      drive.lock();
    else if (!drive.try_lock())
      return false;
    {
      std::lock_guard lock(s->mutex);
      if (s->done) return true;
    }
    try {
      if (block)
        t.wait(*req);
      else if (!t.test(*req))
        return false;
      drive.unlock();
      s->finish(nullptr, {});
    } catch (const std::exception& e) {
      if (!dynamic_cast<const InvalidArgument*>(&e)) t.abandon();
      if (drive.owns_lock()) drive.unlock();
      s->finish(
          std::make_exception_ptr(Error(fmt::format("hopwise: rank {}: {} failed: {}", t.rank(), what, e.what()))),
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
  checks::buffers("send", buf, count, buf, 0, dt, rank());
  const std::size_t bytes = count * dtype_size(dt);
  return post_p2p(*impl_->transport, impl_->transport->isend(buf, bytes, peer, tag),
                  fmt::format("send(count={}, dtype={}, peer={}, tag={})", count, to_string(dt), peer, tag),
                  impl_->completions);
}

Work Communicator::recv_async(void* buf, std::size_t count, DataType dt, int peer, int tag) {
  check_peer("recv", peer, tag, size());
  checks::buffers("recv", buf, 0, buf, count, dt, rank());
  const std::size_t bytes = count * dtype_size(dt);
  return post_p2p(*impl_->transport, impl_->transport->irecv(buf, bytes, peer, tag),
                  fmt::format("recv(count={}, dtype={}, peer={}, tag={})", count, to_string(dt), peer, tag),
                  impl_->completions);
}

void Communicator::send(const void* buf, std::size_t count, DataType dt, int peer, int tag) {
  send_async(buf, count, dt, peer, tag).wait();
}
void Communicator::recv(void* buf, std::size_t count, DataType dt, int peer, int tag) {
  recv_async(buf, count, dt, peer, tag).wait();
}

}  // namespace hopwise::comm
