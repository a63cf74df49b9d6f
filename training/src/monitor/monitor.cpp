// The monitor's life on every rank: samples collected per step, a background allgather per window, and on rank 0
// the interval lines, the alerts and the files.
#include "hopwise/training/monitor.h"

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <utility>

#include "analysis.h"
#include "hopwise/common/env.h"
#include "hopwise/common/error.h"
#include "hopwise/common/log.h"

namespace hopwise::comm {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_of(const std::string& field, const std::string& v) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  const std::string unit = end ? std::string(end) : "";
  const double scale = unit == "s" || unit.empty() ? 1 : unit == "ms" ? 1e-3 : unit == "m" || unit == "min" ? 60 : -1;
  if (end == v.c_str() || scale < 0 || !(x > 0) || !std::isfinite(x * scale))
    throw InvalidArgument(fmt::format(
        "HOPWISE_MONITOR: {}={} is not a duration; write e.g. {}=10s, 500ms, 1m or 200steps", field, v, field));
  return x * scale;
}

// "200steps" or "1step": the count's digits ("200"), or nothing where the value is not a count of steps.
std::optional<std::string> steps_count(const std::string& v) {
  const std::size_t unit = v.find_first_not_of("0123456789");
  if (unit == 0 || unit == std::string::npos) return std::nullopt;
  if (v.compare(unit, std::string::npos, "steps") != 0 && v.compare(unit, std::string::npos, "step") != 0)
    return std::nullopt;
  return v.substr(0, unit);
}

int whole(const std::string& field, const std::string& v, const char* what) {
  char* end = nullptr;
  const long x = std::strtol(v.c_str(), &end, 10);
  if (end == v.c_str() || *end != '\0' || x < 1 || x > 1000000)
    throw InvalidArgument(fmt::format("HOPWISE_MONITOR: {}={} must be a whole number >= 1 ({})", field, v, what));
  return static_cast<int>(x);
}

}  // namespace

MonitorOptions MonitorOptions::parse(const std::string& spec) {
  MonitorOptions o;
  o.on = true;
  if (spec.empty() || spec == "1" || spec == "on") return o;
  std::size_t at = 0;
  while (at <= spec.size()) {
    const std::size_t comma = std::min(spec.find(',', at), spec.size());
    const std::string item = spec.substr(at, comma - at);
    at = comma + 1;
    if (item.empty()) continue;
    const std::size_t eq = item.find('=');
    const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (eq == std::string::npos || value.empty())
      throw InvalidArgument(fmt::format("HOPWISE_MONITOR '{}': '{}' needs a value, e.g. interval=10s", spec, item));
    if (const auto count = key == "interval" ? steps_count(value) : std::nullopt) {
      o.interval_steps = whole(key, *count, "steps per line");
    } else if (key == "interval") {
      o.interval_s = seconds_of(key, value);
      o.interval_steps = 0;
    } else if (key == "every")
      o.every = whole(key, value, "steps between the gathers of the ranks' figures");
    else if (key == "alert_after")
      o.alert_after = whole(key, value, "intervals below HOPWISE_UTIL_ALERT before the alert");
    else
      throw InvalidArgument(
          fmt::format("HOPWISE_MONITOR '{}': unknown field '{}'; fields: interval, every, alert_after", spec, key));
  }
  return o;
}

double MonitorOptions::parse_threshold(const std::string& text) {
  char* end = nullptr;
  double x = std::strtod(text.c_str(), &end);
  const bool percent = end && *end == '%' && end[1] == '\0';
  if (percent) x /= 100;
  if (end == text.c_str() || (!percent && *end != '\0') || !(x >= 0 && x <= 1))
    throw InvalidArgument(
        fmt::format("HOPWISE_UTIL_ALERT '{}' is not a utilization; write a fraction (0.5) or a "
                    "percentage (50%)",
                    text));
  return x;
}

MonitorOptions MonitorOptions::from_env() {
  const auto spec = env::get("HOPWISE_MONITOR");
  MonitorOptions o = spec && *spec != "0" && *spec != "off" ? parse(*spec) : MonitorOptions{};
  o.print = o.on;
  if (const auto t = env::get("HOPWISE_UTIL_ALERT")) o.util_alert = parse_threshold(*t);
  o.metrics_file = env::get_or("HOPWISE_METRICS_FILE", "");
  o.json_file = env::get_or("HOPWISE_METRICS_JSON", "");
  if (!o.metrics_file.empty() || !o.json_file.empty()) o.on = true;
  return o;
}

struct Monitor::Impl {
  Communicator& comm;
  MonitorOptions options;
  // The window being filled, and the one whose allgather is in flight.
  std::vector<double> window, sent, gathered;
  std::size_t window_steps = 0, sent_steps = 0, step = 0, sent_first = 0;
  Work inflight;
  bool in_flight = false;
  double last_codec_s = 0;
  // The monitor's cost on the trainer's thread (record(): bookkeeping, launching and reading the gathers, rank 0's
  // reports and files) not yet put into a sample. The gather itself runs on the progress thread in the background.
  double self_ms = 0;
  Communicator::LinkBytes last_bytes;
  // Rank 0.
  monitor::Interval interval;
  std::size_t interval_first = 0, steps_total = 0;
  Clock::time_point interval_start = Clock::now();
  int low = 0;
  std::vector<MonitorReport> reports;
  std::vector<std::string> alerts;
  std::ofstream json;
  std::string elastic_text;  // the elastic families, once there was an event

  Impl(Communicator& c, MonitorOptions o) : comm(c), options(std::move(o)) {
    // Checked on every rank, so that a bad path stops the whole job here rather than rank 0 alone later (its
    // peers would wait for its gathers until the timeout).
    for (const auto& [path, what] : {std::pair{options.metrics_file, "HOPWISE_METRICS_FILE"},
                                     std::pair{options.json_file, "HOPWISE_METRICS_JSON"}}) {
      if (path.empty()) continue;
      const auto dir = std::filesystem::path(path).parent_path();
      if (!dir.empty() && !std::filesystem::is_directory(dir))
        throw InvalidArgument(fmt::format("{} {}: the directory {} does not exist; create it or choose another path",
                                          what, path, dir.string()));
    }
    last_codec_s = comm.stats().codec_s;
    last_bytes = comm.link_bytes();
    if (comm.rank() == 0 && !options.json_file.empty()) {
      json.open(options.json_file, options.continue_files ? std::ios::app : std::ios::trunc);
      if (!json) throw InvalidArgument(fmt::format("HOPWISE_METRICS_JSON {}: cannot write there", options.json_file));
    }
  }

  void launch() {
    if (window_steps == 0) return;
    drain();
    sent.swap(window);
    window.clear();
    sent_steps = window_steps;
    sent_first = step - window_steps;
    window_steps = 0;
    gathered.assign(sent.size() * static_cast<std::size_t>(comm.size()), 0.0);
    inflight = comm.allgather_async(sent.data(), gathered.data(), sent.size(), DataType::kFloat64);
    in_flight = true;
  }

  // Waits for the window in flight (by now long done) and, on rank 0, reads it.
  void drain() {
    if (!in_flight) return;
    inflight.wait();
    in_flight = false;
    if (comm.rank() != 0) return;
    const std::size_t per_rank = sent.size();
    for (std::size_t s = 0; s < sent_steps; ++s) {
      std::vector<monitor::RankStep> ranks;
      for (int r = 0; r < comm.size(); ++r)
        ranks.push_back(
            monitor::unpack(gathered.data() + static_cast<std::size_t>(r) * per_rank + s * monitor::kRecord));
      if (interval.empty()) interval_first = sent_first + s;
      interval.add(ranks);
      ++steps_total;
      if (json.is_open()) json << monitor::step_json(sent_first + s, ranks, monitor::arrival(ranks)) << '\n';
      if (options.interval_steps > 0 && interval.steps() >= static_cast<std::size_t>(options.interval_steps)) report();
    }
    if (options.interval_steps == 0 &&
        std::chrono::duration<double>(Clock::now() - interval_start).count() >= options.interval_s)
      report();
  }

  void say(const std::string& line) {
    if (options.print_line) {
      options.print_line(line);
    } else {
      log::end_console_line();  // a trainer's progress bar, if one is open, ends first
      std::fprintf(stdout, "%s\n", line.c_str());
    }
  }

  void report() {
    if (interval.empty()) return;
    const auto now = Clock::now();
    MonitorReport r = interval.report(interval_first, std::chrono::duration<double>(now - interval_start).count());
    interval.reset();
    interval_start = now;
    const bool low_now = options.util_alert > 0 && r.utilization < options.util_alert;
    low = low_now ? low + 1 : 0;
    r.low_intervals = low;
    if (low_now) r.cause = monitor::likely_cause(r);
    r.alerting = low_now && low >= options.alert_after;
    r.alert = r.alerting && (low - options.alert_after) % options.alert_after == 0;
    if (options.print) say(monitor_line(r));
    if (json.is_open()) json << monitor::interval_json(r, options.util_alert) << '\n';
    if (r.alert) {
      const std::string line = alert_line(r, options.util_alert, options.alert_after);
      alerts.push_back(line);
      if (options.print) say(line);
      if (json.is_open()) json << monitor::alert_json(r, line) << '\n';
    }
    if (options.print) std::fflush(stdout);
    if (json.is_open()) json.flush();
    if (!options.metrics_file.empty())
      write_file_atomically(options.metrics_file, prometheus_text(r, options.job, steps_total) + elastic_text);
    reports.push_back(std::move(r));
  }
};

Monitor::Monitor(Communicator& comm, MonitorOptions options)
    : impl_(options.on ? std::make_unique<Impl>(comm, std::move(options)) : nullptr) {}

Monitor::~Monitor() {
  // The allgather in flight writes into this monitor's buffers: they must outlive it. (On a failed job the wait
  // ends with the communicator's timeout error, which is dropped here.)
  if (impl_ && impl_->in_flight) {
    try {
      impl_->inflight.wait();
    } catch (...) {
    }
  }
}

bool Monitor::on() const { return impl_ != nullptr; }

void Monitor::record(const StepSample& s) {
  if (!impl_) return;
  Impl& m = *impl_;
  const auto t0 = Clock::now();
  monitor::RankStep x;
  x.step_ms = s.step_ms;
  x.compute_ms = s.compute_ms;
  x.exposed_ms = s.exposed_ms;
  x.bucket_ms = s.bucket_ms;
  for (double d : s.bucket_ms) x.comm_ms += d;
  const double codec = m.comm.stats().codec_s;
  x.codec_ms = (codec - m.last_codec_s) * 1e3;
  m.last_codec_s = codec;
  const Communicator::LinkBytes bytes = m.comm.link_bytes();
  x.host_bytes = static_cast<double>(bytes.host - m.last_bytes.host);
  x.network_bytes = static_cast<double>(bytes.network - m.last_bytes.network);
  m.last_bytes = bytes;
  x.monitor_ms = m.self_ms;
  m.self_ms = 0;
  m.window.resize(m.window.size() + monitor::kRecord);
  monitor::pack(x, m.window.data() + m.window.size() - monitor::kRecord);
  ++m.window_steps;
  ++m.step;
  if (m.window_steps >= static_cast<std::size_t>(m.options.every)) m.launch();
  m.self_ms += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

void Monitor::finish() {
  if (!impl_) return;
  Impl& m = *impl_;
  m.launch();
  m.drain();
  if (m.comm.rank() == 0) m.report();
}

void Monitor::membership_event(const std::string& line, int events_total, double stood_still_s_total) {
  if (!impl_ || impl_->comm.rank() != 0) return;
  Impl& m = *impl_;
  m.elastic_text = prometheus_elastic_text(m.options.job, events_total, stood_still_s_total, m.comm.size());
  if (m.json.is_open()) {
    nlohmann::json j;
    j["type"] = "elastic";
    j["first_step"] = m.step;
    j["ranks"] = m.comm.size();
    j["events_total"] = events_total;
    j["stood_still_s_total"] = stood_still_s_total;
    j["line"] = line;
    m.json << j.dump() << '\n' << std::flush;
  }
  if (!m.options.metrics_file.empty())
    write_file_atomically(
        m.options.metrics_file,
        (m.reports.empty() ? std::string() : prometheus_text(m.reports.back(), m.options.job, m.steps_total)) +
            m.elastic_text);
}

const std::vector<MonitorReport>& Monitor::reports() const {
  static const std::vector<MonitorReport> none;
  return impl_ ? impl_->reports : none;
}

const std::vector<std::string>& Monitor::alerts() const {
  static const std::vector<std::string> none;
  return impl_ ? impl_->alerts : none;
}

}  // namespace hopwise::comm
