// train_mnist's training loop, by concern: the setup (data, model, reducer, averager, a resumed checkpoint), the
// plan printed before the first step, one step (batch, forward, backward handing gradients to the reducer, the
// averager around the optimizer step, trace and monitor), the target's probes, the progress bar, the epoch's end
// (full average, evaluation, checkpoint) and the summary.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "flags.h"
#include "hopwise/comm/communicator.h"
#include "hopwise/training/averaging.h"
#include "hopwise/training/elastic.h"
#include "hopwise/training/monitor.h"
#include "hopwise/training/neighbour_copy.h"
#include "hopwise/training/reducer.h"
#include "mlp.h"
#include "mnist.h"
#include "report.h"

namespace hopwise::examples {

class Trainer {
 public:
  using Clock = std::chrono::steady_clock;

  // Loads the data and builds the model, reducer and averager (rank 0's parameters to every rank), resuming from
  // flags.resume where given. Collective.
  // Under HOPWISE_ELASTIC=shrink `elastic` is the group `comm` belongs to: a lost rank is survived (survive()).
  Trainer(comm::Communicator& comm, Flags flags, comm::ElasticGroup* elastic = nullptr);
  void print_plan() const;  // rank 0: ranks, transport, ring, buckets, model
  void train();             // the epochs after the resumed ones
  void report();            // rank 0: the summary line, the target, tuning, the trace and --json

 private:
  // Per-step figures summed over the run.
  struct Totals {
    double compute_ms = 0, comm_ms = 0, exposed_ms = 0, step_ms = 0, averaging_ms = 0;
    double gradient_exposed_ms = 0;  // of exposed_ms: waiting on the reducer (the rest: on the averager)
    // Of compute_ms: forward, backward, the optimizer step; and from the step's start to its first bucket's
    // launch (the link cannot carry this step's gradients before then).
    double forward_ms = 0, backward_ms = 0, optimizer_ms = 0, first_bucket_ms = 0;
    std::size_t steps = 0, gradient_bytes = 0;
  };

  void split_batch();
  std::string batch_policy() const;  // for the elastic lines: the global batch kept, or the learning rate scaled
  void make_reducer();
  // The elastic side (trainer_elastic.cpp).
  bool survive(const std::function<void()>& part);
  std::string rejoin_group();
  void grow();
  void share_state();
  void note_change(const comm::ElasticEvent& ev, Clock::time_point t0, const std::string& what);
  bool parameters_identical();
  void keep_step_start();  // the step under way, and the neighbour's copy of this rank's parameters
  std::string average_in_lost(const comm::ElasticEvent& ev);  // under an averaging method, after a shrink
  std::string catch_up();                                     // the survivors to the place the furthest one reached
  std::int64_t position() const;  // steps_done_ * 2, + 1 once the boundary work after the step (if any) is done
  bool epoch_end_pending() const;
  bool checkpoint_due() const;

  void order_epoch(int epoch);  // order_ for `epoch`: the same permutation on every rank, whatever came before
  void resume();                // from --resume (a path, or auto: --checkpoint's newest step), or a fresh run's id
  void step(std::size_t s, double& loss_sum);
  void probe_target(int epoch, std::size_t s);
  void progress(int epoch, std::size_t s, double loss_sum, std::size_t losses) const;
  void say_choice();          // rank 0, once: what diloco:auto chose and why, when it has
  void checkpoint();          // a full average, then every rank's file of this step
  void end_epoch(int epoch);  // may be done again after a shrink: its accuracy is then replaced
  double evaluate();          // the test accuracy of the model as it is on every rank. Collective.
  double training_s() const;
  int epoch_of(std::int64_t steps) const;  // the epoch a step count ends in, and the step within it
  std::size_t step_in_epoch(std::int64_t steps) const;

  comm::Communicator* comm_;
  comm::ElasticGroup* elastic_;
  Flags f_;
  int rank_, p_;
  std::string data_dir_;
  Dataset train_, test_;
  int px_;
  std::size_t n_train_;
  Mlp model_;
  std::optional<comm::GradientReducer> reducer_;
  std::optional<comm::ModelAverager> averager_;
  std::optional<comm::Monitor> monitor_;
  std::int64_t steps_done_ = 0;         // optimizer steps since the run's start, resumed ones included
  std::int64_t resumed_steps_ = 0;      // of which a checkpoint held these
  int epochs_ended_ = 0;                // epochs whose end (average, evaluation, checkpoint) is done
  std::int64_t checkpointed_step_ = 0;  // the last step a --checkpoint-every checkpoint (or the resume) holds
  std::string resumed_from_;            // the checkpoint's path; empty: a fresh run
  std::uint64_t run_ = 0;               // the run's id, carried in its checkpoints
  bool just_joined_ = false;            // a newcomer before its first step
  std::string said_;                    // the averager's choice say_choice() printed last
  Trace trace_;
  bool tty_;
  int local_ = 0, first_ = 0;  // this rank's share of the global batch, and where it starts
  float grad_scale_ = 1;
  float lr_ = 0;            // --lr, or scaled with the ranks (--elastic-batch scale-lr)
  int launched_ranks_ = 0;  // the job's ranks at its start (a newcomer's: the job's)
  // Under HOPWISE_ELASTIC=shrink: the step under way and whether its optimizer step was taken; with an averaging
  // method (the ranks' models differ between averagings) the copy of the ring predecessor's parameters.
  bool models_differ_ = false;
  std::optional<comm::NeighbourCopy> neighbour_;
  std::int64_t start_step_ = -1;
  bool step_applied_ = false;
  std::size_t steps_per_epoch_;
  std::vector<std::size_t> order_;
  std::vector<float> xb_, probe_;  // the batch's images; the ranks' mean model for the probes
  std::vector<std::uint8_t> yb_;
  int ordered_epoch_ = -1;   // the epoch order_ is for
  int accuracy_epoch_ = -1;  // the epoch whose accuracy sum_.epoch_accuracy ends with
  Totals totals_;
  Summary sum_;
  Clock::time_point start_;
  double paused_s_ = 0;  // evaluations, off the clock
};

}  // namespace hopwise::examples
