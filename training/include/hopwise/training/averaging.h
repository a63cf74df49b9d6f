// Fewer synchronization points: a model averager that a data-parallel trainer calls around each optimizer step,
// so that ranks wait for each other less often than every step over every link.
//
//   sync                   gradients averaged over the world every step (the reducer alone; the default)
//   local:period=H,warmup=W  post-local SGD (Lin et al., arXiv 1808.07217): W synchronous steps, then no gradient
//                          communication and the parameters averaged every H steps
//   hier:period=H[,warmup=W] gradients averaged within each host every step (the fast path), parameters across
//                          the world every H steps
//   gossip:peers=K[,codec=C] decentralized SGD: each step every rank averages its model with K partners, paired one
//                          to one on the planned ring and shifting one place per round (Bagua's shift_one); the
//                          exchange of x_t overlaps the computation of the gradient at x_t (D-PSGD); codec fp16,
//                          bf16 or int8 sends the model's difference from the last common model
//   async:period=H[,warmup=W][,codec=C] every H steps a snapshot of the model is averaged in the background while
//                          compute goes on; H steps later each rank adds (average - snapshot): staleness at most H
//                          steps; codec fp16, bf16 or int8 (with error feedback) all-reduces the snapshot's
//                          difference from the last average instead
//   diloco:period=H[,inner=sgd|adam|muon][,outer_lr=LR,momentum=M,nesterov=0|1][,fragments=F][,delay=D][,alpha=A]
//          [,codec=C]      DiLoCo (Douillard et al., arXiv 2311.08105) and its streaming form (arXiv 2501.18512):
//                          H local steps of the trainer's own optimizer, then the pseudo-gradient (the last synced
//                          model minus this rank's) averaged over the world and applied to the synced model by an
//                          outer SGD with Nesterov momentum; F fragments synced in turn (one every H/F steps),
//                          each all-reduce running behind D steps of compute, merged keeping alpha of the local
//                          model; any codec, with error feedback per fragment. Where the spec names no outer step,
//                          the measured rule for the inner optimizer's family and the period sets it (plain
//                          averaging but after SGD at H >= 128: training/src/averaging/outer_rule.cpp); named, the
//                          unnamed ones are the papers' (outer_lr 0.7, momentum 0.9, nesterov 1)
//   diloco:auto[,target=U][,inner=sgd|adam|muon] measures the step and the link in the first steps and picks H, F, D
//                          and the codec that keep the predicted compute utilization at U (0.95) with the shortest
//                          period, then checks its choice on the steps that follow (auto_tuner.h), with the outer
//                          rule for the inner optimizer; it says what and why
// warmup=W (local, hier, async, diloco): W synchronous steps first (gradients over the world), the schedule counted
// after. local, hier and async are the outer path with outer_lr 1 and no momentum (training/src/averaging/outer.cpp).
//
// Each method is one file and one row (averaging_method.h), which parse, the errors and the averager read.
//
// Momentum stays local in every method (the averagers touch parameters only), as in Lin et al.'s local SGD and
// torch's PostLocalSGDOptimizer. Every method averages parameters in a way that keeps the ranks' mean model, so
// full_average() before an evaluation gives every rank the model the method's ranks hold on average.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "hopwise/comm/communicator.h"

namespace hopwise::comm {

struct AveragingSpec {
  std::string method = "sync";  // the method's row (averaging_method.h)
  int period = 1;               // local, hier, async: parameters averaged every `period` steps
  int warmup = 0;               // local, hier, async: synchronous steps first
  int delay = 0;                // async: steps from a snapshot to applying its average, 1..period (0: period);
                                // diloco: steps a fragment's all-reduce runs behind, 0..period/fragments (0: blocking)
  int peers = 1;                // gossip: partners per step
  std::string codec = "none";   // gossip, async: none, fp16, bf16 or int8; diloco: any codec (the codec's defaults)
  double outer_lr = 0.7;        // diloco: the outer SGD's learning rate
  double momentum = 0.9;        // diloco: the outer SGD's momentum (0: none)
  int nesterov = 1;             // diloco: Nesterov momentum (1) or heavy ball (0)
  bool outer_by_rule = false;   // diloco: the spec named none of the three above: the rule for inner and period
                                // set them (outer_rule.h), and to_string() leaves them out
  int fragments = 1;            // diloco: contiguous fragments synced in turn, one every period / fragments steps
  double alpha = 0;             // diloco: the share of the local model kept at a merge (0: take the outer result)
  int pick = 0;                 // diloco:auto (1): period, fragments, delay, codec and outer settings measured
  double target = 0.95;         // diloco:auto: the compute utilization to keep
  std::string inner;            // diloco: the trainer's optimizer family (sgd, adam, muon; "": not named), for the
                                // outer step where the spec names none
  // Throws InvalidArgument naming the method or the field that is wrong and what it takes.
  static AveragingSpec parse(const std::string& text);
  std::string to_string() const;  // canonical: parse(to_string()) gives the same spec
};

// What the gradient reducer averages at a step: over the world, within the host, or nothing (local steps).
enum class GradientScope { kWorld, kHost, kNone };
const char* to_string(GradientScope s);

// The one dispatch on a scope: `data` (n floats) averaged in place over the world (allreduce_async) or this rank's
// host (allreduce_within_host_async); nothing for kNone (the gradients stay local).
std::optional<Work> average_in_scope_async(Communicator& comm, GradientScope scope, float* data, std::size_t n);

// Gossip's pairing: the partner of ring position `position` among `n` at `round`, or -1 where it sits the round
// out. Symmetric (partner(partner(p)) == p), a new partner each round: even n by the circle method (n - 1 rounds
// pair everyone with everyone once, no one idle), odd n by (round - p) mod n (the one paired with itself waits).
int gossip_partner(int position, int n, std::int64_t round);

struct AveragingStats {
  std::uint64_t averages = 0;     // parameter averagings this rank took part in (full ones included)
  std::uint64_t bytes = 0;        // parameter bytes this rank sent or contributed (user-buffer bytes, as the reducer)
  double wait_ms = 0;             // time the caller's thread spent in the averager (waiting and mixing)
  std::uint64_t syncs = 0;        // outer syncs (diloco, local, hier, async: one per fragment all-reduce)
  double comm_ms = 0;             // time the background all-reduces took on the progress thread
  double hidden_ms = 0;           // of which compute went on beside them (comm_ms less the caller's wait for them)
  std::uint64_t state_bytes = 0;  // memory the method keeps beside the model (synced copy, momentum, residuals)
};

// Where the model is not the float32 buffer the averager works on (on a GPU, in bfloat16 or float16), that buffer is
// a host copy, and the model's owner keeps the two in step: the averager says which range it is about to read and
// which it wrote. Called on the caller's thread, inside the averager's calls, never on the progress thread.
class ParameterStaging {
 public:
  virtual ~ParameterStaging() = default;
  // params[begin, end) hold the model's current values when this returns.
  virtual void fetch(std::size_t begin, std::size_t end) = 0;
  // params[begin, end) were written: the model takes them before its next use. The copy may still be running when
  // this returns; the averager calls fetch (or publish) before it writes that range again.
  virtual void publish(std::size_t begin, std::size_t end) = 0;
};

class ModelAverager {
 public:
  // `params`: the model's float32 parameters, one buffer the caller owns and updates in place. Collective: rank
  // 0's parameters are broadcast, so every rank starts from the same model. With `staging`, `params` is a host copy
  // of a model that lives elsewhere (ParameterStaging); the caller keeps `staging` alive as long as the averager.
  // `joining`: this process joins a running group (an elastic newcomer): no first broadcast; its state and place
  // come from the members at regroup(), which it calls with them.
  ModelAverager(Communicator& comm, AveragingSpec spec, float* params, std::size_t count,
                ParameterStaging* staging = nullptr, bool joining = false);
  ~ModelAverager();  // waits for an exchange in flight, so nothing lands in freed memory
  ModelAverager(const ModelAverager&) = delete;
  ModelAverager& operator=(const ModelAverager&) = delete;

  const AveragingSpec& spec() const;
  // What the coming step's gradients are averaged over (the reducer's GradientReducer::set_scope).
  GradientScope gradient_scope() const;
  // Between after_step() and the next before_step() the parameters must not change (gossip sends them from where
  // they are). After backward, before the optimizer step: gossip completes the exchange started after the last step and
  // mixes the partners' models in. The others do nothing here.
  void before_step();
  // After the optimizer step: the step's averaging (local, hier: blocking; gossip, async: started, to overlap
  // the next steps' compute). Counts the step.
  void after_step();
  // Every rank's parameters replaced by the world's mean (what is in flight is awaited first). Before every
  // evaluation, a checkpoint and the end. Collective; a no-op for sync, whose ranks are always equal.
  void full_average();
  // The world's mean model written to `out` (count floats), every rank's own parameters untouched: an evaluation
  // that leaves the method's course alone (train_mnist's --eval-every probes). Collective.
  void average_into(float* out);
  // Waits for what is in flight, keeping it (it is applied at its step as ever): an evaluation that follows then
  // does not wait on it off the trainer's clock. Nothing else changes.
  void settle();

  // Elastic membership. regroups(): the method keeps state every member shares (diloco with an outer step or a
  // codec: the synced model, outer momentum, residuals), which a change of members must not lose, so the averager
  // is kept and regroup()ed rather than built anew (the spec alone decides it). After a collective failed and before
  // the old communicator goes, detach(): a sync in flight is kept where it completed here, else marked to be redone.
  // Then regroup(comm) over the new members, every one of them (a newcomer built with `joining` too): the
  // furthest member's shared state and step count go to any member behind it, and the sync that failed is redone
  // over the members here, their pseudo-gradients averaged over them (the lost ones' contributions since the last
  // sync are gone with them). Returns what happened, for a log line. InvalidArgument where !regroups().
  bool regroups() const;
  void detach();
  std::string regroup(Communicator& comm);

  std::int64_t steps() const;  // after_step() calls so far (restored by load())
  const AveragingStats& stats() const;
  // What the method decided last and why (diloco:auto: its choice once it has measured, then what its check of the
  // steps that followed decided), else empty.
  std::string choice() const;
  // diloco:auto's pick and why (its first decision, which choice() holds until the check decides), else empty.
  std::string pick() const;

  // The method's state for a checkpoint: the spec, the step count (which places the next averaging and gossip
  // round) and the method's own state in binary (diloco: the synced model, momentum, residuals, a fragment's
  // average in flight, awaited). gossip needs full_average() first; the outer path saves mid-period. load()
  // refuses another spec, naming both.
  std::string save() const;
  void load(const std::string& saved);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hopwise::comm
