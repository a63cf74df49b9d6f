// A training step at scale, on simulated ranks: the gradient reducer's schedule (training/src/reducer/schedule.cpp:
// its buckets, launched in bucket order as backward completes them) and the compressed recipes
// (comm/src/compressed: a codec's scales, payloads and gathers; PowerSGD's P and Q) run unchanged on every rank's
// actor, their collectives through RankCollectives, while backward's progress is simulated time: a step's gradients
// become ready through the backward's share of the compute, each after its share of the parameters. The averaging
// methods run their period: local SGD computes H steps and then averages the model (blocking); async averages a
// snapshot while H steps of compute go on (the actor waits on the average; compute's clock runs beside it, as
// nothing else crosses the network in those steps). Buffers are phantom (only sizes travel; see RunOptions) and
// the codecs' work is charged at rates measured from the real codecs on this machine, or given.
//
// gossip exchanges the model with its partners on the planned ring (the averager's pairing, gossip_partner) while the
// step computes, then waits for them and mixes. hier averages each bucket within the host as backward completes it
// (Communicator::allreduce_within_host's phases) for H steps, then the model over the world. Not simulated: a
// method's warm-up steps and PowerSGD's (the steady state is what a long run sees), and compute slowed by
// communication on shared cores.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "hopwise/comm/algorithm.h"
#include "hopwise/comm/transport.h"
#include "hopwise/comm/tuning.h"
#include "hopwise/sim/rank_collectives.h"

namespace hopwise::comm::sim {

// One gradient as the reducer registers it and PowerSGD sees it: rows x cols (1 x n for a vector).
struct Layer {
  std::string name;
  std::size_t rows = 1, cols = 0;
};

struct TrainingModel {
  std::string name;
  std::vector<Layer> layers;  // forward order
  std::size_t parameters() const;
};
// "mnist" (train_mnist's MLP: 784-1024-1024-10, 1.86 M parameters), "gpt2-small" (GPT-2 small: 124.4 M, its
// embeddings tied), or the layers "RxC,N,...", forward order (RxC a matrix, N a vector). InvalidArgument naming
// what is wrong.
TrainingModel parse_model(const std::string& spec);

// What a step averages and how: "sync" (gradients over the world every step), "sync/CODEC" (every bucket through a
// codec of compression/codec.h, or PowerSGD: "sync/powersgd:rank=4"), "local:period=H", "hier:period=H",
// "async:period=H[,delay=D][,codec=C]", "gossip:peers=K[,codec=C]" (the averagers' specs, comm/averaging.h), "ddp" (a
// topology-blind library: every bucket on the ring in rank order, the same buckets).
struct TrainingMethod {
  enum class Kind { kSync, kLocal, kHier, kAsync, kGossip };
  std::string spec;  // as given
  Kind kind = Kind::kSync;
  std::string codec = "none";  // sync: the buckets' codec or powersgd spec; async: the snapshot's codec
  int period = 1, delay = 1;   // local, hier, async: steps between averagings; async: steps until an average applies
  int peers = 1;               // gossip: partners a step
  bool ddp = false;
};
TrainingMethod parse_method(const std::string& spec);

// The codec's work per float of the gradient, in seconds: agreeing scales' local pass, encode, decode (a gather
// codec decodes every rank's payload), PowerSGD's three passes at its rank.
struct CodecCosts {
  double scales_s = 0, encode_s = 0, decode_s = 0;
  double p_s = 0, q_s = 0, decompress_s = 0;
};
// From the real codec (or PowerSGD) on this machine: the best of 3 over 4 M floats (a 2048 x 2048 matrix).
CodecCosts measure_codec_costs(const std::string& codec);
// Every pass at `bytes_per_s` of float input (another machine's codec rate, e.g. a GPU's); PowerSGD's whole step.
CodecCosts codec_costs_at(const std::string& codec, double bytes_per_s);

struct StepSettings {
  double compute_s = 0;                        // forward + backward (+ optimizer) of one step on one rank
  double backward_share = 2.0 / 3;             // of compute_s: the backward, through which the gradients become ready
  double bucket_mb = 25, first_bucket_mb = 1;  // the reducer's caps (ReducerOptions)
  CodecCosts costs;
};

// A call a step makes, which the chooser picks an algorithm for.
struct StepCall {
  Collective kind = Collective::kAllreduce;
  DataType dtype = DataType::kFloat32;
  std::size_t count = 0;  // per rank, as the public calls count it (allgather: bytes)
  auto tie() const { return std::tie(kind, dtype, count); }
  bool operator<(const StepCall& o) const { return tie() < o.tie(); }
  bool operator==(const StepCall& o) const { return tie() == o.tie(); }
};
using ChooseAlgorithm = std::function<TuningChoice(const StepCall&)>;  // the algorithm (and chunk) of a call

struct StepResult {
  int steps = 1;                // the steps of one period (local, async: H)
  double period_s = 0;          // their simulated time, the slowest rank's
  double compute_s = 0;         // of which compute
  double wire_bytes = 0;        // a rank's payload bytes in the period, as the recipes count them
  int buckets = 0;              // sync: the reducer's buckets
  std::vector<StepCall> calls;  // the distinct calls of the period
  double step_s() const { return period_s / steps; }
  double utilization() const { return period_s > 0 ? compute_s / period_s : 1; }
};

// The calls one period of `method` makes on `ranks` ranks, without simulating (for trials before the run).
std::vector<StepCall> step_calls(int ranks, const TrainingModel& model, const TrainingMethod& method,
                                 const StepSettings& settings);

// One period of `method` on ranks placed as run_ranks places them (hosts[r]), the ring and hosts as RankCollectives
// takes them (ddp: the rank-order ring), every call's algorithm from `choose` (ddp: the ring). `run`'s payloads are
// made phantom.
StepResult simulate_step(const std::vector<std::string>& hosts, const std::vector<int>& ring,
                         const std::vector<int>& host_of_rank, std::size_t chunk_bytes, RunOptions run,
                         const TrainingModel& model, const TrainingMethod& method, const StepSettings& settings,
                         const ChooseAlgorithm& choose);

}  // namespace hopwise::comm::sim
