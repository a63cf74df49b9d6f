#include "monitor.h"

#include <algorithm>

namespace hopwise::torch_backend {

namespace {
using Clock = std::chrono::steady_clock;
double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }
}  // namespace

TorchMonitor::TorchMonitor(c10::intrusive_ptr<c10d::ProcessGroup> keep, HopwiseBackend& pg,
                           comm::MonitorOptions options)
    : keep_(std::move(keep)), pg_(&pg), last_step_(Clock::now()) {
  options.on = true;
  monitor_ = std::make_unique<comm::Monitor>(pg.communicator(), std::move(options));
  pg_->sequencer().set_logging(true);
}

TorchMonitor::~TorchMonitor() { pg_->sequencer().set_logging(false); }

void TorchMonitor::step() {
  const auto now = Clock::now();
  comm::StepSample s;
  s.step_ms = ms(now - last_step_);
  last_step_ = now;
  Clock::time_point last_call{}, last_end{};
  for (auto& call : pg_->sequencer().take_log()) {
    last_call = std::max(last_call, call.called);
    for (comm::Work& w : call.works) {
      if (!w.test()) continue;  // still in flight (an async call not waited for yet): not this step's
      s.bucket_ms.push_back(ms(w.finished() - w.started()));
      last_end = std::max(last_end, w.finished());
    }
  }
  s.exposed_ms = last_end > last_call ? std::min(s.step_ms, ms(last_end - last_call)) : 0.0;
  s.compute_ms = std::max(0.0, s.step_ms - s.exposed_ms);
  last_ = s;
  monitor_->record(s);
}

void TorchMonitor::finish() { monitor_->finish(); }

}  // namespace hopwise::torch_backend
