// tune_in_simulation (hopwise/sim/tuner.h): each rank's Tuner makes one class's calls on its actor until it decides.
#include "hopwise/sim/tuner.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>

#include "hopwise/common/error.h"
#include "tuner/tuner.h"

namespace hopwise::comm::sim {

namespace {

// Where messages carry no bytes: the agreements' values, by agreement number (the same on every rank: the tuners
// agree at the same calls). Each entry is dropped once every rank has read it.
class AgreementBoard {
 public:
  explicit AgreementBoard(int ranks) : ranks_(ranks) {}
  void post(std::uint64_t seq, const std::vector<double>& v) {
    Entry& e = entries_[seq];
    if (e.max.empty()) e.max = v;
    if (e.max.size() != v.size())
      throw Error(fmt::format("simulated agreement {}: ranks gave {} and {} values", seq, e.max.size(), v.size()));
    for (std::size_t i = 0; i < v.size(); ++i) e.max[i] = std::max(e.max[i], v[i]);
    ++e.posted;
  }
  std::vector<double> take(std::uint64_t seq) {
    auto it = entries_.find(seq);
    if (it == entries_.end() || it->second.posted != ranks_)
      throw Error(fmt::format("simulated agreement {}: read before every rank posted", seq));
    std::vector<double> out = it->second.max;
    if (++it->second.read == ranks_) entries_.erase(it);
    return out;
  }

 private:
  struct Entry {
    std::vector<double> max;
    int posted = 0, read = 0;
  };
  int ranks_;
  std::map<std::uint64_t, Entry> entries_;
};

}  // namespace

TunerRun tune_in_simulation(const TunerJob& job, Collective kind, DataType dt, std::size_t count,
                            const std::vector<TuningChoice>& candidates, const detail::TunerSettings& settings,
                            int max_calls) {
  if (candidates.empty()) throw InvalidArgument("tune_in_simulation: give at least one candidate");
  const int n = static_cast<int>(job.hosts.size());
  const bool phantom = !job.run.real_payloads;
  const std::size_t bytes = count * dtype_size(dt);
  const detail::TuneKey key{kind, dtype_class_of(dt), size_class_of(bytes)};
  AgreementBoard board(n);
  // Phantom: one buffer for every rank, never written; else each rank's own (in and out apart: repeated sums in
  // place would grow without bound).
  std::unique_ptr<std::byte[]> shared(phantom ? new std::byte[std::max<std::size_t>(bytes, 1)] : nullptr);
  std::vector<int> calls(static_cast<std::size_t>(n), 0);
  std::vector<double> decided_at(static_cast<std::size_t>(n), 0);
  TunerRun out;
  std::vector<TuningChoice> choices(static_cast<std::size_t>(n));
  double run_start = -1;  // the clock when the ranks start (it goes on from run to run)
  run_ranks(
      job.hosts,
      [&](int rank, Transport& t) {
        const auto r = static_cast<std::size_t>(rank);
        if (run_start < 0) run_start = now();
        RankCollectives coll(t, job.ring, job.host_of, job.chunk_bytes, phantom);
        std::unique_ptr<std::byte[]> in, result;
        if (!phantom) {
          in.reset(new std::byte[std::max<std::size_t>(bytes, 1)]());
          result.reset(new std::byte[std::max<std::size_t>(bytes, 1)]());
        }
        void* src = phantom ? shared.get() : in.get();
        void* dst = phantom ? shared.get() : result.get();
        std::uint64_t seq = 0;
        const detail::Tuner::Agree agree = [&](std::vector<double>& v) {
          if (phantom) board.post(seq, v);
          coll.run(job.agree_with, Collective::kAllreduce, v.data(), v.data(), v.size(), DataType::kFloat64,
                   ReduceOp::kMax);
          if (phantom) v = board.take(seq);
          ++seq;
        };
        detail::Tuner tuner(settings);
        for (;;) {
          auto pick = tuner.next(
              key, [&] { return candidates; }, agree, rank);
          if (!pick) throw Error("tune_in_simulation: the tuner is off (TunerSettings::online)");
          if (tuner.decided(key)) {
            choices[r] = pick->choice;
            decided_at[r] = now();
            break;
          }
          if (calls[r] >= max_calls)
            throw Error(fmt::format("tune_in_simulation: rank {}'s tuner did not decide in {} calls", rank, max_calls));
          if (pick->trial) {  // lined up, the schedules compared (dispatch.cpp)
            std::vector<double> v{pick->step, -pick->step};
            agree(v);
            if (v[0] != -v[1])
              throw Error(
                  fmt::format("rank {}: the ranks' tuning schedules differ (trial step {}, {} to {} across "
                              "the ranks)",
                              rank, pick->step, -v[1], v[0]));
          }
          const double t0 = now();
          coll.run(pick->choice.algorithm, kind, src, dst, count, dt, ReduceOp::kSum, 0, pick->choice.chunk_bytes);
          tuner.record(key, pick->choice, now() - t0);
          ++calls[r];
        }
        if (rank == 0) {
          out.ranked = tuner.ranked(key);
          out.in_a_row = tuner.in_a_row(key);
          out.stats = tuner.stats();
        }
      },
      job.run);
  for (int r = 1; r < n; ++r)
    if (!(choices[static_cast<std::size_t>(r)] == choices[0]) || calls[static_cast<std::size_t>(r)] != calls[0])
      throw Error(fmt::format("tune_in_simulation: rank {} decided {} after {} calls, rank 0 {} after {}", r,
                              to_string(choices[static_cast<std::size_t>(r)]), calls[static_cast<std::size_t>(r)],
                              to_string(choices[0]), calls[0]));
  out.choice = choices[0];
  out.calls = calls[0];
  out.tuning_s = *std::max_element(decided_at.begin(), decided_at.end()) - run_start;
  return out;
}

}  // namespace hopwise::comm::sim
