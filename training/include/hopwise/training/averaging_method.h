// An averaging method is one file and one row: the row (AveragingMethodRow) says its name, the spec fields it takes
// and how the canonical spec shows them; its factory makes the object (AveragingMethodBase) that a ModelAverager
// calls around each step. Built in (training/src/averaging/<name>.cpp): sync, local and hier (local.cpp), gossip,
// async; register_averaging_method adds one from outside the library (tests/test_averaging.cpp does), and
// AveragingSpec::parse, the errors that list the methods, train_mnist's --averaging and hopwise.torch's
// ModelAverager then take it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hopwise/training/averaging.h"

namespace hopwise::comm {

// What a method works on: the averager's communicator, spec, parameters and statistics.
struct AveragingContext {
  Communicator* comm;  // a pointer: regroup() points it at the next membership's communicator
  const AveragingSpec& spec;
  float* params;
  std::size_t count;
  AveragingStats& stats;
  // The trainer's own averages between steps (evaluations, checkpoints): pauses that diloco:auto's check leaves out.
  std::int64_t out_of_loop = 0;
  // Where params is a host copy of the model (ParameterStaging): a method calls fetch before it reads a range and
  // publish after it wrote one. No-ops without staging.
  ParameterStaging* staging = nullptr;
  void fetch(std::size_t begin, std::size_t end) {
    if (staging && end > begin) staging->fetch(begin, end);
  }
  void publish(std::size_t begin, std::size_t end) {
    if (staging && end > begin) staging->publish(begin, end);
  }
  // The whole copy fetched or published in this call of the averager: the model has not changed since (the trainer
  // steps between calls), so a second fetch_all in the same call copies nothing. ModelAverager clears it per call.
  bool whole_copy_current = false;
  void fetch_all() {
    if (!whole_copy_current) fetch(0, count);
    whole_copy_current = true;
  }
  void publish_all() {
    publish(0, count);
    whole_copy_current = true;
  }
  void average_world();  // the parameters replaced by the world's mean (blocking), counted in stats
  // This process joins a running group (ModelAverager's `joining`): its state comes from the members at regroup().
  bool joining = false;
};

class AveragingMethodBase {
 public:
  virtual ~AveragingMethodBase() = default;
  // What the gradients of the step after `steps` completed steps are averaged over.
  virtual GradientScope gradient_scope(std::int64_t steps) const = 0;
  // After backward, before the optimizer step (gossip mixes here).
  virtual void before_step() {}
  // After optimizer step `step` (1-based): the method's averaging, blocking or started.
  virtual void after_step(std::int64_t step) = 0;
  // Waits for what is in flight and drops it (a full average or a load follows).
  virtual void drain() {}
  virtual bool in_flight() const { return false; }
  // Waits for what is in flight and keeps it, to be applied when due (ModelAverager::settle).
  virtual void settle() {}
  // Every rank now holds the same parameters (after a full average or a load): references restart here.
  virtual void ranks_equal() {}
  // Every rank's parameters made equal to the world's model (ModelAverager::full_average): by default what is in
  // flight is dropped and the parameters averaged (every plain averaging keeps the mean, so nothing is lost).
  virtual void full_average(AveragingContext& ctx) {
    drain();
    ctx.average_world();
    ranks_equal();
  }
  // The method's own state for a checkpoint, in binary (empty: none beyond the step count). May wait for what is
  // in flight but keeps it. load_state() gets what save_state() gave, on the same spec and parameter count.
  virtual bool saves_in_flight() const { return false; }
  virtual std::string save_state() { return {}; }
  virtual void load_state(const std::string& state) {}
  virtual std::string choice() const { return {}; }
  virtual std::string pick() const { return {}; }
  // Where the row's `regroups` says so for the spec. A collective failed and the communicator is about to go: what is
  // in flight is resolved (kept where it completed, else marked to be redone) so that nothing refers to the old
  // communicator. Never throws.
  virtual void detach() {}
  // Over ctx.comm, the next membership's (collective): the members align (the furthest one's shared state and step
  // count to all, a newcomer included) and the sync that failed is redone over those here. `steps` is the
  // averager's step count, set to the furthest member's. Returns what happened, for the event's line.
  virtual std::string regroup(std::int64_t& steps) { return {}; }
};

struct AveragingMethodRow {
  std::string name;                 // the spec's name: "local"
  std::vector<std::string> fields;  // the fields it takes, in the order errors list them: period, warmup, peers, codec
  std::vector<std::string> required;  // of which these have no default
  std::vector<std::string> shown;     // printed by to_string() even at their default
  bool ranks_always_equal = false;    // every step leaves the ranks equal (sync): full_average() has nothing to do
  std::string summary;                // one line for the help
  std::function<std::unique_ptr<AveragingMethodBase>(AveragingContext&)> make;
  bool any_codec = false;           // codec= takes every codec (diloco, error feedback on), not only the model ones
  bool delay_up_to_period = false;  // delay=period is the default, written 0 (async)
  // Whether a spec keeps state every member shares (diloco's synced model and outer momentum), carried across a
  // change of members (detach(), regroup()) instead of starting over. The spec alone decides, so that a newcomer
  // and the members take the same path. Unset: never.
  std::function<bool(const AveragingSpec&)> regroups;
};

// The table. A name that is there is replaced. InvalidArgument for a row without a name or factory, or with a field
// AveragingSpec does not have.
void register_averaging_method(AveragingMethodRow row);
// The row of `name`, or null.
std::shared_ptr<const AveragingMethodRow> find_averaging_method(const std::string& name);
std::vector<std::string> averaging_method_names();
// Whether `spec`'s method carries its state across a change of members (the row's `regroups`; false for an unknown
// method).
bool averaging_regroups(const AveragingSpec& spec);
// AveragingSpec's fields, the names a row may list (alpha, auto, codec, delay, fragments, ...).
std::vector<std::string> averaging_spec_fields();

}  // namespace hopwise::comm
