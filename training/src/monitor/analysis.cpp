#include "analysis.h"

#include <fmt/core.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <numeric>

namespace hopwise::comm::monitor {

void pack(const RankStep& s, double* out) {
  const std::size_t nb = std::min(kMaxBuckets, s.bucket_ms.size());
  const double head[kHeader] = {s.step_ms,       s.compute_ms, s.exposed_ms,
                                s.comm_ms,       s.codec_ms,   s.host_bytes,
                                s.network_bytes, s.monitor_ms, static_cast<double>(nb)};
  std::copy(head, head + kHeader, out);
  std::fill(out + kHeader, out + kRecord, 0.0);
  std::copy(s.bucket_ms.begin(), s.bucket_ms.begin() + static_cast<std::ptrdiff_t>(nb), out + kHeader);
}

RankStep unpack(const double* in) {
  RankStep s{in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], {}};
  const auto nb = static_cast<std::size_t>(std::clamp(in[8], 0.0, static_cast<double>(kMaxBuckets)));
  s.bucket_ms.assign(in + kHeader, in + kHeader + nb);
  return s;
}

StepArrival arrival(const std::vector<RankStep>& ranks) {
  StepArrival a;
  a.lag_ms.assign(ranks.size(), 0.0);
  if (ranks.empty()) return a;
  std::size_t nb = kMaxBuckets;
  for (const RankStep& r : ranks) nb = std::min(nb, r.bucket_ms.size());
  for (std::size_t b = 0; b < nb; ++b) {
    // The collective ends together everywhere: the shortest time in it belongs to the rank that started last.
    int last = 0;
    double longest = ranks[0].bucket_ms[b];
    for (std::size_t r = 1; r < ranks.size(); ++r) {
      longest = std::max(longest, ranks[r].bucket_ms[b]);
      if (ranks[r].bucket_ms[b] < ranks[static_cast<std::size_t>(last)].bucket_ms[b]) last = static_cast<int>(r);
    }
    const double skew = longest - ranks[static_cast<std::size_t>(last)].bucket_ms[b];
    a.bucket_skew_ms.push_back(skew);
    a.bucket_last_rank.push_back(last);
    a.lag_ms[static_cast<std::size_t>(last)] += skew;
  }
  return a;
}

void Interval::add(const std::vector<RankStep>& step) {
  if (sum_.size() != step.size()) {
    reset();
    sum_.resize(step.size());
    lag_.assign(step.size(), 0.0);
  }
  const StepArrival a = arrival(step);
  if (skew_.size() != a.bucket_skew_ms.size()) {  // the buckets were rebuilt: their figures start again
    skew_.assign(a.bucket_skew_ms.size(), 0.0);
    last_.assign(a.bucket_skew_ms.size(), std::vector<int>(step.size(), 0));
  }
  for (std::size_t r = 0; r < step.size(); ++r) {
    RankStep& s = sum_[r];
    const RankStep& x = step[r];
    s.step_ms += x.step_ms;
    s.compute_ms += x.compute_ms;
    s.exposed_ms += x.exposed_ms;
    s.comm_ms += x.comm_ms;
    s.codec_ms += x.codec_ms;
    s.host_bytes += x.host_bytes;
    s.network_bytes += x.network_bytes;
    s.monitor_ms += x.monitor_ms;
    lag_[r] += a.lag_ms[r];
  }
  for (std::size_t b = 0; b < skew_.size(); ++b) {
    skew_[b] += a.bucket_skew_ms[b];
    ++last_[b][static_cast<std::size_t>(a.bucket_last_rank[b])];
  }
  ++steps_;
}

void Interval::reset() {
  steps_ = 0;
  for (RankStep& s : sum_) s = RankStep{};
  std::fill(lag_.begin(), lag_.end(), 0.0);
  std::fill(skew_.begin(), skew_.end(), 0.0);
  for (auto& v : last_) std::fill(v.begin(), v.end(), 0);
}

MonitorReport Interval::report(std::size_t first_step, double seconds) const {
  MonitorReport r;
  r.first_step = first_step;
  r.steps = steps_;
  r.seconds = seconds;
  r.ranks = static_cast<int>(sum_.size());
  const double n = std::max<double>(1, static_cast<double>(steps_));
  const double secs = std::max(1e-9, seconds);
  double util = 0;
  for (std::size_t k = 0; k < sum_.size(); ++k) {
    const RankStep& s = sum_[k];
    r.step_ms.push_back(s.step_ms / n);
    r.compute_ms.push_back(s.compute_ms / n);
    r.exposed_ms.push_back(s.exposed_ms / n);
    r.comm_ms.push_back(s.comm_ms / n);
    r.codec_ms.push_back(s.codec_ms / n);
    r.lag_ms.push_back(lag_[k] / n);
    r.monitor_ms.push_back(s.monitor_ms / n);
    r.host_bytes_per_s.push_back(s.host_bytes / secs);
    r.network_bytes_per_s.push_back(s.network_bytes / secs);
    util += s.step_ms > 0 ? s.compute_ms / s.step_ms : 1.0;
  }
  r.utilization = sum_.empty() ? 0 : util / static_cast<double>(sum_.size());
  if (!r.lag_ms.empty()) {
    const auto it = std::max_element(r.lag_ms.begin(), r.lag_ms.end());
    r.slowest_rank = static_cast<int>(it - r.lag_ms.begin());
    r.slowest_lag_ms = *it;
  }
  for (std::size_t b = 0; b < skew_.size(); ++b) {
    r.bucket_skew_ms.push_back(skew_[b] / n);
    r.bucket_last_rank.push_back(
        static_cast<int>(std::max_element(last_[b].begin(), last_[b].end()) - last_[b].begin()));
  }
  return r;
}

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

std::vector<double> without(const std::vector<double>& v, int skip) {
  std::vector<double> out;
  for (std::size_t i = 0; i < v.size(); ++i)
    if (static_cast<int>(i) != skip) out.push_back(v[i]);
  return out;
}

double total(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); }

}  // namespace

std::string rate(double bytes_per_s) {
  if (bytes_per_s >= 1e9) return fmt::format("{:.2f} GB/s", bytes_per_s / 1e9);
  if (bytes_per_s >= 1e6) return fmt::format("{:.1f} MB/s", bytes_per_s / 1e6);
  return fmt::format("{:.0f} kB/s", bytes_per_s / 1e3);
}

std::string likely_cause(const MonitorReport& r) {
  if (r.ranks == 0 || r.steps == 0) return "no steps recorded";
  const double step = median(r.step_ms), compute = median(r.compute_ms), codec = median(r.codec_ms);
  // What the others lose to the slowest rank: it arrives late, they wait in exposed communication.
  const std::vector<double> others_exposed = without(r.exposed_ms, r.slowest_rank);
  const double waited = others_exposed.empty() ? 0 : median(others_exposed);
  const double idle = std::max(0.0, step - compute);
  if (r.ranks > 1 && r.slowest_lag_ms >= 0.1 * step && r.slowest_lag_ms >= 0.5 * waited) {
    const double own = r.compute_ms[static_cast<std::size_t>(r.slowest_rank)];
    return fmt::format(
        "straggler: rank {} arrives {:.1f} ms late per step and the others wait for it "
        "(its compute {:.1f} ms, the others' median {:.1f} ms)",
        r.slowest_rank, r.slowest_lag_ms, own, median(without(r.compute_ms, r.slowest_rank)));
  }
  if (codec >= 0.5 * idle && codec > 0)
    return fmt::format(
        "codec time: {:.1f} ms per step ({:.0f}% of the step) encoding and decoding, competing with "
        "compute for the cores",
        codec, 100 * codec / std::max(1e-9, step));
  const double net = total(r.network_bytes_per_s), host = total(r.host_bytes_per_s);
  const std::string link = net > 0 ? fmt::format("the network between hosts ({} sent by all ranks)", rate(net))
                                   : fmt::format("the host's own links ({} sent by all ranks)", rate(host));
  return fmt::format("exposed communication: {:.1f} ms per step not hidden behind compute, over {}",
                     median(r.exposed_ms), link);
}

std::string step_json(std::size_t step, const std::vector<RankStep>& ranks, const StepArrival& a) {
  nlohmann::json j;
  j["type"] = "step";
  j["step"] = step;
  auto field = [&](const char* name, double RankStep::*m) {
    std::vector<double> v;
    for (const RankStep& s : ranks) v.push_back(s.*m);
    j[name] = v;
  };
  field("step_ms", &RankStep::step_ms);
  field("compute_ms", &RankStep::compute_ms);
  field("exposed_ms", &RankStep::exposed_ms);
  field("comm_ms", &RankStep::comm_ms);
  field("codec_ms", &RankStep::codec_ms);
  field("host_bytes", &RankStep::host_bytes);
  field("network_bytes", &RankStep::network_bytes);
  field("monitor_ms", &RankStep::monitor_ms);
  std::vector<double> util;
  for (const RankStep& s : ranks) util.push_back(s.step_ms > 0 ? s.compute_ms / s.step_ms : 1.0);
  j["utilization"] = util;
  j["lag_ms"] = a.lag_ms;
  j["bucket_skew_ms"] = a.bucket_skew_ms;
  j["bucket_last_rank"] = a.bucket_last_rank;
  return j.dump();
}

std::string interval_json(const MonitorReport& r, double util_alert) {
  nlohmann::json j;
  j["type"] = "interval";
  j["first_step"] = r.first_step;
  j["steps"] = r.steps;
  j["seconds"] = r.seconds;
  j["utilization"] = r.utilization;
  j["step_ms"] = r.step_ms;
  j["compute_ms"] = r.compute_ms;
  j["exposed_ms"] = r.exposed_ms;
  j["comm_ms"] = r.comm_ms;
  j["codec_ms"] = r.codec_ms;
  j["lag_ms"] = r.lag_ms;
  j["monitor_ms"] = r.monitor_ms;
  j["slowest_rank"] = r.slowest_rank;
  j["slowest_lag_ms"] = r.slowest_lag_ms;
  j["host_bytes_per_s"] = r.host_bytes_per_s;
  j["network_bytes_per_s"] = r.network_bytes_per_s;
  j["bucket_skew_ms"] = r.bucket_skew_ms;
  j["bucket_last_rank"] = r.bucket_last_rank;
  j["low_intervals"] = r.low_intervals;
  if (util_alert > 0) j["util_alert"] = util_alert;  // the threshold it was held to, for the charts
  if (!r.cause.empty()) j["cause"] = r.cause;
  return j.dump();
}

std::string alert_json(const MonitorReport& r, const std::string& line) {
  nlohmann::json j;
  j["type"] = "alert";
  j["first_step"] = r.first_step;
  j["steps"] = r.steps;
  j["utilization"] = r.utilization;
  j["low_intervals"] = r.low_intervals;
  j["cause"] = r.cause;
  j["line"] = line;
  return j.dump();
}

}  // namespace hopwise::comm::monitor
