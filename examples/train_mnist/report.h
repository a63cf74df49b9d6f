// train_mnist's outputs beside the console: the Chrome/Perfetto trace and the --json summary.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "hopwise/comm/communicator.h"
#include "hopwise/comm/tuning.h"
#include "hopwise/training/averaging.h"
#include "hopwise/training/reducer.h"

namespace hopwise::examples {

// Chrome trace events ("X" spans) of this rank, merged on rank 0 by write_trace.
struct Trace {
  std::chrono::steady_clock::time_point origin;
  std::string events;
  int rank = 0;
  bool on = false;
  void span(const std::string& name, const std::string& cat, std::chrono::steady_clock::time_point a,
            std::chrono::steady_clock::time_point b, int tid);
};

// Gathers every rank's events and writes the file on rank 0. Collective.
void write_trace(comm::Communicator& comm, Trace& tr, const std::string& path);

struct Summary {
  int ranks = 0, epochs = 0, batch = 0;
  std::size_t steps = 0;
  double test_accuracy = 0, images_per_s = 0, train_s = 0;
  // Per step. exposed_comm_ms: waiting on the reducer and on the averager; averaging_ms: of that, the averager's
  // (its epoch-end full averages included); comm_ms: the reducer's buckets on the progress thread.
  double step_ms = 0, compute_ms = 0, comm_ms = 0, exposed_comm_ms = 0, averaging_ms = 0, overlap_pct = 0;
  double compute_utilization = 0;
  double forward_ms = 0, backward_ms = 0, optimizer_ms = 0, first_bucket_ms = 0;  // see Trainer::Totals
  double bytes_per_step = 0, gradient_bytes_per_step = 0, averaging_bytes_per_step = 0;
  // The averager's (AveragingStats): outer syncs (one per fragment all-reduce) over the run; per step, the time
  // their background all-reduces took and, of it, what compute went on beside (hidden); the memory the method keeps
  // beside the model (synced copy, momentum, residuals, a fragment's buffers).
  std::uint64_t averaging_syncs = 0, averaging_state_bytes = 0;
  double averaging_comm_ms = 0, averaging_hidden_ms = 0;
  std::string compression, averaging;
  bool overlap = true;
  double target_accuracy = 0;                            // 0: none asked
  double seconds_to_target = -1, epochs_to_target = -1;  // -1: not reached
  std::size_t steps_to_target = 0;
  std::vector<double> epoch_accuracy;  // after each epoch's full average
  // HOPWISE_ELASTIC=shrink: membership changes survived, steps done again, seconds from a failure to going on.
  int elastic_events = 0, steps_redone = 0;
  double stood_still_s = 0;
  // The reducer's step tuning: per size class {"size_class", "buckets", "chosen", "arms": {choice: seconds}} as a
  // JSON array, and the re-tunings its guard reverted.
  std::string step_tuning_json = "[]";
  int step_tuning_reverts = 0;
};

void write_json(const std::string& path, const Summary& s);

// The end-of-run line of an averaging method (not sync): its averagings, bytes and waiting per step over `steps`
// steps, then its syncs (where it made any) with their all-reduces' time per step and the part hidden behind
// compute, and the state it keeps.
std::string describe_averaging(const std::string& spec, const comm::AveragingStats& st, double steps,
                               double wait_ms_per_step);

// The tuner's choices for the gradient buckets' size classes (from 512 B up: not the job's small bookkeeping
// calls), smallest class first, as the summary's "tuned" line lists them: "65536 B one_shot, 1048576 B ring".
std::string describe_tuned(const std::vector<comm::TuningEntry>& entries);

// The reducer's step tuning, as the summary line and as the JSON array of Summary::step_tuning_json.
std::string describe(const std::vector<comm::StepTuning>& tuning);
std::string to_json(const std::vector<comm::StepTuning>& tuning);

}  // namespace hopwise::examples
