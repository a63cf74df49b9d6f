// The host GradientReducer (reducer.h): buckets planned by bucket_plan.h, each a view of the caller's gradient
// memory where its gradients lie back to back, else a bucket buffer they are gathered into and scattered back
// from; a bucket is all-reduced (averaged, through a codec or PowerSGD where asked) on the communicator's progress
// thread as soon as its last gradient is marked ready. Fingerprints and the observed order travel over the
// communicator itself.
#include "hopwise/comm/reducer.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <optional>

#include "bucket_plan.h"
#include "bucket_tuner.h"
#include "hopwise/common/env.h"
#include "hopwise/common/error.h"
#include "hopwise/common/log.h"
#include "hopwise/compression/codec.h"
#include "hopwise/compression/powersgd.h"

namespace hopwise::comm {

ReducerOptions ReducerOptions::from_env() {
  ReducerOptions o;
  if (env::get_or("HOPWISE_BUCKET_MB", "") == "auto")
    o.tune_bucket = true;
  else
    o.bucket_mb = env::get_double("HOPWISE_BUCKET_MB", o.bucket_mb);
  if (!(o.bucket_mb > 0))
    throw InvalidArgument("HOPWISE_BUCKET_MB must be a positive number of megabytes, or auto (measured)");
  o.compression = env::get_or("HOPWISE_COMPRESSION", "none");
  return o;
}

namespace {

using Clock = std::chrono::steady_clock;

struct Param {
  std::string name;
  float* grad;
  std::size_t count;
  std::size_t rows = 1, cols = 0;  // the matrix shape PowerSGD compresses (1 x count: a vector, sent plain)
  int bucket = -1;
  bool ready = false;
  std::unique_ptr<compression::PowerSgdState> powersgd;  // warm start and residual, across steps and rebuilds
};

struct Bucket {
  std::vector<int> params;  // in the order they sit in the bucket
  std::size_t count = 0;
  float* view = nullptr;    // the caller's memory when the params are contiguous, else null
  std::vector<float> flat;  // otherwise: gathered here, reduced, scattered back
  int pending = 0;
  bool launched = false;
  std::size_t wire_bytes = 0;  // what this step's launch puts on the wire
  Work work;
  compression::CodecState codec_state;  // per bucket: error-feedback residual and step
  float* data() { return view ? view : flat.data(); }
};

}  // namespace

struct GradientReducer::Impl {
  Communicator& comm;
  ReducerOptions options;
  std::vector<Param> params;
  std::vector<Bucket> buckets;
  std::vector<int> ready_order;                     // this step's mark_ready order (for the rebuild after step 1)
  std::vector<int> order;                           // the order the buckets were assigned in
  Clock::time_point first_ready;                    // this step's first mark_ready
  std::optional<detail::BucketTuner> bucket_tuner;  // HOPWISE_BUCKET_MB=auto
  int next_launch = 0;
  GradientScope scope = GradientScope::kWorld;
  int steps = 0;
  bool finalized = false;
  std::vector<BucketTiming> timings;
  std::unique_ptr<compression::Codec> codec;        // null: plain allreduce (or PowerSGD)
  std::unique_ptr<compression::PowerSgd> powersgd;  // "powersgd:...": per-matrix low-rank factors

  Impl(Communicator& c, ReducerOptions o) : comm(c), options(o) {
    const auto spec = compression::parse_codec_spec(options.compression);
    if (spec.name == "powersgd")
      powersgd = std::make_unique<compression::PowerSgd>(compression::PowerSgd::from_spec(spec));
    else if (spec.name != "none")
      codec = compression::make_codec(spec);
    if (options.tune_bucket) {
      if (codec)
        log::warn(
            "HOPWISE_BUCKET_MB=auto with the codec {}: its error feedback lives per bucket, so the cap stays "
            "{} MB",
            options.compression, options.bucket_mb);
      else
        bucket_tuner.emplace();
    }
  }

  // PowerSGD: every matrix of the bucket, P factors in one allreduce and Q factors in another (the comm/ call).
  Work launch_powersgd(Bucket& b) {
    std::vector<PowerSgdTensor> ts;
    std::size_t off = 0;
    b.wire_bytes = 0;
    for (int i : b.params) {
      Param& p = params[static_cast<std::size_t>(i)];
      float* data = b.view ? p.grad : b.flat.data() + off;
      off += p.count;
      ts.push_back({data, data, p.rows, p.cols, p.powersgd.get()});
      b.wire_bytes += powersgd->step_bytes(p.rows, p.cols, *p.powersgd);
    }
    return comm.allreduce_powersgd_async(ts, *powersgd, ReduceOp::kAvg);
  }

  std::vector<bucket_plan::Gradient> gradients() const {
    std::vector<bucket_plan::Gradient> g;
    for (const Param& p : params) g.push_back({p.name, p.count, p.rows});
    return g;
  }

  // Buckets in `order` (bucket_plan::assign), each a view or a buffer of its own.
  void assign(const std::vector<int>& new_order) {
    order = new_order;
    buckets.clear();
    for (bucket_plan::Planned& planned : bucket_plan::assign(gradients(), order, options)) {
      Bucket& b = buckets.emplace_back();
      b.params = std::move(planned.members);
      b.count = planned.count;
      for (int i : b.params) params[static_cast<std::size_t>(i)].bucket = static_cast<int>(buckets.size()) - 1;
    }
    for (Bucket& b : buckets) {
      // A view when the members lie back to back in memory (in either direction).
      std::vector<int> by_addr = b.params;
      std::sort(by_addr.begin(), by_addr.end(), [&](int x, int y) { return params[x].grad < params[y].grad; });
      bool contiguous = true;
      for (std::size_t k = 1; k < by_addr.size(); ++k)
        contiguous =
            contiguous && params[by_addr[k - 1]].grad + params[by_addr[k - 1]].count == params[by_addr[k]].grad;
      b.view = contiguous && !by_addr.empty() ? params[by_addr.front()].grad : nullptr;
      if (!b.view) b.flat.assign(b.count, 0.0f);
    }
    for (std::size_t k = 0; k < buckets.size(); ++k)
      buckets[k].codec_state = compression::CodecState(0x6e75 + k, comm.rank(), comm.size());
  }

  // The layout's fingerprint, gathered over the communicator and compared with rank 0's.
  void check_layout() {
    std::vector<bucket_plan::Planned> planned;
    for (const Bucket& b : buckets) planned.push_back({b.params, b.count});
    const std::uint64_t mine = bucket_plan::fingerprint(gradients(), options.compression, planned);
    std::vector<std::uint64_t> all(static_cast<std::size_t>(comm.size()));
    comm.allgather(&mine, all.data(), 1, DataType::kInt64);
    bucket_plan::check_same_layout(all, comm.rank(), "gradient");
  }

  void launch_ready() {
    while (next_launch < static_cast<int>(buckets.size()) && buckets[next_launch].pending == 0) {
      Bucket& b = buckets[next_launch];
      if (!b.view) {
        std::size_t off = 0;
        for (int i : b.params) {
          std::memcpy(b.flat.data() + off, params[i].grad, params[i].count * sizeof(float));
          off += params[i].count;
        }
      }
      if (scope == GradientScope::kHost) {
        b.wire_bytes = comm.host_ranks() > 1 ? b.count * sizeof(float) : 0;
        b.work = comm.allreduce_within_host_async(b.data(), b.data(), b.count, DataType::kFloat32, ReduceOp::kAvg);
      } else if (powersgd) {
        b.work = launch_powersgd(b);
      } else {
        b.wire_bytes = codec ? codec->payload_bytes(b.count) + codec->scale_count(b.count) * sizeof(float)
                             : b.count * sizeof(float);
        b.work =
            codec ? comm.allreduce_compressed_async(b.data(), b.data(), b.count, *codec, b.codec_state, ReduceOp::kAvg)
                  : comm.allreduce_async(b.data(), b.data(), b.count, DataType::kFloat32, ReduceOp::kAvg);
      }
      b.launched = true;
      ++next_launch;
    }
  }

  // Whether this cap's steps measure the buckets' steady algorithms: each bucket's allreduce class is tuned (the
  // communicator's trials would otherwise count against the cap), or this cap has waited 40 steps. Alike on every
  // rank: the tuner decides at the same call everywhere.
  bool buckets_settled() {
    if (++steps_at_cap > 40 || codec || powersgd || !comm.tunes_online()) return true;
    for (const Bucket& b : buckets)
      if (!comm.tuned_choice(Collective::kAllreduce, b.count * sizeof(float), DataType::kFloat32)) return false;
    return true;
  }
  int steps_at_cap = 0;

  void start_step() {
    for (Bucket& b : buckets) {
      b.pending = static_cast<int>(b.params.size());
      b.launched = false;
    }
    for (Param& p : params) p.ready = false;
    ready_order.clear();
    next_launch = 0;
  }
};

GradientReducer::GradientReducer(Communicator& comm, ReducerOptions options)
    : impl_(std::make_unique<Impl>(comm, options)) {}

GradientReducer::~GradientReducer() {
  // Never leave a bucket in flight on buffers that are about to go away.
  for (Bucket& b : impl_->buckets)
    if (b.launched && b.work.valid()) try {
        b.work.wait();
      } catch (...) {
      }
}

int GradientReducer::add_parameter(std::string name, float* grad, std::size_t count) {
  return add_parameter(std::move(name), grad, 1, count);
}

int GradientReducer::add_parameter(std::string name, float* grad, std::size_t rows, std::size_t cols) {
  const std::size_t count = rows * cols;
  if (impl_->finalized)
    throw InvalidArgument(fmt::format("add_parameter('{}') after finalize(); register every parameter first", name));
  if (grad == nullptr && count > 0)
    throw InvalidArgument(fmt::format("add_parameter('{}'): gradient pointer is null for {} elements", name, count));
  Param p{std::move(name), grad, count, rows, cols};
  // Seeded by position, so that every rank draws the same initial Q for the same matrix.
  p.powersgd = std::make_unique<compression::PowerSgdState>(0x70736764ull + impl_->params.size());
  impl_->params.push_back(std::move(p));
  return static_cast<int>(impl_->params.size()) - 1;
}

void GradientReducer::finalize() {
  Impl& m = *impl_;
  if (m.finalized) return;
  m.assign(bucket_plan::reverse_order(m.params.size()));
  m.check_layout();
  m.finalized = true;
  m.start_step();
}

void GradientReducer::mark_ready(int index) {
  Impl& m = *impl_;
  if (!m.finalized) throw InvalidArgument("mark_ready() before finalize(); call finalize() once after add_parameter()");
  if (index < 0 || index >= static_cast<int>(m.params.size()))
    throw InvalidArgument(
        fmt::format("mark_ready({}): no such parameter; indices run 0..{}", index, m.params.size() - 1));
  Param& p = m.params[static_cast<std::size_t>(index)];
  if (p.ready)
    throw InvalidArgument(
        fmt::format("gradient '{}' was marked ready twice in one step; mark each parameter once "
                    "per step, then call finish()",
                    p.name));
  p.ready = true;
  if (m.ready_order.empty()) m.first_ready = Clock::now();
  m.ready_order.push_back(index);
  --m.buckets[static_cast<std::size_t>(p.bucket)].pending;
  if (m.options.overlap && m.scope != GradientScope::kNone) m.launch_ready();
}

StepStats GradientReducer::finish() {
  Impl& m = *impl_;
  if (!m.finalized) throw InvalidArgument("finish() before finalize()");
  std::vector<std::string> missing;
  for (const Param& p : m.params)
    if (!p.ready) missing.push_back(p.name);
  if (!missing.empty())
    throw InvalidArgument(
        fmt::format("finish(): gradient(s) {} were never marked ready this step; call "
                    "mark_ready() for every registered parameter in backward (or register only "
                    "the parameters that get gradients)",
                    fmt::join(missing, ", ")));
  StepStats s;
  m.timings.clear();
  if (m.scope == GradientScope::kNone) {  // a local step: the gradients stay as backward left them
    m.start_step();
    return s;
  }
  m.launch_ready();
  const auto t0 = Clock::now();
  for (std::size_t k = 0; k < m.buckets.size(); ++k) {
    Bucket& b = m.buckets[k];
    b.work.wait();
    if (!b.view) {
      std::size_t off = 0;
      for (int i : b.params) {
        std::memcpy(m.params[i].grad, b.flat.data() + off, m.params[i].count * sizeof(float));
        off += m.params[i].count;
      }
    }
    s.bytes += b.wire_bytes;
    if (m.scope == GradientScope::kHost) s.host_bytes += b.wire_bytes;
    s.comm_ms += std::chrono::duration<double, std::milli>(b.work.finished() - b.work.started()).count();
    m.timings.push_back({static_cast<int>(k), b.count * sizeof(float), b.work.started(), b.work.finished()});
  }
  s.exposed_comm_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  s.buckets = static_cast<int>(m.buckets.size());
  s.overlap_pct = s.comm_ms > 0 ? std::clamp(100.0 * (1.0 - s.exposed_comm_ms / s.comm_ms), 0.0, 100.0) : 100.0;
  ++m.steps;
  // After the first step, rebuild the buckets from the order gradients really arrived in (rank 0's, so that
  // every rank builds the same buckets); a tuned cap starts there with the first candidate.
  if (m.steps == 1 && (m.options.rebuild || m.bucket_tuner)) {
    std::vector<std::int32_t> order(m.ready_order.begin(), m.ready_order.end());
    m.comm.broadcast(order.data(), order.size(), DataType::kInt32, 0);
    const std::vector<int> observed(order.begin(), order.end());
    const auto rebuilt = m.options.rebuild ? bucket_plan::rebuild_order(observed, m.params.size()) : std::nullopt;
    if (m.bucket_tuner) m.options.bucket_mb = m.bucket_tuner->cap();
    if (rebuilt || m.bucket_tuner) m.assign(rebuilt ? *rebuilt : m.order);
  } else if (m.steps > 1 && m.bucket_tuner && m.bucket_tuner->active() && m.buckets_settled()) {
    const double span = std::chrono::duration<double>(Clock::now() - m.first_ready).count();
    const bool changed = m.bucket_tuner->record(span, [&](std::vector<double>& v) {
      m.comm.allreduce(v.data(), v.data(), v.size(), DataType::kFloat64, ReduceOp::kMax);
    });
    if (changed) {
      m.steps_at_cap = 0;
      m.options.bucket_mb = m.bucket_tuner->cap();
      m.assign(m.order);
      if (!m.bucket_tuner->active() && m.comm.rank() == 0)
        log::info("bucket cap tuned: {} MB (median step span in s for caps 1 2 4 8 25 MB: {:.4f})", m.options.bucket_mb,
                  fmt::join(m.bucket_tuner->medians(), " "));
    }
  }
  m.start_step();
  return s;
}

void GradientReducer::set_scope(GradientScope scope) {
  Impl& m = *impl_;
  if (!m.ready_order.empty())
    throw InvalidArgument("set_scope() in the middle of a step; call it after finish(), before the next mark_ready()");
  if (scope == GradientScope::kHost && (m.codec || m.powersgd))
    throw InvalidArgument(
        fmt::format("gradients averaged within the host go uncompressed (the codec's state, {}, "
                    "is the world's); leave compression none with hierarchical averaging",
                    m.options.compression));
  m.scope = scope;
}

GradientScope GradientReducer::scope() const { return impl_->scope; }

std::size_t GradientReducer::bucket_count() const { return impl_->buckets.size(); }
double GradientReducer::bucket_mb() const { return impl_->options.bucket_mb; }
bool GradientReducer::tuning_bucket() const { return impl_->bucket_tuner && impl_->bucket_tuner->active(); }

std::vector<std::vector<std::string>> GradientReducer::bucket_names() const {
  return bucket_plan::names_of(impl_->buckets, impl_->params);
}

const std::vector<GradientReducer::BucketTiming>& GradientReducer::last_timings() const { return impl_->timings; }

}  // namespace hopwise::comm
