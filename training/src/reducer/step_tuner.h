// The step tuner: the communicator's tuner judges each size class by its calls, lined up and in a row, but what a
// training job pays is the step: an algorithm that is fast alone may hold the cores backward needs, or queue badly
// behind the other buckets. Once every bucket's class is decided (and the bucket cap, where tuned, is chosen), each
// class in turn (most bytes first) runs whole steps with each arm: the tuned choice, the tuner's other candidates
// within 2x of it and the cost model's pick (at most `max_arms`), in interleaved blocks (a block's first step
// settles and is not kept); after the first round an arm far slower than the best leaves the race. The slowest rank's
// median step span per arm decides; another arm replaces the tuned one only when it is `margin` faster. Then a guard
// watches: when the tuner changes a class's choice later (a drift re-tuned it), the steps after the change are compared
// with those before, and a change that made the steps `guard` slower is reverted. Every decision is agreed (a max over
// the ranks) at the same step on every rank.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "hopwise/comm/tuning.h"
#include "hopwise/training/reducer.h"  // StepTuning

namespace hopwise::comm::reducer {

// What the step tuner needs from the communicator, per bucket size (bytes of float32).
struct StepChoices {
  std::function<std::optional<TuningChoice>(std::size_t bytes)> decided;     // the tuner's choice (nullopt: trying)
  std::function<std::vector<TuningChoice>(std::size_t bytes)> alternatives;  // worth a try, best first
  std::function<void(std::size_t bytes, const TuningChoice&)> pin;           // from the next call on; every rank
  std::function<void(std::vector<double>&)> max;                             // elementwise max over the ranks
};

struct StepTunerSettings {
  int rounds = 3;        // blocks per arm
  int block_steps = 4;   // kept steps per block (after one that settles)
  int max_arms = 3;      // the tuned choice and at most two others
  int max_classes = 4;   // the classes carrying the most bytes
  double margin = 0.03;  // another arm must be this much faster than the tuned one
  double prune = 1.15;   // after the first round, an arm this much slower than the best leaves the race
  int guard_steps = 10;  // steps compared before and after a change
  double guard = 0.05;   // a change that made steps this much slower is reverted
};

class StepTuner {
 public:
  StepTuner(StepChoices choices, int rank, StepTunerSettings s = {});
  // The buckets (their sizes in bytes) that the coming steps run: their classes are tried from the start.
  void reset(const std::vector<std::size_t>& bucket_bytes);
  // One finished step's span in seconds (its first ready gradient to the end of finish()); every rank at the same
  // step. May agree with the other ranks and pin choices for the next step's calls.
  void step(double span_s);
  bool trying() const { return state_ == State::kTrying; }
  const std::vector<StepTuning>& results() const { return results_; }
  int reverts() const { return reverts_; }

 private:
  enum class State { kWaiting, kTrying, kGuarding };
  struct Class {
    std::size_t bytes = 0;  // one bucket's size in the class (what the calls pass)
    std::size_t total = 0;  // the class's bytes a step
    int buckets = 0;
  };
  bool all_decided() const;
  void start_class();
  void finish_class();
  void start_round();
  void pin_block();
  void prune();
  void guard(double span_s);

  StepChoices choices_;
  int rank_;
  StepTunerSettings s_;
  State state_ = State::kWaiting;
  std::vector<Class> classes_;
  std::size_t current_ = 0;                // the class under trial
  std::vector<TuningChoice> arms_;         // arms_[0]: the tuned choice
  std::vector<std::vector<double>> kept_;  // per arm: kept step spans
  std::vector<bool> alive_;                // per arm: still in the race
  std::vector<std::size_t> order_;         // this round's blocks (arm indices)
  std::size_t pos_ = 0;                    // the block running
  int round_ = 0, block_step_ = 0;         // the round, and the running block's steps so far
  std::vector<StepTuning> results_;
  // The guard: the choices the steps ran with, the last spans under them, and the spans since a change.
  std::vector<std::optional<TuningChoice>> guarded_;
  std::vector<double> before_, after_;
  int reverts_ = 0;
};

}  // namespace hopwise::comm::reducer
