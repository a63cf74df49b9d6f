// The host GradientReducer (reducer.h) over the reducers' schedule (schedule.h): what stays here is memory and
// launches. A bucket is a view of the caller's gradient memory where its gradients lie back to back, else a bucket
// buffer they are gathered into and scattered back from; it is all-reduced (averaged, through a codec or PowerSGD
// where asked) on the communicator's progress thread as soon as its last gradient is marked ready. The schedule's
// fingerprints and observed order travel over the communicator itself.
#include "hopwise/training/reducer.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "hopwise/common/error.h"
#include "hopwise/compression/codec.h"
#include "hopwise/compression/powersgd.h"
#include "schedule.h"
#include "step_tuner.h"

namespace hopwise::comm {

namespace {

using Clock = std::chrono::steady_clock;

struct Memory {  // a gradient's, the caller's
  float* grad = nullptr;
  std::size_t cols = 0;                                  // the matrix shape PowerSGD compresses, with the rows
  std::unique_ptr<compression::PowerSgdState> powersgd;  // warm start and residual, across steps and rebuilds
};

struct BucketMemory {
  float* view = nullptr;       // the caller's memory when the gradients are contiguous, else null
  std::vector<float> flat;     // otherwise: gathered here, reduced, scattered back
  std::size_t wire_bytes = 0;  // what this step's launch puts on the wire
  Work work;
  compression::CodecState codec_state;  // per bucket: error-feedback residual and step
  float* data() { return view ? view : flat.data(); }
};

}  // namespace

struct GradientReducer::Impl {
  Communicator& comm;
  ReducerOptions options;
  std::unique_ptr<compression::Codec> codec;                   // null: plain allreduce (or PowerSGD)
  std::unique_ptr<compression::PowerSgd> powersgd;             // "powersgd:...": per-matrix low-rank factors
  CompressionScope compress_where = CompressionScope::kWorld;  // "network:CODEC": between hosts only
  std::vector<Memory> memory;                                  // per gradient
  std::vector<BucketMemory> bucket_memory;                     // per bucket
  GradientScope scope = GradientScope::kWorld;
  std::vector<BucketTiming> timings;
  std::optional<reducer::Schedule> schedule;
  std::optional<reducer::StepTuner> step_tuner;  // uncompressed, where the communicator tunes online
  bool step_classes_stale = true;                // the buckets changed since the step tuner was told

  Impl(Communicator& c, ReducerOptions o) : comm(c), options(std::move(o)) {
    const auto [where, codec_spec] = split_compression_scope(options.compression);
    compress_where = where;
    const auto spec = compression::parse_codec_spec(codec_spec);
    if (spec.name == "powersgd")
      powersgd = std::make_unique<compression::PowerSgd>(compression::PowerSgd::from_spec(spec));
    else if (spec.name != "none")
      codec = compression::make_codec(spec);
    reducer::Collectives collectives{
        [this](std::uint64_t mine) {
          std::vector<std::uint64_t> all(static_cast<std::size_t>(comm.size()));
          comm.allgather(&mine, all.data(), 1, DataType::kInt64);
          return all;
        },
        [this](std::vector<std::int32_t>& v) { comm.broadcast(v.data(), v.size(), DataType::kInt32, 0); },
        [this](std::vector<double>& v) {
          comm.allreduce(v.data(), v.data(), v.size(), DataType::kFloat64, ReduceOp::kMax);
        }};
    schedule.emplace(
        options, comm.rank(), "gradient", std::move(collectives), [this] { lay_out(); }, !codec,
        "the codec " + options.compression + " keeps its error feedback per bucket");
    if (options.tune_steps && !codec && !powersgd && comm.tunes_online() && comm.size() > 1)
      step_tuner.emplace(
          reducer::StepChoices{
              [this](std::size_t bytes) { return comm.tuned_choice(Collective::kAllreduce, bytes); },
              [this](std::size_t bytes) { return comm.tuning_alternatives(Collective::kAllreduce, bytes); },
              [this](std::size_t bytes, const TuningChoice& choice) {
                comm.pin_choice(Collective::kAllreduce, bytes, DataType::kFloat32, choice);
              },
              [this](std::vector<double>& v) {
                comm.allreduce(v.data(), v.data(), v.size(), DataType::kFloat64, ReduceOp::kMax);
              }},
          comm.rank());
  }

  // The step tuner sees the world's steps only, once the bucket cap (where tuned) is chosen.
  void tune_steps(bool reassigned) {
    if (!step_tuner) return;
    if (reassigned || step_classes_stale) {
      std::vector<std::size_t> bytes;
      for (const reducer::Bucket& b : schedule->buckets()) bytes.push_back(b.count * sizeof(float));
      step_tuner->reset(bytes);
      step_classes_stale = false;
    }
    if (!schedule->tuning() && scope == GradientScope::kWorld) step_tuner->step(schedule->last_span_s());
  }

  // Each bucket a view when its gradients lie back to back in memory (in either direction), else a buffer.
  void lay_out() {
    const auto& gradients = schedule->gradients();
    bucket_memory.clear();
    bucket_memory.resize(schedule->buckets().size());
    for (std::size_t k = 0; k < bucket_memory.size(); ++k) {
      const reducer::Bucket& b = schedule->buckets()[k];
      BucketMemory& m = bucket_memory[k];
      std::vector<int> by_addr = b.gradients;
      std::sort(by_addr.begin(), by_addr.end(), [&](int x, int y) { return memory[x].grad < memory[y].grad; });
      bool contiguous = true;
      for (std::size_t i = 1; i < by_addr.size(); ++i)
        contiguous =
            contiguous && memory[by_addr[i - 1]].grad + gradients[by_addr[i - 1]].count == memory[by_addr[i]].grad;
      m.view = contiguous && !by_addr.empty() ? memory[by_addr.front()].grad : nullptr;
      if (!m.view) m.flat.assign(b.count, 0.0f);
      m.codec_state = compression::CodecState(0x6e75 + k, comm.rank(), comm.size());
    }
  }

  // PowerSGD: every matrix of the bucket, P factors in one allreduce and Q factors in another (the comm/ call).
  Work launch_powersgd(const reducer::Bucket& b, BucketMemory& m) {
    std::vector<PowerSgdTensor> ts;
    m.wire_bytes = 0;
    for (int i : b.gradients) {
      const reducer::Gradient& g = schedule->gradients()[static_cast<std::size_t>(i)];
      Memory& p = memory[static_cast<std::size_t>(i)];
      float* data = m.view ? p.grad : m.flat.data() + g.offset;
      ts.push_back({data, data, g.rows, p.cols, p.powersgd.get()});
      m.wire_bytes += powersgd->step_bytes(g.rows, p.cols, *p.powersgd);
    }
    return comm.allreduce_powersgd_async(ts, *powersgd, ReduceOp::kAvg, compress_where);
  }

  void launch(int k) {
    const reducer::Bucket& b = schedule->buckets()[static_cast<std::size_t>(k)];
    BucketMemory& m = bucket_memory[static_cast<std::size_t>(k)];
    if (!m.view)
      for (int i : b.gradients) {
        const reducer::Gradient& g = schedule->gradients()[static_cast<std::size_t>(i)];
        std::memcpy(m.flat.data() + g.offset, memory[i].grad, g.count * sizeof(float));
      }
    if (powersgd && scope == GradientScope::kWorld) {
      m.work = launch_powersgd(b, m);
    } else if (codec && scope == GradientScope::kWorld) {
      m.wire_bytes = codec->payload_bytes(b.count) + codec->scale_count(b.count) * sizeof(float);
      m.work = comm.allreduce_compressed_async(m.data(), m.data(), b.count, *codec, m.codec_state, ReduceOp::kAvg,
                                               compress_where);
    } else {  // uncompressed, over the world or the host (set_scope keeps codecs to the world)
      m.wire_bytes = scope == GradientScope::kWorld || comm.host_ranks() > 1 ? b.count * sizeof(float) : 0;
      m.work = *average_in_scope_async(comm, scope, m.data(), b.count);
    }
  }

  // Whether this cap's steps measure the buckets' steady algorithms: each bucket's allreduce class is tuned (the
  // communicator's trials would otherwise count against the cap). Alike on every rank.
  bool settled() const {
    if (powersgd || !comm.tunes_online()) return true;
    for (const reducer::Bucket& b : schedule->buckets())
      if (!comm.tuned_choice(Collective::kAllreduce, b.count * sizeof(float), DataType::kFloat32)) return false;
    return true;
  }
};

GradientReducer::GradientReducer(Communicator& comm, ReducerOptions options)
    : impl_(std::make_unique<Impl>(comm, std::move(options))) {}

GradientReducer::~GradientReducer() {
  // Never leave a bucket in flight on buffers that are about to go away.
  for (BucketMemory& m : impl_->bucket_memory)
    if (m.work.valid()) try {
        m.work.wait();
      } catch (...) {
      }
}

int GradientReducer::add_parameter(std::string name, float* grad, std::size_t count) {
  return add_parameter(std::move(name), grad, 1, count);
}

int GradientReducer::add_parameter(std::string name, float* grad, std::size_t rows, std::size_t cols) {
  Impl& m = *impl_;
  if (grad == nullptr && rows * cols > 0)
    throw InvalidArgument(fmt::format("rank {}: add_parameter('{}'): gradient pointer is null for {} elements",
                                      m.comm.rank(), name, rows * cols));
  const int index = m.schedule->add(std::move(name), rows, cols);
  // Seeded by position, so that every rank draws the same initial Q for the same matrix.
  m.memory.push_back({grad, cols, std::make_unique<compression::PowerSgdState>(0x70736764ull + index)});
  return index;
}

void GradientReducer::finalize() { impl_->schedule->finalize(); }

void GradientReducer::mark_ready(int index) {
  Impl& m = *impl_;
  m.schedule->mark_ready(index);
  if (m.schedule->overlaps() && m.scope != GradientScope::kNone) m.schedule->launch_ready([&](int k) { m.launch(k); });
}

StepStats GradientReducer::finish() {
  Impl& m = *impl_;
  StepStats s;
  m.timings.clear();
  if (m.scope == GradientScope::kNone) {  // a local step: the gradients stay as backward left them
    m.schedule->begin_finish([](int) {});
    m.schedule->skip_step();
    return s;
  }
  m.schedule->begin_finish([&](int k) { m.launch(k); });
  const auto t0 = Clock::now();
  const auto& buckets = m.schedule->buckets();
  for (std::size_t k = 0; k < buckets.size(); ++k) {
    BucketMemory& b = m.bucket_memory[k];
    b.work.wait();
    if (!b.view)
      for (int i : buckets[k].gradients) {
        const reducer::Gradient& g = m.schedule->gradients()[static_cast<std::size_t>(i)];
        std::memcpy(m.memory[i].grad, b.flat.data() + g.offset, g.count * sizeof(float));
      }
    s.bytes += b.wire_bytes;
    if (m.scope == GradientScope::kHost) s.host_bytes += b.wire_bytes;
    s.comm_ms += std::chrono::duration<double, std::milli>(b.work.finished() - b.work.started()).count();
    m.timings.push_back({static_cast<int>(k), buckets[k].count * sizeof(float), b.work.started(), b.work.finished()});
  }
  s.exposed_comm_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  s.buckets = static_cast<int>(buckets.size());
  s.overlap_pct = s.comm_ms > 0 ? std::clamp(100.0 * (1.0 - s.exposed_comm_ms / s.comm_ms), 0.0, 100.0) : 100.0;
  // Every bucket is done: old buffers may go.
  m.tune_steps(m.schedule->end_step([] {}, [&] { return m.settled(); }));
  return s;
}

void GradientReducer::set_scope(GradientScope scope) {
  Impl& m = *impl_;
  if (m.schedule->in_step())
    throw InvalidArgument("set_scope() in the middle of a step; call it after finish(), before the next mark_ready()");
  if (scope == GradientScope::kHost && (m.codec || m.powersgd))
    throw InvalidArgument(
        fmt::format("gradients averaged within the host go uncompressed (the codec's state, {}, "
                    "is the world's); leave compression none with hierarchical averaging",
                    m.options.compression));
  m.scope = scope;
}

GradientScope GradientReducer::scope() const { return impl_->scope; }

std::size_t GradientReducer::bucket_count() const { return impl_->schedule->buckets().size(); }
double GradientReducer::bucket_mb() const { return impl_->options.bucket_mb; }
bool GradientReducer::tuning_bucket() const { return impl_->schedule->tuning(); }
std::vector<std::vector<std::string>> GradientReducer::bucket_names() const { return impl_->schedule->bucket_names(); }
const std::vector<GradientReducer::BucketTiming>& GradientReducer::last_timings() const { return impl_->timings; }
std::vector<StepTuning> GradientReducer::step_tuning() const {
  return impl_->step_tuner ? impl_->step_tuner->results() : std::vector<StepTuning>{};
}
int GradientReducer::step_tuning_reverts() const { return impl_->step_tuner ? impl_->step_tuner->reverts() : 0; }

}  // namespace hopwise::comm
