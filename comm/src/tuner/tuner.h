// The online tuner: in the first calls of each (collective, dtype class, size class) it runs every candidate in
// turn, a few rounds, agrees after each round on the slowest rank's time of each (an elementwise max-allreduce of a
// few doubles, so every rank makes the same choice), drops the far slower ones after the first round and keeps
// the fastest median. Where calls are short, the finalists (within `confirm_within` of the best) then run a block
// of calls each in the job's own rhythm, ranks not lined up, and the agreed block means decide: what a training
// step's back-to-back buckets see can differ from an isolated call (on a 1 Gbit/s link, 1 MB buckets in a row took
// ring 10.2-11.6 ms and tree 7.6-9.2 ms each where, lined up, ring was the faster: 6.5-6.9 ms against 7.4-7.9).
// Afterwards it watches the chosen one: every `check_every` calls the ranks agree on its recent median; the first
// such median is its steady time, and a later one past `drift` times that starts the tuning of
// the class again.
//
// The call schedule depends only on how many calls of a class came before and on agreed figures, so every rank
// runs the same candidate at the same call. next() and record() are called by the one thread that executes the
// communicator's calls; the read-only queries may come from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "hopwise/comm/algorithm.h"
#include "hopwise/comm/tuning.h"

namespace hopwise::comm::detail {

struct TuneKey {
  Collective collective;
  std::string dtype_class;
  int size_class;
  auto tie() const { return std::tie(collective, dtype_class, size_class); }
  bool operator<(const TuneKey& o) const { return tie() < o.tie(); }
};

class Tuner {
 public:
  using Agree = std::function<void(std::vector<double>&)>;  // elementwise max over the ranks; collective
  using Candidates = std::function<std::vector<TuningChoice>()>;

  explicit Tuner(TunerSettings s = {}) : s_(s) {}
  const TunerSettings& settings() const { return s_; }

  // Entries from a tuning file: decided from the start. `fingerprint` (of the file's entries) is compared across
  // the ranks at the first call; where ranks read different files, every rank drops them (warning on rank 0).
  void preset(const std::vector<TuningEntry>& entries, std::uint64_t fingerprint);

  // What to run for this call of `key`, or nullopt: not tuned (tuning off and no entry: the cost model chooses).
  // May make one small agreement call first; every rank must call it at the same calls. `trial`: a candidate
  // under trial (the caller lines the ranks up first, so that no rank's time holds another's late arrival).
  struct Pick {
    TuningChoice choice;
    bool trial = false;
    double step = 0;  // a trial's place in this rank's schedule (trials so far and the class): alike on every rank
  };
  std::optional<Pick> next(const TuneKey& key, const Candidates& candidates, const Agree& agree, int rank);
  // A decided class between its drift checks, without the lock or the agreement next() may make: the choice, and
  // the call counted; nullopt where the call must go through next() and record() (not decided, not yet checked
  // against the other ranks' files, or among the `window` timed calls before a check). Safe without the lock: only
  // the executing thread writes classes_, and no reader looks at the count it moves.
  std::optional<TuningChoice> steady(const TuneKey& key);
  // The time this rank took for the call next() returned `choice` for.
  void record(const TuneKey& key, const TuningChoice& choice, double seconds);

  // The decided choice of `key` (nullopt: not decided yet); a pinned one from the moment pin() returns.
  std::optional<TuningChoice> decided(const TuneKey& key) const;
  // The class's candidates that were measured, fastest median first, with their medians (empty: not decided).
  std::vector<std::pair<TuningChoice, double>> ranked(const TuneKey& key) const;
  // The finalists' agreed mean call in the job's rhythm (the confirmation blocks), as they decided the class; empty
  // where no confirmation ran.
  std::vector<std::pair<TuningChoice, double>> in_a_row(const TuneKey& key) const;
  // From any thread, every rank at the same point of its calls (between two calls, like a collective): the calls
  // of `key` run `choice` from the next one on, as if it had been decided (its drift watch starts afresh). The
  // executing thread applies it at its next call, as it alone writes the classes.
  void pin(const TuneKey& key, const TuningChoice& choice);
  std::vector<TuningEntry> entries() const;  // every decided class
  TunerStats stats() const;

 private:
  struct Class {
    std::vector<TuningChoice> candidates;
    std::vector<bool> alive;
    std::vector<std::vector<double>> agreed;  // per candidate: the slowest rank's time of each round
    std::vector<double> local;                // this round's own times, per candidate
    std::vector<std::size_t> order;           // this round's schedule (candidate indices)
    std::size_t pos = 0;                      // calls of this round made
    int round = 0;
    bool pending = false;  // the round is complete: agree at the next call
    bool decided = false;
    TuningChoice choice;
    double tuned_s = 0;           // the choice's time in the trials (ranks lined up)
    double baseline_s = 0;        // its steady time in the job (the first drift check's median; 0: not yet)
    std::vector<double> trial_s;  // this rank's trial times, for the excess figure
    std::deque<double> recent;
    int since_check = 0;
    bool from_file = false;
    bool needs_candidates = false;  // a file's class that drifted: gather the candidates at the next call
    std::vector<std::pair<std::string, double>> measured;    // every candidate's median, once decided
    std::vector<std::pair<TuningChoice, double>> confirmed;  // the finalists' block means, where blocks ran
    // The confirmation: finalists' blocks of calls in the job's rhythm (block + 1 calls each, the first not kept).
    std::vector<std::size_t> finalists;
    std::vector<std::vector<double>> block_s;
    int block = 0;              // kept calls of one finalist's block in one pass
    int passes = 1;             // passes over the finalists, each rotated by one
    std::size_t block_pos = 0;  // confirmation calls made
    bool confirming = false;
    std::size_t pass_calls() const { return finalists.size() * static_cast<std::size_t>(block + 1); }
    std::size_t confirm_calls_total() const { return static_cast<std::size_t>(passes) * pass_calls(); }
    // The finalist (its index in `finalists`) that confirmation call `pos` runs, and whether its time is kept.
    std::size_t confirm_slot(std::size_t pos) const {
      const std::size_t pass = pos / pass_calls(), within = pos % pass_calls();
      return (within / static_cast<std::size_t>(block + 1) + pass) % finalists.size();
    }
    bool confirm_kept(std::size_t pos) const { return pos % pass_calls() % static_cast<std::size_t>(block + 1) != 0; }
  };
  void decide(Class& c, std::size_t pick, double steady_s);
  void finish_confirm(const TuneKey& key, Class& c, const Agree& agree, int rank);
  void start_round(Class& c);
  void finish_round(const TuneKey& key, Class& c, const Agree& agree, int rank);
  void check_drift(const TuneKey& key, Class& c, const Agree& agree, int rank);
  void verify_preset(const Agree& agree, int rank);
  void inherit_prune(const TuneKey& key, std::vector<TuningChoice>& cands) const;
  void apply_pins();  // on the executing thread

  mutable std::mutex pins_mu_;  // guards pins_; never held together with mu_
  std::vector<std::pair<TuneKey, TuningChoice>> pins_;
  std::atomic<bool> has_pins_{false};  // what steady() reads on every call instead of taking a lock

  TunerSettings s_;
  mutable std::mutex mu_;  // guards classes_ and stats_ against the read-only queries
  std::map<TuneKey, Class> classes_;
  TunerStats stats_;
  std::uint64_t fingerprint_ = 0;
  bool verified_ = false;  // the first call compares the ranks' files (also where none has one)
};

}  // namespace hopwise::comm::detail
