// Choosing and running an algorithm: a forced one (HOPWISE_ALGO, set_algorithm) where it implements the call and
// can run here, else the tuner's measured choice (tuner/), else the cost model's pick among the algorithm table's
// candidates; then the row's run function. One rank and empty buffers are handled here once, for every row.
#include <chrono>
#include <cmath>
#include <cstring>

#include <fmt/core.h>

#include "communicator_impl.h"
#include "hopwise/common/error.h"
#include "hopwise/common/reduce.h"

namespace hopwise::comm {

namespace {

detail::TuneKey key_of(Collective c, std::size_t bytes, DataType dt) {
  return {c, dtype_class_of(dt), size_class_of(bytes)};
}

}  // namespace

CostQuery detail::CommunicatorImpl::query(Collective c, std::size_t bytes) const {
  CostQuery q;
  q.collective = c;
  q.bytes = bytes;
  q.ranks = p();
  q.hosts = plan.hosts();
  q.tree_depth = plan.tree_depth;
  return q;
}

Algorithm detail::CommunicatorImpl::model_choice(Collective c, std::size_t bytes) const {
  return cost.choose(query(c, bytes), transport->native() != nullptr);
}

Algorithm detail::CommunicatorImpl::choose(Collective c, std::size_t bytes, DataType dt) const {
  const Algorithm f = forced.load();
  const bool has_native = transport->native() != nullptr;
  if (f != Algorithm::kAuto && implements(f, c) && (!algorithm_info(f).needs_native || has_native)) return f;
  if (tuner)
    if (auto d = tuner->decided(key_of(c, bytes, dt))) return d->algorithm;
  return model_choice(c, bytes);
}

std::vector<TuningChoice> detail::CommunicatorImpl::candidates(Collective c, std::size_t bytes) const {
  return detail::tuning_candidates(cost.candidates(query(c, bytes), transport->native() != nullptr), c, bytes,
                                   tuner->settings().prior, options.chunk_bytes, plan.channels.size() > 1);
}

void detail::CommunicatorImpl::agree_max(std::vector<double>& v) {
  Task t{Collective::kAllreduce, v.data(), v.data(), v.size(), DataType::kFloat64, ReduceOp::kMax};
  run(t, {model_choice(Collective::kAllreduce, v.size() * sizeof(double)), 0, 0});
}

detail::CommunicatorImpl::Selected detail::CommunicatorImpl::select(Collective c, std::size_t count, DataType dt) {
  const std::size_t bytes = count * dtype_size(dt);
  const Algorithm f = forced.load();
  const bool trivial = p() == 1 || (count == 0 && c != Collective::kBarrier);
  if (f != Algorithm::kAuto || !tuner || trivial) return {{choose(c, bytes, dt), 0, 0}};
  const detail::TuneKey key = key_of(c, bytes, dt);
  // Most calls of a tuned job: a map lookup, untimed (the drift check reads only the calls just before it).
  if (auto choice = tuner->steady(key)) return {*choice};
  auto pick = tuner->next(
      key, [&] { return candidates(c, bytes); }, [this](std::vector<double>& v) { agree_max(v); }, transport->rank());
  if (!pick) return {{model_choice(c, bytes), 0, 0}};
  return {pick->choice, true, pick->trial, pick->step, key};
}

void detail::CommunicatorImpl::run(Task& t, const TuningChoice& choice) {
  if (t.kind == Collective::kSend || t.kind == Collective::kRecv)
    throw Error("internal: point-to-point task on the collective path");
  const std::size_t es = dtype_size(t.dt);
  CollectiveCall call{t.kind,
                      t.in,
                      t.out,
                      t.count,
                      t.dt,
                      t.op == ReduceOp::kAvg ? ReduceOp::kSum : t.op,
                      t.op == ReduceOp::kAvg ? 1.0 / p() : 1.0,
                      t.root};
  if (p() == 1 || (t.count == 0 && t.kind != Collective::kBarrier)) {
    if (t.kind == Collective::kBroadcast || t.kind == Collective::kBarrier) return;
    if (t.kind == Collective::kReduce && transport->rank() != t.root) return;
    if (t.out != t.in && t.count != 0) std::memmove(t.out, t.in, t.count * es);
    if (call.scale != 1.0 && t.kind != Collective::kAllgather) scale_by(t.dt, t.out, t.count, call.scale);
    return;
  }
  // The default call check: the run's messages carry the task's stamp, this run numbered as its next part.
  StampedTransport* st = nullptr;
  if (options.stamp_calls) {
    if (!stamped) stamped = std::make_unique<StampedTransport>(*transport);
    st = stamped.get();
  }
  CallStamp stamp;
  if (st) {
    stamp = task_stamp;
    stamp.part = task_stamp.part++;
    stamp.algorithm = static_cast<std::int32_t>(choice.algorithm);
  }
  const AlgorithmInfo& row = algorithm_info(choice.algorithm);
  // A small call's stamp rides in its first message to each peer where the row sends and receives them in one
  // order (not its ring channels side by side).
  const std::size_t blocks = t.kind == Collective::kAllgather || t.kind == Collective::kReduceScatter ? p() : 1;
  const bool side_by_side = row.channels && choice.channels != 1 && plan.channels.size() > 1;
  const bool carry = row.one_order && !side_by_side && t.count <= StampedTransport::kCarryCallBytes / es / blocks;
  StampedRun stamped_run(st, stamp, carry);
  AlgorithmContext ctx{st ? static_cast<Transport&>(*st) : *transport,
                       choice.chunk_bytes ? choice.chunk_bytes : options.chunk_bytes, plan.ring, &workspace, &plan};
  ctx.one_channel = choice.channels == 1;
  ctx.send_window = ring_send_window();
  ctx.first_tag = row.first_tag;
  // A library's own collective moves no messages of ours: compare with the ring's neighbours first.
  if (st && row.needs_native) st->exchange_with((transport->rank() + p() - 1) % p(), (transport->rank() + 1) % p());
  row.run(ctx, call);
  stamped_run.finish();
}

void detail::CommunicatorImpl::run_selected(Task& t, const Selected& s) {
  if (!s.tuned) return run(t, s.choice);
  if (s.trial) {
    // Line the ranks up (no rank's time then holds another's late arrival) and compare their schedules: a rank
    // whose tuner went another way must fail here, naming it, rather than pair its call with a different one.
    std::vector<double> v{s.step, -s.step};
    agree_max(v);
    if (v[0] != -v[1])
      throw Error(
          fmt::format("the ranks' tuning schedules differ (trial step {} here, {} to {} across the ranks); "
                      "run with HOPWISE_TUNE=0 and report this",
                      s.step, -v[1], v[0]));
  }
  const auto t0 = std::chrono::steady_clock::now();
  run(t, s.choice);
  tuner->record(s.key, s.choice, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

void detail::CommunicatorImpl::run_nested(Collective kind, const void* in, void* out, std::size_t count, DataType dt,
                                          ReduceOp op) {
  Task n{kind, in, out, count, dt, op};
  run_selected(n, select(kind, count, dt));
}

}  // namespace hopwise::comm
