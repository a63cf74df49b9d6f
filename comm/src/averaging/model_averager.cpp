// The ModelAverager (averaging.h): when each method averages what, over which ranks, and what overlaps the
// caller's compute. Blocking averages are world allreduces of the parameters (the communicator's tuned choice,
// `hier` across hosts); async's background average runs on the communicator's progress thread; gossip's
// exchanges go point to point on the transport, under a tag of their own (gossip_exchange.cpp).
#include <fmt/core.h>

#include <chrono>
#include <cstring>
#include <sstream>

#include "gossip_exchange.h"
#include "hopwise/comm/averaging.h"
#include "hopwise/common/error.h"
#include "hopwise/compression/codec.h"

namespace hopwise::comm {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

}  // namespace

struct ModelAverager::Impl {
  Communicator& comm;
  AveragingSpec spec;
  float* params;
  std::size_t count;
  std::int64_t steps = 0;
  AveragingStats stats;
  std::unique_ptr<detail::GossipExchange> gossip;
  // async: the snapshot being averaged and where its average lands; with a codec, the snapshot's difference from
  // `reference` (the last average, the same bits on every rank) and the average of those differences
  std::vector<float> snapshot, averaged, reference;
  std::unique_ptr<compression::Codec> codec;
  compression::CodecState codec_state;
  Work background;
  bool in_flight = false;

  Impl(Communicator& c, AveragingSpec s, float* p, std::size_t n) : comm(c), spec(std::move(s)), params(p), count(n) {}

  std::size_t bytes() const { return count * sizeof(float); }

  void average_world() {
    comm.allreduce(params, params, count, DataType::kFloat32, ReduceOp::kAvg);
    ++stats.averages;
    stats.bytes += bytes();
  }

  // async, every H steps: the average launched H steps ago (if any) is applied, x += average - snapshot, keeping
  // the ranks' progress since; then the next snapshot is taken and its average launched. One pass over the model
  // does both (with a codec: the snapshot is x - reference, and the reference moves by the average difference).
  void apply_and_restart() {
    const auto t0 = Clock::now();
    const bool apply = in_flight;
    if (apply) background.wait();
    in_flight = false;
    float* x = params;
    float* s = snapshot.data();
    const float* a = averaged.data();
    if (codec) {
      float* ref = reference.data();
      if (apply)
        for (std::size_t i = 0; i < count; ++i) {
          x[i] += a[i] - s[i];
          ref[i] += a[i];
          s[i] = x[i] - ref[i];
        }
      else
        for (std::size_t i = 0; i < count; ++i) s[i] = x[i] - ref[i];
      background = comm.allreduce_compressed_async(s, averaged.data(), count, *codec, codec_state, ReduceOp::kAvg);
      stats.bytes += codec->payload_bytes(count) + codec->scale_count(count) * sizeof(float);
    } else {
      if (apply)
        for (std::size_t i = 0; i < count; ++i) {
          x[i] += a[i] - s[i];
          s[i] = x[i];
        }
      else
        std::memcpy(s, x, bytes());
      background = comm.allreduce_async(s, averaged.data(), count, DataType::kFloat32, ReduceOp::kAvg);
      stats.bytes += bytes();
    }
    in_flight = true;
    ++stats.averages;
    stats.wait_ms += ms_since(t0);
  }

  // Waits for what is in flight and drops it: a full average follows, and every method's averaging keeps the
  // ranks' mean, so the mean is the same with or without it.
  void drain() {
    if (in_flight) {
      in_flight = false;
      background.wait();
    }
    if (gossip) gossip->drop();
  }
};

ModelAverager::ModelAverager(Communicator& comm, AveragingSpec spec, float* params, std::size_t count)
    : impl_(std::make_unique<Impl>(comm, std::move(spec), params, count)) {
  Impl& m = *impl_;
  if (params == nullptr && count > 0)
    throw InvalidArgument(fmt::format("ModelAverager: the parameter pointer is null for {} elements", count));
  comm.broadcast(params, count, DataType::kFloat32, 0);
  if (m.spec.method == AveragingMethod::kAsync) {
    m.snapshot.assign(count, 0.0f);
    m.averaged.assign(count, 0.0f);
    if (m.spec.codec != "none") {
      // Error feedback: what one average's rounding leaves out goes into the next.
      m.codec = compression::make_codec(m.spec.codec + ":ef=1");
      m.codec_state = compression::CodecState(0x6173796eull, comm.rank(), comm.size());
      m.reference.assign(params, params + count);
    }
  }
  if (m.spec.method == AveragingMethod::kGossip)
    m.gossip = std::make_unique<detail::GossipExchange>(comm, m.spec, params, count);
}

ModelAverager::~ModelAverager() {
  try {
    impl_->drain();
  } catch (...) {  // the error was the caller's to see at the call that failed; nothing is left in flight
  }
}

const AveragingSpec& ModelAverager::spec() const { return impl_->spec; }

GradientScope ModelAverager::gradient_scope() const {
  const Impl& m = *impl_;
  switch (m.spec.method) {
    case AveragingMethod::kSync: return GradientScope::kWorld;
    case AveragingMethod::kLocal:
    case AveragingMethod::kAsync: return m.steps < m.spec.warmup ? GradientScope::kWorld : GradientScope::kNone;
    case AveragingMethod::kHier: return m.steps < m.spec.warmup ? GradientScope::kWorld : GradientScope::kHost;
    case AveragingMethod::kGossip: return GradientScope::kNone;
  }
  return GradientScope::kWorld;
}

void ModelAverager::before_step() {
  Impl& m = *impl_;
  if (!m.gossip) return;
  const auto t0 = Clock::now();
  m.gossip->finish_and_mix();
  m.stats.wait_ms += ms_since(t0);
}

void ModelAverager::after_step() {
  Impl& m = *impl_;
  const std::int64_t t = ++m.steps;
  const int h = m.spec.period;
  switch (m.spec.method) {
    case AveragingMethod::kSync: return;
    case AveragingMethod::kLocal:
    case AveragingMethod::kHier:  // its hosts' ranks already agree: the world's average is across hosts
      if (t > m.spec.warmup && (t - m.spec.warmup) % h == 0) {
        const auto t0 = Clock::now();
        m.average_world();
        m.stats.wait_ms += ms_since(t0);
      }
      return;
    case AveragingMethod::kGossip: {
      const auto t0 = Clock::now();
      m.gossip->start(t - 1);
      m.stats.averages += m.gossip->partners() > 0;
      m.stats.bytes += m.gossip->bytes_sent_per_round() * static_cast<std::uint64_t>(m.gossip->partners());
      m.stats.wait_ms += ms_since(t0);
      return;
    }
    case AveragingMethod::kAsync:
      if (t > m.spec.warmup && (t - m.spec.warmup) % h == 0) m.apply_and_restart();
      return;
  }
}

void ModelAverager::full_average() {
  Impl& m = *impl_;
  if (m.spec.method == AveragingMethod::kSync) return;
  const auto t0 = Clock::now();
  m.drain();
  m.average_world();
  if (m.gossip) m.gossip->set_reference();
  if (m.codec) m.reference.assign(m.params, m.params + m.count);
  m.stats.wait_ms += ms_since(t0);
}

void ModelAverager::average_into(float* out) {
  Impl& m = *impl_;
  if (m.spec.method == AveragingMethod::kSync) {
    std::memcpy(out, m.params, m.bytes());
    return;
  }
  m.comm.allreduce(m.params, out, m.count, DataType::kFloat32, ReduceOp::kAvg);
}

std::int64_t ModelAverager::steps() const { return impl_->steps; }
const AveragingStats& ModelAverager::stats() const { return impl_->stats; }

std::string ModelAverager::save() const {
  if (impl_->in_flight || (impl_->gossip && impl_->gossip->in_flight()))
    throw InvalidArgument("ModelAverager::save() with an averaging in flight; call full_average() first");
  return fmt::format("hopwise-averaging 1 {} {}", impl_->spec.to_string(), impl_->steps);
}

void ModelAverager::load(const std::string& saved) {
  std::istringstream in(saved);
  std::string magic, spec;
  int version = 0;
  std::int64_t steps = -1;
  in >> magic >> version >> spec >> steps;
  if (magic != "hopwise-averaging" || version != 1 || steps < 0)
    throw InvalidArgument(
        fmt::format("ModelAverager::load: '{}' is not a saved averaging state (save() writes "
                    "'hopwise-averaging 1 SPEC STEPS')",
                    saved.substr(0, 80)));
  if (spec != impl_->spec.to_string())
    throw InvalidArgument(
        fmt::format("ModelAverager::load: the state was saved by '{}', this averager is '{}'; "
                    "resume with the same --averaging",
                    spec, impl_->spec.to_string()));
  impl_->drain();
  impl_->steps = steps;
  if (impl_->gossip) impl_->gossip->set_reference();
  if (impl_->codec) impl_->reference.assign(impl_->params, impl_->params + impl_->count);
}

}  // namespace hopwise::comm
