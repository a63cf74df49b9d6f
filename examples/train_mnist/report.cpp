#include "report.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "hopwise/common/error.h"

namespace hopwise::examples {

void Trace::span(const std::string& name, const std::string& cat, std::chrono::steady_clock::time_point a,
                 std::chrono::steady_clock::time_point b, int tid) {
  if (!on) return;
  const double ts = std::chrono::duration<double, std::micro>(a - origin).count();
  const double dur = std::chrono::duration<double, std::micro>(b - a).count();
  events += fmt::format(
      "{}{{\"name\":\"{}\",\"cat\":\"{}\",\"ph\":\"X\",\"ts\":{:.1f},\"dur\":{:.1f},\"pid\":{},\"tid\":{}}}",
      events.empty() ? "" : ",", name, cat, ts, dur, rank, tid);
}

void write_trace(comm::Communicator& comm, Trace& tr, const std::string& path) {
  // Gather every rank's events on all ranks (sizes, then padded bytes) and let rank 0 write the file.
  const std::int64_t mine = static_cast<std::int64_t>(tr.events.size());
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(comm.size()));
  comm.allgather(&mine, sizes.data(), 1, DataType::kInt64);
  const std::size_t width = static_cast<std::size_t>(*std::max_element(sizes.begin(), sizes.end())) + 1;
  std::vector<std::uint8_t> buf(width, ' '), all(width * sizes.size());
  std::memcpy(buf.data(), tr.events.data(), tr.events.size());
  comm.allgather(buf.data(), all.data(), width, DataType::kUInt8);
  if (comm.rank() != 0) return;
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) throw Error("cannot write the trace to " + path);
  std::fputs("{\"traceEvents\":[", f);
  bool first = true;
  for (std::size_t r = 0; r < sizes.size(); ++r) {
    if (sizes[r] == 0) continue;
    if (!first) std::fputc(',', f);
    first = false;
    std::fwrite(all.data() + r * width, 1, static_cast<std::size_t>(sizes[r]), f);
    std::fprintf(f, ",{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%zu,\"args\":{\"name\":\"rank %zu\"}}", r, r);
  }
  std::fputs("]}\n", f);
  std::fclose(f);
}

void write_json(const std::string& path, const Summary& s) {
  std::FILE* j = std::fopen(path.c_str(), "w");
  if (!j) throw Error("cannot write --json " + path);
  auto or_null = [](double v, const char* f) { return v < 0 ? std::string("null") : fmt::format(fmt::runtime(f), v); };
  fmt::print(
      j,
      "{{\"ranks\": {}, \"epochs\": {}, \"test_accuracy\": {:.4f}, \"images_per_s\": {:.1f}, \"train_s\": {:.3f}, "
      "\"step_ms\": {:.3f}, \"compute_ms\": {:.3f}, \"compute_utilization\": {:.4f}, \"comm_ms\": {:.3f}, "
      "\"exposed_comm_ms\": {:.3f}, \"averaging_ms\": {:.3f}, \"overlap_pct\": {:.1f}, \"forward_ms\": {:.3f}, "
      "\"backward_ms\": {:.3f}, \"optimizer_ms\": {:.3f}, \"first_bucket_ms\": {:.3f}, "
      "\"bytes_per_step\": {:.0f}, \"gradient_bytes_per_step\": {:.0f}, \"averaging_bytes_per_step\": {:.0f}, "
      "\"averaging_syncs\": {}, \"averaging_comm_ms\": {:.3f}, \"averaging_hidden_ms\": {:.3f}, "
      "\"averaging_state_bytes\": {}, "
      "\"compression\": \"{}\", \"averaging\": \"{}\", \"overlap\": {}, \"batch\": {}, \"steps\": {}, "
      "\"target_accuracy\": {}, \"seconds_to_target\": {}, \"epochs_to_target\": {}, \"steps_to_target\": {}, "
      "\"epoch_accuracy\": [{:.4f}], \"elastic_events\": {}, \"steps_redone\": {}, \"stood_still_s\": {:.3f}, "
      "\"step_tuning\": {}, \"step_tuning_reverts\": {}}}\n",
      s.ranks, s.epochs, s.test_accuracy, s.images_per_s, s.train_s, s.step_ms, s.compute_ms, s.compute_utilization,
      s.comm_ms, s.exposed_comm_ms, s.averaging_ms, s.overlap_pct, s.forward_ms, s.backward_ms, s.optimizer_ms,
      s.first_bucket_ms, s.bytes_per_step, s.gradient_bytes_per_step, s.averaging_bytes_per_step, s.averaging_syncs,
      s.averaging_comm_ms, s.averaging_hidden_ms, s.averaging_state_bytes, s.compression, s.averaging,
      s.overlap ? "true" : "false", s.batch, s.steps,
      s.target_accuracy > 0 ? fmt::format("{:.4f}", s.target_accuracy) : std::string("null"),
      or_null(s.seconds_to_target, "{:.3f}"), or_null(s.epochs_to_target, "{:.4f}"),
      s.steps_to_target ? std::to_string(s.steps_to_target) : std::string("null"), fmt::join(s.epoch_accuracy, ", "),
      s.elastic_events, s.steps_redone, s.stood_still_s, s.step_tuning_json, s.step_tuning_reverts);
  std::fclose(j);
}

std::string describe_averaging(const std::string& spec, const comm::AveragingStats& st, double steps,
                               double wait_ms_per_step) {
  steps = std::max(1.0, steps);
  std::string line = fmt::format(
      "averaging {}: {} averagings, {:.2f} MB of parameters per step, {:.2f} ms a step "
      "waiting on them",
      spec, st.averages, static_cast<double>(st.bytes) / steps / 1e6, wait_ms_per_step);
  if (st.syncs > 0)
    line += fmt::format("; {} syncs, their all-reduces {:.2f} ms a step, {:.2f} ms of it hidden behind compute",
                        st.syncs, st.comm_ms / steps, st.hidden_ms / steps);
  return line + fmt::format("; {:.2f} MB of state beside the model", static_cast<double>(st.state_bytes) / 1e6);
}

std::string describe_tuned(const std::vector<comm::TuningEntry>& entries) {
  // The tuner keeps its classes in the order it met them; the line reads by size.
  std::vector<const comm::TuningEntry*> buckets;
  for (const comm::TuningEntry& e : entries)
    if (e.size_class >= 10) buckets.push_back(&e);
  std::stable_sort(buckets.begin(), buckets.end(), [](const comm::TuningEntry* a, const comm::TuningEntry* b) {
    return a->size_class < b->size_class;
  });
  std::string out;
  for (const comm::TuningEntry* e : buckets)
    out += fmt::format("{}{} B {}", out.empty() ? "" : ", ", comm::size_class_max_bytes(e->size_class),
                       comm::to_string(e->choice));
  return out;
}

std::string describe(const std::vector<comm::StepTuning>& tuning) {
  std::string out;
  for (const comm::StepTuning& st : tuning) {
    out += fmt::format("{}{} x{}: {}", out.empty() ? "" : "; ", st.size_class, st.buckets, comm::to_string(st.chosen));
    if (st.arms.size() < 2) {
      out += " (nothing else close by calls)";
      continue;
    }
    // "two_shot 9.9 ms kept (hd 10.2, ring 11.3)" or "hd 9.9 ms replaced two_shot 10.3 (ring 11.3)".
    std::string others;
    for (const auto& [choice, s] : st.arms)
      if (choice == st.chosen)
        out += fmt::format(" {:.2f} ms", s * 1e3);
      else if (!(choice == st.arms[0].first))
        others += fmt::format("{}{} {:.2f}", others.empty() ? "" : ", ", comm::to_string(choice), s * 1e3);
    out += st.chosen == st.arms[0].first
               ? " kept"
               : fmt::format(" replaced {} {:.2f}", comm::to_string(st.arms[0].first), st.arms[0].second * 1e3);
    if (!others.empty()) out += " (" + others + ")";
  }
  return out;
}

std::string to_json(const std::vector<comm::StepTuning>& tuning) {
  std::string out;
  for (const comm::StepTuning& st : tuning) {
    std::string arms;
    for (const auto& [choice, s] : st.arms)
      if (st.arms.size() > 1)
        arms += fmt::format("{}\"{}\": {:.6f}", arms.empty() ? "" : ", ", comm::to_string(choice), s);
    out += fmt::format("{}{{\"size_class\": \"{}\", \"buckets\": {}, \"chosen\": \"{}\", \"arms\": {{{}}}}}",
                       out.empty() ? "" : ", ", st.size_class, st.buckets, comm::to_string(st.chosen), arms);
  }
  return "[" + out + "]";
}

}  // namespace hopwise::examples
