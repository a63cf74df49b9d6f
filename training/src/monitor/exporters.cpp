// What the monitor says, as people and their tools read it: the console line, the alert, the Prometheus text.
#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "analysis.h"
#include "hopwise/common/error.h"
#include "hopwise/training/monitor.h"

namespace hopwise::comm {

namespace {

double mean(const std::vector<double>& v) {
  return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

double total(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); }

using monitor::rate;

std::string steps(const MonitorReport& r) {
  return fmt::format("steps {}-{}", r.first_step, r.first_step + std::max<std::size_t>(r.steps, 1) - 1);
}

// Prometheus label values escape backslash, quote and newline.
std::string label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

std::string monitor_line(const MonitorReport& r) {
  std::string line = fmt::format(
      "monitor: {} ({:.1f} s): utilization {:.0f}% (compute {:.1f} of {:.1f} ms per step), exposed comm {:.1f} ms, "
      "codec {:.1f} ms",
      steps(r), r.seconds, 100 * r.utilization, mean(r.compute_ms), mean(r.step_ms), mean(r.exposed_ms),
      mean(r.codec_ms));
  if (r.ranks > 1) line += fmt::format("; slowest rank {}, {:.1f} ms late per step", r.slowest_rank, r.slowest_lag_ms);
  line += fmt::format("; network {}, host {}; monitor {:.3f} ms", rate(total(r.network_bytes_per_s)),
                      rate(total(r.host_bytes_per_s)), mean(r.monitor_ms));
  return line;
}

std::string alert_line(const MonitorReport& r, double threshold, int after) {
  return fmt::format(
      "monitor ALERT: utilization {:.0f}% below {:.0f}% for {} intervals in a row ({}); likely cause: {}",
      100 * r.utilization, 100 * threshold, std::max(r.low_intervals, after), steps(r), r.cause);
}

std::string prometheus_elastic_text(const std::string& job, int events_total, double stood_still_s_total, int ranks) {
  const std::string j = label(job);
  return fmt::format(
      "# HELP hopwise_elastic_events_total Membership changes the job survived (ranks lost or let in).\n"
      "# TYPE hopwise_elastic_events_total counter\nhopwise_elastic_events_total{{job=\"{}\"}} {}\n"
      "# HELP hopwise_elastic_stood_still_seconds_total Seconds the job stood still for them.\n"
      "# TYPE hopwise_elastic_stood_still_seconds_total counter\n"
      "hopwise_elastic_stood_still_seconds_total{{job=\"{}\"}} {:.6g}\n"
      "# HELP hopwise_ranks The job's ranks now.\n# TYPE hopwise_ranks gauge\nhopwise_ranks{{job=\"{}\"}} {}\n",
      j, events_total, j, stood_still_s_total, j, ranks);
}

std::string prometheus_text(const MonitorReport& r, const std::string& job, std::uint64_t steps_total) {
  std::string out;
  const std::string j = label(job);
  auto family = [&](const char* name, const char* type, const char* help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  auto per_rank = [&](const char* name, const char* help, const std::vector<double>& v, double scale) {
    family(name, "gauge", help);
    for (std::size_t k = 0; k < v.size(); ++k)
      out += fmt::format("{}{{job=\"{}\",rank=\"{}\"}} {:.9g}\n", name, j, k, v[k] * scale);
  };
  family("hopwise_steps_total", "counter", "Training steps the monitor has seen.");
  out += fmt::format("hopwise_steps_total{{job=\"{}\"}} {}\n", j, steps_total);
  family("hopwise_compute_utilization_ratio", "gauge",
         "Share of the step spent computing (forward, backward, optimizer), the ranks' mean over the last interval.");
  out += fmt::format("hopwise_compute_utilization_ratio{{job=\"{}\"}} {:.6g}\n", j, r.utilization);
  per_rank("hopwise_step_seconds", "Mean step time over the last interval.", r.step_ms, 1e-3);
  per_rank("hopwise_compute_seconds", "Mean compute time per step over the last interval.", r.compute_ms, 1e-3);
  per_rank("hopwise_exposed_communication_seconds",
           "Mean time per step spent waiting for communication compute did not hide.", r.exposed_ms, 1e-3);
  per_rank("hopwise_communication_seconds", "Mean time per step of the buckets' collectives on the progress thread.",
           r.comm_ms, 1e-3);
  per_rank("hopwise_codec_seconds", "Mean time per step in gradient codecs (encode, decode).", r.codec_ms, 1e-3);
  per_rank("hopwise_monitor_overhead_seconds", "Mean time per step the monitor itself took on the training thread.",
           r.monitor_ms, 1e-3);
  per_rank("hopwise_arrival_lag_seconds",
           "Mean per step of how late the rank arrived at the buckets it was the last to reach.", r.lag_ms, 1e-3);
  family("hopwise_link_sent_bytes_per_second", "gauge", "Bytes sent per second over the last interval, by link class.");
  for (std::size_t k = 0; k < r.host_bytes_per_s.size(); ++k) {
    out += fmt::format("hopwise_link_sent_bytes_per_second{{job=\"{}\",rank=\"{}\",link=\"host\"}} {:.9g}\n", j, k,
                       r.host_bytes_per_s[k]);
    out += fmt::format("hopwise_link_sent_bytes_per_second{{job=\"{}\",rank=\"{}\",link=\"network\"}} {:.9g}\n", j, k,
                       r.network_bytes_per_s[k]);
  }
  family("hopwise_slowest_rank", "gauge", "The rank that arrived last most, by lag, over the last interval.");
  out += fmt::format("hopwise_slowest_rank{{job=\"{}\"}} {}\n", j, r.slowest_rank);
  family("hopwise_bucket_arrival_skew_seconds", "gauge",
         "Mean per step of the time between the first and the last rank starting the bucket's collective.");
  for (std::size_t b = 0; b < r.bucket_skew_ms.size(); ++b)
    out += fmt::format("hopwise_bucket_arrival_skew_seconds{{job=\"{}\",bucket=\"{}\",last_rank=\"{}\"}} {:.9g}\n", j,
                       b, r.bucket_last_rank[b], r.bucket_skew_ms[b] * 1e-3);
  family("hopwise_low_utilization_intervals", "gauge",
         "Consecutive intervals with utilization below HOPWISE_UTIL_ALERT (0 when above or no threshold).");
  out += fmt::format("hopwise_low_utilization_intervals{{job=\"{}\"}} {}\n", j, r.low_intervals);
  family("hopwise_utilization_alert", "gauge", "1 while the utilization alert holds, else 0.");
  out += fmt::format("hopwise_utilization_alert{{job=\"{}\"}} {}\n", j, r.alerting ? 1 : 0);
  return out;
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::filesystem::path target(path);
  const std::filesystem::path tmp =
      target.parent_path() / fmt::format(".{}.{}.tmp", target.filename().string(), ::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f)
    throw InvalidArgument(fmt::format("cannot write {} ({}): check that its directory exists and is writable", path,
                                      std::strerror(errno)));
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0;
  std::fclose(f);
  std::error_code ec;
  if (ok) std::filesystem::rename(tmp, target, ec);
  if (!ok || ec) {
    std::filesystem::remove(tmp, ec);
    throw Error(fmt::format("writing {} failed: {}", path, ok ? ec.message() : std::strerror(errno)));
  }
}

}  // namespace hopwise::comm
