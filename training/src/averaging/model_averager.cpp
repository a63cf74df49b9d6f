// The ModelAverager (averaging.h): what every method shares (the first broadcast, the step count, full averages,
// checkpoints); the method itself, its row's object (averaging_method.h), decides what is averaged when.
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>

#include "hopwise/common/error.h"
#include "hopwise/training/averaging.h"
#include "hopwise/training/averaging_method.h"

namespace hopwise::comm {

struct ModelAverager::Impl {
  AveragingSpec spec;
  std::shared_ptr<const AveragingMethodRow> row;
  AveragingStats stats;
  AveragingContext ctx;
  std::unique_ptr<AveragingMethodBase> method;
  std::int64_t steps = 0;

  Impl(Communicator& c, AveragingSpec s, float* p, std::size_t n, ParameterStaging* staging)
      : spec(std::move(s)), row(find_averaging_method(spec.method)), ctx{&c, spec, p, n, stats} {
    ctx.staging = staging;
    if (!row)
      throw InvalidArgument(fmt::format("ModelAverager: no averaging method is named '{}'; methods: {}", spec.method,
                                        fmt::join(averaging_method_names(), ", ")));
  }
};

ModelAverager::ModelAverager(Communicator& comm, AveragingSpec spec, float* params, std::size_t count,
                             ParameterStaging* staging, bool joining)
    : impl_(std::make_unique<Impl>(comm, std::move(spec), params, count, staging)) {
  if (params == nullptr && count > 0)
    throw InvalidArgument(fmt::format("ModelAverager: the parameter pointer is null for {} elements", count));
  impl_->ctx.joining = joining;
  if (!joining) {
    impl_->ctx.fetch_all();
    comm.broadcast(params, count, DataType::kFloat32, 0);
    impl_->ctx.publish_all();
  }
  impl_->method = impl_->row->make(impl_->ctx);
  if (joining && !regroups())
    throw InvalidArgument(fmt::format(
        "ModelAverager: '{}' keeps no shared state to join with (regroups() is false); a newcomer builds its "
        "averager with the members, as at the start",
        impl_->spec.to_string()));
}

bool ModelAverager::regroups() const { return averaging_regroups(impl_->spec); }

void ModelAverager::detach() { impl_->method->detach(); }

std::string ModelAverager::regroup(Communicator& comm) {
  if (!regroups())
    throw InvalidArgument(fmt::format(
        "ModelAverager::regroup: '{}' keeps no state across a change of members; build a new averager over the "
        "new communicator",
        impl_->spec.to_string()));
  impl_->ctx.comm = &comm;
  impl_->ctx.whole_copy_current = false;
  return impl_->method->regroup(impl_->steps);
}

ModelAverager::~ModelAverager() {
  try {
    if (impl_->method) impl_->method->drain();
  } catch (...) {  // the error was the caller's to see at the call that failed; nothing is left in flight
  }
}

const AveragingSpec& ModelAverager::spec() const { return impl_->spec; }

GradientScope ModelAverager::gradient_scope() const { return impl_->method->gradient_scope(impl_->steps); }

void ModelAverager::before_step() {
  impl_->ctx.whole_copy_current = false;
  impl_->method->before_step();
}

void ModelAverager::after_step() {
  impl_->ctx.whole_copy_current = false;
  impl_->method->after_step(++impl_->steps);
}

void ModelAverager::full_average() {
  Impl& m = *impl_;
  if (m.row->ranks_always_equal) return;
  m.ctx.whole_copy_current = false;
  ++m.ctx.out_of_loop;
  const auto t0 = std::chrono::steady_clock::now();
  m.method->full_average(m.ctx);
  m.stats.wait_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void ModelAverager::average_into(float* out) {
  Impl& m = *impl_;
  ++m.ctx.out_of_loop;
  m.ctx.whole_copy_current = false;
  m.ctx.fetch_all();
  if (m.row->ranks_always_equal) {
    std::memcpy(out, m.ctx.params, m.ctx.count * sizeof(float));
    return;
  }
  m.ctx.comm->allreduce(m.ctx.params, out, m.ctx.count, DataType::kFloat32, ReduceOp::kAvg);
}

void ModelAverager::settle() {
  const auto t0 = std::chrono::steady_clock::now();
  impl_->method->settle();
  impl_->stats.wait_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

std::int64_t ModelAverager::steps() const { return impl_->steps; }
const AveragingStats& ModelAverager::stats() const { return impl_->stats; }

std::string ModelAverager::choice() const { return impl_->method->choice(); }
std::string ModelAverager::pick() const { return impl_->method->pick(); }

// "hopwise-averaging 2 SPEC STEPS BYTES\n" and the method's own state, BYTES long (version 1: the line alone).
std::string ModelAverager::save() const {
  if (impl_->method->in_flight() && !impl_->method->saves_in_flight())
    throw InvalidArgument("ModelAverager::save() with an averaging in flight; call full_average() first");
  const std::string own = impl_->method->save_state();
  return fmt::format("hopwise-averaging 2 {} {} {}\n", impl_->spec.to_string(), impl_->steps, own.size()) + own;
}

void ModelAverager::load(const std::string& saved) {
  const auto eol = saved.find('\n');
  std::istringstream in(saved.substr(0, std::min<std::size_t>(eol, 4096)));
  std::string magic, spec;
  int version = 0;
  std::int64_t steps = -1;
  std::size_t own = 0;
  in >> magic >> version >> spec >> steps;
  if (version == 2) in >> own;
  const bool framed = version == 1 || (version == 2 && in && eol != std::string::npos && saved.size() - eol - 1 == own);
  if (magic != "hopwise-averaging" || !framed || steps < 0)
    throw InvalidArgument(
        fmt::format("ModelAverager::load: '{}' is not a saved averaging state (save() writes "
                    "'hopwise-averaging 2 SPEC STEPS BYTES' and BYTES of the method's state)",
                    saved.substr(0, 80)));
  if (spec != impl_->spec.to_string())
    throw InvalidArgument(
        fmt::format("ModelAverager::load: the state was saved by '{}', this averager is '{}'; "
                    "resume with the same --averaging",
                    spec, impl_->spec.to_string()));
  impl_->method->drain();
  impl_->ctx.whole_copy_current = false;  // the trainer loaded its own parameters
  impl_->steps = steps;
  impl_->method->ranks_equal();
  if (own > 0) impl_->method->load_state(saved.substr(eol + 1));
}

}  // namespace hopwise::comm
