// Measured algorithm choices: what the tuner decided per (collective, dtype class, size class) for one job shape,
// and the tuning file that keeps them (JSON, written by hopwise-tune, read through HOPWISE_TUNING_FILE), in the
// spirit of Open MPI's dynamic rules file and NCCL's tuner plugin.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "hopwise/comm/algorithm.h"
#include "hopwise/common/dtype.h"

namespace hopwise::comm {

// One candidate the tuner times: an algorithm of the table with its pipelining grain and ring channels.
struct TuningChoice {
  Algorithm algorithm = Algorithm::kAuto;
  std::size_t chunk_bytes = 0;  // 0: the communicator's (HOPWISE_CHUNK_BYTES)
  int channels = 0;             // ring allreduce: 0 = the plan's channels, 1 = one ring
  bool operator==(const TuningChoice&) const = default;
};
// "ring", "ring/chunk=1M", "ring/channels=1": as tables, logs and the tuning file print a choice.
std::string to_string(const TuningChoice& c);

// Calls are tuned per size class: class k holds the calls of (2^(k-1), 2^k] bytes (class 0: 0 and 1 byte).
int size_class_of(std::size_t bytes);
std::size_t size_class_max_bytes(int size_class);
// "4 KiB", "16 MiB": the largest call of a size class, as logs name the class.
std::string size_class_text(int size_class);
// Dtypes whose reductions cost alike share their tuning: "float" (fp32, fp64), "half" (fp16, bf16), "int".
std::string dtype_class_of(DataType dt);

struct TuningEntry {
  Collective collective = Collective::kAllreduce;
  std::string dtype_class = "float";
  int size_class = 0;
  TuningChoice choice;
  double seconds = 0;  // the choice's time: the slowest rank's, median over the repetitions
  // Every candidate timed, with its median (those dropped early, far slower than the best, ran fewer rounds).
  std::vector<std::pair<std::string, double>> measured;
};

// What a tuning is valid for: the same number of ranks, hosts and ranks per host.
struct JobShape {
  int ranks = 1, hosts = 1, ranks_per_host = 1;
  bool operator==(const JobShape&) const = default;
};
std::string to_string(const JobShape& s);  // "4 ranks on 2 hosts, 2 per host"

struct TuningFile {
  JobShape job;
  std::string transport;  // what the timings ran over: a job over another transport ignores the file
  std::string version;    // hopwise's, at the time of the tuning
  std::string machine;    // host name, CPU model and cores of rank 0
  std::string created;    // UTC, ISO 8601
  std::vector<TuningEntry> entries;
};

// The largest tuning file read (hopwise-tune writes a few KB).
constexpr std::size_t kMaxTuningFileBytes = 16u << 20;
// Reads and checks a tuning file; throws InvalidArgument naming the file, the line and what is wrong (not a
// regular file, past kMaxTuningFileBytes, malformed JSON, an unknown algorithm or collective, a missing field).
// header_only: everything but the entries (which are skipped unread), to see whether the file fits the job first.
TuningFile read_tuning_file(const std::string& path, bool header_only = false);
// The same for the file's text; `path` names it in the errors.
TuningFile parse_tuning_file(const std::string& text, const std::string& path, bool header_only = false);
// Writes it (atomically: a temporary file renamed over `path`).
void write_tuning_file(const TuningFile& file, const std::string& path);
// Why a file made for `made_for` does not fit `job` ("" when it fits): names each field that differs.
std::string shape_mismatch(const JobShape& made_for, const JobShape& job);
// This machine, as a tuning file records it.
std::string describe_machine();
std::string hopwise_version();

// The online tuner's settings and counters, and the candidates it tries (comm/src/tuner/tuner.h runs them): here so
// that the simulator (sim/) tunes with the job's own settings.
namespace detail {

struct TunerSettings {
  bool online = true;           // HOPWISE_TUNE: tune classes the file does not cover (else the cost model chooses)
  int rounds = 3;               // HOPWISE_TUNE_ROUNDS: repetitions of each candidate (median)
  double prune = 2.0;           // after round 2, drop a candidate whose best is above prune x the best's
  double close = 1.1;           // after `rounds`, candidates within close x the best median race on...
  int close_race_factor = 3;    // ...up to this many times `rounds` in all
  double prior = 8.0;           // never try a candidate the cost model estimates above prior x its best estimate
  int check_every = 64;         // calls of a tuned class between drift checks
  int window = 16;              // recent calls whose median is checked
  double drift = 1.5;           // re-tune when the chosen one takes drift x its steady time
  double confirm_within = 1.5;  // finalists: trial medians within this of the best...
  double short_s = 100e-6;      // ...or, where the best's is below this,
  double confirm_within_short = 4.0;  // within this...
  int confirm_max = 6;                // ...at most this many (lined up, six rows within 1.4x ranked tree 4th of 6
                                      // where in a row it was the only fast one)...
  int confirm_calls = 16;             // ...each run this many calls in a row (after one to settle)...
  double confirm_budget_s = 0.25;     // ...fewer where that would take longer; none where fewer than 4 would fit...
  int confirm_passes = 2;             // ...split into this many passes over the finalists, each in a rotated order
                                      // (a machine that is busy for a while then hurts every finalist alike)
  double cheap_s = 1e-3;              // a trial below this is never dropped on its first round alone: the first
                                      // call at a new size is cold (buffers, slots), and a second try costs little
};

struct TunerStats {
  std::uint64_t trial_calls = 0;  // calls that ran a candidate under trial
  std::uint64_t agreements = 0;   // the small max-allreduces the tuner made
  std::uint64_t retunes = 0;      // classes tuned again after a drift
  double excess_s = 0;            // what the trials cost beyond running the chosen algorithm (this rank)
};

// What a tuner tries for a call of `bytes`: the cost model's candidates (`estimates`, seconds) it does not rule out
// (where a trial would cost more than a millisecond, those within `prior` x the best estimate: trials are cheap where
// calls are short), each at the communicator's chunk; the pipelined ones also at 4x `chunk_bytes` where a call holds
// many chunks, and the ring allreduce on one ring where the plan runs several side by side (`several_channels`).
std::vector<TuningChoice> tuning_candidates(const std::vector<std::pair<Algorithm, double>>& estimates, Collective c,
                                            std::size_t bytes, double prior, std::size_t chunk_bytes,
                                            bool several_channels);

}  // namespace detail

}  // namespace hopwise::comm
